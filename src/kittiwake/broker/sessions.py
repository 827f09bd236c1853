"""Session state: subscriptions, the queue of waiting messages and the deliveries in flight.

A Session is data with small invariant-keeping methods; the rules that move messages between
sessions live in :mod:`kittiwake.broker.broker`. Knows no protocol: a "delivery id" is whatever
the front end puts on the wire (an MQTT packet identifier).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from kittiwake.broker.message import Message
from kittiwake.broker.queues import Queue, QueuedMessage

# A session expiry interval meaning "never expires" (the MQTT 5 value 0xFFFFFFFF).
NEVER_EXPIRES = 0xFFFFFFFF
# Delivery ids are 16-bit and never 0, so MQTT packet identifiers can carry them unchanged.
MAX_DELIVERY_ID = 0xFFFF


class SessionConsumer(Protocol):
    """The live connection attached to a session; a protocol front end implements it."""

    def deliver(self, delivery_id: int, entry: QueuedMessage, *, resend: bool = False) -> None:
        """Send one message; delivery_id is 0 for QoS 0. ``resend`` marks a redelivery."""

    def release(self, delivery_id: int) -> None:
        """Resend the release of a QoS 2 delivery the client already received (PUBREL)."""

    def taken_over(self) -> None:
        """Another connection took this session; close without touching the session."""


@dataclass(slots=True, eq=False)
class Subscription:
    """One filter of one session, with its options."""

    session: Session
    topic_filter: str
    max_qos: int
    share_group: str | None = None
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None

    @property
    def full_filter(self) -> str:
        if self.share_group is None:
            return self.topic_filter
        return f"$share/{self.share_group}/{self.topic_filter}"


class SharedGroup:
    """The members of one shared subscription; each message goes to one member, in turn."""

    __slots__ = ("_cursor", "members", "name", "topic_filter")

    def __init__(self, name: str, topic_filter: str) -> None:
        self.name = name
        self.topic_filter = topic_filter
        # Ordered by joining time so the round robin is deterministic.
        self.members: dict[Session, Subscription] = {}
        self._cursor = 0

    def pick(self) -> Subscription | None:
        """Round robin over members that can take a message now; else any member."""
        members = list(self.members.values())
        if not members:
            return None
        count = len(members)
        for step in range(count):
            candidate = members[(self._cursor + step) % count]
            session = candidate.session
            if session.consumer is not None and len(session.inflight) < session.window:
                self._cursor = (self._cursor + step + 1) % count
                return candidate
        for step in range(count):
            candidate = members[(self._cursor + step) % count]
            if candidate.session.consumer is not None:
                self._cursor = (self._cursor + step + 1) % count
                return candidate
        chosen = members[self._cursor % count]
        self._cursor = (self._cursor + 1) % count
        return chosen


@dataclass(slots=True, eq=False)
class InflightDelivery:
    """A QoS 1/2 message sent and not yet fully acknowledged."""

    entry: QueuedMessage
    # "sent": awaiting PUBACK/PUBREC; "received": PUBREC seen, awaiting PUBCOMP.
    state: str = "sent"


@dataclass(slots=True, eq=False)
class Session:
    """One client's session, alive across connections while it has not expired."""

    client_id: str
    queue: Queue
    expiry_interval: int = 0
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    inflight: dict[int, InflightDelivery] = field(default_factory=dict)
    # QoS 2 publications received from the client and not yet released (PUBREL).
    incoming_qos2: set[int] = field(default_factory=set)
    consumer: SessionConsumer | None = None
    # Deliveries allowed in flight: the lower of the client's Receive Maximum and our limit.
    window: int = 100
    will: Message | None = None
    will_delay: int = 0
    # Seconds the will lives once published (MQTT 5 will Message Expiry Interval).
    will_expiry: int | None = None
    # Publishers' acknowledgements held back until this session's queue drains (flow control).
    drain_waiter: asyncio.Future[None] | None = None
    # Clock times while disconnected: when the session ends, when the will is due.
    expires_at: float | None = None
    will_at: float | None = None
    _next_delivery_id: int = 0

    @property
    def persistent(self) -> bool:
        """A session that outlives its connection keeps its state in the store."""
        return self.expiry_interval > 0

    def allocate_delivery_id(self) -> int:
        """The next id not in flight; the window (< 65535) guarantees one exists."""
        candidate = self._next_delivery_id
        while True:
            candidate = candidate + 1 if candidate < MAX_DELIVERY_ID else 1
            if candidate not in self.inflight:
                self._next_delivery_id = candidate
                return candidate

    def __hash__(self) -> int:
        return id(self)
