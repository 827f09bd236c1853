"""Sessions: persistence across connections, the offline queue, redelivery with DUP, session
expiry and takeover of a client identifier.

MQTT 3.1.1 §3.1.2.4, §4.1, §4.4; MQTT 5 §3.1.2.4, §3.1.2.11.2, §3.1.4, §4.1, §4.4.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from paho.mqtt.packettypes import PacketTypes

from kittiwake.mqtt.packets import Disconnect, PubAck, PubComp, Publish, PubRec, PubRel
from kittiwake.mqtt.properties import Properties

from .clients import VERSIONS, MQTTv5, MQTTv311, props, unique
from .rawclient import ConnectionClosed


def _persistent(paho, address, client_id, version, **kwargs):
    """A paho client resuming (or starting) a persistent session."""
    if version == "v5":
        return paho(
            address, client_id, protocol=MQTTv5, clean_start=False,
            properties=props(PacketTypes.CONNECT, SessionExpiryInterval=300), **kwargs,
        )
    return paho(address, client_id, protocol=MQTTv311, clean=False, **kwargs)


def _raw_session(version):
    return Properties(session_expiry_interval=300) if version == 5 else None


@pytest.mark.parametrize("version", ["v311", "v5"])
def test_persistent_session_queues_qos1_and_qos2_messages_while_offline(address, paho, version):
    """A persistent session keeps its subscriptions while disconnected, stores QoS 1 and 2
    messages for it, and delivers them, in order, when the client resumes the session; the
    CONNACK says session present (MQTT-3.1.2-4/-5, MQTT-3.2.2-2)."""
    topic = unique("sess/offline")
    client_id = unique("sess-offline")
    first = _persistent(paho, address, client_id, version)
    assert not first.session_present
    first.subscribe(topic, 2)
    first.disconnect()
    pub = paho(address)
    pub.publish(topic, b"q1", 1)
    pub.publish(topic, b"q2", 2)
    pub.publish(topic, b"q1 again", 1)
    resumed = _persistent(paho, address, client_id, version)
    assert resumed.session_present
    got = resumed.get_many(3)
    # Ordering is promised per topic and QoS (MQTT-4.6.0-5); paho hands a QoS 2 message over
    # only after its PUBREL round trip, so compare each QoS stream on its own.
    assert [m.payload for m in got if m.qos == 1] == [b"q1", b"q1 again"]
    assert [m.payload for m in got if m.qos == 2] == [b"q2"]
    # The subscription is still there for live traffic.
    pub.publish(topic, b"live", 1)
    assert resumed.get().payload == b"live"
    resumed.no_message(0.25)


@pytest.mark.parametrize("version", ["v311", "v5"])
def test_clean_start_discards_the_previous_session(address, paho, version):
    """Connecting with Clean Session / Clean Start discards any existing session: no session
    present, no queued messages, no subscriptions (MQTT-3.1.2-6 / MQTT-3.1.2-4)."""
    topic = unique("sess/clean")
    client_id = unique("sess-clean")
    first = _persistent(paho, address, client_id, version)
    first.subscribe(topic, 1)
    first.disconnect()
    pub = paho(address)
    pub.publish(topic, b"queued", 1)
    clean = paho(address, client_id, protocol=VERSIONS[version], clean=True)
    assert not clean.session_present
    clean.no_message(0.3)
    pub.publish(topic, b"after clean start", 1)
    clean.no_message(0.3)


def test_v5_session_with_zero_expiry_ends_with_the_connection(address, paho):
    """Without a Session Expiry Interval (0), a v5 session ends when the connection closes,
    even with Clean Start 0 (MQTT 5 §3.1.2.11.2)."""
    topic = unique("sess/zero")
    client_id = unique("sess-zero")
    first = paho(address, client_id, protocol=MQTTv5, clean_start=False)
    first.subscribe(topic, 1)
    first.disconnect()
    paho(address).publish(topic, b"lost", 1)
    again = paho(address, client_id, protocol=MQTTv5, clean_start=False)
    assert not again.session_present
    again.no_message(0.3)


def test_v5_session_expires_after_its_interval(address, paho):
    """A session with Session Expiry Interval 1 s is gone 2 s after the disconnection: no
    session present, its queued messages and subscriptions discarded (MQTT-3.1.2-23)."""
    topic = unique("sess/expire")
    client_id = unique("sess-expire")
    first = paho(
        address, client_id, protocol=MQTTv5, clean_start=False,
        properties=props(PacketTypes.CONNECT, SessionExpiryInterval=1),
    )
    first.subscribe(topic, 1)
    first.disconnect()
    paho(address).publish(topic, b"expires with the session", 1)
    time.sleep(2.0)
    again = paho(address, client_id, protocol=MQTTv5, clean_start=False)
    assert not again.session_present
    again.no_message(0.3)


def test_v5_disconnect_can_shorten_session_expiry_to_zero(address, paho):
    """A v5 DISCONNECT carrying Session Expiry Interval 0 ends the session at once
    (MQTT 5 §3.14.2.2.2)."""
    topic = unique("sess/disc-expiry")
    client_id = unique("sess-disc-expiry")
    first = _persistent(paho, address, client_id, "v5")
    first.subscribe(topic, 1)
    first.disconnect(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0))
    again = paho(address, client_id, protocol=MQTTv5, clean_start=False)
    assert not again.session_present


@pytest.mark.parametrize("version", [4, 5])
def test_unacknowledged_qos1_delivery_is_resent_with_dup_on_resume(address, paho, raw, version):
    """A QoS 1 message sent but not acknowledged before the connection ended is sent again
    when the session resumes, with the same packet identifier and DUP=1 (MQTT-4.4.0-1,
    MQTT-3.3.1-1); once acknowledged it is not sent again."""
    topic = unique("sess/dup1")
    client_id = unique("sess-dup1")
    sub = raw(address, version)
    sub.connect(client_id, clean_start=False, properties=_raw_session(version))
    assert sub.subscribe(topic, 1).reason_codes == [1]
    paho(address).publish(topic, b"ack me", 1)
    original = sub.expect(Publish)
    assert (original.payload, original.qos, original.dup) == (b"ack me", 1, False)
    sub.disconnect()  # without PUBACK

    sub = raw(address, version)
    connack = sub.connect(client_id, clean_start=False, properties=_raw_session(version))
    assert connack.session_present
    resent = sub.expect(Publish)
    assert (resent.topic, resent.payload, resent.qos) == (topic, b"ack me", 1)
    assert resent.dup, "a redelivered PUBLISH must have DUP=1"
    assert resent.packet_id == original.packet_id
    sub.send(PubAck(resent.packet_id))
    sub.no_packet(0.4)

    sub.disconnect()
    sub = raw(address, version)
    connack = sub.connect(client_id, clean_start=False, properties=_raw_session(version))
    assert connack.session_present
    sub.no_packet(0.4)


@pytest.mark.parametrize("version", [4, 5])
def test_unacknowledged_qos2_delivery_is_resent_with_dup_on_resume(address, paho, raw, version):
    """A QoS 2 PUBLISH without PUBREC is resent with DUP=1 on resume (MQTT-4.4.0-1)."""
    topic = unique("sess/dup2")
    client_id = unique("sess-dup2")
    sub = raw(address, version)
    sub.connect(client_id, clean_start=False, properties=_raw_session(version))
    sub.subscribe(topic, 2)
    paho(address).publish(topic, b"exactly once", 2)
    original = sub.expect(Publish)
    assert (original.qos, original.dup) == (2, False)
    sub.disconnect()

    sub = raw(address, version)
    connack = sub.connect(client_id, clean_start=False, properties=_raw_session(version))
    assert connack.session_present
    resent = sub.expect(Publish)
    assert (resent.payload, resent.qos, resent.dup, resent.packet_id) == (
        b"exactly once", 2, True, original.packet_id,
    )
    sub.send(PubRec(resent.packet_id))
    rel = sub.expect(PubRel)
    assert rel.packet_id == resent.packet_id
    sub.send(PubComp(rel.packet_id))
    sub.no_packet(0.4)


@pytest.mark.parametrize("version", [4, 5])
def test_qos2_release_is_resent_not_the_publish_after_pubrec(address, paho, raw, version):
    """Once the client sent PUBREC, resuming the session resends PUBREL, not the PUBLISH
    (MQTT-4.4.0-1: resend unacknowledged PUBREL packets)."""
    topic = unique("sess/pubrel")
    client_id = unique("sess-pubrel")
    sub = raw(address, version)
    sub.connect(client_id, clean_start=False, properties=_raw_session(version))
    sub.subscribe(topic, 2)
    paho(address).publish(topic, b"received once", 2)
    publish = sub.expect(Publish)
    sub.send(PubRec(publish.packet_id))
    assert sub.expect(PubRel).packet_id == publish.packet_id
    sub.disconnect()  # without PUBCOMP

    sub = raw(address, version)
    connack = sub.connect(client_id, clean_start=False, properties=_raw_session(version))
    assert connack.session_present
    rel = sub.expect(PubRel)
    assert rel.packet_id == publish.packet_id
    sub.send(PubComp(rel.packet_id))
    sub.no_packet(0.4)


def test_takeover_closes_the_old_v311_connection(address, raw):
    """A second CONNECT with the same client id makes the broker close the first network
    connection (MQTT-3.1.4-2); the new one is accepted and works."""
    client_id = unique("sess-takeover")
    old = raw(address, 4)
    old.connect(client_id)
    new = raw(address, 4)
    assert new.connect(client_id).reason_code == 0
    assert old.recv_until_closed(2.0) == []  # 3.1.1 has no DISCONNECT from the server
    topic = unique("sess/takeover")
    new.subscribe(topic, 1)
    new.publish(topic, b"still mine", 1)
    assert new.expect(Publish).payload == b"still mine"


def test_v5_takeover_sends_disconnect_session_taken_over_first(address, raw):
    """A v5 connection whose client id is taken over receives DISCONNECT with reason 0x8E
    (Session taken over) before the broker closes it (MQTT-3.1.4-3)."""
    client_id = unique("sess-takeover5")
    old = raw(address, 5)
    old.connect(client_id)
    new = raw(address, 5)
    new.connect(client_id)
    packets = old.recv_until_closed(2.0)
    assert len(packets) == 1 and isinstance(packets[0], Disconnect), packets
    assert packets[0].reason_code == 0x8E


@pytest.mark.parametrize("version", ["v311", "v5"])
def test_takeover_with_paho_keeps_the_persistent_session(address, paho, version):
    """Taking over a persistent session (clean start 0) moves it to the new connection:
    session present, subscriptions kept; the old paho client sees the connection end (v5:
    with reason 0x8E)."""
    topic = unique("sess/takeover-persist")
    client_id = unique("sess-takeover-persist")
    old = _persistent(paho, address, client_id, version)
    old.subscribe(topic, 1)
    new = _persistent(paho, address, client_id, version)
    assert new.session_present
    gone = old.wait_disconnected()
    if version == "v5":
        assert gone.reason_code == 0x8E
    paho(address).publish(topic, b"to the new connection", 1)
    assert new.get().payload == b"to the new connection"
    old.no_message(0.25)


def test_old_connection_cannot_act_after_takeover(address, raw):
    """After the takeover the old connection is closed: anything it sends is lost, nothing
    reaches subscribers."""
    client_id = unique("sess-zombie")
    topic = unique("sess/zombie")
    watcher = raw(address, 5)
    watcher.connect(unique("watcher"))
    watcher.subscribe(topic, 0)
    old = raw(address, 4)
    old.connect(client_id)
    new = raw(address, 4)
    new.connect(client_id)
    old.recv_until_closed(2.0)
    with contextlib.suppress(OSError):
        old.publish(topic, b"zombie", 0)
    watcher.no_packet(0.4)
    with pytest.raises((ConnectionClosed, OSError)):
        old.recv(0.5)
