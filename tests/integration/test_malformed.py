"""Malformed and out-of-protocol input: the offending connection is closed (v5: after a
DISCONNECT or CONNACK with the reason), and nobody else notices.

MQTT 3.1.1 §4.8 / MQTT 5 §4.13 (handling errors), §1.5.5 (Variable Byte Integer), §2.1.3
(fixed header flags), §3.1 (CONNECT rules).
"""

from __future__ import annotations

import socket
import time

import pytest

from kittiwake.mqtt.codec import encode, encode_remaining_length
from kittiwake.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    SubscriptionRequest,
    Will,
)
from kittiwake.mqtt.properties import Properties

from .clients import unique


def frame(first: int, body: bytes) -> bytes:
    """A packet from a first byte and a body, with a correct Remaining Length."""
    return bytes([first]) + encode_remaining_length(len(body)) + body


def utf8(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def publish_body(
    topic: bytes | str, payload: bytes, version: int, packet_id: int | None = None
) -> bytes:
    body = utf8(topic)
    if packet_id is not None:
        body += packet_id.to_bytes(2, "big")
    if version == 5:
        body += b"\x00"  # no properties
    return body + payload


def _subscribe_bytes(version: int) -> bytes:
    return encode(Subscribe(1, [SubscriptionRequest("a/b", 0)]), version)


# (name, bytes for a version, v5 DISCONNECT reason)
AFTER_CONNECT = [
    ("remaining-length-5-bytes", lambda v: b"\x30\xff\xff\xff\xff\x01", 0x81),
    ("subscribe-reserved-flags", lambda v: bytes([0x80]) + _subscribe_bytes(v)[1:], 0x81),
    ("pubrel-reserved-flags", lambda v: b"\x60\x02\x00\x01", 0x81),
    ("reserved-packet-type-0", lambda v: b"\x00\x00", 0x81),
    ("publish-qos-3", lambda v: frame(0x36, publish_body("a/b", b"x", v, 1)), 0x81),
    ("dup-on-qos-0", lambda v: frame(0x38, publish_body("a/b", b"x", v)), 0x81),
    ("wildcard-plus-in-topic", lambda v: frame(0x30, publish_body("a/+", b"x", v)), 0x90),
    ("wildcard-hash-in-topic", lambda v: frame(0x32, publish_body("a/#", b"x", v, 1)), 0x90),
    ("invalid-utf8-topic", lambda v: frame(0x30, publish_body(b"a/\xff\xfe", b"x", v)), 0x81),
    ("nul-in-topic", lambda v: frame(0x30, publish_body("a/\x00b", b"x", v)), 0x81),
    ("packet-id-0", lambda v: frame(0x32, publish_body("a/b", b"x", v, 0)), 0x82),
    ("subscribe-without-filters",
     lambda v: frame(0x82, b"\x00\x01" + (b"\x00" if v == 5 else b"")), 0x82),
    ("second-connect", lambda v: encode(Connect(unique("again"), protocol_version=v), v), 0x82),
    ("connack-from-client", lambda v: encode(ConnAck(False, 0), v), 0x82),
    ("topic-length-past-end", lambda v: frame(0x30, b"\x00\x50a/b"), 0x81),
]


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize(
    ("make", "v5_reason"), [c[1:] for c in AFTER_CONNECT], ids=[c[0] for c in AFTER_CONNECT]
)
def test_malformed_packet_closes_only_that_connection(
    address, raw, bystander, version, make, v5_reason
):
    """A connected client that sends a malformed or forbidden packet is disconnected: 3.1.1
    just closes (MQTT-4.8.0-1), v5 sends DISCONNECT with the reason code first (MQTT-4.13.1-1).
    Other clients keep working, and the broker keeps accepting connections."""
    client = raw(address, version)
    client.connect(unique("malformed"))
    client.send_raw(make(version))
    packets = client.recv_until_closed()
    if version == 5:
        assert [type(p) for p in packets] == [Disconnect], packets
        assert packets[0].reason_code == v5_reason
    else:
        assert packets == []
    bystander.check()
    fresh = raw(address, version)
    assert fresh.connect(unique("after-malformed")).reason_code == 0


def _connect_body(name: str, level: int, flags: int = 0x02, client_id: str = "c") -> bytes:
    body = utf8(name) + bytes([level, flags]) + (10).to_bytes(2, "big")
    if level == 5:
        body += b"\x00"
    return body + utf8(client_id)


def test_first_packet_must_be_connect(address, raw, bystander):
    """Anything but CONNECT as the first packet closes the connection without a reply
    (MQTT-3.1.0-1)."""
    client = raw(address, 4)
    client.send_raw(frame(0x30, publish_body("a/b", b"early", 4)))
    assert client.recv_until_closed() == []
    pinger = raw(address, 4)
    pinger.send_raw(b"\xc0\x00")
    assert pinger.recv_until_closed() == []
    bystander.check()


@pytest.mark.parametrize(
    ("name", "level"), [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4), ("MQTT", 0)]
)
def test_unsupported_protocol_level_gets_connack_0x01(address, raw, bystander, name, level):
    """A CONNECT with a protocol level the broker does not speak gets the 3.1.1-style CONNACK
    return code 0x01 (Unacceptable protocol version) and the connection is closed
    (MQTT-3.1.2-2)."""
    client = raw(address, 4)
    client.send_raw(frame(0x10, _connect_body(name, level)))
    packets = client.recv_until_closed()
    assert len(packets) == 1 and isinstance(packets[0], ConnAck), packets
    assert (packets[0].reason_code, packets[0].session_present) == (0x01, False)
    bystander.check()


