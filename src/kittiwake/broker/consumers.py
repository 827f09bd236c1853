"""Consumers and deliveries: who takes entries from a queue, how many at a time, and how each
attempt ends. Knows no protocol: a front end puts a Delivery on its wire under its own id.

A :class:`Consumer` is attached to one :class:`~kittiwake.broker.queues.Queue`; the queue hands
it entries while it has credit. Each hand-over is a :class:`Delivery`, which stays unsettled
until the front end reports its :class:`Settlement` through the queue.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from kittiwake.broker.queues import Queue, QueuedMessage


class Settlement(Enum):
    """How a delivery attempt ended (the AMQP 1.0 outcomes, which JMS and MQTT map onto)."""

    # Processed: the entry leaves the queue for good.
    ACCEPTED = "accepted"
    # Not processed and never seen by the application: back to the queue, count unchanged.
    RELEASED = "released"
    # Possibly seen (a failed or abandoned attempt): back to the queue, delivery count + 1.
    MODIFIED = "modified"
    # The consumer refuses it as unprocessable: it leaves the queue (to the dead-letter queue).
    REJECTED = "rejected"


class DeliveryState(Enum):
    """Where an unsettled delivery stands on its way to the consumer."""

    # Handed to the front end, no word back yet.
    SENT = "sent"
    # The consumer holds it (AMQP's "received" state; an MQTT QoS 2 PUBREC): taking it back
    # would duplicate it, only its settlement is missing.
    RECEIVED = "received"


# Read per delivery; an Enum class attribute lookup costs several plain ones, so bind it once.
_SENT = DeliveryState.SENT


class Receiver(Protocol):
    """The front end behind a consumer: it puts deliveries on its wire."""

    def deliver(self, delivery: Delivery) -> None:
        """Send one attempt; the front end settles it later through the queue."""

    def deliver_settled(self, entry: QueuedMessage) -> None:
        """Send an entry that needs no settlement (at most once: MQTT QoS 0, AMQP settled)."""

    # Optional: ``deliver_all(deliveries: list[Delivery]) -> None``, :meth:`deliver` for each,
    # in order, at once (one write for a dispatch run). Only a receiver whose ``deliver``
    # never acts on the queue while it runs (settles, detaches) may have it: the queue then
    # starts a whole run of deliveries before handing any over (Queue.dispatch).


class Delivery:
    """One attempt to give one entry to one consumer."""

    __slots__ = ("consumer", "entry", "id", "state", "tag", "view")

    def __init__(self, delivery_id: int, entry: QueuedMessage, consumer: Consumer) -> None:
        # The core's id, unique within its queue; front ends map it to their wire ids.
        self.id = delivery_id
        # The queue's entry: settlement acts on it.
        self.entry = entry
        # What the consumer is sent: the entry itself, or a copy made for this consumer (a
        # shared subscription member's own level and subscription ids).
        self.view = entry
        self.consumer = consumer
        self.state = _SENT
        # The front end's own id for this attempt (an MQTT packet identifier), 0 until it picks
        # one; it stays with the delivery so a resend can reuse it.
        self.tag = 0

    @property
    def delivery_count(self) -> int:
        """Earlier attempts that may have reached a consumer (JMSXDeliveryCount - 1)."""
        return self.entry.delivery_count

    @property
    def redelivered(self) -> bool:
        """This entry may have been seen before (MQTT DUP, JMSRedelivered)."""
        return self.entry.delivery_count > 0

    def __repr__(self) -> str:
        return f"<Delivery {self.id} {self.state.value} count={self.entry.delivery_count}>"


class Credit:
    """How many more deliveries a receiver may take now.

    Two kinds, as the protocols have them: a *window* (MQTT Receive Maximum, JMS prefetch) is
    the most unsettled deliveries at once, so each settlement gives one back; a *link credit*
    (AMQP flow) is spent by deliveries and topped up only by the front end. Consumers of one
    connection on several queues share one Credit (an MQTT session's own queue and its shared
    subscriptions' queues count against one Receive Maximum).
    """

    __slots__ = ("available", "window")

    def __init__(self, *, window: int | None = None, available: int = 0) -> None:
        # Set when a window governs the credit; None for link credit.
        self.window = window
        self.available = window if window is not None else available

    def set_window(self, window: int) -> None:
        """A new window (a reconnect with another Receive Maximum); what is unsettled counts."""
        in_use = self.window - self.available if self.window is not None else 0
        self.window = window
        self.available = window - in_use

    def add(self, amount: int) -> None:
        """Link credit from the front end (AMQP flow)."""
        self.available += amount

    def __repr__(self) -> str:
        return f"<Credit {self.available} of {self.window}>"


# Every consumer's unsettled deliveries until its first (see Consumer.own_unsettled).
NO_DELIVERIES: Final[dict[int, Delivery]] = {}


class Consumer:
    """A taker of entries from one queue, bounded by its credit."""

    __slots__ = ("credit", "name", "queue", "receiver", "selects", "unsettled")

    def __init__(
        self,
        receiver: Receiver | None,
        *,
        window: int | None = None,
        credit: int = 0,
        share: Credit | None = None,
        name: str = "",
        selects: Callable[[QueuedMessage], bool] | None = None,
    ) -> None:
        self.name = name
        # The consumer's selector (a JMS queue consumer's): entries it refuses stay in the
        # queue for others. None (nearly always) = it takes anything, at no cost per entry.
        self.selects = selects
        # None while the consumer cannot take anything (an MQTT session without a connection).
        self.receiver = receiver
        # Its own credit (a window, or link credit), or the one it shares.
        self.credit = share if share is not None else Credit(window=window, available=credit)
        self.queue: Queue | None = None
        # Deliveries awaiting settlement, by delivery id, in the order they were made. The
        # shared empty dict (only ever read) until the first delivery: the queue adds through
        # own_unsettled, so a consumer that never takes anything (an idle session's) holds none.
        self.unsettled: dict[int, Delivery] = NO_DELIVERIES

    def own_unsettled(self) -> dict[int, Delivery]:
        """The unsettled deliveries, to add one to (made on first use)."""
        unsettled = self.unsettled
        if unsettled is NO_DELIVERIES:
            self.unsettled = unsettled = {}
        return unsettled

    @property
    def window(self) -> int | None:
        return self.credit.window

    @property
    def ready(self) -> bool:
        """Can the queue hand this consumer an entry now?"""
        return self.credit.available > 0 and self.receiver is not None

    def set_window(self, window: int) -> None:
        self.credit.set_window(window)

    def add_credit(self, amount: int) -> None:
        self.credit.add(amount)

    def __repr__(self) -> str:
        return f"<Consumer {self.name!r} {self.credit!r} unsettled={len(self.unsettled)}>"
