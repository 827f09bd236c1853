"""Queue rules a front end asks for when it connects a subscription's session (JMS topic
subscriptions: priority order and dead letters, as a JMS queue has); MQTT sessions keep the
defaults (FIFO, nothing dead-lettered)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kittiwake.broker.consumers import Settlement
from kittiwake.broker.dead_letters import DELIVERY_COUNT, ORIGINAL_DESTINATION, REASON
from kittiwake.broker.message import Message
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.broker.queues import DEFAULT_QUEUE_RULES, Queue, QueuedMessage, QueueRules
from kittiwake.broker.sessions import NEVER_EXPIRES, Session

# The ``harness`` fixtures and their consumer (tests/unit/broker/conftest.py).
Harness = Any
Link = Any

JMS_RULES = QueueRules(ordering="priority", dead_letters=True)


def connect(
    harness: Harness, client_id: str, *, durable: bool = True, window: int = 10
) -> tuple[Session, Link]:
    """Connect a session as the AMQP front end connects a JMS topic subscription's."""
    session, link, _ = harness.connect(
        client_id,
        clean_start=False,
        expiry=NEVER_EXPIRES if durable else 0,
        window=window,
        queue_rules=JMS_RULES,
    )
    return session, link


def publish(harness: Harness, topic: str, payload: bytes, **fields: Any) -> Message:
    message: Message = harness.publish(topic, payload, qos=1, **fields)
    return message


def dead_letters(destinations: QueueDestinations, name: str = "DLQ") -> list[QueuedMessage]:
    return destinations.queue(name).entries()


def with_destinations(
    make_harness: Callable[..., Harness], **queues: Any
) -> tuple[Harness, QueueDestinations]:
    harness = make_harness(queues=queues)
    return harness, QueueDestinations(harness.broker)


def test_priority_order_for_what_waited_while_offline(harness: Harness) -> None:
    session, _ = connect(harness, "$durable/c/s")
    harness.subscribe(session, "t", qos=2)
    harness.broker.disconnect(session, publish_will=False)
    for payload, priority in ((b"low", 1), (b"high", 9), (b"mid", 4), (b"high2", 9)):
        publish(harness, "t", payload, priority=priority)
    _, link = connect(harness, "$durable/c/s")
    assert link.payloads == [b"high", b"high2", b"mid", b"low"]


def test_an_mqtt_session_stays_fifo(harness: Harness) -> None:
    session, _, _ = harness.connect("mqtt", clean_start=False, expiry=60)
    harness.subscribe(session, "t", qos=1)
    harness.broker.disconnect(session, publish_will=False)
    for payload, priority in ((b"low", 1), (b"high", 9), (b"mid", 4)):
        publish(harness, "t", payload, priority=priority)
    _, link, _ = harness.connect("mqtt", clean_start=False, expiry=60)
    assert link.payloads == [b"low", b"high", b"mid"]
    assert session.queue_rules is DEFAULT_QUEUE_RULES


def test_failed_too_often_goes_to_the_dead_letter_queue(
    make_harness: Callable[..., Harness],
) -> None:
    harness, destinations = with_destinations(make_harness, max_delivery_attempts=3)
    session, link = connect(harness, "sub", durable=False)
    harness.subscribe(session, "orders/new", qos=2)
    publish(harness, "orders/new", b"poison", priority=7)
    for attempt in range(3):
        delivered = link.deliveries[-1]
        assert delivered.entry.delivery_count == attempt
        assert delivered.delivery is not None
        harness.broker.settle(session, delivered.delivery, Settlement.MODIFIED)
    assert len(link.deliveries) == 3  # no fourth attempt
    (letter,) = dead_letters(destinations)
    properties = letter.message.properties
    assert properties is not None
    assert letter.message.payload == b"poison" and letter.message.priority == 7
    assert properties.get(REASON) == "maximum delivery attempts reached"
    assert properties.get(DELIVERY_COUNT) == 3
    assert properties.get(ORIGINAL_DESTINATION) == "topic://orders/new"
    assert not session.queue.count and not session.consumer.unsettled


def test_rejected_goes_to_the_dead_letter_queue(make_harness: Callable[..., Harness]) -> None:
    harness, destinations = with_destinations(make_harness)
    session, link = connect(harness, "$durable/c/s")
    harness.subscribe(session, "t", qos=2)
    publish(harness, "t", b"bad")
    delivered = link.deliveries[0].delivery
    assert delivered is not None
    assert harness.broker.settle(session, delivered, Settlement.REJECTED)[0]
    (letter,) = dead_letters(destinations)
    assert letter.message.properties is not None
    assert letter.message.properties.get(REASON) == "rejected"
    # Stored: the dead letter in the DLQ, nothing left in the subscription's queue.
    assert [name for name, _ in harness.store.queued] == ["DLQ"]


