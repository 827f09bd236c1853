"""The queue: the one structure holding message references for consumers, and the rules that
hand them out (ordering, visibility, expiry, bounds, credit, settlement, redelivery).

An MQTT session, a shared subscription, a JMS queue and a JMS durable subscription are each one
:class:`Queue`. It never touches the store and never picks a dead-letter destination: whatever
leaves it for good is reported to its owner (``on_removed``), who does both.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal

from kittiwake.broker.consumers import (
    NO_DELIVERIES,
    Consumer,
    Delivery,
    DeliveryState,
    Settlement,
)
from kittiwake.broker.delivery import LEVELS as _LEVELS
from kittiwake.broker.destinations import Destination
from kittiwake.broker.message import Message

log = logging.getLogger(__name__)

Ordering = Literal["fifo", "priority"]
FullPolicy = Literal["reject_new", "discard_oldest"]


@dataclass(slots=True, eq=False)
class QueuedMessage:
    """One queue's reference to a message: the message is shared, this state is not."""

    message: Message
    qos: int
    persistent: bool
    # The RETAIN flag this subscriber sees on the wire.
    retain: bool = False
    subscription_ids: tuple[int, ...] = ()
    # Earlier attempts that may have reached a consumer: settlement as "modified" and a crash
    # during an attempt add one; "released" does not. 0 on a first delivery.
    delivery_count: int = 0
    # Arrival order inside its queue; ties in priority order fall back to it.
    sequence: int = 0
    # Consumers that settled it "modified, undeliverable here"; None (nearly always) = none.
    excluded: set[Consumer] | None = None
    # Store-and-dispatch (broker.publishing.Acceptances): the watch of the publisher waiting
    # for this stored copy's acceptance, or the marker of a copy accepted already; kept on
    # the copy so that neither side looks it up by (queue, message id).
    watch: object = None

    @property
    def size(self) -> int:
        return self.message.size

    @classmethod
    def of(
        cls,
        message: Message,
        max_qos: int,
        retain: bool = False,
        subscription_ids: tuple[int, ...] = (),
    ) -> QueuedMessage:
        """The one way to make a queue's copy of a message: the delivery rule (the lower level
        wins, DESIGN.md section 2) decides its level and whether it is stored. (The publish
        path's route() looks the same table up once per message, for every copy.)"""
        qos, persistent = _LEVELS[message.qos][message.persistent][max_qos]
        return cls(message, qos, persistent, retain, subscription_ids)

    @classmethod
    def restored(
        cls,
        message: Message,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...],
        delivery_count: int,
    ) -> QueuedMessage:
        """A stored copy brought back by recovery: its level was decided when it was queued
        (and only stored copies are persistent), its attempts are the stored count."""
        return cls(message, qos, True, retain, subscription_ids, delivery_count)


@dataclass(frozen=True, slots=True)
class QueueRules:
    """What a subscription's queue does beyond holding entries, asked for by the front end
    that makes the subscription (its protocol's semantics, not a routing rule): the order it
    hands entries out in, and whether what it gives up on (rejected, failed too often,
    expired) moves to the dead-letter and expiry queues (DESIGN.md section 5) instead of being
    dropped. The defaults are MQTT's: FIFO, dropped (counted)."""

    ordering: Ordering = "fifo"
    dead_letters: bool = False


# The rules of every queue that asks for nothing else (MQTT sessions), shared.
DEFAULT_QUEUE_RULES = QueueRules()


class Removal(Enum):
    """Why an entry left its queue for good; the value is the reason a dead letter carries."""

    ACCEPTED = "accepted"
    EXPIRED = "expired"
    # Pushed out of a full queue (the discard_oldest policy).
    DISCARDED = "discarded"
    REJECTED = "rejected"
    # Settled "modified" once too often (max_delivery_attempts).
    DELIVERY_LIMIT = "maximum delivery attempts reached"
    # Dropped with the whole queue (session end, queue deletion).
    PURGED = "purged"


class EntryState(Enum):
    """What browsing reports about an entry."""

    WAITING = "waiting"
    DELAYED = "delayed"
    IN_FLIGHT = "in flight"


@dataclass(slots=True, frozen=True)
class BrowsedEntry:
    """One line of a queue browse: the entry and where it stands."""

    entry: QueuedMessage
    state: EntryState
    # The delivery it is in, for in-flight entries.
    delivery: Delivery | None = None


@dataclass(slots=True)
class QueueCounters:
    """What the queue has had to throw away, for logs and $SYS."""

    rejected: int = 0
    discarded: int = 0
    expired: int = 0
    dead_lettered: int = 0


RemovalHandler = Callable[["Queue", QueuedMessage, Removal], object]


class QueueTotals:
    """What every queue of one broker shares (sessions', shared groups' and JMS queues).

    ``bytes``: bytes waiting in all of them, kept by the queues as their own byte counts
    change, so the broker-wide bound reads one number instead of walking every queue.
    ``dropping``: queues that have dropped messages (full queue) lately. A queue's first drop
    is logged at once; what it drops after that is reported by :meth:`report_drops` from the
    broker's tick, one line per queue and tick with the true counts, so a flood of drops
    neither floods the log nor hides how many were lost.
    """

    __slots__ = ("bytes", "dropping")

    def __init__(self) -> None:
        self.bytes = 0
        # A dict for its insertion order: reports come out in the order the drops began.
        self.dropping: dict[Queue, None] = {}

    def report_drops(self, *, final: bool = False) -> None:
        """Log what each dropping queue dropped since its last line (the tick; ``final`` at
        shutdown). A queue that dropped nothing since is forgotten: its next drop is logged
        at once again."""
        for queue in list(self.dropping):
            if not queue.report_drops() or final:
                del self.dropping[queue]


