"""What the broker writes on its own account always fits the wire and the client's limits:
Response Information, reason strings and user properties are bounded, and reason strings and
user properties are dropped when the client's Maximum Packet Size would be exceeded
(MQTT 5 §3.1.2.11.4, MQTT-3.1.2-24/25). Inputs come from a client, so they are hostile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from connection_harness import Wire
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kittiwake.broker.broker import Broker
from kittiwake.broker.store import MemoryStore
from kittiwake.clock import ManualClock
from kittiwake.config import config_from_dict
from kittiwake.mqtt.answers import MAX_REASON_STRING_BYTES, response_information
from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PubAck,
    Publish,
    Subscribe,
    SubscriptionRequest,
    Will,
)
from kittiwake.mqtt.properties import Properties
from kittiwake.mqtt.reason_codes import ReasonCode


def with_broker(body: Callable[[Broker], None], **config: object) -> None:
    async def main() -> None:
        broker = Broker(config_from_dict(config), clock=ManualClock(), store=MemoryStore())
        body(broker)

    asyncio.run(main())


def frames(wire: Wire) -> list[bytes]:
    """Every packet the connection wrote, as the raw frames a client reads."""
    data = bytes(wire.transport.written)
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        length, shift, i = 0, 0, pos + 1
        while True:
            byte = data[i]
            length |= (byte & 0x7F) << shift
            i += 1
            shift += 7
            if byte < 0x80:
                break
        out.append(data[pos : i + length])
        pos = i + length
    return out


def decoded(wire: Wire) -> list[Packet]:
    decoder = PacketDecoder()
    decoder.protocol_version = wire.version
    return decoder.feed(bytes(wire.transport.written))


def test_response_information_fits_for_the_longest_client_id() -> None:
    """The fuzzing find: a 65,527-byte client id with Request Response Information = 1 made
    the CONNACK unencodable ("response/" + id passes 65,535 bytes); the client got DISCONNECT
    0x83 instead of a CONNACK."""

    def body(broker: Broker) -> None:
        wire = Wire(broker, 5)
        client_id = "c" * 65_527
        connack = wire.connect(client_id, properties=Properties(request_response_information=1))
        assert connack.reason_code == 0
        info = connack.properties.response_information
        assert info is not None
        assert len(info.encode()) <= 256
        assert "+" not in info and "#" not in info

    with_broker(body)


def test_response_information_is_stable_per_client_and_distinct_between_clients() -> None:
    """A client may build its response topics on it, reconnect after reconnect."""
    assert response_information("sensor-1") == response_information("sensor-1")
    assert response_information("sensor-1") != response_information("sensor-2")
    long_a, long_b = "x" * 70_000 + "a", "x" * 70_000 + "b"
    assert response_information(long_a) != response_information(long_b)
    assert response_information("a/+/#") != response_information("a/b/c")


@given(st.text(max_size=300) | st.text(alphabet="+#/$\x01é", max_size=70_000))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_response_information_is_always_a_short_wildcard_free_topic_prefix(client_id: str) -> None:
    info = response_information(client_id)
    assert len(info.encode("utf-8", "surrogatepass")) <= 256
    assert "+" not in info and "#" not in info and "\x00" not in info
    info.encode("utf-8")  # never a lone surrogate


def test_refused_topic_of_control_characters_gets_its_disconnect() -> None:
    """The fuzzing find: a ~16 KB topic of U+0001 with a wildcard; the reason string quoted the
    topic's repr (four characters each), passed 65,535 bytes, and the transport died instead of
    sending DISCONNECT 0x90."""

    def body(broker: Broker) -> None:
        wire = Wire(broker, 5)
        wire.connect("c")
        wire.received()
        wire.send(Publish("\x01" * 16_400 + "/+", b"x", 0))
        packets = wire.received()
        assert len(packets) == 1 and isinstance(packets[0], Disconnect), packets
        assert packets[0].reason_code == ReasonCode.TOPIC_NAME_INVALID
        reason = packets[0].properties.reason_string
        assert reason is not None and len(reason.encode()) <= MAX_REASON_STRING_BYTES
        assert wire.connection.closed and wire.transport.closed

    with_broker(body)


def test_reason_string_dropped_when_the_client_maximum_packet_size_is_small() -> None:
    """MQTT-3.1.2-25 for everything but PUBLISH: a reason string that would take the packet
    past the client's Maximum Packet Size is left out, the reason code still goes."""

    def body(broker: Broker) -> None:
        wire = Wire(broker, 5)
        wire.connect("c", properties=Properties(maximum_packet_size=16))
        wire.received()
        wire.send(Publish("a/+", b"x", 0))
        connack, *raw = frames(wire)
        assert len(connack) <= 16
        assert len(raw) == 1 and len(raw[0]) <= 16, raw
        packet = decoded(wire)[-1]
        assert isinstance(packet, Disconnect)
        assert packet.reason_code == ReasonCode.TOPIC_NAME_INVALID
        assert packet.properties.reason_string is None

    with_broker(body)


