"""Retained messages: set, replace, clear, the RETAIN flag on the wire, and v5 retain options.

MQTT 3.1.1 §3.3.1.3, MQTT 5 §3.3.1.3 (RETAIN) and §3.8.3.1 (Retain As Published, Retain
Handling).
"""

from __future__ import annotations

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from .clients import VERSIONS, MQTTv5, unique


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("version", ["v311", "v5"])
def test_retained_message_goes_to_later_subscriber_with_retain_flag(address, paho, version, qos):
    """A retained publication is stored and sent to a client that subscribes afterwards, with
    RETAIN=1 because it is sent as a result of the new subscription (MQTT-3.3.1-6, -8/-9)."""
    topic = unique("ret/set")
    pub = paho(address, protocol=VERSIONS[version])
    pub.publish(topic, b"stored", qos, retain=True)
    pub.disconnect()  # the retained message outlives its publisher's connection
    sub = paho(address, protocol=VERSIONS[version])
    sub.subscribe(topic, 1)
    message = sub.get()
    assert (message.topic, message.payload, message.retain, message.qos) == (
        topic, b"stored", True, qos,
    )
    sub.no_message(0.25)


def test_newer_retained_message_replaces_the_older(address, paho):
    """Only the latest retained message per topic is kept (MQTT-3.3.1-5)."""
    topic = unique("ret/replace")
    pub = paho(address)
    pub.publish(topic, b"first", 1, retain=True)
    pub.publish(topic, b"second", 1, retain=True)
    pub.publish(topic, b"not retained", 1, retain=False)
    sub = paho(address)
    sub.subscribe(topic, 1)
    message = sub.get()
    assert (message.payload, message.retain) == (b"second", True)
    sub.no_message(0.25)


@pytest.mark.parametrize("version", ["v311", "v5"])
def test_zero_length_retained_publish_clears_and_is_still_delivered_live(address, paho, version):
    """A zero-byte retained publication removes the retained message; current subscribers still
    receive it as a normal message, later subscribers get nothing (MQTT-3.3.1-10/-11)."""
    topic = unique("ret/clear")
    pub = paho(address, protocol=VERSIONS[version])
    pub.publish(topic, b"soon gone", 1, retain=True)
    live = paho(address, protocol=VERSIONS[version])
    live.subscribe(topic, 1)
    assert live.get().payload == b"soon gone"
    pub.publish(topic, b"", 1, retain=True)
    cleared = live.get()
    assert (cleared.topic, cleared.payload, cleared.retain) == (topic, b"", False)
    late = paho(address, protocol=VERSIONS[version])
    late.subscribe(topic, 1)
    late.no_message(0.4)


@pytest.mark.parametrize("version", ["v311", "v5"])
def test_live_delivery_of_retained_publication_has_retain_flag_clear(address, paho, version):
    """A retained publication forwarded to an existing subscription carries RETAIN=0
    (MQTT-3.3.1-9; in v5 unless Retain As Published is set, MQTT-3.3.1-12)."""
    topic = unique("ret/live")
    sub = paho(address, protocol=VERSIONS[version])
    sub.subscribe(topic, 1)
    pub = paho(address)
    pub.publish(topic, b"live", 1, retain=True)
    message = sub.get()
    assert (message.payload, message.retain) == (b"live", False)


def test_retain_as_published_keeps_retain_flag_on_live_delivery(address, paho):
    """A v5 subscription with Retain As Published sees the publisher's RETAIN flag on live
    messages: 1 for retained publications, 0 for others (MQTT-3.3.1-13)."""
    topic = unique("ret/rap")
    sub = paho(address, protocol=MQTTv5)
    sub.subscribe(topic, options=SubscribeOptions(qos=1, retainAsPublished=True))
    pub = paho(address)
    pub.publish(topic, b"retained", 1, retain=True)
    pub.publish(topic, b"plain", 1, retain=False)
    first, second = sub.get_many(2)
    assert (first.payload, first.retain) == (b"retained", True)
    assert (second.payload, second.retain) == (b"plain", False)


