"""AMQP and MQTT on one topic tree, by the seed table of DESIGN.md section 2, row by row:
AMQP (JMS) senders with paho-mqtt subscribers, MQTT publishers with AMQP consumers."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Described, Message, Timeout, symbol
from proton.reactor import AtMostOnce, Filter, Selector
from proton.utils import BlockingConnection, LinkDetached

from ..brokerproc import BrokerProcess
from ..clients import PahoClient, unique

Connect = Callable[..., BlockingConnection]


class NoLocal(Filter):
    """The no-local filter as Qpid JMS sends it (the blocking client has no option for it)."""

    def __init__(self) -> None:
        super().__init__(
            {
                symbol("no-local"): Described(
                    symbol("apache.org:no-local-filter:list"), ["NoLocalFilter{}"]
                )
            }
        )


def round_trip(connection: BlockingConnection) -> None:
    """Make the client send what it holds (a presettled transfer, a receiver's credit): the
    blocking client does I/O only while it waits for something, so wait for an attach."""
    connection.create_sender(unique("flush"), name=unique("flush")).close()


def subscriber(
    paho: Callable[..., PahoClient], amqp_broker: BrokerProcess, topic: str, qos: int
) -> PahoClient:
    client = paho(amqp_broker.address)
    assert client.subscribe(topic, qos) == [qos]
    return client


@pytest.mark.parametrize(
    ("durable", "presettled", "subscription_qos", "expected_qos"),
    [
        # Any message to a QoS 0 subscription arrives at QoS 0.
        (True, False, 0, 0),
        (False, False, 0, 0),
        # Nonpersistent with acknowledgements disabled arrives at QoS 0.
        (False, True, 2, 0),
        # Nonpersistent at QoS 1 or 2 subscriptions arrives at QoS 1.
        (False, False, 1, 1),
        (False, False, 2, 1),
        # Persistent arrives at QoS 1 on QoS 1 subscriptions, QoS 2 on QoS 2 subscriptions.
        (True, False, 1, 1),
        (True, False, 2, 2),
    ],
)
def test_jms_to_mqtt_seed_table(
    amqp: Connect,
    paho: Callable[..., PahoClient],
    amqp_broker: BrokerProcess,
    durable: bool,
    presettled: bool,
    subscription_qos: int,
    expected_qos: int,
) -> None:
    topic = unique("seed") + "/row"
    mqtt = subscriber(paho, amqp_broker, topic, subscription_qos)
    connection = amqp()
    sender = connection.create_sender(
        f"topic://{topic}", options=AtMostOnce() if presettled else None
    )
    sender.send(Message(body=b"payload", durable=durable, inferred=True))
    round_trip(connection)
    received = mqtt.get(timeout=5)
    assert (received.topic, received.payload, received.qos) == (topic, b"payload", expected_qos)


def test_text_body_reaches_mqtt_as_utf8(
    amqp: Connect, paho: Callable[..., PahoClient], amqp_broker: BrokerProcess
) -> None:
    topic = unique("text") + "/t"
    mqtt = subscriber(paho, amqp_broker, topic, 1)
    amqp().create_sender(f"topic://{topic}").send(Message(body="héllo"))
    assert mqtt.get(timeout=5).payload == "héllo".encode()


@pytest.mark.parametrize(("qos", "durable"), [(0, False), (1, True), (2, True)])
def test_mqtt_to_amqp_is_a_bytes_message(
    amqp: Connect,
    paho: Callable[..., PahoClient],
    amqp_broker: BrokerProcess,
    qos: int,
    durable: bool,
) -> None:
    topic = unique("m2a") + "/x"
    connection = amqp()
    receiver = connection.create_receiver(f"topic://{topic}", credit=1)
    round_trip(connection)  # its credit is at the broker: a QoS 0 message needs it
    publisher = paho(amqp_broker.address)
    publisher.publish(topic, b"\x01\x02", qos=qos)
    message = receiver.receive(timeout=5)
    fetcher = receiver.fetcher
    assert fetcher is not None
    # QoS 0 arrives settled (at most once); QoS 1 and 2 wait for the consumer's outcome.
    assert len(fetcher.unsettled) == (0 if qos == 0 else 1)
    if qos:
        receiver.accept()
    assert bytes(message.body) == b"\x01\x02"
    assert message.annotations["x-opt-jms-msg-type"] == 3  # BytesMessage
    assert message.annotations["x-opt-jms-dest"] == 1  # a topic
    assert message.address == topic
    # Persistent when its QoS is 1 or 2.
    assert message.durable is durable


def test_amqp_topic_subscription_uses_mqtt_wildcards(
    amqp: Connect, paho: Callable[..., PahoClient], amqp_broker: BrokerProcess
) -> None:
    base = unique("wild")
    receiver = amqp().create_receiver(f"topic://{base}/+/temperature", credit=10)
    publisher = paho(amqp_broker.address)
    publisher.publish(f"{base}/kitchen/temperature", b"21", qos=1)
    publisher.publish(f"{base}/kitchen/humidity", b"40", qos=1)
    publisher.publish(f"{base}/hall/temperature", b"19", qos=1)
    got = []
    for _ in range(2):
        got.append(receiver.receive(timeout=5).address)
        receiver.accept()
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)
    assert got == [
        f"{base}/kitchen/temperature",
        f"{base}/hall/temperature",
    ]


def test_amqp_to_amqp_on_a_topic_fans_out(amqp: Connect) -> None:
    topic = unique("fan") + "/t"
    connection = amqp()
    first = connection.create_receiver(f"topic://{topic}", name="first")
    second = amqp().create_receiver(f"topic://{topic}", name="second")
    connection.create_sender(f"topic://{topic}").send(Message(body="to all", subject="kind"))
    for receiver in (first, second):
        message = receiver.receive(timeout=5)
        receiver.accept()
        assert (message.body, message.subject) == ("to all", "kind")


def test_a_topic_subscription_ends_with_its_link(
    amqp: Connect, paho: Callable[..., PahoClient], amqp_broker: BrokerProcess
) -> None:
    topic = unique("gone") + "/t"
    connection = amqp()
    receiver = connection.create_receiver(f"topic://{topic}", name="sub")
    receiver.close()
    again = connection.create_receiver(f"topic://{topic}", name="sub2")
    paho(amqp_broker.address).publish(topic, b"after", qos=1)
    assert bytes(again.receive(timeout=5).body) == b"after"
    again.accept()
    # Only the live subscription got it: nothing queued for the closed one.
    with pytest.raises(Timeout):
        again.receive(timeout=0.3)


def test_topic_selector_filters_in_the_broker(amqp: Connect) -> None:
    topic = unique("sel") + "/t"
    connection = amqp()
    receiver = connection.create_receiver(
        f"topic://{topic}", credit=10, options=Selector("colour = 'red' AND size > 2")
    )
    sender = connection.create_sender(f"topic://{topic}")
    sent = [("red", 3), ("blue", 5), ("red", 1), ("red", 9)]
    for colour, size in sent:
        sender.send(Message(body=f"{colour}-{size}", properties={"colour": colour, "size": size}))
    got = []
    for _ in range(2):
        got.append(receiver.receive(timeout=5).body)
        receiver.accept()
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)
    assert got == ["red-3", "red-9"]


def test_selector_on_header_fields(amqp: Connect, paho: Callable[..., PahoClient],
                                   amqp_broker: BrokerProcess) -> None:
    topic = unique("selh") + "/t"
    connection = amqp()
    selector = "JMSType = 'order' AND JMSPriority > 5 AND JMSDeliveryMode = 'PERSISTENT'"
    receiver = connection.create_receiver(
        f"topic://{topic}", credit=10, options=Selector(selector)
    )
    sender = connection.create_sender(f"topic://{topic}")
    sender.send(Message(body="match", subject="order", priority=7, durable=True))
    sender.send(Message(body="low", subject="order", priority=2, durable=True))
    sender.send(Message(body="other type", subject="invoice", priority=7, durable=True))
    sender.send(Message(body="non persistent", subject="order", priority=7, durable=False))
    # An MQTT message has no JMSType: UNKNOWN, not selected.
    paho(amqp_broker.address).publish(topic, b"mqtt", qos=1)
    assert receiver.receive(timeout=5).body == "match"
    receiver.accept()
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)


def test_invalid_selector_is_refused_with_its_position(amqp: Connect) -> None:
    with pytest.raises(LinkDetached, match="column"):
        amqp().create_receiver(f"topic://{unique('bad')}", options=Selector("a = = 1"))


def test_no_local_skips_own_messages_only(amqp: Connect, paho: Callable[..., PahoClient],
                                          amqp_broker: BrokerProcess) -> None:
    topic = unique("nolocal") + "/t"
    connection = amqp()
    receiver = connection.create_receiver(f"topic://{topic}", credit=10, options=NoLocal())
    connection.create_sender(f"topic://{topic}").send(Message(body="mine"))
    amqp().create_sender(f"topic://{topic}").send(Message(body="theirs"))
    paho(amqp_broker.address).publish(topic, b"mqtt", qos=1)
    got = []
    for _ in range(2):
        message = receiver.receive(timeout=5)
        got.append(message.body if isinstance(message.body, str) else bytes(message.body))
        receiver.accept()
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)
    assert got == ["theirs", b"mqtt"]


def test_retained_across_protocols(
    amqp: Connect, paho: Callable[..., PahoClient], amqp_broker: BrokerProcess
) -> None:
    topic = unique("retained") + "/t"
    connection = amqp()
    # A JMS message with JMS_IBM_Retain = 1 is retained...
    connection.create_sender(f"topic://{topic}").send(
        Message(body=b"kept", durable=True, inferred=True, properties={"JMS_IBM_Retain": 1})
    )
    # ...an MQTT subscriber that comes later gets it with RETAIN set...
    late = paho(amqp_broker.address)
    late.subscribe(topic, 1)
    received = late.get(timeout=5)
    assert (received.payload, received.retain) == (b"kept", True)
    # ...and an AMQP subscriber gets it with JMS_IBM_Retain = 1; a live one says 0.
    receiver = connection.create_receiver(f"topic://{topic}", credit=5, name="late")
    retained = receiver.receive(timeout=5)
    receiver.accept()
    assert (bytes(retained.body), retained.properties["JMS_IBM_Retain"]) == (b"kept", 1)
    paho(amqp_broker.address).publish(topic, b"live", qos=1, retain=True)
    live = receiver.receive(timeout=5)
    receiver.accept()
    assert (bytes(live.body), live.properties["JMS_IBM_Retain"]) == (b"live", 0)
