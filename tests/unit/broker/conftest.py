"""Shared helpers for the protocol-free core tests: a recording consumer and a broker harness.

Tests drive :class:`~kittiwake.broker.broker.Broker` directly (no sockets), move time with a
:class:`~kittiwake.clock.ManualClock` and keep durable state in a
:class:`~kittiwake.broker.store.MemoryStore` they can inspect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kittiwake.broker.broker import Broker, Subscribed, SubscribeRefusal, SubscriptionOptions
from kittiwake.broker.consumers import Delivery, DeliveryState
from kittiwake.broker.message import Message
from kittiwake.broker.queues import DEFAULT_QUEUE_RULES, QueuedMessage, QueueRules
from kittiwake.broker.sessions import Session
from kittiwake.broker.store import MemoryStore
from kittiwake.clock import ManualClock
from kittiwake.config import Config, config_from_dict


@dataclass(slots=True)
class Delivered:
    """One PUBLISH the broker asked the front end to send, as the front end saw it."""

    # The wire id (what an MQTT packet id would be); 0 for QoS 0.
    delivery_id: int
    entry: QueuedMessage
    resend: bool
    # The core's delivery, to settle it with; None for QoS 0.
    delivery: Delivery | None = None

    @property
    def payload(self) -> bytes:
        return self.entry.message.payload

    @property
    def topic(self) -> str:
        return self.entry.message.topic

    @property
    def qos(self) -> int:
        return self.entry.qos

    @property
    def retain(self) -> bool:
        return self.entry.retain


class RecordingConsumer:
    """A SessionLink that only remembers what the broker asked of it.

    Like a front end, it gives each delivery a wire id once (sequential ints here) and keeps
    the delivery under that id, so tests settle by the id they saw.
    """

    def __init__(self) -> None:
        self.deliveries: list[Delivered] = []
        self.releases: list[int] = []
        self.taken_over_calls = 0
        self.by_id: dict[int, Delivery] = {}
        self._last_id = 0

    def tag(self, delivery: Delivery) -> int:
        if not delivery.tag:
            self._last_id += 1
            delivery.tag = self._last_id
        self.by_id[delivery.tag] = delivery
        return delivery.tag

    def deliver(self, delivery: Delivery) -> None:
        wire_id = self.tag(delivery)
        if delivery.state is DeliveryState.RECEIVED:
            self.releases.append(wire_id)
            return
        self.deliveries.append(Delivered(wire_id, delivery.entry, delivery.redelivered, delivery))

    def deliver_settled(self, entry: QueuedMessage) -> None:
        self.deliveries.append(Delivered(0, entry, False))

    def taken_over(self) -> None:
        self.taken_over_calls += 1

    def delivery(self, wire_id: int) -> Delivery:
        """The delivery sent under ``wire_id`` (a KeyError if there is none)."""
        return self.by_id[wire_id]

    @property
    def payloads(self) -> list[bytes]:
        return [d.payload for d in self.deliveries]

    def clear(self) -> None:
        self.deliveries.clear()
        self.releases.clear()


class Harness:
    """A broker on a manual clock and a memory store, with short spellings for the core calls."""

    def __init__(self, config: Config | None = None) -> None:
        self.clock = ManualClock()
        self.store = MemoryStore()
        self.broker = Broker(config, clock=self.clock, store=self.store)

    def connect(
        self,
        client_id: str,
        *,
        clean_start: bool = True,
        expiry: int = 0,
        window: int = 100,
        will: Message | None = None,
        will_delay: int = 0,
        will_expiry: int | None = None,
        consumer: RecordingConsumer | None = None,
        start: bool = True,
        queue_rules: QueueRules = DEFAULT_QUEUE_RULES,
    ) -> tuple[Session, RecordingConsumer, bool]:
        """Connect (and, like a front end after CONNACK, start delivery)."""
        consumer = consumer or RecordingConsumer()
        session, present, _ = self.broker.connect(
            client_id,
            consumer,
            clean_start=clean_start,
            expiry_interval=expiry,
            window=window,
            will=will,
            will_delay=will_delay,
            will_expiry=will_expiry,
            queue_rules=queue_rules,
        )
        if start:
            self.broker.start_delivery(session)
        return session, consumer, present

    def subscribe(
        self, session: Session, full_filter: str, qos: int = 0, **options: Any
    ) -> Subscribed:
        """Subscribe and, like a front end after SUBACK, send the retained messages."""
        result = self.broker.subscribe(
            session, full_filter, SubscriptionOptions(max_qos=qos, **options)
        )
        assert isinstance(result, Subscribed), result
        self.broker.send_retained(result)
        return result

    def try_subscribe(
        self, session: Session, full_filter: str, qos: int = 0
    ) -> Subscribed | SubscribeRefusal:
        return self.broker.subscribe(session, full_filter, SubscriptionOptions(max_qos=qos))

    def publish(
        self,
        topic: str,
        payload: bytes = b"x",
        qos: int = 0,
        *,
        retain: bool = False,
        persistent: bool | None = None,
        origin: str | None = None,
        expiry_in: float | None = None,
        **fields: Any,
    ) -> Message:
        """Publish like an MQTT front end: QoS 1 and 2 are persistent unless told otherwise."""
        message = Message(
            topic=topic,
            payload=payload,
            qos=qos,
            retain=retain,
            persistent=qos > 0 if persistent is None else persistent,
            origin=origin,
            expiry=None if expiry_in is None else self.clock.now() + expiry_in,
            **fields,
        )
        assert self.broker.publish(message) is None  # MemoryStore commits at once
        return message

    def restart(self) -> Harness:
        """A new broker over this one's store, recovered as at process start."""
        again = Harness.__new__(Harness)
        again.clock = ManualClock(self.clock.now(), self.clock.wall_ms())
        again.store = self.store
        again.broker = Broker(self.broker.config, clock=again.clock, store=self.store)
        again.broker.recover()
        return again

    def ack(self, session: Session, consumer: RecordingConsumer, wire_id: int) -> bool:
        """Acknowledge what ``consumer`` received under ``wire_id`` (a PUBACK or PUBCOMP)."""
        delivery = consumer.by_id.get(wire_id)
        return delivery is not None and self.broker.acknowledge(session, delivery)[0]

    def received(self, session: Session, consumer: RecordingConsumer, wire_id: int) -> bool:
        """The client holds what it got under ``wire_id`` (a PUBREC)."""
        delivery = consumer.by_id.get(wire_id)
        return delivery is not None and self.broker.received(session, delivery)[0]

    def advance(self, seconds: float) -> None:
        """Move time and fire the broker's due timers, as the tick loop would."""
        self.clock.advance(seconds)
        self.broker.tick()


@pytest.fixture
def harness() -> Harness:
    return Harness()


@pytest.fixture
def make_harness() -> Callable[..., Harness]:
    """Build a harness from a config written as nested dicts (the TOML shape)."""

    def make(**raw: Any) -> Harness:
        return Harness(config_from_dict(raw))

    return make