@pytest.mark.parametrize("name", ["HTTP", "mqtt", ""])
def test_unknown_protocol_name_is_closed_without_connack(address, raw, bystander, name):
    """A CONNECT with a protocol name other than MQTT/MQIsdp is not MQTT: the broker closes the
    connection without a CONNACK (MQTT-3.1.2-1)."""
    client = raw(address, 4)
    client.send_raw(frame(0x10, _connect_body(name, 4)))
    assert client.recv_until_closed() == []
    bystander.check()


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize(
    "flags",
    [0x03, 0x1E, 0x22, 0x42],
    ids=["reserved-bit", "will-qos-3", "will-retain-without-will", "password-without-user"],
)
def test_malformed_connect_is_closed(address, raw, bystander, version, flags):
    """Invalid CONNECT flags (reserved bit set MQTT-3.1.2-3, will QoS 3 MQTT-3.1.2-14, will
    retain without will MQTT-3.1.2-15, password flag without user name MQTT-3.1.2-22 in 3.1.1,
    and in v5 a password flag whose password is missing) close the connection; a v5 client
    may first get a CONNACK with an error reason (MQTT 5 §3.1.4, "MAY send a CONNACK")."""
    client = raw(address, version)
    client.send_raw(frame(0x10, _connect_body("MQTT", version, flags)))
    packets = client.recv_until_closed()
    assert packets == [] or (
        version == 5 and len(packets) == 1 and isinstance(packets[0], ConnAck)
        and packets[0].reason_code >= 0x80
    ), packets
    bystander.check()


def test_non_mqtt_bytes_are_closed(address, raw, bystander):
    """An HTTP request on the MQTT port is closed without a reply. ('G' reads as a PUBACK
    with reserved flags set and 'E' as a Remaining Length of 69, so the request must be at
    least that long for the broker to see a complete packet; real browsers send more.)"""
    client = raw(address, 4)
    client.send_raw(
        b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: integration-test/1.0\r\n"
        b"Accept: */*\r\nConnection: close\r\n\r\n"
    )
    assert client.recv_until_closed() == []
    bystander.check()