def test_wildcard_subscription_receives_every_matching_retained_message(address, paho):
    """Subscribing with wildcards delivers the retained message of every matching topic, and
    none of the others."""
    base = unique("ret/wild")
    pub = paho(address)
    topics = [f"{base}/a", f"{base}/b/c", f"{base}/b/d"]
    for topic in topics:
        pub.publish(topic, topic.encode(), 1, retain=True)
    pub.publish(f"{base}-other/x", b"no", 1, retain=True)
    sub = paho(address)
    sub.subscribe(f"{base}/#", 1)
    got = sub.get_many(3)
    assert sorted(m.topic for m in got) == sorted(topics)
    assert all(m.retain and m.payload == m.topic.encode() for m in got)
    sub.no_message(0.25)
    plus = paho(address)
    plus.subscribe(f"{base}/b/+", 1)
    assert sorted(m.topic for m in plus.get_many(2)) == [f"{base}/b/c", f"{base}/b/d"]
    plus.no_message(0.25)


@pytest.mark.parametrize(("sub_qos", "expected"), [(0, 0), (1, 1), (2, 1)])
def test_retained_delivery_qos_is_lower_of_message_and_subscription(
    address, paho, sub_qos, expected
):
    """A retained QoS 1 message is sent to a new subscriber at min(1, granted QoS)."""
    topic = unique("ret/qos")
    paho(address).publish(topic, b"q1", 1, retain=True)
    sub = paho(address)
    sub.subscribe(topic, sub_qos)
    message = sub.get()
    assert (message.payload, message.qos, message.retain) == (b"q1", expected, True)


def _subscribe_twice(paho, address, topic, handling):
    sub = paho(address, protocol=MQTTv5)
    options = SubscribeOptions(qos=1, retainHandling=handling)
    sub.subscribe(topic, options=options)
    first = sub.drain() or ([sub.get(0.5)] if handling != 2 else [])
    if handling == 2:
        sub.no_message(0.3)
    sub.subscribe(topic, options=options)  # the same filter again: replaces the subscription
    return sub, first


def test_retain_handling_0_sends_retained_on_every_subscribe(address, paho):
    """Retain Handling 0: retained messages are sent at subscribe time, also when the
    subscription already existed (MQTT-3.3.1-9)."""
    topic = unique("ret/rh0")
    paho(address).publish(topic, b"rh", 1, retain=True)
    sub, first = _subscribe_twice(paho, address, topic, SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE)
    assert [(m.payload, m.retain) for m in first] == [(b"rh", True)]
    again = sub.get()
    assert (again.payload, again.retain) == (b"rh", True)
    sub.no_message(0.25)


