"""QoS 0/1/2 end to end through real clients: every message arrives, at the right QoS, once.

MQTT 3.1.1 §4.3 and MQTT 5 §4.3 (delivery protocols), §3.8.4 (overlapping subscriptions),
§4.6 (ordering).
"""

from __future__ import annotations

import pytest

from kittiwake.mqtt.packets import PubComp, Publish, PubRec, PubRel
from kittiwake.mqtt.properties import Properties

from .clients import VERSIONS, MQTTv5, unique

V5_SESSION = {"SessionExpiryInterval": 60}


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("pub_version", ["v311", "v5"])
@pytest.mark.parametrize("sub_version", ["v311", "v5"])
def test_message_reaches_subscriber_once_at_its_qos(address, paho, qos, pub_version, sub_version):
    """A message published at QoS q to a QoS q subscription arrives once, intact, at QoS q,
    whatever protocol version publisher and subscriber speak."""
    topic = unique("qos/e2e")
    sub = paho(address, protocol=VERSIONS[sub_version])
    assert sub.subscribe(topic, qos) == [qos]
    pub = paho(address, protocol=VERSIONS[pub_version])
    payload = bytes(range(256)) * 3  # binary payload survives unchanged
    pub.publish(topic, payload, qos)
    message = sub.get()
    assert (message.topic, message.payload, message.qos) == (topic, payload, qos)
    assert not message.retain
    sub.no_message(0.15)


@pytest.mark.parametrize(
    ("pub_qos", "sub_qos", "expected"), [(2, 0, 0), (2, 1, 1), (1, 0, 0), (0, 2, 0), (1, 2, 1)]
)
def test_delivered_qos_is_the_lower_of_publication_and_subscription(
    address, paho, pub_qos, sub_qos, expected
):
    """The subscriber receives the message at min(published QoS, granted QoS) (MQTT-3.8.4-8)."""
    topic = unique("qos/downgrade")
    sub = paho(address)
    assert sub.subscribe(topic, sub_qos) == [sub_qos]
    pub = paho(address)
    pub.publish(topic, b"level", pub_qos)
    message = sub.get()
    assert message.qos == expected
    sub.no_message(0.15)


@pytest.mark.parametrize("qos", [1, 2])
def test_stream_from_one_publisher_arrives_complete_and_in_order(address, paho, qos):
    """200 QoS 1/2 messages on one topic from one publisher all arrive, in publish order
    (MQTT 5 §4.6 ordered topics)."""
    topic = unique("qos/order")
    sub = paho(address, protocol=MQTTv5)
    sub.subscribe(topic, qos)
    pub = paho(address, protocol=MQTTv5)
    infos = [pub.publish(topic, str(i).encode(), qos, wait=False) for i in range(200)]
    for info in infos:
        info.wait_for_publish(10)
        assert info.is_published()
    received = [int(m.payload) for m in sub.get_many(200, timeout=10)]
    assert received == list(range(200))
    sub.no_message(0.3)


@pytest.mark.parametrize("version", ["v311", "v5"])
def test_overlapping_subscriptions_deliver_one_copy_at_highest_qos(address, paho, version):
    """A session whose filters overlap gets one copy of a matching message, at the highest QoS
    its matching subscriptions grant (MQTT 5 §3.3.4 / the 3.1.1 non-normative recommendation)."""
    base = unique("qos/overlap")
    sub = paho(address, protocol=VERSIONS[version])
    assert sub.subscribe(f"{base}/+/x", 0) == [0]
    assert sub.subscribe(f"{base}/#", 2) == [2]
    assert sub.subscribe(f"{base}/a/x", 1) == [1]
    pub = paho(address)
    pub.publish(f"{base}/a/x", b"one copy", 2)
    message = sub.get()
    assert (message.payload, message.qos) == (b"one copy", 2)
    sub.no_message(0.3)
    # A QoS 0 publication is capped by its own QoS, still one copy.
    pub.publish(f"{base}/a/x", b"qos0", 0)
    message = sub.get()
    assert (message.payload, message.qos) == (b"qos0", 0)
    sub.no_message(0.2)


