"""The one interface through which the core makes state durable, and its in-memory implementation.

The core calls these methods in publish and acknowledge order and then asks :meth:`Store.commit`
for a barrier; an acknowledgement to a client waits for that barrier. A disk store (SQLite,
group commit) implements the same protocol, so the core never changes when it slots in.
Queue entries are keyed by queue name (the broker names queues, see
:func:`~kittiwake.broker.sessions.session_queue_name`), session records by client id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kittiwake.broker.completion import Completion
from kittiwake.broker.durable_subscriptions import SubscriptionDefinition
from kittiwake.broker.message import Message
from kittiwake.broker.publication_rows import PublicationRows
from kittiwake.broker.queues import DEFAULT_QUEUE_RULES, QueuedMessage, QueueRules


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
    # The user its client connected as; None: anonymous (or stored before schema 7).
    principal: str | None = None
    # Its queue's order and dead-lettering (see QueueRules), as its front end asked.
    queue_rules: QueueRules = DEFAULT_QUEUE_RULES


@dataclass(slots=True)
class QueuedRecord:
    """A stored entry of a queue: a reference to a stored message and its delivery state."""

    queue: str
    message_id: int
    qos: int
    retain: bool
    subscription_ids: tuple[int, ...]
    delivery_count: int = 0
    # 0 while queued; the delivery (packet) id once in flight.
    delivery_id: int = 0
    # "queued", "sent" (awaiting PUBACK/PUBREC) or "received" (PUBREC seen, awaiting PUBCOMP).
    state: str = "queued"


# A duplicate-detection key: an MQTT packet id, a JMS duplicate id, a Spark fence.
DuplicateKey = int | str


@dataclass(slots=True)
class RecoveredState:
    """Everything a restart hands back to the core."""

    messages: dict[int, Message] = field(default_factory=dict)
    sessions: dict[str, SessionRecord] = field(default_factory=dict)
    # In message id order.
    queued: list[QueuedRecord] = field(default_factory=list)
    retained: dict[str, Message] = field(default_factory=dict)
    # The duplicate-detection keys of each producer.
    duplicates: dict[str, set[DuplicateKey]] = field(default_factory=dict)
    # Queue destinations' in-flight windows (what their consumers could hold), by queue.
    queue_windows: dict[str, int] = field(default_factory=dict)
    # JMS durable subscriptions' definitions (topic, selector, noLocal), by session client id.
    durable_definitions: dict[str, SubscriptionDefinition] = field(default_factory=dict)


class Store(Protocol):
    """Durable state changes, in the order the core makes them.

    Every change made in one loop turn is committed in one transaction (or none of it is), so
    a duplicate-detection key and the state it guards are stored together.
    """

    # True when the journal keeps some QoS 0 publications (the operator opted topics in for
    # the data pipeline): only then does the core hand QoS 0 publications to journal().
    keeps_qos0: bool

    def journal(self, message: Message) -> None:
        """Record a publication; assigns ``message.message_id`` when it keeps it.

        Ids only grow and are never reused: they are the journal's sequence numbers, and reach
        it in the order they were handed out. Called for every persistent publication,
        referenced or not: a store with a journal retention keeps it (and makes the
        publisher's acknowledgement wait for it), one without keeps it only while a queue
        references it. Called for a non-persistent publication (QoS 0, JMS NON_PERSISTENT)
        only where :meth:`journals_qos0` says so; nothing waits for that write.
        """

    def journal_rows(self, rows: PublicationRows, created: float) -> Sequence[int]:
        """Record every row as :meth:`journal` records a message, in row order (the same ids,
        the same journal rows), without a message object per row; returns each row's id (0:
        none). ``created`` is the rows' acceptance time on the broker's clock. The core hands
        a non-persistent row to no other check: the store decides it as :meth:`journal`
        would for a message the core handed it."""

    def journals_qos0(self, topic: str) -> bool:
        """Whether the journal keeps non-persistent publications (QoS 0, JMS NON_PERSISTENT)
        on ``topic`` (then they must not bypass :meth:`journal`)."""

    def keeps_in_journal(self, message: Message) -> bool:
        """Whether this journalled message's row is written whatever its queues do (the
        journal's retention keeps it): then its publisher waits for the commit, never only
        for its copies' acceptance (DESIGN.md section 3)."""

    def enqueue(self, queue: str, entry: QueuedMessage) -> None:
        """Add a journalled message to a queue."""

    def mark_delivery(
        self, queue: str, message_id: int, delivery_id: int, state: str, lazy: bool = False
    ) -> None:
        """Record that a queued message is in flight (or PUBREC'd) under ``delivery_id``.

        ``lazy``: the mark may be written late, after later commits, and not at all when the
        entry is removed first. For at-least-once deliveries only: a crash before the mark is
        written sends the message again as a first delivery, which at-least-once allows. An
        exactly-once delivery must keep its id, so its marks are never lazy.
        """

    def count_possible_delivery(self, queue: str, message_id: int) -> None:
        """Recovery counted a queued message as possibly delivered (a crash may have lost its
        in-flight mark): add that attempt to its stored count, so a second crash before the
        next mark still counts it."""

    def remove(self, queue: str, message_id: int) -> None:
        """The queue is done with this message (acknowledged, expired or discarded)."""

    def delete_queue(self, queue: str) -> None:
        """Forget a queue with every entry it holds."""

    def save_session(self, record: SessionRecord) -> None:
        """Store (or replace) a session with its subscriptions and will."""

    def save_queue_window(self, queue: str, window: int) -> None:
        """How many entries of a queue destination its consumers may hold at once (0 when
        it has none), so recovery after a crash can count what may have been in flight."""

    def save_durable_definition(self, client_id: str, definition: SubscriptionDefinition) -> None:
        """Store (or replace) what the JMS durable subscription whose session is ``client_id``
        was made as (its topic, selector and noLocal): after a restart, a consumer asking for
        it with another one replaces it (JMS). Forgotten with the session (delete_session)."""

    def delete_session(self, client_id: str) -> None:
        """Forget the session record, its subscriptions, its will and its durable
        subscription's definition (not its queue)."""

    def set_retained(self, topic: str, message: Message | None) -> None:
        """Store (or, with None, clear) the persistent retained message of a topic."""

    def add_duplicate(self, producer: str, key: DuplicateKey) -> None:
        """Remember ``key`` of ``producer``: a message carrying it again must not be taken
        again. Stored in the same transaction as the changes of the same loop turn."""

    def remove_duplicate(self, producer: str, key: DuplicateKey) -> None: ...

    def delete_duplicates(self, producer: str) -> None:
        """Forget every key of ``producer``."""

    def commit(self) -> Completion:
        """A barrier: None when everything so far is already durable, else the future of the
        batch that holds it (one per batch, shared by every caller: never one per call)."""

    def commit_unhurried(self) -> Completion:
        """:meth:`commit` for a caller that can wait a little longer (a QoS 1 publisher that
        goes once its copies are accepted, an acceptance nobody waits for): the store may then
        hold the batch back briefly, so that entries accepted meanwhile are never written."""

    def recover(self) -> RecoveredState: ...

    def close(self) -> None: ...