def test_retain_handling_1_sends_retained_only_for_a_new_subscription(address, paho):
    """Retain Handling 1: retained messages only if the subscription did not exist
    (MQTT-3.3.1-10)."""
    topic = unique("ret/rh1")
    paho(address).publish(topic, b"rh", 1, retain=True)
    sub, first = _subscribe_twice(paho, address, topic, SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
    assert [(m.payload, m.retain) for m in first] == [(b"rh", True)]
    sub.no_message(0.4)


def test_retain_handling_2_never_sends_retained(address, paho):
    """Retain Handling 2: no retained messages at subscribe time (MQTT-3.3.1-11); live
    messages still flow."""
    topic = unique("ret/rh2")
    pub = paho(address)
    pub.publish(topic, b"rh", 1, retain=True)
    sub, first = _subscribe_twice(paho, address, topic, SubscribeOptions.RETAIN_DO_NOT_SEND)
    assert first == []
    sub.no_message(0.3)
    pub.publish(topic, b"live", 1)
    assert sub.get().payload == b"live"


def test_retained_publication_queued_for_offline_session_arrives_with_retain_clear(
    address, paho
):
    """A retained publication that matched an existing (persistent, offline) subscription is
    delivered later with RETAIN=0: it is sent because of the established subscription, not a
    new one (MQTT-3.3.1-9)."""
    topic = unique("ret/queued")
    client_id = unique("ret-queued")
    sub = paho(address, client_id, clean=False)
    sub.subscribe(topic, 1)
    sub.disconnect()
    paho(address).publish(topic, b"retained while away", 1, retain=True)
    back = paho(address, client_id, clean=False)
    assert back.session_present
    message = back.get()
    assert (message.payload, message.retain) == (b"retained while away", False)
    back.no_message(0.25)


@pytest.mark.timeout(600)
def test_every_retained_message_reaches_a_new_subscriber_past_its_queue_limit(broker):
    """The issue's scenario: 20,000 retained QoS 1 messages on distinct topics (twice the
    default queue limit of 10,000); a new QoS 1 subscriber to r/# that acknowledges everything
    receives all 20,000, paced by its window, and nothing is rejected."""
    from kittiwake.mqtt.packets import PubAck, Publish

    from .rawclient import RawClient

    process = broker()
    count = 20_000
    publisher = RawClient(process.address, 5, timeout=30)
    publisher.connect(unique("ret-pub"))
    outstanding: set[int] = set()
    for n in range(count):
        packet = publisher.publish(f"r/{n}", b"%d" % n, 1, retain=True, wait_ack=False)
        outstanding.add(packet.packet_id)
        while len(outstanding) >= 100 or (n == count - 1 and outstanding):
            ack = publisher.expect(PubAck, timeout=30)
            outstanding.discard(ack.packet_id)
    subscriber = RawClient(process.address, 5, timeout=30)
    subscriber.connect(unique("ret-sub"))
    subscriber.subscribe("r/#", 1)
    seen: set[bytes] = set()
    while len(seen) < count:
        packet = subscriber.expect(Publish, timeout=30)
        assert packet.retain and packet.qos == 1
        seen.add(packet.payload)
        subscriber.send(PubAck(packet.packet_id))
    assert seen == {b"%d" % n for n in range(count)}
    assert "full" not in process.log_text()
    subscriber.no_packet(0.3)


def test_a_live_copy_does_not_overtake_its_topics_retained_message_not_yet_sent(broker):
    """A new wildcard subscriber's retained messages go out as its window opens; live copies
    published meanwhile wait behind them, so no topic's newer live message reaches it before
    that topic's older retained one (MQTT §4.6, ordered topics). Before, a copy that arrived
    while the window was full went first as soon as it opened: the subscriber saw "new", then
    the stale retained "old"."""
    from kittiwake.mqtt.packets import PubAck, Publish

    from .rawclient import RawClient

    process = broker(limits={"max_inflight": 1})
    prefix = unique("retained/order")
    publisher = RawClient(process.address, 4)
    publisher.connect(unique("ret-pub"))
    for n in range(3):
        publisher.publish(f"{prefix}/{n}", b"old %d" % n, 1, retain=True)
    subscriber = RawClient(process.address, 4)
    subscriber.connect(unique("ret-sub"))
    subscriber.subscribe(f"{prefix}/+", 1)
    packet = subscriber.expect(Publish)  # the window of one is full until this is acknowledged
    for n in range(3):
        publisher.publish(f"{prefix}/{n}", b"new %d" % n, 1)  # acknowledged: routed
    got = []
    while True:
        got.append((packet.topic, packet.payload, packet.retain))
        subscriber.send(PubAck(packet.packet_id))
        if len(got) == 6:
            break
        packet = subscriber.expect(Publish)
    for n in range(3):
        topic = f"{prefix}/{n}"
        assert [(p, r) for t, p, r in got if t == topic] == [
            (b"old %d" % n, True),
            (b"new %d" % n, False),
        ], got
    subscriber.no_packet(0.3)


def test_a_live_qos0_copy_does_not_overtake_its_topics_retained_message_not_yet_sent(broker):
    """The QoS 0 side of the rule above (MQTT §4.6: a publisher's messages on a topic, at one
    QoS, reach a subscriber in the order they were received): retained QoS 0 messages a new
    wildcard subscription is still owed (its window full) go before the live QoS 0 copies of
    their topics, which the broker would otherwise write at once (its QoS 0 fast path)."""
    from kittiwake.mqtt.packets import PubAck, Publish

    from .rawclient import RawClient

    process = broker(limits={"max_inflight": 1})
    prefix = unique("retained/order0")
    publisher = RawClient(process.address, 4)
    publisher.connect(unique("ret-pub"))
    for n in range(3):
        publisher.publish(f"{prefix}/r/{n}", b"old %d" % n, 0, retain=True)
    subscriber = RawClient(process.address, 4)
    subscriber.connect(unique("ret-sub"))
    subscriber.subscribe(f"{prefix}/q", 1)
    publisher.publish(f"{prefix}/q", b"block", 1)
    block = subscriber.expect(Publish)  # unacknowledged: the window of one is full
    subscriber.subscribe(f"{prefix}/r/+", 0)
    for n in range(3):
        publisher.publish(f"{prefix}/r/{n}", b"new %d" % n, 0)
    publisher.publish(f"{prefix}/q", b"after", 1)  # acknowledged: the QoS 0 ones were routed
    got = []
    while len(got) < 6:  # the three retained and three live ones, all at QoS 0
        packet = subscriber.expect(Publish)
        got.append((packet.topic, packet.payload, packet.retain))
        if len(got) == 3:
            subscriber.send(PubAck(block.packet_id))  # the window opens: the rest may go
    for n in range(3):
        topic = f"{prefix}/r/{n}"
        assert [(p, r) for t, p, r in got if t == topic] == [
            (b"old %d" % n, True),
            (b"new %d" % n, False),
        ], got
    after = subscriber.expect(Publish)
    assert after.payload == b"after"
    subscriber.send(PubAck(after.packet_id))
    subscriber.no_packet(0.3)


# -- limits.max_retained_payload ---------------------------------------------------------------

RETAINED_LIMIT = 16


def test_a_retained_payload_over_the_limit_is_delivered_but_not_retained(broker, paho, raw):
    """limits.max_retained_payload 16: a 17-byte retained publication reaches the live
    subscriber but is not retained (the topic keeps its older message). A v5 QoS 1 publisher
    gets PUBACK 0x97 Quota exceeded, QoS 2 PUBREC 0x97 (the exchange ends: its packet id is
    free again), a 3.1.1 one a plain PUBACK; logged, and counted in /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from kittiwake.mqtt.packets import Publish, PubRec

    process = broker(http=True, limits={"max_retained_payload": RETAINED_LIMIT})
    address = process.address
    topic = unique("ret/limit")
    big = b"x" * (RETAINED_LIMIT + 1)
    paho(address).publish(topic, b"y" * RETAINED_LIMIT, 1, retain=True)  # the limit: kept
    live = paho(address)
    live.subscribe(topic, 2)
    assert live.get().payload == b"y" * RETAINED_LIMIT

    v5 = paho(address, protocol=MQTTv5)
    assert v5.publish_result(v5.publish(topic, big, 1, retain=True, wait=False)) == 0x97
    assert live.get().payload == big
    client = raw(address, 5)
    client.connect(unique("ret-limit-qos2"))
    client.send(Publish(topic, big + b"2", 2, retain=True, packet_id=7))
    rec = client.expect(PubRec)
    assert (rec.packet_id, rec.reason_code) == (7, 0x97)
    assert live.get().payload == big + b"2"
    client.send(Publish(topic, b"id 7 again", 2, packet_id=7))  # a new publication, not a resend
    assert client.expect(PubRec).reason_code == 0
    assert live.get().payload == b"id 7 again"
    paho(address).publish(topic, big + b"3", 1, retain=True)  # 3.1.1: acknowledged as usual
    assert live.get().payload == big + b"3"

    late = paho(address)
    late.subscribe(topic, 1)
    kept = late.get()
    assert (kept.payload, kept.retain) == (b"y" * RETAINED_LIMIT, True)
    late.no_message(0.25)
    assert process.log_text().count(f"retained message on '{topic}'") == 3
    with urllib.request.urlopen(process.http_url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    refused = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "kittiwake_retained_refused_total"
    ]
    assert refused == [3]


def test_a_jms_retained_message_over_the_limit_is_delivered_but_not_retained(broker, paho):
    """The limit is the core's: a JMS message with JMS_IBM_Retain = 1 over it reaches a live
    subscriber and is not retained."""
    from proton import Message
    from proton.utils import BlockingConnection

    process = broker(amqp=True, limits={"max_retained_payload": RETAINED_LIMIT})
    topic = unique("ret/jms-limit")
    live = paho(process.address)
    live.subscribe(topic, 1)
    connection = BlockingConnection(process.amqp_url, timeout=10)
    try:
        sender = connection.create_sender(f"topic://{topic}")
        for body in (b"small", b"z" * (RETAINED_LIMIT + 1)):
            sender.send(
                Message(body=body, durable=True, inferred=True, properties={"JMS_IBM_Retain": 1})
            )
    finally:
        connection.close()
    assert [m.payload for m in live.get_many(2)] == [b"small", b"z" * (RETAINED_LIMIT + 1)]
    late = paho(process.address)
    late.subscribe(topic, 1)
    assert late.get().payload == b"small"
    late.no_message(0.25)
