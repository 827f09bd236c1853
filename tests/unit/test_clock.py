"""The broker's one clock: monotonic in production, moved by hand in tests."""

from __future__ import annotations

import time

import pytest

from kittiwake.clock import Clock, ManualClock, MonotonicClock


def test_manual_clock_stands_still_until_advanced() -> None:
    """ManualClock reads its start time until a test moves it."""
    clock = ManualClock(50.0)
    assert clock.now() == clock.now() == 50.0


def test_manual_clock_default_start_is_not_zero() -> None:
    """The default start is positive, so 'created = 0' never looks like a real time."""
    assert ManualClock().now() > 0


def test_manual_clock_advances() -> None:
    """advance moves the clock forward by exactly the given seconds."""
    clock = ManualClock(0.0)
    clock.advance(1.5)
    clock.advance(0)
    clock.advance(2)
    assert clock.now() == 3.5


def test_manual_clock_never_runs_backwards() -> None:
    """A negative advance is refused and leaves the time unchanged."""
    clock = ManualClock(10.0)
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert clock.now() == 10.0


def test_monotonic_clock_never_decreases() -> None:
    """The production clock is monotonic: successive readings never go down."""
    clock = MonotonicClock()
    readings = [clock.now() for _ in range(1000)]
    assert readings == sorted(readings)


def test_both_clocks_satisfy_the_protocol() -> None:
    """Either clock can be handed to the broker where a Clock is expected."""
    clocks: list[Clock] = [MonotonicClock(), ManualClock()]
    assert all(isinstance(c.now(), float) for c in clocks)
    assert all(isinstance(c.wall_ms(), int) for c in clocks)


def test_manual_wall_clock_moves_with_the_clock() -> None:
    """Wall time advances by exactly what the monotonic time does, in milliseconds."""
    clock = ManualClock(10.0, wall_start_ms=1_000_000)
    assert clock.wall_ms() == 1_000_000
    clock.advance(2.5)
    assert clock.wall_ms() == 1_002_500


def test_manual_wall_clock_starts_at_a_fixed_epoch() -> None:
    """Two manual clocks agree on the wall time: stored times are reproducible in tests."""
    assert ManualClock().wall_ms() == ManualClock(5_000.0).wall_ms() > 0


def test_monotonic_wall_clock_is_milliseconds_since_the_epoch() -> None:
    """The production wall clock reads the system time, in whole milliseconds."""
    before = time.time_ns() // 1_000_000
    reading = MonotonicClock().wall_ms()
    after = time.time_ns() // 1_000_000
    assert isinstance(reading, int)
    assert before <= reading <= after
