"""A store whose commits the test completes, and a consumer that records deliveries: for unit
tests of what waits for a commit (persist -> acknowledge -> dispatch, store-and-dispatch,
a publisher's acknowledgement), where the test must choose the order of "commit done" and
"copy accepted" rather than leave it to a writer thread."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kittiwake.broker.consumers import Delivery
from kittiwake.broker.queues import QueuedMessage
from kittiwake.broker.store import MemoryStore


class HeldCommitStore(MemoryStore):
    """Every commit() until resolve()/fail() returns the same unresolved future."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: asyncio.Future[None] | None = None

    def commit(self) -> asyncio.Future[None]:  # type: ignore[override]
        if self.pending is None:
            self.pending = asyncio.get_running_loop().create_future()
        return self.pending

    def resolve(self) -> None:
        """The pending commit is durable; the next commit() starts a new one."""
        assert self.pending is not None
        self.pending.set_result(None)
        self.pending = None

    def fail(self) -> None:
        """The pending commit failed (the disk is full); the next commit() starts a new one."""
        assert self.pending is not None
        self.pending.set_exception(OSError("disk full"))
        self.pending = None


class RecordingConsumer:
    """Remembers the deliveries the broker sent, for the test to acknowledge."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []

    def tag(self, delivery: Delivery) -> int:
        return delivery.id

    def deliver(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        pass

    def taken_over(self) -> None:
        pass


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 10))