def test_refused_connect_with_a_long_will_topic_gets_a_bounded_reason() -> None:
    def body(broker: Broker) -> None:
        wire = Wire(broker, 5)
        will = Will("deny/" + "\x01" * 60_000, b"bye")
        wire.send_bytes(encode(Connect("c", protocol_version=5, will=will), 5))
        packets = decoded(wire)
        assert len(packets) == 1 and isinstance(packets[0], ConnAck), packets
        assert packets[0].reason_code == ReasonCode.NOT_AUTHORIZED
        reason = packets[0].properties.reason_string
        assert reason is None or len(reason.encode()) <= MAX_REASON_STRING_BYTES

    with_broker(body, auth={"publish_deny": ["deny/#"]})


# -- the property: whatever a client sends, what comes back decodes and fits -----------------

_hostile_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
    max_size=40,
) | st.builds(
    lambda char, count, tail: char * count + tail,
    st.sampled_from(["\x01", "é", "💥", "a", "+", "/", "#"]),
    st.integers(0, 25_000),
    st.sampled_from(["", "/+", "#", "/a", "+"]),
)


@st.composite
def _conversations(draw: st.DrawFn) -> tuple[str, Properties, list[Packet]]:
    client_id = draw(_hostile_text)
    props = Properties(
        request_response_information=draw(st.sampled_from([None, 0, 1])),
        request_problem_information=draw(st.sampled_from([None, 0, 1])),
        maximum_packet_size=draw(st.sampled_from([None, 5, 16, 64, 1000, 70_000])),
        topic_alias_maximum=draw(st.sampled_from([None, 2])),
    )
    packets: list[Packet] = []
    for packet_id in range(1, draw(st.integers(0, 3)) + 1):
        kind = draw(st.sampled_from(["publish", "subscribe", "puback"]))
        topic = draw(_hostile_text)
        if kind == "publish":
            qos = draw(st.integers(0, 2))
            packets.append(Publish(topic or "t", b"p", qos, packet_id=packet_id if qos else None))
        elif kind == "subscribe":
            packets.append(Subscribe(packet_id, [SubscriptionRequest(topic or "t", 1)]))
        else:
            packets.append(PubAck(packet_id))
    return client_id, props, packets


@given(_conversations(), st.sampled_from([4, 5]))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_answer_decodes_and_fits_the_client_limit(
    conversation: tuple[str, Properties, list[Packet]], version: int
) -> None:
    client_id, props, packets = conversation

    def body(broker: Broker) -> None:
        wire = Wire(broker, version)
        connect = Connect(client_id, protocol_version=version, properties=props)
        try:
            first = encode(connect, version)
        except ValueError:
            return  # a client cannot send this either
        wire.send_bytes(first)
        for packet in packets:
            if wire.connection.closed:
                break
            try:
                data = encode(packet, version)
            except ValueError:
                continue
            wire.send_bytes(data)
        limit = props.maximum_packet_size if version == 5 and props.maximum_packet_size else None
        for frame in frames(wire):
            # A CONNACK carries properties the client needs; the smallest limits cannot take
            # them (no real client asks for less than 64 bytes).
            if limit is not None and (frame[0] >> 4 != 2 or limit >= 64):
                assert len(frame) <= limit, (limit, frame[:40])
        for packet in decoded(wire):  # every frame decodes
            reason = getattr(packet, "properties", Properties()).reason_string
            assert reason is None or len(reason.encode()) <= MAX_REASON_STRING_BYTES

    with_broker(body, auth={"publish_deny": ["deny/#"]})
