"""Wills and session expiry: the timers of sessions without a connection, and publishing a will
when it is due. Knows no protocol; never sleeps (the broker's tick asks what is due).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kittiwake.broker.sessions import Session

if TYPE_CHECKING:
    from kittiwake.broker.broker import Broker

log = logging.getLogger(__name__)


def next_timer(session: Session) -> float | None:
    """The earlier of a detached session's will and expiry times, or None."""
    times = [t for t in (session.will_at, session.expires_at) if t is not None]
    return min(times) if times else None


class SessionTimers:
    """Sessions without a connection, and when their wills and expiries are due.

    A heap of (due, sequence, session), so a tick touches only what is due, not every offline
    session. Entries go stale when a session reattaches or ends, or is re-armed under a later
    time; :meth:`due` skips those.
    """

    __slots__ = ("_heap", "_sequence", "detached")

    def __init__(self) -> None:
        # Sessions without a connection, the only ones whose timers can fire.
        self.detached: set[Session] = set()
        self._heap: list[tuple[float, int, Session]] = []
        self._sequence = itertools.count()

    def detach(self, session: Session) -> None:
        """The session has no connection now; its will and expiry timers start to count."""
        self.detached.add(session)
        self.rearm(session)

    def attach(self, session: Session) -> None:
        """The session has a connection again (or ended): its timers stop."""
        self.detached.discard(session)

    def rearm(self, session: Session) -> None:
        """Schedule the session's next timer, if it has one."""
        due = next_timer(session)
        if due is not None:
            heapq.heappush(self._heap, (due, next(self._sequence), session))

    def due(self, now: float) -> Iterator[Session]:
        """The detached sessions with a timer due at ``now``, each once; the caller fires them
        and calls :meth:`rearm` for those that live on."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, _, session = heapq.heappop(heap)
            if session in self.detached and next_timer(session) == at:
                yield session


def publish_will(broker: Broker, session: Session) -> None:
    """Publish the session's will now (if it still has one and may), then forget it."""
    will = session.will
    session.will = None
    session.will_at = None
    if will is None:
        return
    permissions = session.permissions or broker.authorizer
    if not permissions.may_publish(will.topic):
        log.info("client %s: will to %s not authorised", session.client_id, will.topic)
        return
    log.debug("client %s: publishing will to %s", session.client_id, will.topic)
    will.created = broker.clock.now()
    if session.will_expiry is not None:
        will.expiry = will.created + session.will_expiry
    broker.publish(will)
