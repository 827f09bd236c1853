"""The one source of time for the broker: expiry, keepalive, delays and timestamps all read it.

Tests swap in :class:`ManualClock` to move time without sleeping; nothing else calls ``time``.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds for every duration, and the wall clock for what leaves the process."""

    def now(self) -> float:
        """Monotonic seconds; only differences between readings mean anything."""

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch: message timestamps and times stored on disk,
        which must keep their meaning across a restart (a monotonic reading does not)."""


class MonotonicClock:
    """The production clock: immune to wall-clock jumps, so expiry never runs backwards."""

    __slots__ = ()

    # The builtin itself, not a wrapper: the publish path reads the clock per message.
    now = staticmethod(time.monotonic)

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when a test says so; its wall clock moves with it."""

    __slots__ = ("_now", "_start", "_wall_start_ms")

    # 2023-11-14T22:13:20Z: a fixed, plausible epoch, so stored wall times are reproducible.
    DEFAULT_WALL_START_MS = 1_700_000_000_000

    def __init__(self, start: float = 1_000.0, wall_start_ms: int = DEFAULT_WALL_START_MS) -> None:
        self._now = start
        self._start = start
        self._wall_start_ms = wall_start_ms

    def now(self) -> float:
        return self._now

    def wall_ms(self) -> int:
        return self._wall_start_ms + round((self._now - self._start) * 1000)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never runs backwards")
        self._now += seconds