class MemoryStore:
    """Keeps the durable state in dictionaries: it survives a broker object, not a process.

    It is the default until the disk store lands, and the reference the disk store is tested
    against. ``commit`` is always immediate.
    """

    keeps_qos0 = False

    def __init__(self) -> None:
        self._next_id = 0
        self.messages: dict[int, Message] = {}
        self._refcounts: dict[int, int] = {}
        self.sessions: dict[str, SessionRecord] = {}
        self.queued: dict[tuple[str, int], QueuedRecord] = {}
        self.retained: dict[str, Message] = {}
        self.duplicates: dict[str, set[DuplicateKey]] = {}
        self.queue_windows: dict[str, int] = {}
        self.durable_definitions: dict[str, SubscriptionDefinition] = {}

    def journal(self, message: Message) -> None:
        # No retention here: a message is kept only while a queue references it.
        if message.message_id == 0:
            self._next_id += 1
            message.message_id = self._next_id

    def journal_rows(self, rows: PublicationRows, created: float) -> Sequence[int]:
        count = len(rows)
        if rows.uniform_qos is not None and rows.uniform_qos > 0:
            first = self._next_id + 1
            self._next_id += count
            return range(first, first + count)
        ids: list[int] = []
        for level in rows.qos:
            if level > 0:
                self._next_id += 1
                ids.append(self._next_id)
            else:
                ids.append(0)
        return ids

    def journals_qos0(self, topic: str) -> bool:
        return False

    def keeps_in_journal(self, message: Message) -> bool:
        return False

    def enqueue(self, queue: str, entry: QueuedMessage) -> None:
        message_id = entry.message.message_id
        self.messages[message_id] = entry.message
        key = (queue, message_id)
        if key not in self.queued:
            self._refcounts[message_id] = self._refcounts.get(message_id, 0) + 1
        self.queued[key] = QueuedRecord(
            queue,
            message_id,
            entry.qos,
            entry.retain,
            entry.subscription_ids,
            entry.delivery_count,
        )

    def mark_delivery(
        self, queue: str, message_id: int, delivery_id: int, state: str, lazy: bool = False
    ) -> None:
        record = self.queued.get((queue, message_id))
        if record is not None:
            record.delivery_id = delivery_id
            record.state = state
            if state == "sent":
                record.delivery_count += 1

    def count_possible_delivery(self, queue: str, message_id: int) -> None:
        record = self.queued.get((queue, message_id))
        if record is not None:
            record.delivery_count += 1

    def remove(self, queue: str, message_id: int) -> None:
        if self.queued.pop((queue, message_id), None) is not None:
            self._unreference(message_id)

    def delete_queue(self, queue: str) -> None:
        for key in [k for k in self.queued if k[0] == queue]:
            del self.queued[key]
            self._unreference(key[1])

    def save_session(self, record: SessionRecord) -> None:
        self.sessions[record.client_id] = record

    def save_queue_window(self, queue: str, window: int) -> None:
        if window:
            self.queue_windows[queue] = window
        else:
            self.queue_windows.pop(queue, None)

    def save_durable_definition(self, client_id: str, definition: SubscriptionDefinition) -> None:
        self.durable_definitions[client_id] = definition

    def delete_session(self, client_id: str) -> None:
        self.sessions.pop(client_id, None)
        self.durable_definitions.pop(client_id, None)

    def set_retained(self, topic: str, message: Message | None) -> None:
        if message is None:
            self.retained.pop(topic, None)
        else:
            self.retained[topic] = message

    def add_duplicate(self, producer: str, key: DuplicateKey) -> None:
        self.duplicates.setdefault(producer, set()).add(key)

    def remove_duplicate(self, producer: str, key: DuplicateKey) -> None:
        keys = self.duplicates.get(producer)
        if keys is not None:
            keys.discard(key)

    def delete_duplicates(self, producer: str) -> None:
        self.duplicates.pop(producer, None)

    def commit(self) -> Completion:
        return None

    def commit_unhurried(self) -> Completion:
        return self.commit()

    def recover(self) -> RecoveredState:
        return RecoveredState(
            messages=dict(self.messages),
            sessions=dict(self.sessions),
            queued=sorted(self.queued.values(), key=lambda r: r.message_id),
            retained=dict(self.retained),
            duplicates={k: set(v) for k, v in self.duplicates.items() if v},
            queue_windows=dict(self.queue_windows),
            durable_definitions=dict(self.durable_definitions),
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
