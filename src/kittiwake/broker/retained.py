"""Retained messages: one per topic, newest wins, an empty payload clears, expiry removes.

Knows nothing of subscriptions; the broker asks it which retained messages a new filter sees.
"""

from __future__ import annotations

from kittiwake.broker.message import Message
from kittiwake.broker.topics import is_wildcard, topic_matches


class RetainedMessages:
    """The retained message of every topic that has one."""

    __slots__ = ("_by_topic",)

    def __init__(self) -> None:
        self._by_topic: dict[str, Message] = {}

    def __len__(self) -> int:
        return len(self._by_topic)

    def __contains__(self, topic: str) -> bool:
        return topic in self._by_topic

    def get(self, topic: str) -> Message | None:
        return self._by_topic.get(topic)

    def update(self, message: Message) -> Message | None:
        """Apply a retained publication; returns the message it replaced or cleared.

        A zero-length payload clears the topic and is not itself retained (DESIGN.md §2).
        """
        if not message.payload:
            return self._by_topic.pop(message.topic, None)
        previous = self._by_topic.get(message.topic)
        self._by_topic[message.topic] = message
        return previous

    def restore(self, message: Message) -> None:
        self._by_topic[message.topic] = message

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
        expired = [m for m in self._by_topic.values() if m.expired(now)]
        for message in expired:
            del self._by_topic[message.topic]
        return expired
