"""The one interface through which the core makes state durable, and its in-memory implementation.

The core calls these methods in publish and acknowledge order and then asks :meth:`Store.commit`
for a barrier; an acknowledgement to a client waits for that barrier. A disk store (SQLite,
group commit) implements the same protocol, so the core never changes when it slots in.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Protocol

from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage


@dataclass(slots=True, frozen=True)
class SubscriptionRecord:
    """A subscription as stored: the full filter (with any $share prefix) and its options."""

    topic_filter: str
    max_qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


@dataclass(slots=True)
class SessionRecord:
    """A persistent session: what must come back after a restart."""

    client_id: str
    expiry_interval: int
    subscriptions: list[SubscriptionRecord] = field(default_factory=list)
    will: Message | None = None
    will_delay: int = 0
    will_expiry: int | None = None
    # The in-flight window of the connection attached when this was saved; 0 = none attached.
    # After a crash, that many queued entries may have been sent with their lazy in-flight
    # marks lost: recovery counts them as possibly delivered.
    window: int = 0


@dataclass(slots=True)
class QueuedRecord:
    """A stored reference from a session's queue to a journalled message."""

    client_id: str
    message_id: int
    qos: int
    retain: bool
    subscription_ids: tuple[int, ...]
    delivery_count: int = 0
    # 0 while queued; the delivery (packet) id once in flight.
    delivery_id: int = 0
    # "queued", "sent" (awaiting PUBACK/PUBREC) or "received" (PUBREC seen, awaiting PUBCOMP).
    state: str = "queued"


@dataclass(slots=True)
class RecoveredState:
    """Everything a restart hands back to the core."""

    messages: dict[int, Message] = field(default_factory=dict)
    sessions: dict[str, SessionRecord] = field(default_factory=dict)
    queued: list[QueuedRecord] = field(default_factory=list)
    retained: dict[str, Message] = field(default_factory=dict)
    incoming_qos2: dict[str, set[int]] = field(default_factory=dict)


class Store(Protocol):
    """Durable state changes, in the order the core makes them."""

    def journal(self, message: Message) -> None:
        """Record a persistent publication; assigns ``message.message_id``.

        Called for every persistent publication, referenced or not: a store with a journal
        retention keeps it (and makes the publisher's acknowledgement wait for it), one without
        keeps it only once a queue references it.
        """

    def enqueue(self, client_id: str, entry: QueuedMessage) -> None:
        """Reference a journalled message from a persistent session's queue."""

    def mark_delivery(
        self, client_id: str, message_id: int, delivery_id: int, state: str, lazy: bool = False
    ) -> None:
        """Record that a queued message is in flight (or PUBREC'd) under ``delivery_id``.

        ``lazy``: the mark may be written late, after later commits, and not at all when the
        entry is released first. For at-least-once deliveries only: a crash before the mark is
        written sends the message again as a first delivery, which at-least-once allows. An
        exactly-once delivery must keep its id, so its marks are never lazy.
        """

    def release(self, client_id: str, message_id: int) -> None:
        """The session is done with this message (acknowledged, expired or discarded)."""

    def save_session(self, record: SessionRecord) -> None: ...

    def delete_session(self, client_id: str) -> None:
        """Forget the session with its queue references and QoS 2 state."""

    def set_retained(self, topic: str, message: Message | None) -> None:
        """Store (or, with None, clear) the persistent retained message of a topic."""

    def add_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        """A QoS 2 publication was accepted; a resend with this id must not be routed again."""

    def remove_incoming_qos2(self, client_id: str, packet_id: int) -> None: ...

    def commit(self) -> Awaitable[None] | None:
        """A barrier: None when everything so far is already durable, else an awaitable."""

    def recover(self) -> RecoveredState: ...

    def close(self) -> None: ...


class MemoryStore:
    """Keeps the durable state in dictionaries: it survives a broker object, not a process.

    It is the default until the disk store lands, and the reference the disk store is tested
    against. ``commit`` is always immediate.
    """

    def __init__(self) -> None:
        self._next_id = 0
        self.messages: dict[int, Message] = {}
        self._refcounts: dict[int, int] = {}
        self.sessions: dict[str, SessionRecord] = {}
        self.queued: dict[tuple[str, int], QueuedRecord] = {}
        self.retained: dict[str, Message] = {}
        self.incoming_qos2: dict[str, set[int]] = {}

    def journal(self, message: Message) -> None:
        # No retention here: a message is kept only while a queue references it.
        if message.message_id == 0:
            self._next_id += 1
            message.message_id = self._next_id

    def enqueue(self, client_id: str, entry: QueuedMessage) -> None:
        message_id = entry.message.message_id
        self.messages[message_id] = entry.message
        key = (client_id, message_id)
        if key not in self.queued:
            self._refcounts[message_id] = self._refcounts.get(message_id, 0) + 1
        self.queued[key] = QueuedRecord(
            client_id,
            message_id,
            entry.qos,
            entry.retain,
            entry.subscription_ids,
            entry.delivery_count,
        )

    def mark_delivery(
        self, client_id: str, message_id: int, delivery_id: int, state: str, lazy: bool = False
    ) -> None:
        record = self.queued.get((client_id, message_id))
        if record is not None:
            record.delivery_id = delivery_id
            record.state = state
            if state == "sent":
                record.delivery_count += 1

    def release(self, client_id: str, message_id: int) -> None:
        if self.queued.pop((client_id, message_id), None) is not None:
            self._unreference(message_id)

    def save_session(self, record: SessionRecord) -> None:
        self.sessions[record.client_id] = record

    def delete_session(self, client_id: str) -> None:
        self.sessions.pop(client_id, None)
        self.incoming_qos2.pop(client_id, None)
        for key in [k for k in self.queued if k[0] == client_id]:
            del self.queued[key]
            self._unreference(key[1])

    def set_retained(self, topic: str, message: Message | None) -> None:
        if message is None:
            self.retained.pop(topic, None)
        else:
            self.retained[topic] = message

    def add_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        self.incoming_qos2.setdefault(client_id, set()).add(packet_id)

    def remove_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        ids = self.incoming_qos2.get(client_id)
        if ids is not None:
            ids.discard(packet_id)

    def commit(self) -> Awaitable[None] | None:
        return None

    def recover(self) -> RecoveredState:
        return RecoveredState(
            messages=dict(self.messages),
            sessions=dict(self.sessions),
            queued=sorted(self.queued.values(), key=lambda r: r.message_id),
            retained=dict(self.retained),
            incoming_qos2={k: set(v) for k, v in self.incoming_qos2.items()},
        )

    def close(self) -> None:
        pass

    def _unreference(self, message_id: int) -> None:
        count = self._refcounts.get(message_id, 0) - 1
        if count <= 0:
            self._refcounts.pop(message_id, None)
            self.messages.pop(message_id, None)
        else:
            self._refcounts[message_id] = count
