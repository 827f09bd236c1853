"""Retained messages: one per topic, newest wins, an empty payload clears, expiry removes.

Knows nothing of subscriptions; the broker asks it which retained messages a new filter sees.
"""

from __future__ import annotations

import heapq

from kittiwake.broker.message import Message
from kittiwake.broker.topics import is_wildcard, topic_matches


class RetainedMessages:
    """The retained message of every topic that has one."""

    __slots__ = ("_by_topic", "_expiring")

    def __init__(self) -> None:
        self._by_topic: dict[str, Message] = {}
        # (expiry, tie-breaker, message) for messages that expire, so the periodic sweep
        # looks only at what is due instead of every retained message.
        self._expiring: list[tuple[float, int, Message]] = []

    def __len__(self) -> int:
        return len(self._by_topic)

    def __contains__(self, topic: str) -> bool:
        return topic in self._by_topic

    def get(self, topic: str) -> Message | None:
        return self._by_topic.get(topic)

    def messages(self) -> list[Message]:
        """Every retained message (a copy of the list: operators' views, not the hot path)."""
        return list(self._by_topic.values())

    def update(self, message: Message) -> Message | None:
        """Apply a retained publication; returns the message it replaced or cleared.

        A zero-length MQTT payload clears the topic and is not itself retained; an empty JMS
        message neither clears nor is retained (DESIGN.md §2).
        """
        if not message.payload:
            if message.clears_retained:
                return self._by_topic.pop(message.topic, None)
            return None
        previous = self._by_topic.get(message.topic)
        self._by_topic[message.topic] = message
        self._track(message)
        return previous

    def restore(self, message: Message) -> None:
        self._by_topic[message.topic] = message
        self._track(message)

    def _track(self, message: Message) -> None:
        if message.expiry is None:
            return
        heap = self._expiring
        if len(heap) > 2 * len(self._by_topic) + 1024:
            # Replaced messages linger in the heap until due; rebuild before they pile up.
            heap[:] = [e for e in heap if self._by_topic.get(e[2].topic) is e[2]]
            heapq.heapify(heap)
        heapq.heappush(heap, (message.expiry, id(message), message))

    def matching(self, topic_filter: str, now: float) -> list[Message]:
        """Unexpired retained messages a filter matches, oldest topic first."""
        if not is_wildcard(topic_filter):
            message = self._by_topic.get(topic_filter)
            if message is None or message.expired(now):
                return []
            return [message]
        return [
            message
            for topic, message in self._by_topic.items()
            if topic_matches(topic_filter, topic) and not message.expired(now)
        ]

    def remove_expired(self, now: float) -> list[Message]:
        """Drop expired messages; returns them so their stored copies can go too."""
        expired: list[Message] = []
        heap = self._expiring
        while heap and heap[0][0] <= now:
            message = heapq.heappop(heap)[2]
            # Only if it is still the topic's retained message (not replaced or cleared).
            if self._by_topic.get(message.topic) is message:
                del self._by_topic[message.topic]
                expired.append(message)
        return expired