# The counters of every queue that has thrown nothing away (never written to).
_NO_COUNTS: Final = QueueCounters()
# Every queue's heaps until they get an entry: shared, so never written to (Queue._own_heap).
_NO_ENTRIES: Final[list[Any]] = []


class Queue:
    """Entries waiting for consumers, bounded by count and bytes, with a policy when full.

    Entries wait in one of three places: a deque (FIFO order), a heap (priority order), or the
    delayed heap until their delivery time. Entries given back by consumers wait in a heap of
    their own, by arrival, ahead of the rest, so a redelivery keeps its place.
    :meth:`dispatch` moves waiting entries to consumers that have credit, in turn.

    A queue whose owner offers at-most-once entries instead of queueing them (a session's, a
    shared group's: ``offers_at_most_once``) holds such an entry only while its delivery time
    is ahead; when it is due it is offered (:meth:`offer`), as it would have been at once had
    it had no delivery time, and never waits for credit.
    """

    __slots__ = (
        "_counters",
        "_cursor",
        "_delayed",
        "_groups",
        "_groups_over",
        "_heap",
        "_next_delivery_id",
        "_ready",
        "_returned",
        "_selective",
        "_sequence",
        "bytes",
        "consumers",
        "count",
        "destination",
        "drops_logged",
        "durable",
        "in_flight",
        "max_bytes",
        "max_delivery_attempts",
        "max_groups",
        "max_messages",
        "name",
        "offers_at_most_once",
        "on_removed",
        "ordering",
        "policy",
        "totals",
    )

    def __init__(
        self,
        name: str,
        *,
        max_messages: int,
        max_bytes: int,
        policy: FullPolicy = "reject_new",
        ordering: Ordering = "fifo",
        max_delivery_attempts: int = 0,
        durable: bool = False,
        on_removed: RemovalHandler | None = None,
        destination: Destination | None = None,
        totals: QueueTotals | None = None,
        offers_at_most_once: bool = False,
        max_groups: int = 0,
    ) -> None:
        self.name = name
        # Due at-most-once entries are offered, not queued for credit (see the class text);
        # False for a queue destination, whose consumers compete for every entry alike.
        self.offers_at_most_once = offers_at_most_once
        # Set when the queue is a destination itself (a JMS queue); None when bindings feed it.
        self.destination = destination
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.policy = policy
        self.ordering = ordering
        # Settled "modified" this many times, an entry is dead-lettered; 0 = never.
        self.max_delivery_attempts = max_delivery_attempts
        # Message groups kept with their consumer at once (0 = no limit): see _keep_group.
        self.max_groups = max_groups
        # Its entries are written to the store; such an entry waits for its message's commit.
        self.durable = durable
        # Told of every entry that leaves for good (the owner removes its stored copy and moves
        # dead letters and expired entries where they belong); of an accepted one only when it
        # is stored (durable queue, persistent entry): otherwise nothing is left to clean up.
        self.on_removed = on_removed
        self.bytes = 0
        # The broker-wide count this queue's bytes are part of (its own when it has none).
        self.totals = totals if totals is not None else QueueTotals()
        # Entries waiting, visible or not; kept by hand because the hot path asks constantly.
        self.count = 0
        # Entries given to consumers and not settled yet.
        self.in_flight = 0
        # Its own counters from its first drop; until then the shared zeros (see counters).
        self._counters: QueueCounters | None = None
        # Drops (rejected + discarded) the log has told of so far (QueueTotals.dropping).
        self.drops_logged = 0
        self.consumers: list[Consumer] = []
        self._cursor = 0
        # Attached consumers with a selector, plus one once an entry with a message group has
        # come: while any is, dispatch asks each entry who may take it; while none is,
        # dispatch never looks.
        self._selective = 0
        # Message group -> the consumer that has it (DESIGN.md section 5); None until the
        # first entry with a group comes, so queues without groups never look.
        # Insertion order is use order (a group's use moves it to the end), so the group
        # used longest ago comes first when the map is over ``max_groups``.
        self._groups: dict[str, Consumer] | None = None
        # Whether the map has been over max_groups (logged once per queue).
        self._groups_over = False
        self._sequence = 0
        self._next_delivery_id = 0
        # FIFO entries live in a deque, made on the first one (760 bytes that most idle
        # sessions never need); priority entries in a heap of (-priority, seq, entry).
        self._ready: deque[QueuedMessage] | None = None
        # The three heaps are the shared empty list (only ever read) until their first entry:
        # most queues never use them (see _own_heap).
        self._heap: list[tuple[int, int, QueuedMessage]] = _NO_ENTRIES
        # Entries not yet visible: (delivery_time, seq, entry).
        self._delayed: list[tuple[float, int, QueuedMessage]] = _NO_ENTRIES
        # Entries given back by consumers in FIFO order: (seq, entry), served first.
        self._returned: list[tuple[int, QueuedMessage]] = _NO_ENTRIES

    def __len__(self) -> int:
        return self.count

    @property
    def deliveries_started(self) -> int:
        """Delivery attempts started so far: while entries wait, a new one means a consumer
        settled something (flow control's measure of progress)."""
        return self._next_delivery_id

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} waiting={self.count} in_flight={self.in_flight}>"

    # -- putting entries in ---------------------------------------------------------------

    def push(self, entry: QueuedMessage) -> tuple[bool, list[QueuedMessage]]:
        """Add an entry at the back; when full, apply the policy.

        Returns whether the entry was accepted and the entries discarded to make room (also
        counted, and reported to ``on_removed`` when set).
        """
        message = entry.message
        size = len(message.payload) + len(message.topic)  # Message.size, without two calls
        if self.count >= self.max_messages or self.bytes + size > self.max_bytes:
            victims: list[QueuedMessage] = []
            if self.policy == "reject_new" or not self._discard_oldest(entry.size, victims):
                self._own_counters().rejected += 1
                self._note_drop()
                return False, victims
            self._sequence += 1
            entry.sequence = self._sequence
            self._insert(entry)
            return True, victims
        self._sequence = entry.sequence = self._sequence + 1
        ready = self._ready
        if (
            ready is not None
            and message.delivery_time is None
            and self.ordering == "fifo"
            and message.group_id is None
        ):
            # _insert's usual case, inlined: this is every queued QoS 1 copy's path.
            self.bytes += size
            self.totals.bytes += size
            self.count += 1
            ready.append(entry)
        else:
            self._insert(entry)
        return _PUSHED

    def push_all(self, entries: list[QueuedMessage]) -> None:
        """:meth:`push` for each of a run of entries, in one step: for a caller that has
        checked :meth:`takes_run` for them, so each would be accepted at the back (no
        policy, no heap) exactly as one by one (publishing.publish_run)."""
        ready = self._ready
        if ready is None:
            ready = self._ready = deque()
        sequence = self._sequence
        size = 0
        for entry in entries:
            sequence += 1
            entry.sequence = sequence
            message = entry.message
            size += len(message.payload) + len(message.topic)
        self._sequence = sequence
        self.bytes += size
        self.totals.bytes += size
        self.count += len(entries)
        ready.extend(entries)

    def takes_run(self, entries: int, size: int) -> bool:
        """Would :meth:`push` accept this many more FIFO entries (no delivery time, no message
        group) of this many bytes in all, each at the back, one after the other? (Sizes only
        grow, so the last one's check decides.)"""
        return (
            self.ordering == "fifo"
            and self.count + entries <= self.max_messages
            and self.bytes + size <= self.max_bytes
        )

    def has_room(self, entries: int, size: int) -> bool:
        """Would this many more entries of this many bytes all be accepted now?"""
        if self.policy == "discard_oldest":
            return size <= self.max_bytes
        return self.count + entries <= self.max_messages and self.bytes + size <= self.max_bytes

    def push_front(self, entry: QueuedMessage) -> None:
        """Put an entry back in its arrival place, ahead of later ones; never refused."""
        if self._groups is None and entry.message.group_id is not None:
            self._start_grouping()
        size = entry.size
        self.bytes += size
        self.totals.bytes += size
        self.count += 1
        if self.ordering == "priority":
            heapq.heappush(self._own_heap(), (-entry.message.priority, entry.sequence, entry))
        else:
            returned = self._returned
            if returned is _NO_ENTRIES:
                self._returned = returned = []
            heapq.heappush(returned, (entry.sequence, entry))

    # -- drops: counted at once, logged without flooding ------------------------------------

    @property
    def counters(self) -> QueueCounters:
        """What the queue has thrown away (read only: the queue counts through
        _own_counters, made on its first drop, so a queue that never drops holds none)."""
        counters = self._counters
        return counters if counters is not None else _NO_COUNTS

    def _own_counters(self) -> QueueCounters:
        counters = self._counters
        if counters is None:
            self._counters = counters = QueueCounters()
        return counters

    @property
    def dropped(self) -> int:
        """Entries this queue has refused or pushed out because it was full, ever."""
        return self.counters.rejected + self.counters.discarded

    def _note_drop(self) -> None:
        """A drop was just counted: the first of a run is logged at once; the rest are left to
        :meth:`report_drops` (the broker's tick, and the queue's end), with their true count."""
        dropping = self.totals.dropping
        if self in dropping:
            return
        dropping[self] = None
        self.drops_logged = dropped = self.dropped
        log.warning(
            "queue %s full (%d messages, %d bytes; %s): dropped a message, %d in all; "
            "further drops are reported by the broker's tick",
            self.name,
            self.count,
            self.bytes,
            self.policy,
            dropped,
        )

    def report_drops(self) -> bool:
        """Log the drops since the last line, if any; whether there were any."""
        dropped = self.dropped
        since = dropped - self.drops_logged
        if not since:
            return False
        self.drops_logged = dropped
        log.warning(
            "queue %s full (%d messages, %d bytes; %s): %d more dropped, %d in all",
            self.name,
            self.count,
            self.bytes,
            self.policy,
            since,
            dropped,
        )
        return True

    def end_drop_report(self) -> None:
        """The queue's end (session end, deletion): the drops not yet logged are, now."""
        dropping = self.totals.dropping
        if self in dropping:
            del dropping[self]
            self.report_drops()

    # -- taking entries out ---------------------------------------------------------------

    def pop(self, now: float, expired: list[QueuedMessage] | None = None) -> QueuedMessage | None:
        """The next visible, unexpired entry, or None.

        Expired entries are skipped and counted; when ``expired`` is given they are appended to
        it, else they are reported to ``on_removed``.
        """
        if self._delayed and self._delayed[0][0] <= now:
            self._release_delayed(now)
        while True:
            if self._returned:
                entry = heapq.heappop(self._returned)[1]
            elif self._ready:
                entry = self._ready.popleft()
            elif self._heap:
                entry = heapq.heappop(self._heap)[2]
            else:
                return None
            message = entry.message
            size = len(message.payload) + len(message.topic)
            self.bytes -= size
            self.totals.bytes -= size
            self.count -= 1
            if message.expiry is not None and now >= message.expiry:
                self._own_counters().expired += 1
                if expired is not None:
                    expired.append(entry)
                elif self.on_removed is not None:
                    self.on_removed(self, entry, Removal.EXPIRED)
                continue
            return entry

    def expire(self, now: float) -> int:
        """Remove every waiting entry whose expiry has passed (a sweep for queues nobody
        consumes); returns how many. Runs every tick over every such queue: one that has
        nothing expired (the usual case, most messages have no expiry) is only read, not
        emptied and refilled."""
        if not any(entry.message.expired(now) for entry in self._waiting()):
            return 0
        removed = 0
        keep: list[QueuedMessage] = []
        for entry in self.drain():
            if entry.message.expired(now):
                removed += 1
                self._own_counters().expired += 1
                if self.on_removed is not None:
                    self.on_removed(self, entry, Removal.EXPIRED)
            else:
                keep.append(entry)
        for entry in sorted(keep, key=_by_sequence):
            self._insert(entry)
        return removed

    def reorder(self, ordering: Ordering) -> None:
        """Hand entries out in another order from now on; those waiting keep their arrival
        order within it (a subscription whose front end asks for other rules)."""
        if ordering == self.ordering:
            return
        entries = sorted(self.drain(), key=_by_sequence)
        self.ordering = ordering
        for entry in entries:
            self._insert(entry)

    def remove_message(self, message: Message) -> list[QueuedMessage]:
        """Drop every waiting entry of one message (its publication was refused)."""
        gone: list[QueuedMessage] = []
        for entry in sorted(self.drain(), key=_by_sequence):
            if entry.message is message:
                gone.append(entry)
            else:
                self._insert(entry)
        return gone

    def drain(self) -> list[QueuedMessage]:
        """Remove and return every waiting entry, visible or not (session end, queue deletion).

        In-flight entries stay with their consumers.
        """
        entries = self.entries()
        self._returned = _NO_ENTRIES
        self._ready = None
        self._heap = _NO_ENTRIES
        self._delayed = _NO_ENTRIES
        self.totals.bytes -= self.bytes
        self.bytes = 0
        self.count = 0
        return entries

    def entries(self) -> list[QueuedMessage]:
        """A snapshot of the waiting entries in no guaranteed order."""
        return (
            [e for _, e in self._returned]
            + list(self._ready or ())
            + [e for _, _, e in self._heap]
            + [e for _, _, e in self._delayed]
        )

    def _waiting(self) -> Iterator[QueuedMessage]:
        """The waiting entries in no guaranteed order, without copying them."""
        for _, entry in self._returned:
            yield entry
        yield from self._ready or ()
        for _, _, entry in self._heap:
            yield entry
        for _, _, entry in self._delayed:
            yield entry

    def next_visible_time(self) -> float | None:
        return self._delayed[0][0] if self._delayed else None

    # -- consumers ------------------------------------------------------------------------

    def attach(self, consumer: Consumer) -> None:
        """Add a consumer; it takes entries from the next :meth:`dispatch` on."""
        if consumer.queue is not None and consumer.queue is not self:
            raise ValueError(f"{consumer!r} is attached to {consumer.queue!r} already")
        consumer.queue = self
        if consumer not in self.consumers:
            # A new list of the exact size (most queues, a session's, have one consumer):
            # concatenation allocates n + 1 slots, where [*xs, x] over-allocates as append does.
            self.consumers = self.consumers + [consumer]  # noqa: RUF005
            if consumer.selects is not None:
                self._selective += 1

    def detach(self, consumer: Consumer) -> None:
        """Remove a consumer; what it has not settled comes back as possibly delivered."""
        self.recall(consumer, received_too=True)
        if consumer in self.consumers:
            index = self.consumers.index(consumer)
            del self.consumers[index]
            if self._cursor > index:
                self._cursor -= 1
            if consumer.selects is not None:
                self._selective -= 1
        groups = self._groups
        if groups:
            # Its groups move to the consumers that take their next entries.
            for group in [g for g, owner in groups.items() if owner is consumer]:
                del groups[group]
        consumer.queue = None

    def recall(self, consumer: Consumer, *, received_too: bool = False) -> int:
        """Take back the consumer's unsettled deliveries as "modified" (possibly delivered);
        deliveries it holds already (RECEIVED) stay unless ``received_too``. Returns how many
        came back."""
        taken = [
            d for d in consumer.unsettled.values() if received_too or d.state is DeliveryState.SENT
        ]
        for delivery in taken:
            self.settle(delivery, Settlement.MODIFIED)
        return len(taken)

    def dispatch(self, now: float) -> int:
        """Give waiting entries to consumers that have credit, in turn; returns how many.

        An entry of a message whose commit is pending waits when it must (see
        :meth:`_waits_for_commit`); an entry nobody present may take stays for later.
        """
        if not self.count:
            return 0
        delayed = self._delayed
        if delayed and delayed[0][0] <= now and self.offers_at_most_once:
            # Due at-most-once entries go out first, whatever the consumers' credit.
            offered = self._release_delayed(now)
            if offered:
                return offered + self.dispatch(now)
        if self._selective:
            return self._dispatch_selective(now)
        consumers = self.consumers
        if len(consumers) == 1:
            # The common case (an MQTT session): no turn-taking, no exclusion bookkeeping.
            consumer = consumers[0]
            if consumer.receiver is None:
                return 0
            credit = consumer.credit
            if credit.available <= 0:
                return 0  # (a flood's usual pump: the window is full)
            sent = 0
            unsettled = consumer.unsettled
            if unsettled is NO_DELIVERIES:
                unsettled = consumer.own_unsettled()
            # A receiver that takes a run (Receiver.deliver_all) gets this dispatch's
            # deliveries at once, in one write; its deliver() never acts on this queue.
            receiver = consumer.receiver
            deliver_all: Callable[[list[Delivery]], None] | None
            deliver_all = getattr(receiver, "deliver_all", None)
            run: list[Delivery] | None = [] if deliver_all is not None else None
            try:
                while credit.available > 0:
                    if run is None:
                        receiver = consumer.receiver
                        if receiver is None:
                            break
                    ready = self._ready
                    if run is not None and ready and not self._returned and not self._delayed:
                        # The loop's usual case for a run of entries at once: the FIFO
                        # entries at the front that need no look (no expiry, no commit to
                        # wait for, no consumer excluded), as many as the window takes,
                        # started in one step (a subscriber behind a flood: every queued
                        # delivery). The first that needs a look goes the way below.
                        room = credit.available
                        plain = 0
                        size = 0
                        for entry in ready:
                            message = entry.message
                            if (
                                message.expiry is not None
                                or message.awaiting_commit
                                or entry.excluded is not None
                            ):
                                break
                            size += len(message.payload) + len(message.topic)
                            plain += 1
                            if plain == room:
                                break
                        if plain:
                            delivery_id = self._next_delivery_id
                            for _ in range(plain):
                                delivery_id += 1
                                delivery = Delivery(delivery_id, ready.popleft(), consumer)
                                unsettled[delivery_id] = delivery
                                run.append(delivery)
                            self._next_delivery_id = delivery_id
                            self.bytes -= size
                            self.totals.bytes -= size
                            self.count -= plain
                            credit.available -= plain
                            self.in_flight += plain
                            sent += plain
                            continue
                    if (
                        ready
                        and not self._returned
                        and not self._delayed
                        and ready[0].message.expiry is None
                    ):
                        # pop's usual case, inlined: the next FIFO entry, nothing ahead of it and
                        # nothing to expire (every queued delivery's path).
                        entry = ready.popleft()
                        message = entry.message
                        size = len(message.payload) + len(message.topic)
                        self.bytes -= size
                        self.totals.bytes -= size
                        self.count -= 1
                    else:
                        popped = self.pop(now)
                        if popped is None:
                            break
                        entry = popped
                    if entry.message.awaiting_commit and self._waits_for_commit(entry):
                        self.push_front(entry)
                        break
                    if entry.excluded is not None and consumer in entry.excluded:
                        self.push_front(entry)
                        if run and deliver_all is not None:
                            started, run = run, []
                            deliver_all(started)
                        return sent + self._dispatch_many(now)
                    # _start, inlined: this is every queued delivery's path.
                    self._next_delivery_id = delivery_id = self._next_delivery_id + 1
                    delivery = Delivery(delivery_id, entry, consumer)
                    unsettled[delivery_id] = delivery
                    credit.available -= 1
                    self.in_flight += 1
                    if run is not None:
                        run.append(delivery)
                    else:
                        receiver.deliver(delivery)
                    sent += 1
            finally:
                # What was started goes out, whatever ended the loop.
                if run and deliver_all is not None:
                    deliver_all(run)
            return sent
        return self._dispatch_many(now)

    def _dispatch_many(self, now: float) -> int:
        skipped: list[QueuedMessage] = []
        sent = 0
        while True:
            entry = self.pop(now)
            if entry is None:
                break
            if entry.message.awaiting_commit and self._waits_for_commit(entry):
                self.push_front(entry)
                break
            # The turn moves on only when a consumer takes something.
            consumer = self._next_ready(entry.excluded)
            if consumer is None:
                if entry.excluded is None or self._next_ready(None, advance=False) is None:
                    self.push_front(entry)
                    break
                skipped.append(entry)  # nobody present may take it; later ones may go
                continue
            self._start(consumer, entry)
            sent += 1
        for entry in skipped:
            self.push_front(entry)
        return sent

    def _dispatch_selective(self, now: float) -> int:
        """Dispatch while some consumer has a selector (JMS): each entry goes to the next
        consumer in turn that can take it and selects it; an entry no ready consumer selects
        stays in its place, and later ones may go. Every waiting entry may be looked at once
        per dispatch: the price of selectors, paid only by queues that have them."""
        skipped: list[QueuedMessage] = []
        sent = 0
        while self._next_ready(None, advance=False) is not None:
            entry = self.pop(now)
            if entry is None:
                break
            if entry.message.awaiting_commit and self._waits_for_commit(entry):
                self.push_front(entry)
                break
            consumer = self._next_selecting(entry)
            if consumer is None:
                skipped.append(entry)
                continue
            self._start(consumer, entry)
            sent += 1
        for entry in skipped:
            self.push_front(entry)
        return sent

    def _next_selecting(self, entry: QueuedMessage) -> Consumer | None:
        """The next consumer in turn that can take this entry and whose selector selects it;
        for an entry of a message group, only the group's consumer, or the next in turn that
        can take it when the group has none (which then has the group)."""
        excluded = entry.excluded
        group = entry.message.group_id
        groups = self._groups
        if group is not None and groups is not None:
            owner = groups.get(group)
            if owner is not None:
                # The group waits for its consumer's credit; other entries may go meanwhile.
                if owner.credit.available <= 0 or owner.receiver is None:
                    return None
                if excluded is not None and owner in excluded:
                    return None
                if owner.selects is not None and not owner.selects(entry):
                    return None
                if self.max_groups:
                    # Used now: the last to be forgotten (see _keep_group).
                    del groups[group]
                    groups[group] = owner
                return owner
            taker = self._next_taking(entry, excluded)
            if taker is not None:
                self._keep_group(groups, group, taker)
            return taker
        return self._next_taking(entry, excluded)

    def _next_taking(self, entry: QueuedMessage, excluded: set[Consumer] | None) -> Consumer | None:
        """The next consumer in turn that can take this entry and whose selector selects it."""
        consumers = self.consumers
        count = len(consumers)
        for step in range(count):
            index = (self._cursor + step) % count
            consumer = consumers[index]
            if consumer.credit.available <= 0 or consumer.receiver is None:
                continue
            if excluded is not None and consumer in excluded:
                continue
            selects = consumer.selects
            if selects is not None and not selects(entry):
                continue
            self._cursor = (index + 1) % count
            return consumer
        return None

    def _next_ready(
        self, excluded: set[Consumer] | None, *, advance: bool = True
    ) -> Consumer | None:
        """The next consumer in turn that can take an entry (and is not excluded)."""
        consumers = self.consumers
        count = len(consumers)
        for step in range(count):
            index = (self._cursor + step) % count
            consumer = consumers[index]
            if consumer.credit.available > 0 and consumer.receiver is not None:
                if excluded is not None and consumer in excluded:
                    continue
                if advance:
                    self._cursor = (index + 1) % count
                return consumer
        return None

    def offer(self, entry: QueuedMessage) -> bool:
        """An at-most-once entry goes to the next consumer that has a receiver, or nowhere.

        It is never queued and spends no credit (MQTT QoS 0, AMQP pre-settled transfers), so
        a consumer whose window is full still gets it.
        """
        consumers = self.consumers
        if len(consumers) == 1:
            receiver = consumers[0].receiver
            if receiver is None:
                return False
            receiver.deliver_settled(entry)
            return True
        count = len(consumers)
        for step in range(count):
            index = (self._cursor + step) % count
            receiver = consumers[index].receiver
            if receiver is not None:
                self._cursor = (index + 1) % count
                receiver.deliver_settled(entry)
                return True
        return False

    def _start(self, consumer: Consumer, entry: QueuedMessage) -> Delivery:
        self._next_delivery_id = delivery_id = self._next_delivery_id + 1
        delivery = Delivery(delivery_id, entry, consumer)
        unsettled = consumer.unsettled
        if unsettled is NO_DELIVERIES:
            unsettled = consumer.own_unsettled()
        unsettled[delivery_id] = delivery
        consumer.credit.available -= 1
        self.in_flight += 1
        receiver = consumer.receiver
        assert receiver is not None
        receiver.deliver(delivery)
        return delivery

    def deliver_now(self, consumer: Consumer, entry: QueuedMessage) -> Delivery:
        """Put an entry in flight to this consumer at once, bypassing the waiting entries: for
        an owner that has checked nothing waits ahead of it and the consumer has credit."""
        # _start, inlined: this is every QoS 1 delivery's path when nothing waits.
        self._sequence = entry.sequence = self._sequence + 1
        self._next_delivery_id = delivery_id = self._next_delivery_id + 1
        delivery = Delivery(delivery_id, entry, consumer)
        unsettled = consumer.unsettled
        if unsettled is NO_DELIVERIES:
            unsettled = consumer.own_unsettled()
        unsettled[delivery_id] = delivery
        consumer.credit.available -= 1
        self.in_flight += 1
        receiver = consumer.receiver
        assert receiver is not None
        receiver.deliver(delivery)
        return delivery

    def deliver_now_all(
        self,
        consumer: Consumer,
        entries: list[QueuedMessage],
        deliver_all: Callable[[list[Delivery]], None],
    ) -> None:
        """:meth:`deliver_now` for each of a run of entries, handed over at once to the
        consumer's receiver that takes runs (its ``deliver_all``, which never acts on this
        queue while it runs): for an owner that has checked nothing waits ahead of them and
        the consumer's window has room for all."""
        sequence = self._sequence
        delivery_id = self._next_delivery_id
        unsettled = consumer.unsettled
        if unsettled is NO_DELIVERIES:
            unsettled = consumer.own_unsettled()
        run: list[Delivery] = []
        for entry in entries:
            sequence += 1
            entry.sequence = sequence
            delivery_id += 1
            delivery = Delivery(delivery_id, entry, consumer)
            unsettled[delivery_id] = delivery
            run.append(delivery)
        self._sequence = sequence
        self._next_delivery_id = delivery_id
        consumer.credit.available -= len(run)
        self.in_flight += len(run)
        deliver_all(run)

    @property
    def group_count(self) -> int:
        """Message groups this queue keeps with a consumer now (bounded by ``max_groups``
        plus those with messages in flight)."""
        return len(self._groups) if self._groups is not None else 0

    def group_owner(self, group: str) -> Consumer | None:
        """The consumer that has the message group now, if any."""
        return self._groups.get(group) if self._groups is not None else None

    def _start_grouping(self) -> dict[str, Consumer]:
        """The first entry with a message group: dispatch asks each entry who may take it
        from now on (the selective path), and groups are kept."""
        groups = self._groups = {}
        self._selective += 1
        return groups

    def _keep_group(self, groups: dict[str, Consumer], group: str, consumer: Consumer) -> None:
        """The group is now the consumer's. Past ``max_groups`` the groups used longest ago
        whose consumers hold none of their entries are forgotten, a tenth of the limit at once
        (their next entries go to whoever takes them, as a new group's would; nothing of them
        is in flight, so their order holds), which bounds the map whatever group ids producers
        invent. Groups with entries in flight are never forgotten, so the map may exceed the
        limit by at most what is in flight."""
        groups[group] = consumer
        limit = self.max_groups
        if not limit or len(groups) <= limit:
            return
        if not self._groups_over:
            self._groups_over = True
            log.warning(
                "queue %s holds more than %d message groups (limits.max_message_groups): the "
                "groups used longest ago whose consumers hold none of their messages are "
                "forgotten, so their next messages may go to another consumer",
                self.name,
                limit,
            )
        # Which groups are in flight, from one walk over the unsettled deliveries: paid once
        # per tenth of the limit of new groups, not per new group.
        busy = {d.entry.message.group_id for c in self.consumers for d in c.unsettled.values()}
        busy.add(group)
        excess = len(groups) - (limit - limit // 10)
        for candidate in list(itertools.islice(groups, excess + len(busy))):
            owner = groups.pop(candidate)
            if candidate in busy:
                groups[candidate] = owner  # stays, as if used now
                continue
            excess -= 1
            if not excess:
                return

    def _ungroup(self, consumer: Consumer, group: str) -> None:
        """The consumer gave back an entry of its group: the group may move once it holds
        none of the group's entries any more (one consumer at a time, DESIGN.md section 5)."""
        groups = self._groups
        if groups is None or groups.get(group) is not consumer:
            return
        for delivery in consumer.unsettled.values():
            if delivery.entry.message.group_id == group:
                return
        del groups[group]

    def restore(self, consumer: Consumer, entry: QueuedMessage, state: DeliveryState) -> Delivery:
        """Recovery: an entry that was in flight to this consumer when the broker stopped is
        in flight again, without being sent (the owner resends it when the consumer is back)."""
        self._sequence += 1
        entry.sequence = self._sequence
        self._next_delivery_id += 1
        delivery = Delivery(self._next_delivery_id, entry, consumer)
        delivery.state = state
        group = entry.message.group_id
        if group is not None:
            groups = self._groups if self._groups is not None else self._start_grouping()
            if group not in groups:
                self._keep_group(groups, group, consumer)
        consumer.own_unsettled()[delivery.id] = delivery
        consumer.credit.available -= 1
        self.in_flight += 1
        return delivery

    # -- settlement -----------------------------------------------------------------------

    def settle(
        self, delivery: Delivery, outcome: Settlement, *, undeliverable_here: bool = False
    ) -> bool:
        """End one delivery attempt; False when it was settled already.

        Entries that come back wait for the next :meth:`dispatch`; the caller runs it.
        """
        consumer = delivery.consumer
        if consumer.unsettled.pop(delivery.id, None) is None:
            return False
        credit = consumer.credit
        if credit.window is not None:
            credit.available += 1
        self.in_flight -= 1
        entry = delivery.entry
        if outcome is _ACCEPTED:
            # Only a stored entry leaves something behind for the owner to clean up.
            if self.durable and entry.persistent and self.on_removed is not None:
                self.on_removed(self, entry, _REMOVAL_ACCEPTED)
        elif outcome is Settlement.RELEASED:
            self.push_front(entry)
            if self._groups is not None and entry.message.group_id is not None:
                self._ungroup(consumer, entry.message.group_id)
        elif outcome is Settlement.MODIFIED:
            if self._groups is not None and entry.message.group_id is not None:
                self._ungroup(consumer, entry.message.group_id)
            entry.delivery_count += 1
            if undeliverable_here:
                if entry.excluded is None:
                    entry.excluded = set()
                entry.excluded.add(consumer)
            limit = self.max_delivery_attempts
            if limit and entry.delivery_count >= limit:
                self._remove(entry, Removal.DELIVERY_LIMIT)
            else:
                self.push_front(entry)
        else:
            self._remove(entry, Removal.REJECTED)
        return True

    def accept_all(self, deliveries: list[Delivery]) -> tuple[bool, bool]:
        """:meth:`settle` as accepted for each of a run of deliveries (a subscriber's run of
        acknowledgements), its usual case inlined: one call for the run, not one each. A
        delivery of another queue (a shared group's, taken by a member) is settled by its
        own queue. Returns whether a stored entry was among them (its removal goes to the
        store) and whether entries wait in a queue that settled one (it needs a pump)."""
        stored = False
        waiting = False
        settled = False  # (one of this queue's own)
        durable = self.durable
        for delivery in deliveries:
            consumer = delivery.consumer
            if consumer.queue is not self:
                queue = consumer.queue
                if queue is not None and queue.settle(delivery, _ACCEPTED):
                    if delivery.entry.persistent and queue.durable:
                        stored = True
                    if queue.count:
                        waiting = True
                continue
            if consumer.unsettled.pop(delivery.id, None) is None:
                continue  # settled already
            settled = True
            credit = consumer.credit
            if credit.window is not None:
                credit.available += 1
            self.in_flight -= 1
            if durable:
                entry = delivery.entry
                if entry.persistent:
                    stored = True
                    # Only a stored entry leaves something behind for the owner to clean up.
                    if self.on_removed is not None:
                        self.on_removed(self, entry, _REMOVAL_ACCEPTED)
        return stored, waiting or (settled and self.count > 0)

    def mark_received(self, delivery: Delivery) -> bool:
        """The consumer holds the entry now (an MQTT PUBREC); only its settlement remains."""
        if delivery.consumer.unsettled.get(delivery.id) is not delivery:
            return False
        delivery.state = DeliveryState.RECEIVED
        return True

    # -- browsing -------------------------------------------------------------------------

    def browse(self, now: float) -> list[BrowsedEntry]:
        """Every entry in the order consumers get them, in-flight ones included as such.

        Read-only: nothing is taken, counted or expired. Expired entries not yet removed are
        left out; entries not visible yet come last, by delivery time.
        """
        # (priority rank, arrival rank, row): a due delayed entry ranks as if it arrived now,
        # which is what the next dispatch will make of it.
        ranked: list[tuple[int, int, BrowsedEntry]] = []
        by_priority = self.ordering == "priority"

        def add(
            entry: QueuedMessage, state: EntryState, sequence: int, delivery: Delivery | None = None
        ) -> None:
            if not entry.message.expired(now):
                rank = -entry.message.priority if by_priority else 0
                ranked.append((rank, sequence, BrowsedEntry(entry, state, delivery)))

        waiting = [e for _, e in self._returned] + list(self._ready or ())
        waiting += [e for *_, e in self._heap]
        for entry in waiting:
            add(entry, EntryState.WAITING, entry.sequence)
        due_now = sorted((item for item in self._delayed if item[0] <= now), key=_by_time)
        for offset, (_, _, entry) in enumerate(due_now, start=1):
            add(entry, EntryState.WAITING, self._sequence + offset)
        for consumer in self.consumers:
            for delivery in consumer.unsettled.values():
                add(delivery.entry, EntryState.IN_FLIGHT, delivery.entry.sequence, delivery)
        ranked.sort(key=lambda item: item[:2])
        rows = [row for _, _, row in ranked]
        for t, _, entry in sorted(self._delayed, key=_by_time):
            if t > now and not entry.message.expired(now):
                rows.append(BrowsedEntry(entry, EntryState.DELAYED))
        return rows

    # -- internals ------------------------------------------------------------------------

    def _waits_for_commit(self, entry: QueuedMessage) -> bool:
        """Persist → acknowledge → dispatch: a stored copy, and an exactly-once one (whose
        publisher resends if the commit fails, which would duplicate it), wait for the commit.
        An at-least-once copy nobody stores may go first: a failed commit only duplicates it."""
        return entry.qos == 2 or (self.durable and entry.persistent)

    def _remove(self, entry: QueuedMessage, reason: Removal) -> None:
        if reason is Removal.DELIVERY_LIMIT or reason is Removal.REJECTED:
            self._own_counters().dead_lettered += 1
        if self.on_removed is not None:
            self.on_removed(self, entry, reason)

    def _insert(self, entry: QueuedMessage) -> None:
        message = entry.message
        if self._groups is None and message.group_id is not None:
            self._start_grouping()
        size = len(message.payload) + len(message.topic)
        self.bytes += size
        self.totals.bytes += size
        self.count += 1
        delivery_time = message.delivery_time
        if delivery_time is not None:
            delayed = self._delayed
            if delayed is _NO_ENTRIES:
                self._delayed = delayed = []
            heapq.heappush(delayed, (delivery_time, entry.sequence, entry))
        elif self.ordering == "priority":
            heapq.heappush(self._own_heap(), (-message.priority, entry.sequence, entry))
        else:
            ready = self._ready
            if ready is None:
                ready = self._ready = deque()
            ready.append(entry)

    def _release_delayed(self, now: float) -> int:
        """Make due entries visible; a due at-most-once entry of a queue that offers them is
        offered instead (or dropped, expired or with nobody to take it). Returns how many
        were offered."""
        offered = 0
        while self._delayed and self._delayed[0][0] <= now:
            entry = heapq.heappop(self._delayed)[2]
            if entry.qos == 0 and self.offers_at_most_once:
                message = entry.message
                size = len(message.payload) + len(message.topic)
                self.bytes -= size
                self.totals.bytes -= size
                self.count -= 1
                if message.expiry is not None and now >= message.expiry:
                    self._own_counters().expired += 1
                    if self.on_removed is not None:
                        self.on_removed(self, entry, Removal.EXPIRED)
                elif self.offer(entry):
                    offered += 1
                continue
            # It arrives now, behind what arrived while it waited. Visibility is this queue's
            # state: the shared, immutable Message keeps its delivery time.
            self._sequence += 1
            entry.sequence = self._sequence
            if self.ordering == "priority":
                heapq.heappush(self._own_heap(), (-entry.message.priority, entry.sequence, entry))
            else:
                self._append_ready(entry)
        return offered

    def _own_heap(self) -> list[tuple[int, int, QueuedMessage]]:
        """The priority heap, made on its first entry (until then the shared empty list)."""
        heap = self._heap
        if heap is _NO_ENTRIES:
            self._heap = heap = []
        return heap

    def _append_ready(self, entry: QueuedMessage) -> None:
        ready = self._ready
        if ready is None:
            ready = self._ready = deque()
        ready.append(entry)

    def _discard_oldest(self, needed_bytes: int, victims: list[QueuedMessage]) -> bool:
        """Drop oldest visible entries until the new one fits; False if it never can."""
        if needed_bytes > self.max_bytes:
            return False
        while self.count >= self.max_messages or self.bytes + needed_bytes > self.max_bytes:
            if self._returned:
                victim = heapq.heappop(self._returned)[1]
            elif self._ready:
                victim = self._ready.popleft()
            elif self._heap:
                # The lowest-priority, newest entry is the cheapest to lose in priority order.
                victim_index = max(range(len(self._heap)), key=lambda i: self._heap[i][:2])
                victim = self._heap.pop(victim_index)[2]
                heapq.heapify(self._heap)
            elif self._delayed:
                victim = heapq.heappop(self._delayed)[2]
            else:
                return False
            size = victim.size
            self.bytes -= size
            self.totals.bytes -= size
            self.count -= 1
            self._own_counters().discarded += 1
            victims.append(victim)
            if self.on_removed is not None:
                self.on_removed(self, victim, Removal.DISCARDED)
        self._note_drop()
        return True


# Enum members read on the hot path, bound once (an Enum class attribute lookup is not free).
_ACCEPTED = Settlement.ACCEPTED
_REMOVAL_ACCEPTED = Removal.ACCEPTED

# Shared by every push that discards nothing, so the hot path allocates no list.
_NO_VICTIMS: list[QueuedMessage] = []
# What such a push returns: one tuple for all of them, not a new one each.
_PUSHED: tuple[bool, list[QueuedMessage]] = (True, _NO_VICTIMS)


def _by_sequence(entry: QueuedMessage) -> int:
    return entry.sequence


def _by_time(item: tuple[float, int, QueuedMessage]) -> tuple[float, int]:
    return item[0], item[1]
