"""Producer flow control: a QoS 1/2 publisher's acknowledgement waits while a connected receiver
it feeds has too much queued, until that queue is half drained, so a fast publisher cannot bury
a slow subscriber. Hands out futures; never blocks, never drops anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from kittiwake.broker.completion import all_of
from kittiwake.broker.sessions import Session


class FlowControl:
    """The congestion rule and the futures publishers wait on."""

    __slots__ = ("_both", "depth", "loop")

    def __init__(self, depth: int) -> None:
        # Queued messages at which a connected receiver counts as congested; 0 disables.
        self.depth = depth
        # Set once the broker runs on a loop; without one nothing can wait.
        self.loop: asyncio.AbstractEventLoop | None = None
        # A commit and a drain both waited for: one shared future per pair, not one per message.
        self._both: dict[tuple[asyncio.Future[None], asyncio.Future[None]], asyncio.Future[None]]
        self._both = {}

    def congested(self, receivers: Iterable[object]) -> asyncio.Future[None] | None:
        """A future that resolves once the first congested session among ``receivers`` has
        drained, or None.

        Only connected sessions count: an offline session's queue does not drain, and a
        publisher must never wait on a subscriber that is not there. (Shared groups do not:
        their messages wait for whichever member has room.)
        """
        depth = self.depth
        if not depth or self.loop is None:
            return None
        for receiver in receivers:
            if not isinstance(receiver, Session):
                continue
            if receiver.link is not None and receiver.queue.count >= depth:
                # One future per congested session, shared by every publisher waiting on it.
                waiter = receiver.drain_waiter
                if waiter is None:
                    waiter = receiver.drain_waiter = self.loop.create_future()
                return waiter
        return None

    def pumped(self, session: Session) -> None:
        """After a pump: publishers waiting on this session go once its queue is half empty."""
        if session.drain_waiter is not None and session.queue.count <= self.depth // 2:
            self.release(session)

    @staticmethod
    def release(session: Session) -> None:
        """Let every publisher waiting on this session go (it drained, or disconnected)."""
        waiter = session.drain_waiter
        session.drain_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

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
