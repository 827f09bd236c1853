"""Resource limits: packet size both ways, Receive Maximum both ways, in-flight window, session
queue bounds, and keepalive enforcement.

MQTT 5 §3.1.2.10 (Keep Alive), §3.1.2.11.3/§3.2.2.3.3 (Receive Maximum), §3.1.2.11.4/
§3.2.2.3.6 (Maximum Packet Size), §4.9 (flow control); MQTT 3.1.1 §3.1.2.10.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from paho.mqtt.packettypes import PacketTypes

from kittiwake.mqtt.codec import encode
from kittiwake.mqtt.packets import (
    Connect,
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

from .clients import MQTTv5, MQTTv311, props, unique, wait_until

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
    # paho's own call, not the helper's: its return code can already say "not connected"
    # when the broker's DISCONNECT beats the call's return (a loaded machine), which is the
    # very answer this test waits for.
    client.client.publish("limits/big", b"x" * (MAX_PACKET * 2), 0)
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


def test_qos2_awaiting_a_slow_commit_counts_once_against_receive_maximum(broker, raw):
    """A QoS 2 publication whose PUBREC waits for the store is one open exchange, not two:
    with Receive Maximum 4 and commits held back for 0.5 s, three open QoS 2 publications of
    a persistent session are within the quota and no 0x93 follows."""
    address = broker(limits={"receive_maximum": 4}, store={"max_delay": 0.5}).address
    client = raw(address, 5)
    client.connect(unique("rm-slow"), clean_start=False,
                   properties=Properties(session_expiry_interval=60))
    for packet_id in (1, 2, 3):
        client.send(Publish("limits/rm-slow", b"q2", 2, packet_id=packet_id))
    assert sorted(client.expect(PubRec, timeout=5.0).packet_id for _ in range(3)) == [1, 2, 3]
    for packet_id in (1, 2, 3):
        client.send(PubRel(packet_id))
    assert sorted(client.expect(PubComp, timeout=5.0).packet_id for _ in range(3)) == [1, 2, 3]


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


def test_only_deliveries_in_flight_are_resent_with_dup(address, paho, raw):
    """On session resumption the unacknowledged in-flight deliveries (2 here, max_inflight) are
    resent first, in their original order, with DUP=1 and their packet ids; messages that were
    still queued are then sent for the first time, with DUP=0 (MQTT-3.3.1-1/-3, MQTT-4.4.0-1)."""
    topic = unique("limits/dup-order")
    client_id = unique("dup-order")
    client = raw(address, 4)
    client.connect(client_id, clean_start=False)
    client.subscribe(topic, 1)
    pub = paho(address)
    for i in range(4):
        pub.publish(topic, str(i).encode(), 1)
    sent = [client.expect(Publish), client.expect(Publish)]
    client.no_packet(0.2)
    client.disconnect()

    client = raw(address, 4)
    assert client.connect(client_id, clean_start=False).session_present
    resent = [client.expect(Publish), client.expect(Publish)]
    assert [(p.payload, p.packet_id, p.dup) for p in resent] == [
        (p.payload, p.packet_id, True) for p in sent
    ]
    for p in resent:
        client.send(PubAck(p.packet_id))
    fresh = [client.expect(Publish), client.expect(Publish)]
    assert [(p.payload, p.dup) for p in fresh] == [(b"2", False), (b"3", False)]


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


def test_dropped_messages_are_logged_with_their_true_count_and_counted_in_metrics(
    broker, paho
):
    """1,500 messages beyond an offline session's limit of 5: the first drop is logged at
    once, the rest by the broker's tick; the log's running total reaches exactly 1,500, and
    /metrics counts the same 1,500 in kittiwake_messages_dropped_total."""
    import re
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    process = broker(http=True, limits={"max_queued_messages": 5})
    topic = unique("limits/dropped")
    client_id = unique("dropped")
    sub = paho(process.address, client_id, clean=False)
    sub.subscribe(topic, 1)
    sub.disconnect()
    pub = paho(process.address)
    sent = [pub.publish(topic, str(i).encode(), 1, wait=False) for i in range(1_505)]
    for info in sent:
        info.wait_for_publish(10)
        assert info.is_published()

    def totals_logged() -> list[int]:
        return [int(n) for n in re.findall(r"full \(.*?\): .*?(\d+) in all", process.log_text())]

    assert wait_until(lambda: 1_500 in totals_logged(), 10), totals_logged()[-5:]
    assert max(totals_logged()) == 1_500
    assert len(totals_logged()) < 1_500  # one line per tick, not one per message

    def dropped_metric() -> float:
        with urllib.request.urlopen(process.http_url + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return next(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "kittiwake_messages_dropped_total"
        )

    assert dropped_metric() == 1_500
    back = paho(process.address, client_id, clean=False)
    assert back.session_present
    assert [m.payload for m in back.get_many(5)] == [str(i).encode() for i in range(5)]


@pytest.mark.parametrize("clean", [True, False])
def test_a_copy_larger_than_the_queue_byte_limit_is_dropped_even_with_nothing_waiting(
    broker, paho, clean
):
    """A QoS 1 copy larger than its subscriber's max_queued_bytes is refused by the queue's
    policy, as it would be behind a waiting entry, also when it could go at once (an empty
    queue and room in the window). ``clean``: the copy is not stored (False: it is stored, a
    persistent session's, and may go before its commit). Before, such a copy was delivered
    whenever it took the at-once path."""
    process = broker(limits={"max_queued_bytes": 1000})
    topic = unique("limits/bytes")
    sub = paho(process.address, unique("bytes"), clean=clean)
    sub.subscribe(topic, 1)
    pub = paho(process.address)
    pub.publish(topic, b"x" * 2000, 1)
    pub.publish(topic, b"fence", 1)
    payloads = [m.payload for m in sub.get_many(1)]
    assert payloads == [b"fence"], [len(p) for p in payloads]
    assert "full" in process.log_text()


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


# -- connection, subscription and topic bounds (dedicated brokers) ----------------------------


def test_connections_beyond_max_connections_are_refused(broker, raw):
    """limits.max_connections bounds open connections: one more is closed at once, without
    reading anything; when a slot frees up, a new connection is accepted again."""
    address = broker(limits={"max_connections": 2}).address
    first, second = raw(address, 4), raw(address, 4)
    first.connect(unique("conn1"))
    second.connect(unique("conn2"))
    third = raw(address, 4)
    with contextlib.suppress(OSError):  # already reset: refused before we could write
        third.send(Connect(unique("conn3")))
    assert third.recv_until_closed() == [], "no CONNACK for a connection over the limit"
    first.disconnect()
    time.sleep(0.2)
    fourth = raw(address, 4)
    assert fourth.connect(unique("conn4")).reason_code == 0


@pytest.mark.parametrize(("version", "refusal"), [(4, 0x80), (5, 0x97)])
def test_subscriptions_beyond_the_per_session_limit_are_refused(broker, raw, version, refusal):
    """limits.max_subscriptions_per_session: further new filters are refused (3.1.1 0x80, v5
    0x97 Quota exceeded); replacing an existing subscription is still allowed."""
    address = broker(limits={"max_subscriptions_per_session": 2}).address
    client = raw(address, version)
    client.connect(unique("subs-quota"))
    assert client.subscribe("a", 0).reason_codes == [0]
    assert client.subscribe("b", 0).reason_codes == [0]
    assert client.subscribe("c", 0).reason_codes == [refusal]
    assert client.subscribe("a", 1).reason_codes == [1]


@pytest.mark.parametrize("version", [4, 5])
def test_topics_deeper_than_max_topic_levels_are_refused(broker, raw, version):
    """limits.max_topic_levels: a deeper subscription filter is refused in the SUBACK (3.1.1
    0x80, v5 0x8F) and a deeper topic name in PUBLISH is a Topic Name invalid error (v5
    DISCONNECT 0x90; 3.1.1 close)."""
    address = broker(limits={"max_topic_levels": 3}).address
    client = raw(address, version)
    client.connect(unique("levels"))
    assert client.subscribe("a/b/c", 0).reason_codes == [0]
    assert client.subscribe("a/b/c/d", 0).reason_codes == [0x8F if version == 5 else 0x80]
    client.send(Publish("a/b/c/d", b"too deep", 0))
    packets = client.recv_until_closed()
    if version == 5:
        assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, 0x90)]
    else:
        assert packets == []


def test_message_expiry_is_capped_by_max_message_expiry(broker, paho):
    """sessions.max_message_expiry caps a publisher's Message Expiry Interval."""
    address = broker(sessions={"max_message_expiry": 5}).address
    sub = paho(address, protocol=MQTTv5)
    topic = unique("limits/expiry-cap")
    sub.subscribe(topic, 1)
    pub = paho(address, protocol=MQTTv5)
    pub.publish(topic, b"x", 1, properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=3600))
    pub.publish(topic, b"y", 1, properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=2))
    capped, kept = sub.get_many(2)
    assert capped.properties.MessageExpiryInterval in (4, 5)
    assert kept.properties.MessageExpiryInterval in (1, 2)


