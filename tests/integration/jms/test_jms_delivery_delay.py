"""Delivery delay for every subscription kind (issue 11), through kittiwake.jms and paho-mqtt
over sockets: a message sent to a topic with a delivery delay reaches no subscriber before its
delivery time, whatever level it is delivered at (acknowledged, NO_ACKNOWLEDGE, acknowledgements
disabled, an MQTT QoS 0 subscription), and reaches each of them once it is due.

"Not before" is a receive bounded well short of the delay; "arrives" is a generous bound: no
test depends on how soon after its time a message comes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kittiwake.jms import (
    NO_ACKNOWLEDGE,
    NON_PERSISTENT,
    Connection,
    DeliveryMode,
    Message,
    MessageConsumer,
    Session,
    Topic,
)

from ..brokerproc import BrokerProcess
from ..clients import PahoClient, unique

Connect = Callable[..., Connection]

DELAY_MS = 1500
# Shorter than the delay by a margin that leaves room for a slow machine's send.
NOT_BEFORE_S = 0.8
ARRIVES_WITHIN_S = 10.0


def send_delayed(
    session: Session, topic: Topic, body: str, *, mode: DeliveryMode | None = None
) -> None:
    producer = session.create_producer(topic)
    producer.set_delivery_delay(DELAY_MS)
    if mode is not None:
        producer.set_delivery_mode(mode)
    producer.send(session.create_text_message(body))


def assert_delayed(consumer: MessageConsumer, body: str) -> None:
    assert consumer.receive(NOT_BEFORE_S) is None, "delivered before its delivery time"
    message: Message | None = consumer.receive(ARRIVES_WITHIN_S)
    assert message is not None, "never delivered"
    assert message.get_body() == body
    assert message.get_jms_delivery_time() >= message.get_jms_timestamp() + DELAY_MS


@pytest.mark.parametrize(
    "kind",
    ["auto-acknowledge", "no-acknowledge", "disable-ack", "durable", "shared", "shared-durable"],
)
def test_a_delayed_topic_send_waits_for_its_time(connect: Connect, kind: str) -> None:
    topic = Topic(unique("delay-" + kind))
    name = unique("sub")
    if kind == "no-acknowledge":
        consumer = connect().create_session(False, NO_ACKNOWLEDGE).create_consumer(topic)
    elif kind == "disable-ack":
        consumer = connect(disable_ack=True).create_session().create_consumer(topic)
    elif kind == "durable":
        session = connect(client_id=unique("delay-client")).create_session()
        consumer = session.create_durable_consumer(topic, name)
    elif kind == "shared":
        consumer = connect().create_session().create_shared_consumer(topic, name)
    elif kind == "shared-durable":
        consumer = connect().create_session().create_shared_durable_consumer(topic, name)
    else:
        consumer = connect().create_session().create_consumer(topic)
    if kind == "disable-ack":
        # NON_PERSISTENT with acknowledgements disabled: at most once (QoS 0) end to end.
        producing = connect(disable_ack=True).create_session()
        send_delayed(producing, topic, "later", mode=NON_PERSISTENT)
    else:
        send_delayed(connect().create_session(), topic, "later")
    assert_delayed(consumer, "later")


def test_a_delayed_durable_send_waits_while_the_subscriber_is_away(connect: Connect) -> None:
    """Queued for an absent durable subscriber, the message is still invisible until due."""
    topic = Topic(unique("delay-away"))
    session = connect(client_id=unique("delay-client")).create_session()
    session.create_durable_consumer(topic, "audit").close()
    send_delayed(connect().create_session(), topic, "later")
    assert_delayed(session.create_durable_consumer(topic, "audit"), "later")


@pytest.mark.parametrize("mode", ["persistent", "non-persistent-disable-ack"])
def test_a_delayed_send_reaches_an_mqtt_qos0_subscriber_only_when_due(
    connect: Connect, paho: Callable[..., PahoClient], jms_broker: BrokerProcess, mode: str
) -> None:
    topic = unique("delay-mqtt") + "/t"
    mqtt = paho(jms_broker.address)
    assert mqtt.subscribe(topic, 0) == [0]
    if mode == "persistent":
        send_delayed(connect().create_session(), Topic(topic), "later")
    else:
        session = connect(disable_ack=True).create_session()
        send_delayed(session, Topic(topic), "later", mode=NON_PERSISTENT)
    with pytest.raises(AssertionError, match="no message"):
        mqtt.get(timeout=NOT_BEFORE_S)
    received = mqtt.get(timeout=ARRIVES_WITHIN_S)
    assert (received.payload, received.qos) == (b"later", 0)
