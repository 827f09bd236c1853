"""Durable topic subscriptions (client id = container id, subscription name = link name):
they collect messages while no consumer is attached, survive a broker restart, refuse a second
consumer, and end on unsubscribe (a link closed rather than detached)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import Message, Timeout
from proton.reactor import DurableSubscription
from proton.utils import BlockingConnection, LinkDetached

from ..brokerproc import BrokerProcess
from ..clients import PahoClient, unique

Connect = Callable[..., BlockingConnection]


def subscribe(connection: BlockingConnection, topic: str, name: str, credit: int = 10) -> Any:
    return connection.create_receiver(
        f"topic://{topic}", name=name, credit=credit, options=DurableSubscription()
    )


def bodies(receiver: Any, count: int) -> list[Any]:
    got = []
    for _ in range(count):
        message = receiver.receive(timeout=5)
        receiver.accept()
        got.append(message.body if isinstance(message.body, str) else bytes(message.body))
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)
    return got


def test_collects_while_away_and_resumes(
    amqp: Connect, paho: Callable[..., PahoClient], amqp_broker: BrokerProcess
) -> None:
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    first = amqp(container_id=client_id)
    subscribe(first, topic, "sub")
    first.close()  # a connection drop detaches: the subscription stays
    amqp().create_sender(f"topic://{topic}").send(Message(body="while away", durable=True))
    paho(amqp_broker.address).publish(topic, b"from mqtt", qos=1)
    again = amqp(container_id=client_id)
    assert bodies(subscribe(again, topic, "sub"), 2) == ["while away", b"from mqtt"]


def test_a_second_consumer_is_refused(amqp: Connect) -> None:
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    subscribe(amqp(container_id=client_id), topic, "sub")
    with pytest.raises(LinkDetached, match="active consumer"):
        subscribe(amqp(container_id=client_id), topic, "sub")


def test_unsubscribe_ends_it(amqp: Connect) -> None:
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    connection = amqp(container_id=client_id)
    subscribe(connection, topic, "sub").link.detach()
    connection.close()
    sender = amqp().create_sender(f"topic://{topic}")
    sender.send(Message(body="before unsubscribe"))
    # Unsubscribe as Qpid JMS does: attach by name without a source, then close the link.
    lookup_connection = amqp(container_id=client_id)
    lookup = lookup_connection.create_receiver(None, name="sub")
    assert lookup.link.remote_source.address == topic
    lookup.close()
    sender.send(Message(body="after unsubscribe"))
    later = amqp(container_id=client_id)
    with pytest.raises(LinkDetached, match="not-found"):
        later.create_receiver(None, name="sub")
    # Subscribing again starts afresh: nothing from before.
    assert bodies(subscribe(amqp(container_id=client_id), topic, "sub"), 0) == []


def test_another_topic_replaces_the_subscription(amqp: Connect) -> None:
    first_topic, second_topic = unique("durable") + "/a", unique("durable") + "/b"
    client_id = unique("jms-client")
    connection = amqp(container_id=client_id)
    subscribe(connection, first_topic, "sub")
    connection.close()
    amqp().create_sender(f"topic://{first_topic}").send(Message(body="old topic"))
    again = amqp(container_id=client_id)
    receiver = subscribe(again, second_topic, "sub")
    amqp().create_sender(f"topic://{second_topic}").send(Message(body="new topic"))
    assert bodies(receiver, 1) == ["new topic"]


def test_survives_a_restart(
    broker: Callable[..., BrokerProcess], paho: Callable[..., PahoClient]
) -> None:
    process = broker(amqp=True)
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    connection = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
    subscribe(connection, topic, "sub")
    connection.close()
    sender = BlockingConnection(process.amqp_url, timeout=10)
    link = sender.create_sender(f"topic://{topic}")
    link.send(Message(body="kept", durable=True))
    link.send(Message(body="not kept", durable=False))
    sender.close()
    process.stop()
    process.start()
    again = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
    try:
        receiver = subscribe(again, topic, "sub")
        message = receiver.receive(timeout=5)
        receiver.accept()
        assert message.body in ("kept", b"kept")  # the type: see the next test
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.3)
    finally:
        again.close()


@pytest.mark.xfail(
    strict=True,
    reason="the store keeps no AMQP sections yet: a stored message comes back from a restart "
    "as a BytesMessage built from its core fields",
)
def test_a_text_message_keeps_its_type_across_a_restart(
    broker: Callable[..., BrokerProcess],
) -> None:
    process = broker(amqp=True)
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    connection = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
    subscribe(connection, topic, "sub")
    connection.close()
    sender = BlockingConnection(process.amqp_url, timeout=10)
    sender.create_sender(f"topic://{topic}").send(Message(body="text", durable=True))
    sender.close()
    process.stop()
    process.start()
    again = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
    try:
        assert subscribe(again, topic, "sub").receive(timeout=5).body == "text"
    finally:
        again.close()


def test_persistent_queue_messages_survive_a_restart(
    broker: Callable[..., BrokerProcess],
) -> None:
    process = broker(amqp=True)
    queue = unique("restart-queue")
    connection = BlockingConnection(process.amqp_url, timeout=10)
    sender = connection.create_sender(queue)
    sender.send(Message(body=b"in flight", durable=True, inferred=True))
    sender.send(Message(body=b"waiting", durable=True, inferred=True))
    sender.send(Message(body=b"not stored", durable=False, inferred=True))
    # No prefetch: receive() grants one credit, so exactly one message goes out.
    receiver = connection.create_receiver(queue, credit=0)
    assert bytes(receiver.receive(timeout=5).body) == b"in flight"  # never settled
    process.stop()
    connection.close()
    process.start()
    again = BlockingConnection(process.amqp_url, timeout=10)
    try:
        receiver = again.create_receiver(queue, credit=10)
        got = []
        for _ in range(2):
            message = receiver.receive(timeout=5)
            receiver.accept()
            got.append((bytes(message.body), message.delivery_count))
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.3)
        # The one that was in flight may have been seen: it comes back counted.
        assert got == [(b"in flight", 1), (b"waiting", 0)]
    finally:
        again.close()
