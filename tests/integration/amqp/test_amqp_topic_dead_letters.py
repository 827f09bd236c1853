"""Topic subscriptions (plain, durable, shared) over AMQP with python-qpid-proton: a message
that fails too often or is rejected goes to the dead-letter queue with its reason, original
destination and delivery count, as from a JMS queue; an offline durable subscription hands
out what it collected in priority order. (The module broker allows 3 delivery attempts.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import Message, Timeout
from proton.reactor import DurableSubscription
from proton.utils import BlockingConnection, BlockingReceiver

from ..clients import unique
from .test_amqp_queues import modified_failed
from .test_amqp_shared import shared

Connect = Callable[..., BlockingConnection]

MAX_ATTEMPTS = 3  # the module broker's max_delivery_attempts (conftest.py)


def dead_letter(connection: BlockingConnection, marker: str) -> Message:
    """The dead letter carrying property ``marker`` (the DLQ is shared by every test; other
    letters are consumed on the way)."""
    dead = connection.create_receiver("DLQ", credit=10)
    for _ in range(200):
        letter = dead.receive(timeout=5)
        dead.accept()
        if letter.properties.get("marker") == marker:
            dead.close()
            return letter
    raise AssertionError(f"no dead letter with marker {marker}")


def plain(connection: BlockingConnection, topic: str) -> BlockingReceiver:
    return connection.create_receiver(f"topic://{topic}", credit=1)


def durable(connection: BlockingConnection, topic: str) -> BlockingReceiver:
    return connection.create_receiver(
        f"topic://{topic}", name="sub", credit=1, options=DurableSubscription()
    )


def shared_durable(connection: BlockingConnection, topic: str) -> BlockingReceiver:
    return shared(connection, topic, "workers", global_=False, durable=True, credit=1)


def shared_volatile(connection: BlockingConnection, topic: str) -> BlockingReceiver:
    return shared(connection, topic, "workers|volatile1", global_=False, credit=1)


SUBSCRIPTIONS: dict[str, Callable[[BlockingConnection, str], BlockingReceiver]] = {
    "plain": plain,
    "durable": durable,
    "shared": shared_volatile,
    "shared durable": shared_durable,
}


@pytest.mark.parametrize("kind", list(SUBSCRIPTIONS))
def test_a_poison_message_is_dead_lettered_after_the_maximum(amqp: Connect, kind: str) -> None:
    topic, marker = unique("poison") + "/t", unique("marker")
    connection = amqp(container_id=unique("jms-client"))
    receiver = SUBSCRIPTIONS[kind](connection, topic)
    amqp().create_sender(f"topic://{topic}").send(
        Message(body="poison", durable=True, properties={"marker": marker})
    )
    for attempt in range(MAX_ATTEMPTS):
        assert receiver.receive(timeout=5).delivery_count == attempt
        modified_failed(receiver)
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)  # no further attempt
    letter = dead_letter(amqp(), marker)
    assert letter.body == "poison"
    assert letter.properties["KW_Reason"] == "maximum delivery attempts reached"
    assert letter.properties["KW_OriginalDestination"] == f"topic://{topic}"
    assert letter.properties["JMSXDeliveryCount"] == MAX_ATTEMPTS


@pytest.mark.parametrize("kind", ["plain", "durable", "shared"])
def test_a_rejected_message_is_dead_lettered(amqp: Connect, kind: str) -> None:
    topic, marker = unique("rejected") + "/t", unique("marker")
    connection = amqp(container_id=unique("jms-client"))
    receiver = SUBSCRIPTIONS[kind](connection, topic)
    amqp().create_sender(f"topic://{topic}").send(
        Message(body=b"bad", properties={"marker": marker})
    )
    receiver.receive(timeout=5)
    receiver.reject()
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)
    letter = dead_letter(amqp(), marker)
    assert bytes(letter.body) == b"bad"
    assert letter.properties["KW_Reason"] == "rejected"
    assert letter.properties["KW_OriginalDestination"] == f"topic://{topic}"
    assert letter.properties["JMSXDeliveryCount"] == 0


def test_an_offline_durable_subscription_delivers_in_priority_order(amqp: Connect) -> None:
    topic, client_id = unique("priority") + "/t", unique("jms-client")
    first = amqp(container_id=client_id)
    durable(first, topic)
    first.close()  # detached: the subscription collects
    sender = amqp().create_sender(f"topic://{topic}")
    for body, priority in (("low", 1), ("high", 9), ("mid", 4), ("high2", 9), ("low2", 1)):
        sender.send(Message(body=body, priority=priority, durable=True))
    again = amqp(container_id=client_id)
    receiver = durable(again, topic)
    got: list[Any] = []
    for _ in range(5):
        got.append(receiver.receive(timeout=5).body)
        receiver.accept()
    assert got == ["high", "high2", "mid", "low", "low2"]


def test_a_shared_subscription_orders_by_priority_before_its_consumer_attaches(
    amqp: Connect,
) -> None:
    """A shared durable subscription's queue is in priority order too: what waited while
    nobody consumed comes out highest first."""
    topic, client_id = unique("priority") + "/t", unique("jms-client")
    first = amqp(container_id=client_id)
    shared_durable(first, topic).link.detach()
    first.close()
    sender = amqp().create_sender(f"topic://{topic}")
    for body, priority in (("low", 0), ("high", 8), ("mid", 5)):
        sender.send(Message(body=body, priority=priority, durable=True))
    receiver = shared_durable(amqp(container_id=client_id), topic)
    got: list[Any] = []
    for _ in range(3):
        got.append(receiver.receive(timeout=5).body)
        receiver.accept()
    assert got == ["high", "mid", "low"]
