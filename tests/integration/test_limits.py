"""Resource limits: packet size both ways, Receive Maximum both ways, in-flight window, session
queue bounds, and keepalive enforcement.

MQTT 5 §3.1.2.10 (Keep Alive), §3.1.2.11.3/§3.2.2.3.3 (Receive Maximum), §3.1.2.11.4/
§3.2.2.3.6 (Maximum Packet Size), §4.9 (flow control); MQTT 3.1.1 §3.1.2.10.
"""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes

from kittiwake.mqtt.codec import encode
from kittiwake.mqtt.packets import (
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Will,
)
from kittiwake.mqtt.properties import Properties

from .clients import MQTTv5, MQTTv311, props, unique

MAX_PACKET = 1024


@pytest.fixture(scope="module")
def module_broker_config():
    return {
        "limits": {
            "max_packet_size": MAX_PACKET,
            "receive_maximum": 3,
            "max_inflight": 2,
            "max_queued_messages": 5,
        },
    }


def _publish_of_size(size: int, version: int) -> Publish:
    """A QoS 0 PUBLISH whose encoded size (fixed header included) is exactly ``size``."""
    packet = Publish("t/size", b"", 0)
    overhead = len(encode(packet, version))
    packet.payload = b"x" * (size - overhead)
    while len(encode(packet, version)) > size:  # the remaining-length field grew
        packet.payload = packet.payload[:-1]
    assert len(encode(packet, version)) == size
    return packet


# -- maximum packet size ---------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 5])
def test_packet_of_exactly_the_maximum_size_is_accepted(address, raw, version):
    """limits.max_packet_size counts the whole packet; one of exactly that size is fine."""
    client = raw(address, version)
    client.connect(unique("max-ok"))
    client.subscribe("t/size", 0)
    client.send(_publish_of_size(MAX_PACKET, version))
    assert len(client.wait_for(Publish).payload) > 900


def test_oversized_packet_closes_a_v311_connection(address, raw, bystander):
    """A 3.1.1 client sending a packet bigger than limits.max_packet_size is disconnected
    without any reply; other clients are unaffected."""
    client = raw(address, 4)
    client.connect(unique("too-big4"))
    client.send(_publish_of_size(MAX_PACKET + 1, 4))
    assert client.recv_until_closed() == []
    bystander.check()


def test_oversized_packet_gets_v5_disconnect_packet_too_large(address, raw, bystander):
    """A v5 client exceeding the Maximum Packet Size the CONNACK announced receives
    DISCONNECT 0x95 (Packet too large) and is closed (MQTT-3.2.2-15 / §4.13)."""
    client = raw(address, 5)
    assert client.connect(unique("too-big5")).properties.maximum_packet_size == MAX_PACKET
    client.send(_publish_of_size(MAX_PACKET + 1, 5))
    packets = client.recv_until_closed()
    assert [type(p) for p in packets] == [Disconnect]
    assert packets[0].reason_code == 0x95
    bystander.check()


def test_paho_v5_oversized_publish_is_disconnected_with_packet_too_large(address, paho):
    """The same through paho: its on_disconnect reports reason 0x95."""
    client = paho(address, protocol=MQTTv5)
    client.publish("limits/big", b"x" * (MAX_PACKET * 2), 0, wait=False)
    assert client.wait_disconnected().reason_code == 0x95


def test_client_maximum_packet_size_is_never_exceeded(address, paho):
    """A v5 client's Maximum Packet Size is respected: a larger message is not sent to it
    (MQTT-3.1.2-24/-25), later smaller ones are, and the connection stays up."""
    topic = unique("limits/client-max")
    small_client = paho(
        address, protocol=MQTTv5,
        properties=props(PacketTypes.CONNECT, MaximumPacketSize=200),
    )
    small_client.subscribe(topic, 1)
    everyone = paho(address, protocol=MQTTv5)
    everyone.subscribe(topic, 1)
    pub = paho(address)
    pub.publish(topic, b"L" * 500, 1)
    pub.publish(topic, b"small", 1)
    pub.publish(topic, b"small again", 0)
    assert [m.payload for m in small_client.get_many(2)] == [b"small", b"small again"]
    small_client.no_message(0.25)
    assert [len(m.payload) for m in everyone.get_many(3)] == [500, 5, 11]
    assert small_client.client.is_connected()


