"""JMS shared subscriptions in the core: one queue, each message to one consumer, and the
checks JMS 2.0 (section 8.3) makes across clients: while a subscription has consumers its
topic, selector and noLocal are fixed; an unused durable one asked for with others is
replaced."""

from __future__ import annotations

from typing import Any

from kittiwake.broker.consumers import Consumer, Delivery
from kittiwake.broker.queues import QueuedMessage
from kittiwake.broker.shared_subscriptions import (
    SharedDefinition,
    SharedRefusal,
    SharedSubscription,
    shared_client_id,
)
from kittiwake.selector import compile_selector

# The ``harness`` fixture (tests/unit/broker/conftest.py): a broker on a memory store.
Harness = Any


class RecordingLink:
    """A consumer's link that only remembers the payloads it was sent."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def tag(self, delivery: Delivery) -> int:
        if not delivery.tag:
            delivery.tag = delivery.id
        return delivery.tag

    def deliver(self, delivery: Delivery) -> None:
        self.payloads.append(delivery.entry.message.payload)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        self.payloads.append(entry.message.payload)

    def taken_over(self) -> None:
        raise AssertionError("a shared subscription's consumer is never taken over")


DURABLE = shared_client_id("client", "orders", durable=True)
VOLATILE = shared_client_id("$global", "work", durable=False)


def join(
    harness: Harness,
    client_id: str,
    topic: str,
    selector: str | None = None,
    *,
    durable: bool,
    credit: int = 10,
) -> tuple[SharedSubscription, Consumer, RecordingLink]:
    """A consumer joins (and, when it is the first, opens) a shared subscription."""
    registry = harness.broker.shared_subscriptions
    joined = registry.join(client_id, SharedDefinition.of(topic, selector), durable=durable)
    assert isinstance(joined, SharedSubscription), joined
    if joined.session is None:
        assert registry.open(joined) is None
    link = RecordingLink()
    consumer = joined.add(
        link,
        selector=None if selector is None else compile_selector(selector),
        no_local_origin=None,
        protocol_headers=None,
    )
    consumer.credit.available = credit
    joined.pump_now()
    return joined, consumer, link


def leave(
    harness: Harness, subscription: SharedSubscription, link: RecordingLink, **how: bool
) -> None:
    unsubscribe = how.get("unsubscribe", False)
    subscription.remove(link, unsubscribe=unsubscribe)
    harness.broker.shared_subscriptions.leave(subscription, unsubscribe=unsubscribe)


def test_each_message_goes_to_one_consumer(harness: Harness) -> None:
    _, _, first = join(harness, VOLATILE, "jobs", durable=False, credit=2)
    _, _, second = join(harness, VOLATILE, "jobs", durable=False, credit=2)
    for n in range(4):
        harness.publish("jobs", b"%d" % n, qos=1)
    assert sorted(first.payloads + second.payloads) == [b"0", b"1", b"2", b"3"]
    assert first.payloads and second.payloads


def test_a_consumer_with_another_selector_is_refused_while_others_consume(
    harness: Harness,
) -> None:
    join(harness, DURABLE, "orders", "n > 1", durable=True)
    registry = harness.broker.shared_subscriptions
    for other in (
        SharedDefinition.of("orders", "n > 2"),
        SharedDefinition.of("orders", None),
        SharedDefinition.of("other", "n > 1"),
        SharedDefinition.of("orders", "n > 1", no_local=True),
    ):
        assert isinstance(registry.join(DURABLE, other, durable=True), SharedRefusal), other
    # The same definition (whitespace aside) joins.
    same = registry.join(DURABLE, SharedDefinition.of("orders", " n > 1 "), durable=True)
    assert isinstance(same, SharedSubscription)


def test_a_volatile_subscription_with_another_selector_is_refused_too(harness: Harness) -> None:
    join(harness, VOLATILE, "jobs", durable=False)
    joined = harness.broker.shared_subscriptions.join(
        VOLATILE, SharedDefinition.of("jobs", "kind = 'x'"), durable=False
    )
    assert isinstance(joined, SharedRefusal)


def test_an_unused_durable_subscription_keeps_collecting_under_its_definition(
    harness: Harness,
) -> None:
    subscription, _, link = join(harness, DURABLE, "orders", durable=True)
    leave(harness, subscription, link)
    harness.publish("orders", b"kept", qos=1)
    _, _, again = join(harness, DURABLE, "orders", durable=True)
    assert again.payloads == [b"kept"]


def test_recreating_an_unused_durable_subscription_with_another_selector_replaces_it(
    harness: Harness,
) -> None:
    subscription, _, link = join(harness, DURABLE, "orders", durable=True)
    leave(harness, subscription, link)
    harness.publish("orders", b"for-the-old-one", qos=1, properties={"n": 5})
    _, _, again = join(harness, DURABLE, "orders", "n > 1", durable=True)
    assert again.payloads == [], "a new subscription: what the old one held is gone"
    harness.publish("orders", b"new", qos=1, properties={"n": 5})
    assert again.payloads == [b"new"]


def test_recreating_an_unused_durable_subscription_with_another_topic_replaces_it(
    harness: Harness,
) -> None:
    subscription, _, link = join(harness, DURABLE, "orders", durable=True)
    leave(harness, subscription, link)
    harness.publish("orders", b"old", qos=1)
    _, _, again = join(harness, DURABLE, "invoices", durable=True)
    harness.publish("orders", b"not-any-more", qos=1)
    harness.publish("invoices", b"new", qos=1)
    assert again.payloads == [b"new"]


def test_an_unsubscribed_durable_subscription_is_forgotten(harness: Harness) -> None:
    subscription, _, link = join(harness, DURABLE, "orders", durable=True)
    leave(harness, subscription, link, unsubscribe=True)
    registry = harness.broker.shared_subscriptions
    assert DURABLE not in registry.active and DURABLE not in registry.definitions
    assert DURABLE not in harness.broker.sessions


def test_a_name_held_by_an_unshared_durable_subscription_is_refused(harness: Harness) -> None:
    harness.connect(DURABLE, expiry=3600)  # an unshared durable subscriber holds the name
    registry = harness.broker.shared_subscriptions
    joined = registry.join(DURABLE, SharedDefinition.of("orders", None), durable=True)
    assert isinstance(joined, SharedSubscription)
    assert registry.open(joined) is not None
