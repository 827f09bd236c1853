"""kittiwake.jms and paho-mqtt on one topic tree: the JMS-to-MQTT table of DESIGN.md section 2
row by row, MQTT publications as JMS messages, and the retained rules across protocols."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from paho.mqtt.packettypes import PacketTypes

from kittiwake.jms import (
    NON_PERSISTENT,
    PERSISTENT,
    BytesMessage,
    Connection,
    DeliveryMode,
    Message,
    MessageConsumer,
    Session,
    Topic,
)

from ..brokerproc import BrokerProcess
from ..clients import MQTTv5, PahoClient, props, unique, wait_until

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


def retain(session: Session, topic: str, text: str, time_to_live: int | None = None) -> Message:
    """Publish ``text`` to ``topic`` as a retained JMS message (``JMS_IBM_Retain`` = 1)."""
    message = session.create_text_message(text)
    message.set_int_property("JMS_IBM_Retain", 1)
    session.create_producer(Topic(topic)).send(message, time_to_live=time_to_live)
    return message


def body_and_retain(consumer: MessageConsumer, timeout: float = 5) -> tuple[object, object]:
    """The next message's body (text, or bytes from MQTT) and its ``JMS_IBM_Retain`` (None
    for a publication that was not retained)."""
    message = consumer.receive(timeout)
    assert message is not None, "no message"
    body = message.read_bytes() if isinstance(message, BytesMessage) else message.get_body()
    return body, message.get_object_property("JMS_IBM_Retain")


def test_empty_mqtt_retained_publish_clears_for_jms_too(
    connect: Connect, paho: Callable[..., PahoClient], jms_broker: BrokerProcess
) -> None:
    base = unique("retained-clear")
    session = connect().create_session()
    retain(session, f"{base}/cleared", "on")
    retain(session, f"{base}/kept", "kept")
    live = session.create_consumer(Topic(f"{base}/cleared"))
    assert body_and_retain(live) == ("on", 1)
    mqtt = paho(jms_broker.address)
    mqtt.publish(f"{base}/cleared", b"", qos=1, retain=True)
    # The empty publication is still delivered live, as a publication that was retained.
    assert body_and_retain(live) == (b"", 0)
    # A later JMS subscriber to both topics gets only the one still retained.
    late = session.create_consumer(Topic(f"{base}/+"))
    assert body_and_retain(late) == ("kept", 1)
    assert late.receive(0.3) is None
    # So does a later MQTT subscriber.
    later_mqtt = paho(jms_broker.address)
    later_mqtt.subscribe(f"{base}/+", 1)
    assert later_mqtt.get(timeout=5).payload == b"kept"
    later_mqtt.no_message(0.3)


def test_mqtt5_retained_message_with_expiry_is_not_delivered_after_it_expired(
    connect: Connect, paho: Callable[..., PahoClient], jms_broker: BrokerProcess
) -> None:
    base = unique("retained-expiry")
    publisher = paho(jms_broker.address, protocol=MQTTv5)
    expiring = props(PacketTypes.PUBLISH, MessageExpiryInterval=1)
    publisher.publish(f"{base}/expiring", b"stale", qos=1, retain=True, properties=expiring)
    published = time.monotonic()
    publisher.publish(f"{base}/kept", b"kept", qos=1, retain=True)
    # Before it expires a JMS subscriber gets it (so it was retained at all).
    early = connect().create_session().create_consumer(Topic(f"{base}/expiring"))
    assert body_and_retain(early) == (b"stale", 1)
    assert wait_until(lambda: time.monotonic() > published + 1.2, 5)
    late = connect().create_session().create_consumer(Topic(f"{base}/+"))
    assert body_and_retain(late) == (b"kept", 1)
    assert late.receive(0.3) is None


def test_jms_retained_message_with_a_ttl_is_not_delivered_after_it_expired(
    connect: Connect, paho: Callable[..., PahoClient], jms_broker: BrokerProcess
) -> None:
    base = unique("retained-ttl")
    session = connect().create_session()
    # The TTL is long enough that a loaded machine still attaches the early consumer before
    # the message expires (500 ms was not: under load the early consumer found nothing).
    stale = retain(session, f"{base}/expiring", "stale", time_to_live=3000)
    retain(session, f"{base}/kept", "kept")
    early = session.create_consumer(Topic(f"{base}/expiring"))
    assert body_and_retain(early) == ("stale", 1)
    assert wait_until(lambda: time.time() * 1000 > stale.get_jms_expiration() + 100, 10)
    late = session.create_consumer(Topic(f"{base}/+"))
    assert body_and_retain(late) == ("kept", 1)
    assert late.receive(0.3) is None
    mqtt = paho(jms_broker.address)
    mqtt.subscribe(f"{base}/+", 1)
    assert mqtt.get(timeout=5).payload == b"kept"
    mqtt.no_message(0.3)


def test_no_local_does_not_filter_retained_messages(connect: Connect) -> None:
    topic = unique("retained-nolocal") + "/state"
    connection = connect()
    session = connection.create_session()
    retain(session, topic, "mine")
    # The connection's own retained message reaches its own noLocal consumer ...
    own = session.create_consumer(Topic(topic), no_local=True)
    assert body_and_retain(own) == ("mine", 1)
    # ... while its own live messages do not; another connection's do.
    retain(session, topic, "mine, live")
    other = connect().create_session()
    other.create_producer(Topic(topic)).send(other.create_text_message("theirs"))
    assert body_and_retain(own) == ("theirs", None)


def test_durable_subscription_gets_retained_messages_only_when_created(connect: Connect) -> None:
    topic = unique("retained-durable") + "/state"
    connection = connect(client_id=unique("retained-durable-client"))
    session = connection.create_session()
    retain(session, topic, "on")
    subscriber = session.create_durable_consumer(Topic(topic), "status")
    assert body_and_retain(subscriber) == ("on", 1)
    subscriber.close()
    # Re-attached to the existing subscription: no retained message again, only what is new.
    again = session.create_durable_consumer(Topic(topic), "status")
    session.create_producer(Topic(topic)).send(session.create_text_message("live"))
    assert body_and_retain(again) == ("live", None)
    assert again.receive(0.3) is None
    again.close()
    session.unsubscribe("status")
    # A new subscription of the same name is created afresh: the retained message again
    # (the newest one, which is still "on": the live message was not retained).
    fresh = session.create_durable_consumer(Topic(topic), "status")
    assert body_and_retain(fresh) == ("on", 1)


def test_a_replaced_durable_subscription_is_created_afresh_with_retained_messages(
    connect: Connect,
) -> None:
    """Another selector replaces a durable subscription (an unsubscribe and a new one, as JMS
    says): the new one is created, so it gets the retained messages."""
    topic = unique("retained-replaced") + "/state"
    session = connect(client_id=unique("retained-replaced-client")).create_session()
    retain(session, topic, "on")
    first = session.create_durable_consumer(Topic(topic), "status", "colour IS NULL")
    assert body_and_retain(first) == ("on", 1)
    first.close()
    wider = "colour IS NULL OR colour = 'red'"
    replaced = session.create_durable_consumer(Topic(topic), "status", wider)
    assert body_and_retain(replaced) == ("on", 1)


def test_mqtt_311_resubscription_gets_retained_messages_again(
    connect: Connect, paho: Callable[..., PahoClient], jms_broker: BrokerProcess
) -> None:
    """The "only when created" rule is the JMS durable subscription's: MQTT 3.1.1 resends
    retained messages on every SUBSCRIBE, also for a persistent session (DESIGN.md §2)."""
    topic = unique("retained-resubscribe") + "/state"
    retain(connect().create_session(), topic, "on")
    mqtt = paho(jms_broker.address, unique("retained-311"), clean=False)
    assert mqtt.subscribe(topic, 1) == [1]
    first = mqtt.get(timeout=5)
    assert (first.payload, first.retain) == (b"on", True)
    assert mqtt.subscribe(topic, 1) == [1]
    again = mqtt.get(timeout=5)
    assert (again.payload, again.retain) == (b"on", True)
