"""The broker's one clock: monotonic in production, moved by hand in tests."""

from __future__ import annotations

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