# -- Receive Maximum ---------------------------------------------------------------------------


def test_exceeding_receive_maximum_gets_disconnect_0x93(address, raw, bystander):
    """A v5 client with more unacknowledged QoS 2 publications than the broker's Receive
    Maximum (3 here; PUBREL never sent) is disconnected with 0x93 (MQTT-3.3.4-8, §4.9)."""
    client = raw(address, 5)
    assert client.connect(unique("rm-breach")).properties.receive_maximum == 3
    for packet_id in (1, 2, 3):
        client.send(Publish("limits/rm", b"q2", 2, packet_id=packet_id))
    for _ in range(3):
        assert isinstance(client.recv(), PubRec)
    client.send(Publish("limits/rm", b"one too many", 2, packet_id=4))
    packets = client.recv_until_closed()
    assert packets and isinstance(packets[-1], Disconnect), packets
    assert packets[-1].reason_code == 0x93
    assert all(isinstance(p, PubRec) for p in packets[:-1])
    bystander.check()


def test_released_publications_free_receive_maximum_quota(address, raw):
    """Completed QoS 2 exchanges (PUBREL/PUBCOMP) no longer count: a client can keep sending
    as long as no more than Receive Maximum are open at once."""
    client = raw(address, 5)
    client.connect(unique("rm-ok"))
    for round_ in range(3):
        ids = [round_ * 3 + i for i in (1, 2, 3)]
        for packet_id in ids:
            client.send(Publish("limits/rm-ok", b"q2", 2, packet_id=packet_id))
        assert sorted(client.expect(PubRec).packet_id for _ in ids) == ids
        for packet_id in ids:
            client.send(PubRel(packet_id))
        assert sorted(client.expect(PubComp).packet_id for _ in ids) == ids
    for packet_id in (20, 21, 22):  # QoS 1 also counts until acknowledged, then frees
        client.send(Publish("limits/rm-ok", b"q1", 1, packet_id=packet_id))
    assert sorted(client.expect(PubAck).packet_id for _ in range(3)) == [20, 21, 22]
    assert client.is_open(0.3)


def test_client_receive_maximum_limits_unacknowledged_deliveries(address, paho, raw):
    """The broker never has more unacknowledged QoS 1/2 deliveries to a v5 client than its
    Receive Maximum (1 here); each PUBACK releases the next (MQTT-3.3.4-9)."""
    topic = unique("limits/client-rm")
    client = raw(address, 5)
    client.connect(unique("client-rm"), properties=Properties(receive_maximum=1))
    client.subscribe(topic, 1)
    pub = paho(address)
    for i in range(3):
        pub.publish(topic, str(i).encode(), 1)
    for i in range(3):
        delivery = client.expect(Publish)
        assert delivery.payload == str(i).encode()
        client.no_packet(0.3)
        client.send(PubAck(delivery.packet_id))


def test_max_inflight_limits_unacknowledged_deliveries_to_a_v311_client(address, paho, raw):
    """limits.max_inflight (2 here) bounds the QoS 1 deliveries awaiting PUBACK for a client
    that cannot announce a Receive Maximum; acknowledging frees room for the next, in order."""
    topic = unique("limits/inflight")
    client = raw(address, 4)
    client.connect(unique("inflight"))
    client.subscribe(topic, 1)
    pub = paho(address)
    for i in range(4):
        pub.publish(topic, str(i).encode(), 1)
    first, second = client.expect(Publish), client.expect(Publish)
    assert (first.payload, second.payload) == (b"0", b"1")
    client.no_packet(0.3)
    client.send(PubAck(first.packet_id))
    assert client.expect(Publish).payload == b"2"
    client.no_packet(0.2)
    client.send(PubAck(second.packet_id))
    assert client.expect(Publish).payload == b"3"


