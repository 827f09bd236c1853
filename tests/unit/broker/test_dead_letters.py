"""Dead letters and expired entries move to their queues as messages that keep their body and
properties and gain their original destination, queue, the reason and the delivery count."""

from __future__ import annotations

from typing import Any

from kittiwake.broker.consumers import Consumer, Delivery, Settlement
from kittiwake.broker.dead_letters import (
    DELIVERY_COUNT,
    ORIGINAL_DESTINATION,
    ORIGINAL_QUEUE,
    REASON,
    DeadLetters,
)
from kittiwake.broker.destinations import Destination
from kittiwake.broker.message import Message, MessageProperties, PropertyType
from kittiwake.broker.queues import Queue, QueuedMessage, Removal
from kittiwake.broker.routing import Router
from kittiwake.clock import ManualClock
from kittiwake.config import QueuePattern, QueuesConfig


class Receiver:
    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []

    def deliver(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        raise AssertionError("nothing here is at most once")


def world(**dead_letter_settings: Any) -> tuple[Router, ManualClock]:
    """A router whose queues hand what they give up on to DeadLetters, as the broker wires it."""
    holder: list[DeadLetters] = []

    def new_queue(name: str) -> Queue:
        return Queue(
            name,
            max_messages=100,
            max_bytes=100_000,
            max_delivery_attempts=2,
            destination=Destination.queue(name),
            on_removed=lambda q, e, r: holder[0](q, e, r),
        )

    router = Router(new_queue)
    holder.append(DeadLetters(router, QueuesConfig(**dead_letter_settings)))
    return router, ManualClock()


def fail_twice(queue: Queue, clock: ManualClock) -> None:
    receiver = Receiver()
    consumer = Consumer(receiver, window=1)
    queue.attach(consumer)
    for _ in range(2):
        queue.dispatch(clock.now())
        queue.settle(receiver.deliveries.pop(), Settlement.MODIFIED)
    queue.detach(consumer)


def test_a_dead_letter_keeps_body_and_properties_and_says_where_and_why() -> None:
    router, clock = world()
    orders = router.queue("orders")
    original = Message(
        "orders",
        b"body",
        qos=2,
        persistent=True,
        priority=7,
        properties=MessageProperties(
            [("colour", "red", PropertyType.STRING), ("size", 3, PropertyType.SHORT)]
        ),
        expiry=clock.now() + 3600,
    )
    orders.push(QueuedMessage.of(original, 2))
    fail_twice(orders, clock)
    assert orders.count == 0
    (dead,) = router.queue("DLQ").entries()
    message = dead.message
    assert message is not original, "the original message is shared and never changes"
    assert (message.payload, message.priority, message.persistent) == (b"body", 7, True)
    assert message.properties is not None
    assert list(message.properties.typed_items()) == [
        ("colour", "red", PropertyType.STRING),
        ("size", 3, PropertyType.SHORT),
        (ORIGINAL_DESTINATION, "queue://orders", PropertyType.STRING),
        (ORIGINAL_QUEUE, "orders", PropertyType.STRING),
        (REASON, Removal.DELIVERY_LIMIT.value, PropertyType.STRING),
        (DELIVERY_COUNT, 2, PropertyType.INT),
    ]
    assert message.expiry is None and message.message_id == 0
    assert original.properties is not None and dict(original.properties) == {
        "colour": "red",
        "size": 3,
    }


def test_a_rejected_entry_of_a_subscription_queue_names_its_topic() -> None:
    router, clock = world()
    subscription = router.queue("sub")
    subscription.destination = None  # fed by a binding, as a durable subscription is
    subscription.push(QueuedMessage.of(Message("sensors/1", b"x", qos=1, persistent=True), 1))
    receiver = Receiver()
    subscription.attach(Consumer(receiver, window=1))
    subscription.dispatch(clock.now())
    subscription.settle(receiver.deliveries[0], Settlement.REJECTED)
    (dead,) = router.queue("DLQ").entries()
    assert dead.message.properties[ORIGINAL_DESTINATION] == "topic://sensors/1"
    assert dead.message.properties[REASON] == "rejected"
    assert dead.message.properties[DELIVERY_COUNT] == 0


def test_a_pattern_names_one_dead_letter_queue_per_queue() -> None:
    router, clock = world(dead_letter_queue="DLQ.{queue}")
    orders = router.queue("orders")
    orders.push(QueuedMessage.of(Message("orders", b"x", qos=1), 1))
    fail_twice(orders, clock)
    assert [e.message.payload for e in router.queue("DLQ.orders").entries()] == [b"x"]
    assert "DLQ" not in router.queues


def test_expired_entries_move_to_the_expiry_queue_and_stay_there() -> None:
    router, clock = world()
    orders = router.queue("orders")
    orders.push(QueuedMessage.of(Message("orders", b"old", expiry=clock.now() + 1), 0))
    clock.advance(5)
    assert orders.expire(clock.now()) == 1
    assert orders.counters.expired == 1
    (moved,) = router.queue("ExpiryQueue").entries()
    assert moved.message.properties[REASON] == "expired"
    assert router.queue("ExpiryQueue").expire(clock.now() + 10**6) == 0


def test_without_an_expiry_queue_expired_entries_are_only_counted() -> None:
    router, clock = world(expiry_queue="")
    orders = router.queue("orders")
    orders.push(QueuedMessage.of(Message("orders", b"old", expiry=clock.now() + 1), 0))
    clock.advance(5)
    orders.expire(clock.now())
    assert orders.counters.expired == 1
    assert set(router.queues) == {"orders"}


def test_the_dead_letter_queue_does_not_dead_letter_into_itself() -> None:
    router, clock = world()
    dlq = router.queue("DLQ")
    dlq.push(QueuedMessage.of(Message("DLQ", b"x"), 0))
    fail_twice(dlq, clock)
    assert dlq.count == 0 and dlq.counters.dead_lettered == 1


def test_a_pattern_never_names_a_queue_of_the_brokers_own_namespace() -> None:
    """A subscription's queue has a broker name (``$session/...``); a pattern that starts with
    the original queue's name must still name an ordinary queue, one that a restart recovers
    (names starting with ``$`` are the broker's own and are not recovered as queues)."""
    router, clock = world(dead_letter_queue="{queue}.DLQ")
    subscription = router.queue("$session/$durable/app/audit")
    subscription.push(QueuedMessage.of(Message("audit/1", b"x", qos=1), 1))
    fail_twice(subscription, clock)
    (name,) = [n for n in router.queues if n.endswith(".DLQ")]
    assert not name.startswith("$")
    assert [e.message.payload for e in router.queue(name).entries()] == [b"x"]


def test_a_pattern_gives_matching_queues_their_own_dead_letter_and_expiry_queues() -> None:
    """DESIGN.md section 5: dead-letter and expiry queues per queue name pattern; the first
    pattern that matches applies, what it leaves out keeps the [queues] value."""
    router, clock = world(
        patterns=(
            QueuePattern("orders/#", dead_letter_queue="DLQ.{queue}"),
            QueuePattern("audit/+", expiry_queue=""),
        )
    )
    orders = router.queue("orders/eu")
    orders.push(QueuedMessage.of(Message("orders/eu", b"o", qos=1), 1))
    fail_twice(orders, clock)
    other = router.queue("billing")
    other.push(QueuedMessage.of(Message("billing", b"b", qos=1), 1))
    fail_twice(other, clock)
    assert [e.message.payload for e in router.queue("DLQ.orders/eu").entries()] == [b"o"]
    assert [e.message.payload for e in router.queue("DLQ").entries()] == [b"b"]
    audit = router.queue("audit/1")
    audit.push(QueuedMessage.of(Message("audit/1", b"a", expiry=clock.now() + 1), 0))
    orders.push(QueuedMessage.of(Message("orders/eu", b"late", expiry=clock.now() + 1), 0))
    clock.advance(2)
    audit.expire(clock.now())
    orders.expire(clock.now())
    # audit/+ drops its expired entries; orders/# keeps the default expiry queue.
    assert [e.message.payload for e in router.queue("ExpiryQueue").entries()] == [b"late"]
    assert audit.counters.expired == 1