def test_expired_goes_to_the_expiry_queue(make_harness: Callable[..., Harness]) -> None:
    harness, destinations = with_destinations(make_harness)
    session, _ = connect(harness, "$durable/c/s")
    harness.subscribe(session, "t", qos=2)
    harness.broker.disconnect(session, publish_will=False)
    publish(harness, "t", b"stale", expiry_in=5)
    harness.advance(10)
    _, link = connect(harness, "$durable/c/s")
    assert link.payloads == []
    (moved,) = dead_letters(destinations, "ExpiryQueue")
    assert moved.message.payload == b"stale"
    assert moved.message.properties is not None
    assert moved.message.properties.get(REASON) == "expired"


def test_an_mqtt_session_never_dead_letters(make_harness: Callable[..., Harness]) -> None:
    harness, destinations = with_destinations(make_harness, max_delivery_attempts=2)
    session, link, _ = harness.connect("mqtt", window=1)
    harness.subscribe(session, "t", qos=1)
    publish(harness, "t", b"again")
    for _ in range(4):
        delivered = link.deliveries[-1].delivery
        assert delivered is not None
        harness.broker.settle(session, delivered, Settlement.MODIFIED)
    assert len(link.deliveries) == 5  # no limit: still delivered
    assert dead_letters(destinations) == []


def test_rules_survive_a_restart(make_harness: Callable[..., Harness]) -> None:
    harness, _ = with_destinations(make_harness, max_delivery_attempts=2)
    session, _ = connect(harness, "$durable/c/s")
    harness.subscribe(session, "t", qos=2)
    harness.broker.disconnect(session, publish_will=False)
    for payload, priority in ((b"low", 1), (b"high", 9), (b"mid", 4)):
        publish(harness, "t", payload, priority=priority)
    again = harness.restart()
    destinations = QueueDestinations(again.broker)
    recovered = again.broker.sessions["$durable/c/s"]
    assert recovered.queue_rules == JMS_RULES
    assert recovered.queue.max_delivery_attempts == 2
    session, link = connect(again, "$durable/c/s", window=1)
    assert link.payloads == [b"high"]
    for _ in range(2):
        delivered = link.deliveries[-1].delivery
        assert delivered is not None
        again.broker.settle(session, delivered, Settlement.MODIFIED)
    assert [e.message.payload for e in dead_letters(destinations)] == [b"high"]
    assert link.payloads[-1] == b"mid"


def test_reorder_keeps_arrival_order_within_a_priority() -> None:
    queue = Queue("q", max_messages=10, max_bytes=10_000)
    for payload, priority in ((b"a", 1), (b"b", 9), (b"c", 1), (b"d", 9)):
        queue.push(
            QueuedMessage.of(Message(topic="t", payload=payload, qos=1, priority=priority), 1)
        )
    queue.reorder("priority")
    order = [queue.pop(0.0) for _ in range(4)]
    assert [e.message.payload for e in order if e is not None] == [b"b", b"d", b"a", b"c"]


def test_an_unattended_subscription_moves_expired_entries_on(
    make_harness: Callable[..., Harness],
) -> None:
    """Nobody consumes from the durable subscription: the tick sweeps its expired entries to
    the expiry queue, as it sweeps a queue without consumers (an MQTT session keeps its own
    until it pops them)."""
    harness, destinations = with_destinations(make_harness)
    session, _ = connect(harness, "$durable/c/s")
    harness.subscribe(session, "t", qos=2)
    harness.broker.disconnect(session, publish_will=False)
    mqtt, _, _ = harness.connect("mqtt", clean_start=False, expiry=3600)
    harness.subscribe(mqtt, "t", qos=1)
    harness.broker.disconnect(mqtt, publish_will=False)
    publish(harness, "t", b"stale", expiry_in=5)
    publish(harness, "t", b"fresh")
    harness.advance(10)
    assert [e.message.payload for e in dead_letters(destinations, "ExpiryQueue")] == [b"stale"]
    assert [e.message.payload for e in session.queue.entries()] == [b"fresh"]
    assert session.queue.counters.expired == 1 and mqtt.queue.counters.expired == 0
    # Attached again, it is no longer swept by the tick (its dispatch drops what expires).
    connect(harness, "$durable/c/s")
    assert session not in harness.broker.unattended