# -- session queue bounds ------------------------------------------------------------------------


def _fill_offline_queue(paho, address, count):
    topic = unique("limits/queue")
    client_id = unique("queue")
    sub = paho(address, client_id, clean=False)
    sub.subscribe(topic, 1)
    sub.disconnect()
    pub = paho(address)
    for i in range(count):
        pub.publish(topic, str(i).encode(), 1)
    back = paho(address, client_id, clean=False)
    assert back.session_present
    return back


def test_full_session_queue_rejects_new_messages_by_default(address, paho):
    """With limits.max_queued_messages 5 and queue_full_policy reject_new, an offline session
    keeps the first 5 of 8 messages."""
    back = _fill_offline_queue(paho, address, 8)
    assert [m.payload for m in back.get_many(5)] == [str(i).encode() for i in range(5)]
    back.no_message(0.3)


def test_full_session_queue_discards_oldest_when_configured(broker, paho):
    """queue_full_policy discard_oldest keeps the newest 5 of 8 messages."""
    address = broker(limits={"max_queued_messages": 5, "queue_full_policy": "discard_oldest"})
    back = _fill_offline_queue(paho, address.address, 8)
    assert [m.payload for m in back.get_many(5)] == [str(i).encode() for i in range(3, 8)]
    back.no_message(0.3)


# -- keepalive -------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 5])
def test_silent_client_is_disconnected_after_one_and_a_half_keepalives(
    address, paho, raw, version
):
    """A client with keepalive 1 s that sends nothing is disconnected once 1.5 s have passed
    (MQTT-3.1.2-24; the broker checks every 0.5 s); v5 gets DISCONNECT 0x8D (Keep Alive
    timeout) first, and the will is published because this is not a normal disconnection."""
    will_topic = unique("limits/ka-will")
    watcher = paho(address, protocol=MQTTv5)
    watcher.subscribe(will_topic, 1)
    client = raw(address, version)
    client.connect(unique("ka"), keepalive=1, will=Will(will_topic, b"timed out", 1))
    start = time.monotonic()
    packets = client.recv_until_closed(4.0)
    elapsed = time.monotonic() - start
    assert 1.4 <= elapsed <= 2.6, f"closed after {elapsed:.2f}s with keepalive 1 s"
    if version == 5:
        assert [type(p) for p in packets] == [Disconnect]
        assert packets[0].reason_code == 0x8D
    else:
        assert packets == []
    assert watcher.get(1.0).payload == b"timed out"


def test_pingreq_keeps_a_quiet_client_connected(address, raw):
    """A client that sends PINGREQ within its keepalive stays connected and gets PINGRESP each
    time (MQTT-3.12.4-1)."""
    client = raw(address, 4)
    client.connect(unique("pinger"), keepalive=1)
    for _ in range(4):  # 2.2 s, well past the 1.5 s limit
        time.sleep(0.55)
        client.send(PingReq())
        assert isinstance(client.expect(PingResp, timeout=1.0), PingResp)
    assert client.is_open(0.1)


def test_paho_clients_keep_their_connections_with_keepalive_pings(address, paho):
    """paho's own keepalive handling (keepalive 1 s, PINGREQ when idle) keeps a 3.1.1 and a v5
    client connected past the 1.5 s limit."""
    topic = unique("limits/paho-ka")
    clients = [paho(address, protocol=p, keepalive=1) for p in (MQTTv311, MQTTv5)]
    for client in clients:
        client.subscribe(topic, 1)
    time.sleep(2.2)
    paho(address).publish(topic, b"still here", 1)
    for client in clients:
        assert client.client.is_connected() and not client.disconnects
        assert client.get().payload == b"still here"
