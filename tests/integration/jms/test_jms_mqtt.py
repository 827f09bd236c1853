"""kittiwake.jms and paho-mqtt on one topic tree: the JMS-to-MQTT table of DESIGN.md section 2
row by row, MQTT publications as JMS messages, and the retained rules across protocols."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kittiwake.jms import NON_PERSISTENT, PERSISTENT, BytesMessage, Connection, DeliveryMode, Topic

from ..brokerproc import BrokerProcess
from ..clients import PahoClient, unique

Connect = Callable[..., Connection]


@pytest.mark.parametrize(
    ("mode", "disable_ack", "subscription_qos", "expected_qos"),
    [
        # Any message to a QoS 0 subscription arrives at QoS 0.
        (PERSISTENT, False, 0, 0),
        (NON_PERSISTENT, False, 0, 0),
        # Nonpersistent with acknowledgements disabled arrives at QoS 0.
        (NON_PERSISTENT, True, 2, 0),
        # Nonpersistent at QoS 1 or 2 subscriptions arrives at QoS 1.
        (NON_PERSISTENT, False, 1, 1),
        (NON_PERSISTENT, False, 2, 1),
        # Persistent arrives at QoS 1 (QoS 1 subscription) or QoS 2 (QoS 2 subscription).
        (PERSISTENT, False, 1, 1),
        (PERSISTENT, False, 2, 2),
    ],
)
def test_jms_to_mqtt_table(
    connect: Connect,
    paho: Callable[..., PahoClient],
    jms_broker: BrokerProcess,
    mode: DeliveryMode,
    disable_ack: bool,
    subscription_qos: int,
    expected_qos: int,
) -> None:
    topic = unique("table") + "/row"
    mqtt = paho(jms_broker.address)
    assert mqtt.subscribe(topic, subscription_qos) == [subscription_qos]
    session = connect(disable_ack=disable_ack).create_session()
    producer = session.create_producer(Topic(topic))
    producer.set_delivery_mode(mode)
    message = session.create_bytes_message()
    message.write_bytes(b"payload")
    producer.send(message)
    received = mqtt.get(timeout=5)
    assert (received.topic, received.payload, received.qos) == (topic, b"payload", expected_qos)


def test_text_message_reaches_mqtt_as_utf8(
    connect: Connect, paho: Callable[..., PahoClient], jms_broker: BrokerProcess
) -> None:
    topic = unique("text") + "/t"
    mqtt = paho(jms_broker.address)
    mqtt.subscribe(topic, 1)
    session = connect().create_session()
    session.create_producer(Topic(topic)).send(session.create_text_message("héllo"))
    assert mqtt.get(timeout=5).payload == "héllo".encode()


@pytest.mark.parametrize(("qos", "mode"), [(0, NON_PERSISTENT), (1, PERSISTENT), (2, PERSISTENT)])
def test_mqtt_publication_is_a_bytes_message(
    connect: Connect,
    paho: Callable[..., PahoClient],
    jms_broker: BrokerProcess,
    qos: int,
    mode: DeliveryMode,
) -> None:
    base = unique("m2j")
    consumer = connect().create_session().create_consumer(Topic(f"{base}/+/temperature"))
    publisher = paho(jms_broker.address)
    publisher.publish(f"{base}/kitchen/humidity", b"40", qos=qos)
    publisher.publish(f"{base}/kitchen/temperature", b"21", qos=qos)
    message = consumer.receive(5)
    assert isinstance(message, BytesMessage)
    assert message.read_bytes() == b"21"
    assert message.get_jms_delivery_mode() == mode
    assert message.get_jms_destination() == Topic(f"{base}/kitchen/temperature")
    assert consumer.receive(0.2) is None


def test_retained_across_protocols(
    connect: Connect, paho: Callable[..., PahoClient], jms_broker: BrokerProcess
) -> None:
    topic = unique("retained") + "/state"
    session = connect().create_session()
    live = session.create_consumer(Topic(topic))
    retained = session.create_text_message("on")
    retained.set_int_property("JMS_IBM_Retain", 1)
    session.create_producer(Topic(topic)).send(retained)
    # Delivered live: the property says 0.
    first = live.receive(5)
    assert first is not None and first.get_int_property("JMS_IBM_Retain") == 0
    # A later MQTT subscriber gets it with RETAIN set, a later JMS subscriber with the
    # property 1.
    mqtt = paho(jms_broker.address)
    mqtt.subscribe(topic, 1)
    got = mqtt.get(timeout=5)
    assert (got.payload, got.retain) == (b"on", True)
    late = session.create_consumer(Topic(topic)).receive(5)
    assert late is not None and late.get_body() == "on"
    assert late.get_int_property("JMS_IBM_Retain") == 1


def test_empty_retained_jms_message_does_not_clear(
    connect: Connect, paho: Callable[..., PahoClient], jms_broker: BrokerProcess
) -> None:
    topic = unique("retained-empty") + "/state"
    session = connect().create_session()
    producer = session.create_producer(Topic(topic))
    retained = session.create_text_message("on")
    retained.set_int_property("JMS_IBM_Retain", 1)
    producer.send(retained)
    empty = session.create_message()
    empty.set_int_property("JMS_IBM_Retain", 1)
    producer.send(empty)
    mqtt = paho(jms_broker.address)
    mqtt.subscribe(topic, 1)
    assert mqtt.get(timeout=5).payload == b"on"
