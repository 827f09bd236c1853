"""A bounded queue of message references waiting for a consumer.

The same structure serves an MQTT session (one consumer, FIFO) and, with another dispatch
policy, a JMS queue (competing consumers, priority order, delayed visibility, redelivery): the
queue only orders and bounds; who takes the next entry is the owner's business.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from dataclasses import dataclass
from typing import Literal

from kittiwake.broker.message import Message

log = logging.getLogger(__name__)

Ordering = Literal["fifo", "priority"]


@dataclass(slots=True, eq=False)
class QueuedMessage:
    """One subscriber's copy of a message: the message is shared, this state is not."""

    message: Message
    qos: int
    persistent: bool
    # The RETAIN flag this subscriber sees on the wire.
    retain: bool = False
    subscription_ids: tuple[int, ...] = ()
    delivery_count: int = 0
    # Arrival order inside its queue; ties in priority order fall back to it.
    sequence: int = 0

    @property
    def size(self) -> int:
        return self.message.size


@dataclass(slots=True)
class QueueCounters:
    """What the queue has had to throw away, for logs and $SYS."""

    rejected: int = 0
    discarded: int = 0
    expired: int = 0


class MessageQueue:
    """Bounded by message count and bytes, with a configured policy when full."""

    __slots__ = (
        "_delayed",
        "_heap",
        "_ready",
        "_sequence",
        "bytes",
        "count",
        "counters",
        "max_bytes",
        "max_messages",
        "name",
        "ordering",
        "policy",
    )

    def __init__(
        self,
        name: str,
        *,
        max_messages: int,
        max_bytes: int,
        policy: Literal["reject_new", "discard_oldest"] = "reject_new",
        ordering: Ordering = "fifo",
    ) -> None:
        self.name = name
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.policy = policy
        self.ordering = ordering
        self.bytes = 0
        # Entries held, visible or not; kept by hand because the hot path asks constantly.
        self.count = 0
        self.counters = QueueCounters()
        self._sequence = 0
        # FIFO entries live in a deque; priority entries in a heap of (-priority, seq, entry).
        self._ready: deque[QueuedMessage] = deque()
        self._heap: list[tuple[int, int, QueuedMessage]] = []
        # Entries not yet visible: (delivery_time, seq, entry).
        self._delayed: list[tuple[float, int, QueuedMessage]] = []

    def __len__(self) -> int:
        return self.count

    def push(self, entry: QueuedMessage) -> tuple[bool, list[QueuedMessage]]:
        """Add an entry at the back; when full, apply the policy.

        Returns whether the entry was accepted and the entries discarded to make room, which
        the owner must release (a stored reference, for one).
        """
        victims: list[QueuedMessage] = []
        full = self.count >= self.max_messages or self.bytes + entry.size > self.max_bytes
        if full and (self.policy == "reject_new" or not self._discard_oldest(entry.size, victims)):
            self.counters.rejected += 1
            if self.counters.rejected == 1 or self.counters.rejected % 1000 == 0:
                log.warning(
                    "queue %s full (%d messages, %d bytes): rejected %d so far",
                    self.name,
                    len(self),
                    self.bytes,
                    self.counters.rejected,
                )
            return False, victims
        self._sequence += 1
        entry.sequence = self._sequence
        self._insert(entry)
        return True, victims

    def push_front(self, entry: QueuedMessage) -> None:
        """Put a previously taken entry back ahead of the rest (redelivery); never refused."""
        self.bytes += entry.size
        self.count += 1
        if self.ordering == "priority":
            heapq.heappush(self._heap, (-entry.message.priority, entry.sequence, entry))
        else:
            self._ready.appendleft(entry)

    def pop(self, now: float, expired: list[QueuedMessage] | None = None) -> QueuedMessage | None:
        """The next visible, unexpired entry, or None.

        Expired entries are skipped and counted; when ``expired`` is given they are appended to
        it, so the owner can release what they hold (a stored reference, for one).
        """
        if self._delayed and self._delayed[0][0] <= now:
            self._release_delayed(now)
        while True:
            if self._ready:
                entry = self._ready.popleft()
            elif self._heap:
                entry = heapq.heappop(self._heap)[2]
            else:
                return None
            message = entry.message
            self.bytes -= len(message.payload) + len(message.topic)
            self.count -= 1
            if message.expiry is not None and message.expired(now):
                self.counters.expired += 1
                if expired is not None:
                    expired.append(entry)
                continue
            return entry

    def remove_message(self, message: Message) -> None:
        """Drop every entry of one message (its publication was refused)."""
        for entry in self.drain():
            if entry.message is not message:
                self._insert(entry)

    def drain(self) -> list[QueuedMessage]:
        """Remove and return every entry, visible or not (session end, queue deletion)."""
        entries = self.entries()
        self._ready.clear()
        self._heap.clear()
        self._delayed.clear()
        self.bytes = 0
        self.count = 0
        return entries

    def entries(self) -> list[QueuedMessage]:
        """A snapshot in no guaranteed order (browsing, persistence checks)."""
        return list(self._ready) + [e for _, _, e in self._heap] + [e for _, _, e in self._delayed]

    def next_visible_time(self) -> float | None:
        return self._delayed[0][0] if self._delayed else None

    def _insert(self, entry: QueuedMessage) -> None:
        message = entry.message
        self.bytes += len(message.payload) + len(message.topic)
        self.count += 1
        delivery_time = message.delivery_time
        if delivery_time is not None:
            heapq.heappush(self._delayed, (delivery_time, entry.sequence, entry))
        elif self.ordering == "priority":
            heapq.heappush(self._heap, (-entry.message.priority, entry.sequence, entry))
        else:
            self._ready.append(entry)

    def _release_delayed(self, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            entry = heapq.heappop(self._delayed)[2]
            # Visibility is this queue's state: the shared, immutable Message keeps its time.
            if self.ordering == "priority":
                heapq.heappush(self._heap, (-entry.message.priority, entry.sequence, entry))
            else:
                self._ready.append(entry)

    def _discard_oldest(self, needed_bytes: int, victims: list[QueuedMessage]) -> bool:
        """Drop oldest visible entries until the new one fits; False if it never can."""
        if needed_bytes > self.max_bytes:
            return False
        while len(self) >= self.max_messages or self.bytes + needed_bytes > self.max_bytes:
            if self._ready:
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
            self.bytes -= victim.size
            self.count -= 1
            self.counters.discarded += 1
            victims.append(victim)
        if self.counters.discarded == 1 or self.counters.discarded % 1000 == 0:
            log.warning(
                "queue %s full: discarded %d oldest so far", self.name, self.counters.discarded
            )
        return True
