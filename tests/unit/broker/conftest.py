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
from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage
from kittiwake.broker.sessions import Session
from kittiwake.broker.store import MemoryStore
from kittiwake.clock import ManualClock
from kittiwake.config import Config, config_from_dict


@dataclass(slots=True)
class Delivered:
    """One call of SessionConsumer.deliver, as the front end would have seen it."""

    delivery_id: int
    entry: QueuedMessage
    resend: bool

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
    """A SessionConsumer that only remembers what the broker asked of it."""

    def __init__(self) -> None:
        self.deliveries: list[Delivered] = []
        self.releases: list[int] = []
        self.taken_over_calls = 0

    def deliver(self, delivery_id: int, entry: QueuedMessage, *, resend: bool = False) -> None:
        self.deliveries.append(Delivered(delivery_id, entry, resend))

    def release(self, delivery_id: int) -> None:
        self.releases.append(delivery_id)

    def taken_over(self) -> None:
        self.taken_over_calls += 1

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
