"""Periodic work on the core's loop (expiry sweeps, timers): one failing run is logged and
never stops the later ones. Owns no state of its own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def run_every(
    loop: asyncio.AbstractEventLoop, interval: float, action: Callable[[], object], what: str
) -> Callable[[], None]:
    """Call ``action`` every ``interval`` seconds on ``loop``; returns a canceller.

    An exception is logged with ``what`` and the next run still comes: a bug in one timer
    must not silently stop every later expiry.
    """
    handle: asyncio.TimerHandle | None = None

    def run() -> None:
        nonlocal handle
        try:
            action()
        except Exception:
            log.exception("%s failed", what)
        handle = loop.call_later(interval, run)

    handle = loop.call_later(interval, run)

    def cancel() -> None:
        if handle is not None:
            handle.cancel()

    return cancel
