"""The broker's message: everything MQTT and JMS need to say about one publication.

A Message is immutable once published; per-subscriber state (QoS granted, retain flag on the
wire, delivery count) lives in :class:`~kittiwake.broker.queues.QueuedMessage`, never here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# JMS default priority; MQTT has no priority, so every MQTT message carries this.
DEFAULT_PRIORITY = 4


@dataclass(slots=True, eq=False)
class Message:
    """One publication as the core sees it, with no protocol's wire form."""

    topic: str
    payload: bytes
    # The publisher's reliability, on the MQTT scale: 0 at most once, 1 at least once,
    # 2 exactly once. JMS maps PERSISTENT to 2, NON_PERSISTENT to 1, acks disabled to 0.
    qos: int = 0
    retain: bool = False
    # Persistent messages go through the store before the publisher is acknowledged.
    persistent: bool = False
    priority: int = DEFAULT_PRIORITY
    # Absolute clock times (see kittiwake.clock); None = never expires / deliver now.
    expiry: float | None = None
    delivery_time: float | None = None
    # When the broker accepted it (clock time); message expiry is forwarded relative to it.
    created: float = 0.0
    # The connection that published it, for noLocal; None for broker-made messages.
    origin: str | None = None
    # Typed application properties (JMS); MQTT 5 user properties are kept apart because
    # their order and repetition matter on the wire.
    properties: dict[str, Any] = field(default_factory=dict)
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    payload_format_indicator: int | None = None
    # Assigned by the broker when a persistent message is journalled; 0 = not stored.
    message_id: int = 0
    # Front ends memoize wire encodings here so a fan-out encodes once, not once per subscriber.
    encoded: dict[object, bytes] | None = None
    # Set while the commit that makes it durable is pending: stored copies are not dispatched
    # before it (persist -> acknowledge -> dispatch), whatever triggers a pump meanwhile.
    awaiting_commit: bool = False

    @property
    def size(self) -> int:
        """Bytes this message costs a queue's byte budget (payload and topic dominate)."""
        return len(self.payload) + len(self.topic)

    def expired(self, now: float) -> bool:
        return self.expiry is not None and now >= self.expiry

    def remaining_expiry(self, now: float) -> int | None:
        """Whole seconds left before expiry, as MQTT 5 forwards it; None = no expiry."""
        if self.expiry is None:
            return None
        return max(0, int(self.expiry - now + 0.999))