@pytest.mark.parametrize(("version", "code"), [(5, 0x97), (4, 3)])
def test_connections_beyond_the_per_address_limit_are_refused_with_a_reason(
    broker, raw, version, code
):
    """limits.max_connections_per_address: one more from the address gets a refusing CONNACK
    (v5 0x97 Quota exceeded, 3.1.1 return code 3) and is closed; the log names the address."""
    process = broker(limits={"max_connections_per_address": 2})

    def accepted():  # type: ignore[no-untyped-def]
        # The readiness probe of the test harness may still count until its close is seen.
        client = raw(process.address, 4)
        connack = client.connect(unique("addr"), expect_success=False)
        return client if connack.reason_code == 0 else None

    first = wait_until(accepted, 5)
    second = wait_until(accepted, 5)
    assert first is not None and second is not None
    third = raw(process.address, version)
    connack = third.connect(unique("addr3"), expect_success=False)
    assert connack.reason_code == code
    assert third.recv_until_closed() == []
    assert "refusing 127.0.0.1:" in process.log_text()
    assert "too many connections from this address" in process.log_text()
    first.disconnect()

    def admitted() -> bool:
        client = raw(process.address, 5)
        return client.connect(unique("addr4"), expect_success=False).reason_code == 0

    assert wait_until(admitted, 5), "the freed slot was never given back"