def test_truncated_packet_then_hang_up_leaves_broker_healthy(address, raw, bystander):
    """A client that hangs up in the middle of a packet (here half a CONNECT, then half a
    PUBLISH on a connected client) costs nothing but that connection."""
    half = raw(address, 4)
    connect = encode(Connect(unique("half")), 4)
    half.send_raw(connect[: len(connect) // 2])
    half.close()
    mid = raw(address, 4)
    mid.connect(unique("mid"))
    publish = encode(Publish("a/b", b"x" * 100, 1, packet_id=1), 4)
    mid.send_raw(publish[:50])
    mid.close()
    bystander.check()


def test_malformed_packet_from_a_will_holder_publishes_its_will(address, raw, paho):
    """A connection closed for a protocol error ends abnormally, so its will is published
    (MQTT-3.1.2-8: the server closes the connection because of a protocol error)."""
    topic = unique("malformed/will")
    watcher = paho(address)
    watcher.subscribe(topic, 1)
    client = raw(address, 4)
    client.connect(unique("will-holder"), will=Will(topic, b"broke the rules", 1))
    client.send_raw(b"\x00\x00")
    client.recv_until_closed()
    assert watcher.get().payload == b"broke the rules"


@pytest.mark.parametrize(
    "flags", [0x03, 0x1E], ids=["reserved-bit", "will-qos-3"]
)
def test_malformed_v5_connect_gets_connack_with_reason(address, raw, bystander, flags):
    """A 5.0 CONNECT that turns out malformed is answered with CONNACK 0x81 before the close,
    so the client can tell a broken packet from a network failure (MQTT 5 §3.1.4)."""
    client = raw(address, 5)
    client.send_raw(frame(0x10, _connect_body("MQTT", 5, flags)))
    packets = client.recv_until_closed()
    assert len(packets) == 1 and isinstance(packets[0], ConnAck), packets
    assert packets[0].reason_code == 0x81
    bystander.check()


def test_short_non_mqtt_greeting_is_closed_at_once(address, raw, bystander):
    """Bytes that cannot start a CONNECT close the connection on arrival, without waiting
    for a packet to complete (a port scanner's 'HELO' must not hold a connection open)."""
    client = raw(address, 4)
    client.send_raw(b"HELO")
    assert client.recv_until_closed(timeout=2.0) == []
    bystander.check()


# -- answers that must fit, whatever the client sent (finds of a fuzzing run) -----------------


def test_longest_client_id_with_response_information_gets_its_connack(address, raw, bystander):
    """A 65,527-byte client id with Request Response Information = 1: the broker's Response
    Information derived from the id no longer fitted a string field, so the client got
    DISCONNECT 0x83 instead of a CONNACK. It must get a CONNACK with a short one."""
    client = raw(address, 5)
    connack = client.connect(
        "i" * 65_527, properties=Properties(request_response_information=1)
    )
    info = connack.properties.response_information
    assert info and len(info.encode()) <= 256
    assert client.is_open()
    bystander.check()


def test_refused_topic_of_control_characters_is_answered_with_disconnect(
    address, raw, bystander
):
    """A PUBLISH whose ~16 KB topic of U+0001 carries a wildcard: the reason string quoted the
    topic's repr (four characters each) past 65,535 bytes and the transport died ("Fatal error
    on transport") instead of sending DISCONNECT 0x90."""
    client = raw(address, 5)
    client.connect(unique("control-chars"))
    client.send_raw(frame(0x30, publish_body("\x01" * 16_400 + "/+", b"x", 5)))
    packets = client.recv_until_closed()
    assert [type(p) for p in packets] == [Disconnect], packets
    assert packets[0].reason_code == 0x90
    reason = packets[0].properties.reason_string
    assert reason is not None and len(reason.encode()) <= 256
    bystander.check()


def test_reason_string_left_out_when_the_client_maximum_packet_size_is_small(address, raw):
    """MQTT-3.1.2-25 (and §3.1.2.11.4): a reason string that would take an answer past the
    client's Maximum Packet Size is dropped; the reason code still arrives."""
    client = raw(address, 5)
    client.connect(unique("small-max"), properties=Properties(maximum_packet_size=24))
    client.send_raw(frame(0x30, publish_body("a/+/long-enough-to-quote", b"x", 5)))
    client.sock.settimeout(3)
    data = b""
    while True:  # the raw bytes, to measure the frame as the client's limit counts it
        chunk = client.sock.recv(4096)
        if not chunk:
            break
        data += chunk
    assert data[0] == 0xE0 and len(data) <= 24, data
    assert data == b"\xe0\x01\x90", data


def _tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of ``sock`` (linux/tcp.h: 1 ESTABLISHED, 7 CLOSE, 8 CLOSE_WAIT)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def _wait_for_state(sock: socket.socket, states: set[int], timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while (state := _tcp_state(sock)) not in states:
        assert time.monotonic() < deadline, f"TCP state stayed {state}, not one of {states}"
        time.sleep(0.005)
    return state


def test_client_still_sending_pubrels_reads_the_disconnect(broker, raw):
    """After DISCONNECT 0x93 (receive maximum exceeded) the broker closes its write side and
    keeps reading until the client is done: a client still sending PUBRELs for earlier PUBRECs
    must be able to read the DISCONNECT, not get a broken pipe first (MQTT 5 §4.13)."""
    address = broker(limits={"receive_maximum": 2})
    client = raw(address, 5)
    client.connect(unique("pubrel-sender"))
    for packet_id in (1, 2, 3):
        client.send(Publish("t/rm", b"x", 2, packet_id=packet_id))
    # The broker has answered and half-closed (FIN received): CLOSE_WAIT here.
    _wait_for_state(client.sock, {8})
    for packet_id in (1, 2):
        client.send(PubRel(packet_id))
    # Whatever the broker did with them, our end must still be writable: a broker that closed
    # outright answers the first PUBREL with a reset (state CLOSE) and the next send fails.
    for _ in range(20):
        client.send(PubRel(1))
    packets = client.recv_until_closed()
    kinds = [type(p) for p in packets]
    assert kinds[-1] is Disconnect and packets[-1].reason_code == 0x93, packets
    assert kinds.count(PubRec) == 2, packets


@pytest.mark.parametrize("version", [4, 5])
def test_packets_before_a_malformed_one_in_the_same_read_are_handled(
    address, raw, paho, version
):
    """A client that pipelines CONNECT, a QoS 1 PUBLISH and then a broken packet in one write
    is answered packet by packet: CONNACK, PUBACK, and only then the close (v5: DISCONNECT
    0x81). Found by the fuzzing harness: the whole read was dropped and a v5 client got a
    refusing CONNACK for a CONNECT that was fine."""
    topic = unique("pipelined")
    watcher = paho(address)
    watcher.subscribe(topic, 1)
    client = raw(address, version)
    client.send_raw(
        encode(Connect(unique("pipeliner"), protocol_version=version), version)
        + encode(Publish(topic, b"before the break", 1, packet_id=7), version)
        + b"\x00\x00"  # reserved packet type 0
    )
    packets = client.recv_until_closed()
    kinds = [type(p).__name__ for p in packets]
    expected = ["ConnAck", "PubAck"] + (["Disconnect"] if version == 5 else [])
    assert kinds == expected, packets
    assert packets[0].reason_code == 0 and packets[1].packet_id == 7
    assert watcher.get().payload == b"before the break"
