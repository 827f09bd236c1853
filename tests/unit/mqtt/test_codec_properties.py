"""MQTT 5 property validation, and hypothesis: generated round trips and random-byte robustness.

The allowed-packet table below is transcribed from the MQTT 5.0 spec (section 2.2.2.2)
independently of properties.py, so a slip in either shows up as a failure.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kittiwake.mqtt.codec import MQTTProtocolError, PacketDecoder, encode
from kittiwake.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
    Will,
)
from kittiwake.mqtt.properties import (
    WILL_PROPERTIES,
    Properties,
    PropertyId,
    decode_properties,
    encode_properties,
)
from kittiwake.mqtt.reason_codes import ReasonCode

P = PacketType
W = WILL_PROPERTIES
ACKS = {P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP}

# Property -> (field, packets it may appear in), straight from the spec's table.
SPEC: dict[PropertyId, tuple[str, set[int]]] = {
    PropertyId.PAYLOAD_FORMAT_INDICATOR: ("payload_format_indicator", {P.PUBLISH, W}),
    PropertyId.MESSAGE_EXPIRY_INTERVAL: ("message_expiry_interval", {P.PUBLISH, W}),
    PropertyId.CONTENT_TYPE: ("content_type", {P.PUBLISH, W}),
    PropertyId.RESPONSE_TOPIC: ("response_topic", {P.PUBLISH, W}),
    PropertyId.CORRELATION_DATA: ("correlation_data", {P.PUBLISH, W}),
    PropertyId.SUBSCRIPTION_IDENTIFIER: ("subscription_identifiers", {P.PUBLISH, P.SUBSCRIBE}),
    PropertyId.SESSION_EXPIRY_INTERVAL: (
        "session_expiry_interval",
        {P.CONNECT, P.CONNACK, P.DISCONNECT},
    ),
    PropertyId.ASSIGNED_CLIENT_IDENTIFIER: ("assigned_client_identifier", {P.CONNACK}),
    PropertyId.SERVER_KEEP_ALIVE: ("server_keep_alive", {P.CONNACK}),
    PropertyId.AUTHENTICATION_METHOD: ("authentication_method", {P.CONNECT, P.CONNACK, P.AUTH}),
    PropertyId.AUTHENTICATION_DATA: ("authentication_data", {P.CONNECT, P.CONNACK, P.AUTH}),
    PropertyId.REQUEST_PROBLEM_INFORMATION: ("request_problem_information", {P.CONNECT}),
    PropertyId.WILL_DELAY_INTERVAL: ("will_delay_interval", {W}),
    PropertyId.REQUEST_RESPONSE_INFORMATION: ("request_response_information", {P.CONNECT}),
    PropertyId.RESPONSE_INFORMATION: ("response_information", {P.CONNACK}),
    PropertyId.SERVER_REFERENCE: ("server_reference", {P.CONNACK, P.DISCONNECT}),
    PropertyId.REASON_STRING: (
        "reason_string",
        {P.CONNACK, *ACKS, P.SUBACK, P.UNSUBACK, P.DISCONNECT, P.AUTH},
    ),
    PropertyId.RECEIVE_MAXIMUM: ("receive_maximum", {P.CONNECT, P.CONNACK}),
    PropertyId.TOPIC_ALIAS_MAXIMUM: ("topic_alias_maximum", {P.CONNECT, P.CONNACK}),
    PropertyId.TOPIC_ALIAS: ("topic_alias", {P.PUBLISH}),
    PropertyId.MAXIMUM_QOS: ("maximum_qos", {P.CONNACK}),
    PropertyId.RETAIN_AVAILABLE: ("retain_available", {P.CONNACK}),
    PropertyId.USER_PROPERTY: (
        "user_properties",
        {P.CONNECT, P.CONNACK, P.PUBLISH, W, *ACKS, P.SUBSCRIBE, P.SUBACK, P.UNSUBSCRIBE}
        | {P.UNSUBACK, P.DISCONNECT, P.AUTH},
    ),
    PropertyId.MAXIMUM_PACKET_SIZE: ("maximum_packet_size", {P.CONNECT, P.CONNACK}),
    PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE: ("wildcard_subscription_available", {P.CONNACK}),
    PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (
        "subscription_identifier_available",
        {P.CONNACK},
    ),
    PropertyId.SHARED_SUBSCRIPTION_AVAILABLE: ("shared_subscription_available", {P.CONNACK}),
}

ALL_CONTEXTS = [W, *range(1, 16)]

# One valid sample value per property, and its wire encoding (id byte included).
SAMPLE: dict[PropertyId, tuple[Any, bytes]] = {
    PropertyId.PAYLOAD_FORMAT_INDICATOR: (1, b"\x01\x01"),
    PropertyId.MESSAGE_EXPIRY_INTERVAL: (70000, b"\x02\x00\x01\x11\x70"),
    PropertyId.CONTENT_TYPE: ("ct", b"\x03\x00\x02ct"),
    PropertyId.RESPONSE_TOPIC: ("r/t", b"\x08\x00\x03r/t"),
    PropertyId.CORRELATION_DATA: (b"\x00\xff", b"\x09\x00\x02\x00\xff"),
    PropertyId.SUBSCRIPTION_IDENTIFIER: ([200], b"\x0b\xc8\x01"),
    PropertyId.SESSION_EXPIRY_INTERVAL: (0xFFFFFFFF, b"\x11\xff\xff\xff\xff"),
    PropertyId.ASSIGNED_CLIENT_IDENTIFIER: ("id", b"\x12\x00\x02id"),
    PropertyId.SERVER_KEEP_ALIVE: (0, b"\x13\x00\x00"),
    PropertyId.AUTHENTICATION_METHOD: ("m", b"\x15\x00\x01m"),
    PropertyId.AUTHENTICATION_DATA: (b"d", b"\x16\x00\x01d"),
    PropertyId.REQUEST_PROBLEM_INFORMATION: (0, b"\x17\x00"),
    PropertyId.WILL_DELAY_INTERVAL: (5, b"\x18\x00\x00\x00\x05"),
    PropertyId.REQUEST_RESPONSE_INFORMATION: (1, b"\x19\x01"),
    PropertyId.RESPONSE_INFORMATION: ("ri", b"\x1a\x00\x02ri"),
    PropertyId.SERVER_REFERENCE: ("sr", b"\x1c\x00\x02sr"),
    PropertyId.REASON_STRING: ("why", b"\x1f\x00\x03why"),
    PropertyId.RECEIVE_MAXIMUM: (1, b"\x21\x00\x01"),
    PropertyId.TOPIC_ALIAS_MAXIMUM: (0, b"\x22\x00\x00"),
    PropertyId.TOPIC_ALIAS: (0x1234, b"\x23\x12\x34"),
    PropertyId.MAXIMUM_QOS: (0, b"\x24\x00"),
    PropertyId.RETAIN_AVAILABLE: (1, b"\x25\x01"),
    PropertyId.USER_PROPERTY: ([("k", "v")], b"\x26\x00\x01k\x00\x01v"),
    PropertyId.MAXIMUM_PACKET_SIZE: (1, b"\x27\x00\x00\x00\x01"),
    PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE: (0, b"\x28\x00"),
    PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (1, b"\x29\x01"),
    PropertyId.SHARED_SUBSCRIPTION_AVAILABLE: (0, b"\x2a\x00"),
}


def block(*props: bytes) -> bytes:
    body = b"".join(props)
    assert len(body) < 128
    return bytes((len(body),)) + body


def decode_block(data: bytes, packet_type: int) -> Properties:
    props, end = decode_properties(data, 0, packet_type)
    assert end == len(data)
    return props


def reason(data: bytes, packet_type: int) -> ReasonCode:
    with pytest.raises(MQTTProtocolError) as info:
        decode_properties(data, 0, packet_type)
    return info.value.reason_code


# --- the table --------------------------------------------------------------------------------


def test_property_ids_match_spec() -> None:
    assert len(PropertyId) == 27
    assert set(PropertyId) == set(SPEC)
    assert list(Properties.__slots__) == [SPEC[pid][0] for pid in sorted(PropertyId)]


@pytest.mark.parametrize("pid", list(PropertyId), ids=lambda p: p.name)
def test_property_allowed_exactly_where_the_spec_says(pid: PropertyId) -> None:
    name, allowed = SPEC[pid]
    value, wire = SAMPLE[pid]
    for context in ALL_CONTEXTS:
        if context in allowed:
            props = decode_block(block(wire), context)
            assert getattr(props, name) == value
            assert encode_properties(props, context) == block(wire)
        else:
            # 2.2.2.2: an identifier not valid for its packet type is a Malformed Packet.
            assert reason(block(wire), context) == ReasonCode.MALFORMED_PACKET
            with pytest.raises(ValueError):
                encode_properties(Properties(**{name: value}), context)


def test_empty_properties_encode_to_single_zero() -> None:
    for context in ALL_CONTEXTS:
        assert encode_properties(Properties(), context) == b"\x00"


@pytest.mark.parametrize("pid_byte", [0x00, 0x04, 0x0A, 0x10, 0x14, 0x1B, 0x20, 0x2B, 0x7F, 0xFF])
def test_unknown_property_identifier_is_malformed(pid_byte: int) -> None:
    assert reason(block(bytes((pid_byte, 0))), P.PUBLISH) == ReasonCode.MALFORMED_PACKET


# --- repeats ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pid",
    [p for p in PropertyId if p != PropertyId.USER_PROPERTY],
    ids=lambda p: p.name,
)
def test_property_twice_is_protocol_error(pid: PropertyId) -> None:
    _, allowed = SPEC[pid]
    wire = SAMPLE[pid][1]
    for context in allowed:
        if pid == PropertyId.SUBSCRIPTION_IDENTIFIER and context == P.PUBLISH:
            continue
        assert reason(block(wire, wire), context) == ReasonCode.PROTOCOL_ERROR


def test_repeatable_properties() -> None:
    user = block(
        b"\x26" + b"\x00\x01a\x00\x01b", b"\x26\x00\x01a\x00\x01b", b"\x26\x00\x00\x00\x00"
    )
    assert decode_block(user, P.PUBLISH).user_properties == [("a", "b"), ("a", "b"), ("", "")]
    subs = block(b"\x0b\x01", b"\x0b\xff\xff\xff\x7f", b"\x0b\x01")
    assert decode_block(subs, P.PUBLISH).subscription_identifiers == [1, 268_435_455, 1]


def test_subscribe_may_not_encode_two_subscription_identifiers() -> None:
    with pytest.raises(ValueError):
        encode_properties(Properties(subscription_identifiers=[1, 2]), P.SUBSCRIBE)


# --- values -----------------------------------------------------------------------------------

BOOLEAN_BYTES = [
    PropertyId.PAYLOAD_FORMAT_INDICATOR,
    PropertyId.REQUEST_PROBLEM_INFORMATION,
    PropertyId.REQUEST_RESPONSE_INFORMATION,
    PropertyId.MAXIMUM_QOS,
    PropertyId.RETAIN_AVAILABLE,
    PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE,
    PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    PropertyId.SHARED_SUBSCRIPTION_AVAILABLE,
]


@pytest.mark.parametrize("pid", BOOLEAN_BYTES, ids=lambda p: p.name)
@pytest.mark.parametrize("value", [2, 0x80, 0xFF])
def test_boolean_byte_properties_reject_other_values(pid: PropertyId, value: int) -> None:
    context = min(SPEC[pid][1] - {W}) if SPEC[pid][1] - {W} else W
    assert reason(block(bytes((pid, value))), context) == ReasonCode.PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("wire", "context"),
    [
        (b"\x21\x00\x00", P.CONNECT),  # receive maximum 0
        (b"\x21\x00\x00", P.CONNACK),
        (b"\x27\x00\x00\x00\x00", P.CONNECT),  # maximum packet size 0
        (b"\x27\x00\x00\x00\x00", P.CONNACK),
        (b"\x23\x00\x00", P.PUBLISH),  # topic alias 0
        (b"\x0b\x00", P.PUBLISH),  # subscription identifier 0
        (b"\x0b\x00", P.SUBSCRIBE),
    ],
)
def test_zero_is_a_protocol_error(wire: bytes, context: int) -> None:
    assert reason(block(wire), context) == ReasonCode.PROTOCOL_ERROR


def test_response_topic_with_wildcard_is_protocol_error() -> None:
    # MQTT-3.3.2-14: the Response Topic MUST NOT contain wildcard characters.
    assert reason(block(b"\x08\x00\x03a/#"), P.PUBLISH) == ReasonCode.PROTOCOL_ERROR
    assert reason(block(b"\x08\x00\x03a/+"), W) == ReasonCode.PROTOCOL_ERROR


@pytest.mark.parametrize(
    "data",
    [
        b"\x05\x02\x00\x00",  # property length beyond the packet
        b"\x03\x02\x00\x00",  # four-byte value cut by the property length
        b"\x02\x21\x00",  # two-byte value cut
        b"\x01\x01",  # byte value cut
        b"\x03\x03\x00\x05",  # string length beyond the block
        b"\x03\x09\x00\x05",  # binary length beyond the block
        b"\x04\x26\x00\x00\x00",  # user property value cut
        b"\x02\x0b\x80",  # varint cut
        b"\x06\x0b\x80\x80\x80\x80\x01",  # varint of 5 bytes
        b"\x80",  # property length varint cut
        b"\xff\xff\xff\xff\x01",  # property length varint of 5 bytes
        b"",  # no property length at all
    ],
)
def test_overruns_are_malformed(data: bytes) -> None:
    assert reason(data, P.PUBLISH) == ReasonCode.MALFORMED_PACKET


def test_value_may_not_borrow_from_after_the_block() -> None:
    # The string's length points past the block into the bytes after it (e.g. the payload).
    data = b"\x03\x03\x00\x05" + b"abcde"
    assert reason(data, P.PUBLISH) == ReasonCode.MALFORMED_PACKET


def test_decode_properties_from_memoryview_at_offset() -> None:
    data = memoryview(b"junk" + block(SAMPLE[PropertyId.CONTENT_TYPE][1]) + b"rest")
    props, end = decode_properties(data, 4, P.PUBLISH)
    assert props == Properties(content_type="ct")
    assert bytes(data[end:]) == b"rest"


def test_properties_in_a_full_packet_reject_bad_context() -> None:
    # topic alias (PUBLISH only) inside a PUBACK, via the packet decoder.
    dec = PacketDecoder()
    dec.protocol_version = 5
    with pytest.raises(MQTTProtocolError) as info:
        dec.feed(b"\x40\x07\x00\x01\x00\x03\x23\x00\x01")
    assert info.value.reason_code == ReasonCode.MALFORMED_PACKET


def test_will_properties_use_the_will_table() -> None:
    # Will delay interval is legal in the will, not in CONNECT itself; the reverse for
    # session expiry interval.
    will = Will("t", b"m", properties=Properties(will_delay_interval=1))
    ok = Connect("c", 5, will=will, properties=Properties(session_expiry_interval=1))
    dec = PacketDecoder()
    assert dec.feed(encode(ok)) == [ok]
    bad = encode(Connect("c", 5, will=Will("t", b"m"))).replace(
        b"\x00\x01c\x00", b"\x00\x01c\x05\x11\x00\x00\x00\x01"
    )
    bad = bytes((bad[0], bad[1] + 5)) + bad[2:]
    with pytest.raises(MQTTProtocolError) as info:
        PacketDecoder().feed(bad)
    assert info.value.reason_code == ReasonCode.MALFORMED_PACKET


# --- hypothesis: generated packets round-trip -------------------------------------------------

CHARS = st.characters(codec="utf-8", exclude_characters="\x00")
text = st.text(CHARS, max_size=12)
topic_name = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00+#"), min_size=1, max_size=12
)
binary = st.binary(max_size=16)
u8_bool = st.integers(0, 1)
u16 = st.integers(0, 0xFFFF)
u16_nonzero = st.integers(1, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
packet_id = st.integers(1, 0xFFFF)
pairs = st.lists(st.tuples(text, text), max_size=3)

VALUES: dict[str, st.SearchStrategy[Any]] = {
    "payload_format_indicator": u8_bool,
    "message_expiry_interval": u32,
    "content_type": text,
    "response_topic": topic_name,
    "correlation_data": binary,
    "session_expiry_interval": u32,
    "assigned_client_identifier": text,
    "server_keep_alive": u16,
    "authentication_method": text,
    "authentication_data": binary,
    "request_problem_information": u8_bool,
    "will_delay_interval": u32,
    "request_response_information": u8_bool,
    "response_information": text,
    "server_reference": text,
    "reason_string": text,
    "receive_maximum": u16_nonzero,
    "topic_alias_maximum": u16,
    "topic_alias": u16_nonzero,
    "maximum_qos": u8_bool,
    "retain_available": u8_bool,
    "maximum_packet_size": st.integers(1, 0xFFFFFFFF),
    "wildcard_subscription_available": u8_bool,
    "subscription_identifier_available": u8_bool,
    "shared_subscription_available": u8_bool,
    "user_properties": pairs,
}


def properties_for(context: int) -> st.SearchStrategy[Properties]:
    optional = {
        name: VALUES[name]
        for name, allowed in SPEC.values()
        if context in allowed and name in VALUES
    }
    if context == P.PUBLISH:
        optional["subscription_identifiers"] = st.lists(
            st.integers(1, 268_435_455), min_size=1, max_size=3
        )
    elif context == P.SUBSCRIBE:
        optional["subscription_identifiers"] = st.lists(
            st.integers(1, 268_435_455), min_size=1, max_size=1
        )
    return st.fixed_dictionaries({}, optional=optional).map(lambda kw: Properties(**kw))


def props_or_empty(version: int, context: int) -> st.SearchStrategy[Properties]:
    return properties_for(context) if version == 5 else st.just(Properties())


@st.composite
def connects(draw: st.DrawFn, version: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_name),
            draw(binary),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(props_or_empty(version, W)),
        )
    username = draw(st.none() | text)
    password = draw(st.none() | binary) if username is not None or version == 5 else None
    return Connect(
        draw(text),
        version,
        clean_start=draw(st.booleans()),
        keepalive=draw(u16),
        will=will,
        username=username,
        password=password,
        properties=draw(props_or_empty(version, P.CONNECT)),
    )


@st.composite
def publishes(draw: st.DrawFn, version: int) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(props_or_empty(version, P.PUBLISH))
    topic = draw(topic_name)
    if version == 5 and props.topic_alias is not None and draw(st.booleans()):
        topic = ""
    return Publish(
        topic,
        draw(st.binary(max_size=300)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos or version == 3 else False,
        draw(packet_id) if qos else None,
        props,
    )


def acks(cls: Any, version: int) -> st.SearchStrategy[Packet]:
    if version != 5:
        return st.builds(cls, packet_id)
    return st.builds(cls, packet_id, st.integers(0, 255), properties_for(cls.packet_type))


def subscription_requests(version: int) -> st.SearchStrategy[SubscriptionRequest]:
    if version != 5:
        return st.builds(SubscriptionRequest, text, st.integers(0, 2))
    return st.builds(
        SubscriptionRequest,
        text,
        st.integers(0, 2),
        st.booleans(),
        st.booleans(),
        st.integers(0, 2),
    )


def reason_only(cls: Any) -> st.SearchStrategy[Packet]:
    return st.builds(cls, st.integers(0, 255), properties_for(cls.packet_type))


def packets(version: int) -> st.SearchStrategy[Packet]:
    v5 = version == 5
    codes = st.lists(st.integers(0, 255), min_size=1, max_size=5)
    options: list[st.SearchStrategy[Packet]] = [
        connects(version),
        st.builds(
            ConnAck,
            st.booleans() if version != 3 else st.just(False),
            st.integers(0, 255),
            props_or_empty(version, P.CONNACK),
        ),
        publishes(version),
        acks(PubAck, version),
        acks(PubRec, version),
        acks(PubRel, version),
        acks(PubComp, version),
        st.builds(
            Subscribe,
            packet_id,
            st.lists(subscription_requests(version), min_size=1, max_size=4),
            props_or_empty(version, P.SUBSCRIBE),
        ),
        st.builds(SubAck, packet_id, codes, props_or_empty(version, P.SUBACK)),
        st.builds(
            Unsubscribe,
            packet_id,
            st.lists(text, min_size=1, max_size=4),
            props_or_empty(version, P.UNSUBSCRIBE),
        ),
        st.builds(UnsubAck, packet_id, codes, properties_for(P.UNSUBACK))
        if v5
        else st.builds(UnsubAck, packet_id),
        st.just(PingReq()),
        st.just(PingResp()),
        reason_only(Disconnect) if v5 else st.just(Disconnect()),
    ]
    if v5:
        options.append(reason_only(Auth))
    return st.one_of(options)


def feed_in_chunks(version: int, data: bytes, cuts: list[int]) -> list[Packet]:
    dec = PacketDecoder()
    dec.protocol_version = version
    out: list[Packet] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        out += dec.feed(data[start:cut])
        start = cut
    return out


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("version", [3, 4, 5])
def test_generated_packets_roundtrip(version: int) -> None:
    @SETTINGS
    @given(st.lists(packets(version), min_size=1, max_size=4), st.data())
    def check(batch: list[Packet], data: st.DataObject) -> None:
        stream = b"".join(encode(p, version) for p in batch)
        # A CONNECT in the batch resets the decoder's version to its own, which is `version`.
        assert feed_in_chunks(version, stream, []) == batch
        cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=4))
        assert feed_in_chunks(version, stream, cuts) == batch

    check()


@pytest.mark.parametrize("context", ALL_CONTEXTS)
def test_generated_properties_roundtrip(context: int) -> None:
    @settings(max_examples=60, deadline=None)
    @given(properties_for(context))
    def check(props: Properties) -> None:
        wire = encode_properties(props, context)
        assert decode_block(wire, context) == props

    check()


# --- hypothesis: hostile bytes ----------------------------------------------------------------


def feed_only_protocol_errors(version: int, data: bytes, cuts: list[int]) -> None:
    with contextlib.suppress(MQTTProtocolError):
        feed_in_chunks(version, data, cuts)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([3, 4, 5]), st.binary(max_size=200), st.lists(st.integers(0, 200)))
def test_random_bytes_raise_only_protocol_errors(
    version: int, data: bytes, cuts: list[int]
) -> None:
    feed_only_protocol_errors(version, data, [c for c in cuts if c <= len(data)])


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([3, 4, 5]),
    st.integers(1, 15),
    st.binary(max_size=120),
)
def test_random_bodies_with_valid_headers_raise_only_protocol_errors(
    version: int, ptype: int, body: bytes
) -> None:
    # A well-formed fixed header gets the random bytes past framing into the packet parsers.
    flags = 0b0010 if ptype in (6, 8, 10) else 0
    if ptype == 3:
        flags = random.Random(body).randrange(16)
    data = bytes((ptype << 4 | flags, len(body))) + body
    feed_only_protocol_errors(version, data, [])


@pytest.mark.parametrize("version", [3, 4, 5])
def test_mutated_valid_packets_raise_only_protocol_errors(version: int) -> None:
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(packets(version), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255))))
    def check(packet: Packet, flips: list[tuple[int, int]]) -> None:
        data = bytearray(encode(packet, version))
        for where, value in flips:
            data[where % len(data)] = value
        feed_only_protocol_errors(version, bytes(data), [])
        if len(data) > 2:
            feed_only_protocol_errors(version, bytes(data[: len(data) // 2]) + b"\xc0\x00", [])

    check()
