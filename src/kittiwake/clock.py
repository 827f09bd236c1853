"""The one source of time for the broker: expiry, keepalive and delays all read it.

Tests swap in :class:`ManualClock` to move time without sleeping; nothing else calls ``time``.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds; only differences between readings mean anything."""

    def now(self) -> float: ...


class MonotonicClock:
    """The production clock: immune to wall-clock jumps, so expiry never runs backwards."""

    __slots__ = ()

    # The builtin itself, not a wrapper: the publish path reads the clock per message.
    now = staticmethod(time.monotonic)


class ManualClock:
    """A clock that moves only when a test says so."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 1_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never runs backwards")
        self._now += seconds