@pytest.mark.parametrize("version", [4, 5])
def test_qos2_publish_resent_with_dup_is_delivered_exactly_once(address, paho, raw, version):
    """A QoS 2 PUBLISH resent (DUP=1, same packet id) before PUBREL is acknowledged again with
    PUBREC but not routed again: subscribers get it exactly once (MQTT 5 §4.3.3 method B for the
    receiver). After PUBCOMP, the packet id is free and carries a new message."""
    topic = unique("qos/exactly-once")
    sub = paho(address, protocol=MQTTv5)
    sub.subscribe(topic, 2)
    pub = raw(address, version)
    pub.connect(unique("raw-qos2"))
    pub.send(Publish(topic, b"once", 2, False, False, 7))
    first = pub.expect(PubRec)
    assert (first.packet_id, first.reason_code) == (7, 0)
    for _ in range(2):
        pub.send(Publish(topic, b"once", 2, False, True, 7))
        again = pub.expect(PubRec)
        assert (again.packet_id, again.reason_code) == (7, 0)
    pub.send(PubRel(7))
    comp = pub.expect(PubComp)
    assert (comp.packet_id, comp.reason_code) == (7, 0)
    message = sub.get()
    assert (message.payload, message.qos) == (b"once", 2)
    sub.no_message(0.3)
    # The identifier was released: the same id now means a new message.
    pub.send(Publish(topic, b"next", 2, False, False, 7))
    assert pub.expect(PubRec).packet_id == 7
    pub.send(PubRel(7))
    assert pub.expect(PubComp).packet_id == 7
    assert sub.get().payload == b"next"
    sub.no_message(0.2)


@pytest.mark.parametrize("version", [4, 5])
def test_qos2_exactly_once_survives_publisher_reconnect(address, paho, raw, version):
    """A publisher with a persistent session that loses its connection between PUBREC and
    PUBREL may resend the PUBLISH (DUP=1) after reconnecting; the broker remembers the packet
    id in the session and does not deliver the message a second time (MQTT-4.3.3)."""
    topic = unique("qos/exactly-once-resume")
    client_id = unique("raw-qos2-resume")
    sub = paho(address, protocol=MQTTv5)
    sub.subscribe(topic, 2)
    session = Properties(session_expiry_interval=60) if version == 5 else None
    pub = raw(address, version)
    pub.connect(client_id, clean_start=False, properties=session)
    pub.send(Publish(topic, b"resumed", 2, False, False, 42))
    assert pub.expect(PubRec).packet_id == 42
    pub.disconnect()
    assert sub.get().payload == b"resumed"

    pub = raw(address, version)
    connack = pub.connect(client_id, clean_start=False, properties=session)
    assert connack.session_present
    pub.send(Publish(topic, b"resumed", 2, False, True, 42))
    assert pub.expect(PubRec).packet_id == 42
    pub.send(PubRel(42))
    comp = pub.expect(PubComp)
    assert (comp.packet_id, comp.reason_code) == (42, 0)
    sub.no_message(0.5)


@pytest.mark.parametrize(("version", "code"), [(4, 0x00), (5, 0x92)])
def test_pubrel_for_unknown_packet_id_is_answered_with_pubcomp(address, raw, version, code):
    """A PUBREL for a packet id the broker holds no QoS 2 state for still gets a PUBCOMP with
    that id (MQTT-4.3.3-11 / MQTT-3.6.4-1); v5 says Packet Identifier not found (0x92). The
    connection stays up."""
    client = raw(address, version)
    client.connect(unique("pubrel-unknown"))
    client.send(PubRel(999))
    comp = client.expect(PubComp)
    assert (comp.packet_id, comp.reason_code) == (999, code)
    assert client.is_open(0.2)
