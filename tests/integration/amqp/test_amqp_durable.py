"""Durable topic subscriptions (client id = container id, subscription name = link name):
they collect messages while no consumer is attached, survive a broker restart, refuse a second
consumer, and end on unsubscribe (a link closed rather than detached)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import Message, Timeout, byte, short, symbol
from proton.reactor import DurableSubscription, Selector
from proton.utils import BlockingConnection, LinkDetached

from ..brokerproc import BrokerProcess
from ..clients import PahoClient, unique
from .test_amqp_mqtt_interop import NoLocal

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


def test_unsubscribing_while_a_consumer_is_active_is_refused(amqp: Connect) -> None:
    """The lookup by name that begins an unsubscribe (as Qpid JMS does it) is refused with
    amqp:resource-locked while the subscription has a consumer; the subscription goes on."""
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    consumer_connection = amqp(container_id=client_id)
    active = subscribe(consumer_connection, topic, "sub")
    with pytest.raises(LinkDetached) as refused:
        amqp(container_id=client_id).create_receiver(None, name="sub")
    assert refused.value.condition == "amqp:resource-locked"
    assert "active consumer" in str(refused.value)
    sender = amqp().create_sender(f"topic://{topic}")
    sender.send(Message(body="still subscribed"))
    assert bodies(active, 1) == ["still subscribed"]
    consumer_connection.close()  # a detach: the subscription stays
    sender.send(Message(body="while away"))
    again = subscribe(amqp(container_id=client_id), topic, "sub")
    assert bodies(again, 1) == ["while away"]


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


def selective(connection: BlockingConnection, topic: str, name: str, selector: str) -> Any:
    return connection.create_receiver(
        f"topic://{topic}",
        name=name,
        credit=10,
        options=[DurableSubscription(), Selector(selector)],
    )


def numbered(n: int) -> Message:
    return Message(body=str(n), properties={"n": n})


def test_another_selector_replaces_the_subscription(amqp: Connect) -> None:
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    first = amqp(container_id=client_id)
    selective(first, topic, "sub", "n > 1")
    first.close()
    sender = amqp().create_sender(f"topic://{topic}")
    sender.send(numbered(0))
    sender.send(numbered(5))
    receiver = selective(amqp(container_id=client_id), topic, "sub", "n < 3")
    sender.send(numbered(1))
    sender.send(numbered(4))
    assert bodies(receiver, 1) == ["1"]


def test_another_selector_with_an_active_consumer_is_refused(amqp: Connect) -> None:
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    active = selective(amqp(container_id=client_id), topic, "sub", "n > 1")
    with pytest.raises(LinkDetached, match="active consumer"):
        selective(amqp(container_id=client_id), topic, "sub", "n < 3")
    amqp().create_sender(f"topic://{topic}").send(numbered(5))
    assert bodies(active, 1) == ["5"], "the subscription is unchanged"


def test_a_lookup_by_name_keeps_the_subscription_as_it_is(amqp: Connect) -> None:
    """Attaching by name without a source (how Qpid JMS finds one to unsubscribe) asks for
    no definition: a detach afterwards leaves the subscription, selector and all."""
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    first = amqp(container_id=client_id)
    selective(first, topic, "sub", "n > 1")
    first.close()
    amqp().create_sender(f"topic://{topic}").send(numbered(5))
    lookup_connection = amqp(container_id=client_id)
    lookup = lookup_connection.create_receiver(None, name="sub", credit=0)
    assert lookup.link.remote_source.address == topic
    lookup.link.detach()
    lookup_connection.close()
    again = selective(amqp(container_id=client_id), topic, "sub", "n > 1")
    assert bodies(again, 1) == ["5"]


def test_a_lookup_by_name_consumes_with_the_stored_selector(amqp: Connect) -> None:
    """A receiver attached by name without a source (Qpid JMS's reattach lookup) consumes the
    subscription as it was defined: its stored selector still chooses what it gets."""
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    first = amqp(container_id=client_id)
    selective(first, topic, "sub", "n > 1")
    first.close()
    sender = amqp().create_sender(f"topic://{topic}")
    sender.send(numbered(0))
    sender.send(numbered(5))
    lookup = amqp(container_id=client_id).create_receiver(None, name="sub", credit=10)
    assert lookup.link.remote_source.address == topic
    answered = lookup.link.remote_source.filter
    answered.rewind()
    answered.next()
    filters = answered.get_object()
    assert filters[symbol("jms-selector")].value == "n > 1", "answered with its own source"
    sender.send(numbered(1))
    sender.send(numbered(7))
    assert bodies(lookup, 2) == ["5", "7"]


def test_a_lookup_by_name_consumes_with_the_stored_no_local(amqp: Connect) -> None:
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    first = amqp(container_id=client_id)
    first.create_receiver(
        f"topic://{topic}", name="sub", credit=10, options=[DurableSubscription(), NoLocal()]
    )
    first.close()
    connection = amqp(container_id=client_id)
    lookup = connection.create_receiver(None, name="sub", credit=10)
    connection.create_sender(f"topic://{topic}").send(Message(body="mine"))
    amqp().create_sender(f"topic://{topic}").send(Message(body="theirs"))
    assert bodies(lookup, 1) == ["theirs"]


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


def test_queue_messages_keep_their_amqp_form_across_a_restart(
    broker: Callable[..., BrokerProcess],
) -> None:
    """Text, map, list, binary-value and data bodies come back as they were sent, with their
    JMS message type, ids, subject and application properties."""
    process = broker(amqp=True)
    queue = unique("restart-forms")
    jms_type = symbol("x-opt-jms-msg-type")
    sent = [
        Message(body="text", annotations={jms_type: byte(5)}, id="ID:1", subject="order"),
        Message(body={"k": 1, "s": "v"}, annotations={jms_type: byte(2)}, correlation_id="c2"),
        Message(body=[1, "two"], annotations={jms_type: byte(4)}, reply_to="queue://replies"),
        Message(body=b"raw", annotations={jms_type: byte(3)}, properties={"n": short(7)}),
        Message(body=b"inferred", inferred=True, properties={"flag": True}),
    ]
    connection = BlockingConnection(process.amqp_url, timeout=10)
    sender = connection.create_sender(queue)
    for message in sent:
        message.durable = True
        sender.send(message)
    connection.close()
    process.stop()
    process.start()
    again = BlockingConnection(process.amqp_url, timeout=10)
    try:
        receiver = again.create_receiver(queue, credit=10)
        for want in sent:
            got = receiver.receive(timeout=5)
            receiver.accept()
            body = bytes(got.body) if isinstance(got.body, memoryview) else got.body
            assert (body, got.inferred) == (want.body, want.inferred)
            assert type(body) is type(want.body)
            assert (got.annotations or {}).get(jms_type) == (want.annotations or {}).get(jms_type)
            assert (got.id, got.correlation_id, got.subject, got.reply_to) == (
                want.id, want.correlation_id, want.subject, want.reply_to,
            )
            assert got.properties == want.properties
            assert [type(v) for v in (got.properties or {}).values()] == [
                type(v) for v in (want.properties or {}).values()
            ]
    finally:
        again.close()


def test_a_shared_durable_subscription_survives_a_restart(
    broker: Callable[..., BrokerProcess],
) -> None:
    """What it collected, and what was in flight to one of its consumers (counted), come
    back to a consumer after a restart."""
    from .test_amqp_shared import shared

    process = broker(amqp=True)
    topic = unique("shared-durable") + "/t"
    connection = BlockingConnection(process.amqp_url, timeout=10)
    receiver = shared(connection, topic, "keep|global", global_=True, durable=True, credit=0)
    sender = connection.create_sender(f"topic://{topic}")
    sender.send(Message(body="in flight", durable=True))
    sender.send(Message(body="waiting", durable=True))
    assert receiver.receive(timeout=5).body == "in flight"  # never settled
    process.stop()
    connection.close()
    process.start()
    again = BlockingConnection(process.amqp_url, timeout=10)
    try:
        receiver = shared(again, topic, "keep|global", global_=True, durable=True)
        got = []
        for _ in range(2):
            message = receiver.receive(timeout=5)
            receiver.accept()
            got.append((message.body, message.delivery_count))
        assert got == [("in flight", 1), ("waiting", 0)]
    finally:
        again.close()


def test_no_local_after_a_restart_leaves_in_what_another_connection_stored(
    broker: Callable[..., BrokerProcess],
) -> None:
    """A connection without a client id (no sole-connection-for-container) is its own origin
    for noLocal. Connection ids count again from the start after a restart, so a stored
    message's origin must not name the new run's connection that happens to get the same
    number: here the subscriber's resumed connection is numbered as the publisher was."""
    process = broker(amqp=True)
    topic, client_id = unique("durable") + "/t", unique("jms-client")
    first = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
    first.create_receiver(
        f"topic://{topic}", name="sub", credit=10, options=[DurableSubscription(), NoLocal()]
    )
    first.close()  # the run's connection 1
    sender = BlockingConnection(process.amqp_url, timeout=10)  # connection 2
    sender.create_sender(f"topic://{topic}").send(Message(body="theirs", durable=True))
    sender.close()
    process.stop()
    process.start()
    spacer = BlockingConnection(process.amqp_url, timeout=10)  # the new run's connection 1
    again = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)  # 2
    try:
        receiver = again.create_receiver(
            f"topic://{topic}", name="sub", credit=10, options=[DurableSubscription(), NoLocal()]
        )
        assert bodies(receiver, 1) == ["theirs"]
    finally:
        again.close()
        spacer.close()