def test_connections_arriving_too_fast_from_one_address_are_refused(broker, raw):
    """limits.max_connection_rate: past the one-second burst, a v5 client gets CONNACK 0x9F
    Connection rate exceeded (10 connections in a row at 1 per second: some must be refused
    unless the loop took 9 seconds)."""
    process = broker(limits={"max_connection_rate": 1})
    codes = []
    for n in range(10):
        client = raw(process.address, 5)
        codes.append(client.connect(unique(f"rate{n}"), expect_success=False).reason_code)
    assert 0x9F in codes, codes
    assert set(codes) <= {0, 0x9F}, codes
    assert "connection rate exceeded for this address" in process.log_text()


def test_amqp_connections_beyond_the_per_address_limit_are_closed(broker):
    """The same limits hold on an AMQP listener: the socket is closed before any frame."""
    import socket

    process = broker(amqp=True, limits={"max_connections_per_address": 1})
    def served() -> socket.socket | None:
        # The broker's readiness probe may still count until its close is seen: retry.
        sock = socket.create_connection((process.host, process.amqp_port), timeout=5)
        try:
            sock.sendall(b"AMQP\x03\x01\x00\x00")
            if sock.recv(8).startswith(b"AMQP"):
                return sock
        except OSError:
            pass
        sock.close()
        return None

    kept = wait_until(served, 5)
    assert kept is not None, "the first connection is not served"
    refused = socket.create_connection((process.host, process.amqp_port), timeout=5)
    with contextlib.suppress(OSError):
        refused.sendall(b"AMQP\x03\x01\x00\x00")
    with contextlib.suppress(ConnectionResetError):
        assert refused.recv(8) == b"", "a connection over the limit was served"
    assert "refusing amqp" in process.log_text()
    kept.close()
    refused.close()
