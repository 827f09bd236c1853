"""Producer flow control: a QoS 1/2 publisher's acknowledgement waits while a connected receiver
it feeds has too much queued (messages or bytes) and keeps making progress, or while every queue
together holds more than the broker-wide bound. Hands out futures; never blocks, never drops.

Held acknowledgements go back as the receiver drains, a batch at a time, oldest first (see
:meth:`FlowControl.pumped`): released all at once at half the depth, every publisher would stop
until then and refill together, so the queue would swing between half the depth and the depth
plus every publisher's window, and the loop would idle between the receiver's acknowledgements
while publishers that could have kept it busy wait.

A receiver that makes no progress for ``stalled_subscriber_timeout`` stops holding anyone back:
one stuck subscriber (or a dead TCP connection not yet detected) must not halt every publisher
feeding it. Its own queue then fills to its limits and its policy applies, counted and logged.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kittiwake.broker.completion import all_of
from kittiwake.broker.sessions import Session

if TYPE_CHECKING:
    from kittiwake.broker.broker import BrokerStats
    from kittiwake.broker.queues import Queue, QueuedMessage
    from kittiwake.config import LimitsConfig

log = logging.getLogger(__name__)

# A watch's start time before the first periodic check has seen it.
_UNSTAMPED = -1.0
# Publications held on one future at most: the step in which held acknowledgements go back as
# a congested receiver drains (a future per this many, not one per publication). The oldest
# future goes once the queue has room for this many below the depth (for half the depth, if
# that is less: a small depth keeps the plain rule, everyone at half).
RELEASE_BATCH = 100


@dataclass(slots=True)
class _Waiter:
    """One future publishers wait on, and how many publications it holds."""

    future: asyncio.Future[None]
    held: int = 0


@dataclass(slots=True)
class _Progress:
    """What a congested receiver had done when last looked at, and since when."""

    # The queue's deliveries started so far: a new one means an acknowledgement freed room.
    started: int
    since: float
    # Entries its queue had rejected or discarded when it stalled, and when last reported.
    dropped_at_stall: int = 0
    dropped_reported: int = 0


class FlowControl:
    """The congestion rule, the stall rule, and the futures publishers wait on."""

    __slots__ = (
        "_both",
        "_stalled",
        "_total_waiter",
        "_waiters",
        "_watched",
        "batch",
        "depth",
        "depth_bytes",
        "loop",
        "max_total_bytes",
        "stall_timeout",
        "stats",
        "total_bytes",
    )

    def __init__(self, limits: LimitsConfig, stats: BrokerStats) -> None:
        # Queued messages, or bytes, at which a connected receiver counts as congested; 0
        # disables that count (a bound no queue reaches).
        self.depth = limits.flow_control_depth or sys.maxsize
        # The room below the depth that releases the oldest future (RELEASE_BATCH).
        self.batch = max(1, min(self.depth // 2, RELEASE_BATCH))
        # Capped at half a queue's byte limit: backpressure engages before the limit does.
        self.depth_bytes = min(
            limits.flow_control_bytes or sys.maxsize, limits.max_queued_bytes // 2
        )
        self.stall_timeout = limits.stalled_subscriber_timeout
        self.max_total_bytes = limits.max_total_queued_bytes
        self.stats = stats
        # Set once the broker runs on a loop; without one nothing can wait.
        self.loop: asyncio.AbstractEventLoop | None = None
        # A commit and a drain both waited for: one shared future per pair, not one per message.
        self._both: dict[tuple[asyncio.Future[None], asyncio.Future[None]], asyncio.Future[None]]
        self._both = {}
        # The futures publishers wait on, per congested session, oldest first; the newest is
        # also the session's ``drain_waiter`` (None when nobody waits on it).
        self._waiters: dict[Session, deque[_Waiter]] = {}
        # Congested receivers the periodic check looks at, and those found stalled.
        self._watched: dict[Session, _Progress] = {}
        self._stalled: set[Session] = set()
        # Bytes queued everywhere at the last check, and the future every publisher waits on
        # while that is above the broker-wide bound.
        self.total_bytes = 0
        self._total_waiter: asyncio.Future[None] | None = None

    def congested(self, receivers: Iterable[object]) -> asyncio.Future[None] | None:
        """A future that resolves once the broker is under its bound and the first congested,
        progressing session among ``receivers`` has drained enough (see :meth:`pumped`), or
        None.

        Only connected sessions count: an offline session's queue does not drain, and a
        publisher must never wait on a subscriber that is not there. (Shared groups do not:
        their messages wait for whichever member has room.)
        """
        if self.loop is None:
            return None
        if self._total_waiter is not None:
            return self._total_waiter
        depth = self.depth
        depth_bytes = self.depth_bytes
        for receiver in receivers:
            if not isinstance(receiver, Session):
                continue
            queue = receiver.made_queue  # (a receiver was given a copy: it has its queue)
            if queue is None:
                continue
            if (
                (queue.count >= depth or queue.bytes >= depth_bytes)
                and receiver.link is not None
                and receiver not in self._stalled
            ):
                return self._hold(receiver, queue, self.loop)
        return None

    def congested_run(
        self, queued: list[tuple[Session, list[QueuedMessage], int]], count: int
    ) -> list[asyncio.Future[None] | None] | None:
        """:meth:`congested` for each of a run of ``count`` publications
        (publishing.publish_run) once every copy is queued: ``queued`` holds, in route order,
        each session that queued copies, its copies (one per publication, in order) and the
        index of the first one queued (those before went in flight at once). What
        :meth:`congested` would have returned for each publication, in order; None when
        that is None for all (the usual case). During a run queues only grow, so a session
        holds the publications from the first whose copy left its queue at the depth on."""
        loop = self.loop
        if loop is None or not queued:
            return None
        if self._total_waiter is not None:
            first = min(start for _, _, start in queued)
            return [None] * first + [self._total_waiter] * (count - first)
        holding: list[tuple[int, Session, Queue]] = []
        depth = self.depth
        depth_bytes = self.depth_bytes
        for session, entries, start in queued:
            queue = session.made_queue
            if queue is None or session.link is None or session in self._stalled:
                continue
            # Walked back from the run's end, where the queue is now, to the first copy
            # that left it at the depth.
            waiting = queue.count
            size = queue.bytes
            index = count
            while index > start and (waiting >= depth or size >= depth_bytes):
                index -= 1
                message = entries[index].message
                waiting -= 1
                size -= len(message.payload) + len(message.topic)
            if index < count:
                holding.append((index, session, queue))
        if not holding:
            return None
        drained: list[asyncio.Future[None] | None] = []
        for publication in range(count):
            future = None
            for first, session, queue in holding:
                if first <= publication:
                    future = self._hold(session, queue, loop)
                    break
            drained.append(future)
        return drained

    def _hold(
        self, session: Session, queue: Queue, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[None]:
        """A publication is held on this congested, progressing session: the future of its
        batch of held publications (see RELEASE_BATCH)."""
        if session not in self._watched:
            # The next check stamps the time: no clock read on the publish path.
            self._watched[session] = _Progress(queue.deliveries_started, _UNSTAMPED)
        # One future per batch of publications held on a congested session, shared by every
        # publisher among them.
        waiters = self._waiters.get(session)
        if waiters is None:
            waiters = self._waiters[session] = deque()
        if not waiters or waiters[-1].held >= RELEASE_BATCH:
            waiters.append(_Waiter(loop.create_future()))
            session.drain_waiter = waiters[-1].future
        newest = waiters[-1]
        newest.held += 1
        return newest.future

    def pumped(self, session: Session) -> None:
        """After a pump: the publications held longest go, a batch at a time, while the queue
        has room for a batch below the depth; everyone goes once it is half empty. (Bytes:
        everyone, once they are half the byte depth.)"""
        if session.drain_waiter is None:
            return
        queue = session.queue
        if queue.bytes > self.depth_bytes // 2:
            return
        count = queue.count
        if count <= self.depth // 2:
            self.release(session)
            return
        room = self.depth - count
        batch = self.batch
        waiters = self._waiters.get(session)
        if waiters is None:
            session.drain_waiter = None
            return
        while waiters and room >= batch:
            waiter = waiters.popleft()
            room -= waiter.held
            if not waiter.future.done():
                waiter.future.set_result(None)
        if not waiters:
            del self._waiters[session]
            session.drain_waiter = None

    def release(self, session: Session) -> None:
        """Let every publisher waiting on this session go (it drained, stalled or left)."""
        session.drain_waiter = None
        waiters = self._waiters.pop(session, None)
        if waiters is None:
            return
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_result(None)

    def is_stalled(self, session: Session) -> bool:
        return session in self._stalled

    def check(self, now: float, total_bytes: int) -> None:
        """The periodic look (the broker's tick): stalls, recoveries, the broker-wide bound."""
        for session, progress in list(self._watched.items()):
            self._check_progress(session, progress, now)
        self._check_total(total_bytes)

    def _check_progress(self, session: Session, progress: _Progress, now: float) -> None:
        queue = session.queue
        stalled = session in self._stalled
        if session.link is None:
            # Gone: an absent subscriber holds nobody (release() ran when it left).
            self._forget(session, progress, "disconnected")
            return
        if progress.since == _UNSTAMPED:
            progress.since = now
        started = queue.deliveries_started
        if started != progress.started:
            progress.started = started
            progress.since = now
            if stalled:
                self._forget(session, progress, "is making progress again")
                return
        congested = queue.count >= self.depth or queue.bytes >= self.depth_bytes
        if not stalled:
            if not congested and session.drain_waiter is None:
                del self._watched[session]
            elif self.stall_timeout and now - progress.since >= self.stall_timeout:
                self._stall(session, progress, now)
            return
        dropped = _dropped(session)
        if dropped != progress.dropped_reported:
            progress.dropped_reported = dropped
            log.warning(
                "subscriber %s (stalled): %d messages dropped since it stalled; its queue "
                "holds %d messages, %d bytes",
                session.client_id,
                dropped - progress.dropped_at_stall,
                queue.count,
                queue.bytes,
            )

    def _stall(self, session: Session, progress: _Progress, now: float) -> None:
        queue = session.queue
        self._stalled.add(session)
        progress.dropped_at_stall = progress.dropped_reported = _dropped(session)
        self.stats.subscriber_stalls += 1
        self.stats.stalled_subscribers = len(self._stalled)
        log.warning(
            "subscriber %s made no progress for %.1f s with %d messages (%d bytes) queued: "
            "it no longer holds publishers back; its queue fills to its limit (%s applies)",
            session.client_id,
            now - progress.since,
            queue.count,
            queue.bytes,
            queue.policy,
        )
        self.release(session)

    def _forget(self, session: Session, progress: _Progress, why: str) -> None:
        del self._watched[session]
        if session in self._stalled:
            self._stalled.discard(session)
            self.stats.stalled_subscribers = len(self._stalled)
            log.info(
                "subscriber %s %s; %d messages were dropped while it was stalled",
                session.client_id,
                why,
                _dropped(session) - progress.dropped_at_stall,
            )

    def _check_total(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes
        bound = self.max_total_bytes
        if not bound or self.loop is None:
            return
        waiter = self._total_waiter
        if waiter is None and total_bytes >= bound:
            self._total_waiter = self.loop.create_future()
            self.stats.total_bound_engaged += 1
            log.warning(
                "%d bytes queued in all, over max_total_queued_bytes (%d): every QoS 1/2 "
                "publisher is held back until half of that is left",
                total_bytes,
                bound,
            )
        elif waiter is not None and total_bytes <= bound // 2:
            self._total_waiter = None
            if not waiter.done():
                waiter.set_result(None)
            log.info("%d bytes queued in all: publishers go again", total_bytes)

    def commit_and_drain(
        self, commit: asyncio.Future[None], drained: asyncio.Future[None]
    ) -> asyncio.Future[None]:
        """Resolves once both are done: with the drain's cancellation or error if it has one,
        else with the commit's outcome (a failed commit must reach the publisher)."""
        key = (commit, drained)
        both = self._both.get(key)
        if both is not None:
            return both
        combined = all_of(drained, commit)  # the drain's failure first, as documented
        assert combined is not None
        self._both[key] = combined
        combined.add_done_callback(lambda _: self._both.pop(key, None))
        return combined


def _dropped(session: Session) -> int:
    counters = session.queue.counters
    return counters.rejected + counters.discarded
