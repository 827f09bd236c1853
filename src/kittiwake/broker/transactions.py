"""Transactions: the sends and settlements of one session, staged, then applied together in one
loop turn (so one store commit) across destinations, or dropped. Knows no protocol; the owner
commits the store and dispatches the queues a commit touched."""

from __future__ import annotations

from collections.abc import Callable

from kittiwake.broker.consumers import Delivery, Settlement
from kittiwake.broker.destinations import Destination
from kittiwake.broker.message import Message
from kittiwake.broker.queues import Queue, QueuedMessage
from kittiwake.broker.routing import Router


class TransactionRolledBack(Exception):
    """A commit could not apply everything, so it applied nothing and rolled back."""


class Transaction:
    """Staged work of one session. Deliveries staged for settlement stay unsettled (their
    consumer's credit stays spent) until the commit or the rollback."""

    __slots__ = ("_on_enqueued", "router", "sends", "settlements")

    def __init__(
        self,
        router: Router,
        on_enqueued: Callable[[Queue, QueuedMessage], object] | None = None,
    ) -> None:
        self.router = router
        # Told of each entry a commit enqueues (the owner writes it to the store).
        self._on_enqueued = on_enqueued
        self.sends: list[tuple[Destination, Message]] = []
        self.settlements: list[tuple[Delivery, Settlement]] = []

    def send(self, destination: Destination, message: Message) -> None:
        self.sends.append((destination, message))

    def settle(self, delivery: Delivery, outcome: Settlement = Settlement.ACCEPTED) -> None:
        self.settlements.append((delivery, outcome))

    def commit(self) -> list[Queue]:
        """Apply every staged settlement and send, or none; returns the queues to dispatch.

        Raises :class:`TransactionRolledBack` (after rolling back) when a staged delivery was
        taken back meanwhile (its consumer went away) or a destination has no room.
        """
        for delivery, _ in self.settlements:
            if delivery.consumer.unsettled.get(delivery.id) is not delivery:
                self.rollback()
                raise TransactionRolledBack(
                    f"delivery {delivery.id} was settled outside the transaction"
                )
        copies: list[tuple[Queue, QueuedMessage]] = []
        for destination, message in self.sends:
            copies.extend(self.router.route(destination, message))
        needed: dict[Queue, list[int]] = {}
        for queue, entry in copies:
            count_and_size = needed.setdefault(queue, [0, 0])
            count_and_size[0] += 1
            count_and_size[1] += entry.size
        for queue, (count, size) in needed.items():
            if not queue.has_room(count, size):
                self.rollback()
                raise TransactionRolledBack(f"queue {queue.name} has no room for {count} more")
        touched: dict[Queue, None] = {}
        for delivery, outcome in self.settlements:
            owner = delivery.consumer.queue
            if owner is not None and owner.settle(delivery, outcome):
                touched[owner] = None
        for queue, entry in copies:
            queue.push(entry)
            touched[queue] = None
            if self._on_enqueued is not None:
                self._on_enqueued(queue, entry)
        self.sends.clear()
        self.settlements.clear()
        return list(touched)

    def rollback(self) -> list[Queue]:
        """Drop the staged sends; the staged settlements' entries go back to their queues as
        possibly delivered (delivery count + 1). Returns the queues to dispatch."""
        touched: dict[Queue, None] = {}
        for delivery, _ in self.settlements:
            queue = delivery.consumer.queue
            if queue is not None and queue.settle(delivery, Settlement.MODIFIED):
                touched[queue] = None
        self.sends.clear()
        self.settlements.clear()
        return list(touched)
