"""Every way a peer's bytes can break the protocol, and the error (and reason code) it maps to."""

from __future__ import annotations

import contextlib
import re

import pytest

from kittiwake.mqtt.codec import (
    MalformedPacketError,
    MQTTProtocolError,
    PacketDecoder,
    PacketTooLargeError,
    UnsupportedProtocolVersionError,
    encode,
    encode_remaining_length,
)
from kittiwake.mqtt.packets import Connect, Packet, Publish
from kittiwake.mqtt.properties import Properties
from kittiwake.mqtt.reason_codes import ReasonCode

MALFORMED = ReasonCode.MALFORMED_PACKET
PROTOCOL = ReasonCode.PROTOCOL_ERROR
TOPIC_INVALID = ReasonCode.TOPIC_NAME_INVALID


def s(text: str | bytes) -> bytes:
    """A length-prefixed string field from raw bytes (so invalid UTF-8 can be written)."""
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def pkt(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_remaining_length(len(body)) + body


def feed(data: bytes, version: int = 4) -> list[Packet]:
    dec = PacketDecoder()
    dec.protocol_version = version
    return dec.feed(data)


def fails(data: bytes, reason: ReasonCode, version: int = 4) -> MQTTProtocolError:
    with pytest.raises(MQTTProtocolError) as info:
        feed(data, version)
    assert info.value.reason_code == reason, str(info.value)
    if reason == MALFORMED:
        assert isinstance(info.value, MalformedPacketError)
    return info.value


def connect(
    flags: int = 0x02,
    payload: bytes = s("cid"),
    name: bytes = s("MQTT"),
    level: int = 4,
    props: bytes = b"",
) -> bytes:
    return pkt(0x10, name + bytes((level, flags)) + b"\x00\x3c" + props + payload)


# --- exception classes ------------------------------------------------------------------------


def test_error_classes() -> None:
    e = MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, "nope")
    assert str(e) == "nope" and e.reason_code is ReasonCode.PROTOCOL_ERROR
    assert MalformedPacketError("m").reason_code == MALFORMED
    assert PacketTooLargeError().reason_code == ReasonCode.PACKET_TOO_LARGE
    u = UnsupportedProtocolVersionError(7)
    assert u.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION and u.protocol_version == 7
    assert issubclass(UnsupportedProtocolVersionError, MQTTProtocolError)


# --- fixed header -----------------------------------------------------------------------------


def test_remaining_length_five_bytes() -> None:
    fails(b"\x30\xff\xff\xff\xff\x01", MALFORMED)


def test_remaining_length_fifth_byte_detected_without_waiting() -> None:
    fails(b"\x30\xff\xff\xff\xff", MALFORMED)


def test_incomplete_remaining_length_waits() -> None:
    assert feed(b"\x30\xff\xff") == []


@pytest.mark.parametrize(
    "first",
    [
        0x11,  # CONNECT
        0x28,  # CONNACK
        0x41,  # PUBACK
        0x52,  # PUBREC
        0x60,  # PUBREL needs 0b0010
        0x63,
        0x7F,  # PUBCOMP
        0x80,  # SUBSCRIBE needs 0b0010
        0x83,
        0x91,  # SUBACK
        0xA0,  # UNSUBSCRIBE needs 0b0010
        0xAA,  # UNSUBSCRIBE with DUP: only 3.1 allowed it
        0xB2,  # UNSUBACK
        0xC1,  # PINGREQ
        0xD8,  # PINGRESP
        0xE2,  # DISCONNECT
    ],
)
def test_reserved_fixed_header_flags(first: int) -> None:
    fails(bytes((first, 0)), MALFORMED)


def test_auth_reserved_flags_v5() -> None:
    fails(b"\xf1\x00", MALFORMED, 5)


def test_reserved_packet_type_0() -> None:
    fails(b"\x00\x00", MALFORMED)
    fails(b"\x00\x00", MALFORMED, 5)


@pytest.mark.parametrize("version", [3, 4])
def test_auth_before_v5(version: int) -> None:
    fails(b"\xf0\x00", MALFORMED, version)


def test_oversize_detected_from_fixed_header_alone() -> None:
    dec = PacketDecoder(max_packet_size=100)
    with pytest.raises(PacketTooLargeError) as info:
        dec.feed(b"\x30\xe8\x07")  # remaining length 1000, no body yet
    assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE


def test_oversize_counts_fixed_header() -> None:
    data = encode(Publish("t", b"x" * 95))  # 2 + 3 + 95 = 100 bytes
    assert len(data) == 100
    assert len(PacketDecoder(max_packet_size=100).feed(data)) == 1
    with pytest.raises(PacketTooLargeError):
        PacketDecoder(max_packet_size=99).feed(data[:2])


def test_oversize_after_a_good_packet_in_the_same_feed() -> None:
    dec = PacketDecoder(max_packet_size=10)
    with pytest.raises(PacketTooLargeError):
        dec.feed(b"\xc0\x00" + b"\x30\x7f")


# --- PUBLISH ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 4, 5])
def test_publish_qos_3(version: int) -> None:
    fails(pkt(0x36, s("a") + b"\x00\x01"), MALFORMED, version)


@pytest.mark.parametrize("version", [4, 5])
def test_publish_qos0_with_dup(version: int) -> None:
    # MQTT-3.3.1-2 (3.1.1 and 5.0): DUP MUST be 0 for QoS 0. 3.1 had no such rule.
    body = s("a") + (b"\x00" if version == 5 else b"")
    fails(pkt(0x38, body), MALFORMED, version)


@pytest.mark.parametrize("version", [3, 4, 5])
@pytest.mark.parametrize("qos", [1, 2])
def test_publish_packet_id_0(version: int, qos: int) -> None:
    fails(pkt(0x30 | qos << 1, s("a") + b"\x00\x00"), PROTOCOL, version)


@pytest.mark.parametrize("version", [3, 4, 5])
@pytest.mark.parametrize("topic", ["a/+", "#", "a/#", "+", "a+b"])
def test_publish_wildcard_topic(version: int, topic: str) -> None:
    body = s(topic) + (b"\x00" if version == 5 else b"")
    fails(pkt(0x30, body), TOPIC_INVALID, version)


@pytest.mark.parametrize("version", [3, 4])
def test_publish_empty_topic_v3_v4(version: int) -> None:
    fails(pkt(0x30, s("") + b"payload"), MALFORMED, version)


def test_publish_empty_topic_v5_without_alias() -> None:
    fails(pkt(0x30, s("") + b"\x00payload"), PROTOCOL, 5)


def test_publish_empty_topic_v5_with_alias_is_fine() -> None:
    assert feed(pkt(0x30, s("") + b"\x03\x23\x00\x05p"), 5) == [
        Publish("", b"p", properties=Properties(topic_alias=5))
    ]


def test_publish_too_short() -> None:
    fails(pkt(0x30, b"\x00"), MALFORMED)
    fails(pkt(0x30, s("abc")[:-1]), MALFORMED)
    fails(pkt(0x32, s("a") + b"\x00"), MALFORMED)  # half a packet id


def test_publish_v5_missing_property_length() -> None:
    fails(pkt(0x30, s("a")), MALFORMED, 5)


# --- strings: UTF-8, U+0000, lengths ----------------------------------------------------------

BAD_UTF8 = [
    pytest.param(b"\xff", id="invalid-byte"),
    pytest.param(b"\xc0\xaf", id="overlong"),
    pytest.param(b"\xed\xa0\x80", id="surrogate-d800"),
    pytest.param(b"\xed\xbf\xbf", id="surrogate-dfff"),
    pytest.param(b"a\xe2\x82", id="truncated"),
    pytest.param(b"\xf4\x90\x80\x80", id="above-10ffff"),
    pytest.param(b"a\x00b", id="nul"),
]


@pytest.mark.parametrize("raw", BAD_UTF8)
@pytest.mark.parametrize("version", [4, 5])
def test_bad_string_in_publish_topic(raw: bytes, version: int) -> None:
    fails(pkt(0x30, s(raw) + (b"\x00" if version == 5 else b"")), MALFORMED, version)


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_bad_string_in_client_id(raw: bytes) -> None:
    fails(connect(payload=s(raw)), MALFORMED)


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_bad_string_in_username(raw: bytes) -> None:
    fails(connect(flags=0x82, payload=s("c") + s(raw)), MALFORMED)


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_bad_string_in_will_topic(raw: bytes) -> None:
    fails(connect(flags=0x06, payload=s("c") + s(raw) + s("msg")), MALFORMED)


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_bad_string_in_protocol_name(raw: bytes) -> None:
    fails(connect(name=s(raw)), MALFORMED)


@pytest.mark.parametrize("raw", BAD_UTF8)
@pytest.mark.parametrize("version", [4, 5])
def test_bad_string_in_topic_filters(raw: bytes, version: int) -> None:
    props = b"\x00" if version == 5 else b""
    fails(pkt(0x82, b"\x00\x01" + props + s(raw) + b"\x01"), MALFORMED, version)
    fails(pkt(0xA2, b"\x00\x01" + props + s(raw)), MALFORMED, version)


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_bad_string_in_user_property(raw: bytes) -> None:
    prop = b"\x26" + s(raw) + s("v")
    fails(pkt(0x30, s("t") + bytes((len(prop),)) + prop), MALFORMED, 5)
    prop = b"\x26" + s("k") + s(raw)
    fails(pkt(0x30, s("t") + bytes((len(prop),)) + prop), MALFORMED, 5)


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_bad_string_in_reason_string(raw: bytes) -> None:
    prop = b"\x1f" + s(raw)
    fails(pkt(0x40, b"\x00\x01\x00" + bytes((len(prop),)) + prop), MALFORMED, 5)


def test_string_length_past_end_of_packet() -> None:
    fails(connect(payload=b"\x00\x10abc"), MALFORMED)
    fails(pkt(0x82, b"\x00\x01\x00\x05ab"), MALFORMED)
    fails(pkt(0xA2, b"\x00\x01\x00\x05ab"), MALFORMED)


def test_string_length_cannot_borrow_from_the_next_packet() -> None:
    # The UNSUBSCRIBE's filter length points into the PINGREQ after it.
    fails(pkt(0xA2, b"\x00\x01\x00\x03a") + b"\xc0\x00", MALFORMED)


def test_binary_length_past_end_of_packet() -> None:
    fails(connect(flags=0x06, payload=s("c") + s("t") + b"\x00\x09xx"), MALFORMED)
    fails(connect(flags=0xC2, payload=s("c") + s("u") + b"\x00\x09xx"), MALFORMED)


# --- leftover bytes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "version"),
    [
        (b"\x40\x03\x00\x01\x00", 4),  # PUBACK v4 with extra byte
        (b"\x50\x03\x00\x01\x00", 3),
        (b"\x62\x03\x00\x01\x00", 4),
        (b"\x70\x03\x00\x01\x00", 4),
        (b"\xc0\x01\x00", 4),  # PINGREQ with a body
        (b"\xc0\x01\x00", 5),
        (b"\xd0\x01\x00", 4),  # PINGRESP with a body
        (b"\xe0\x01\x00", 4),  # DISCONNECT v4 with a body
        (b"\x20\x03\x00\x00\x00", 4),  # CONNACK v4 with a body
        (b"\xb0\x03\x00\x01\x00", 4),  # UNSUBACK v4 with reason codes
        (b"\x40\x05\x00\x01\x00\x00\x00", 5),  # v5 PUBACK: bytes after the properties
        (b"\x40\x05\x00\x01\x00\x02\x00", 5),  # v5 PUBACK: property length past the end
        (b"\xe0\x03\x00\x00\x00", 5),  # v5 DISCONNECT: bytes after the properties
        (b"\xf0\x03\x18\x00\x00", 5),  # v5 AUTH: bytes after the properties
        (b"\x20\x04\x00\x00\x00\x00", 5),  # v5 CONNACK: bytes after the properties
    ],
)
def test_trailing_bytes(data: bytes, version: int) -> None:
    fails(data, MALFORMED, version)


def test_connect_trailing_bytes() -> None:
    fails(connect(payload=s("c") + b"\x00"), MALFORMED)


@pytest.mark.parametrize(
    ("data", "version"),
    [
        (b"\x40\x01\x00", 4),  # PUBACK shorter than a packet id
        (b"\x40\x00", 5),
        (b"\x20\x01\x00", 4),  # CONNACK too short
        (b"\x20\x00", 5),
        (b"\x90\x01\x00", 4),  # SUBACK too short
        (b"\xb0\x00", 5),
        (b"\x10\x00", 4),  # empty CONNECT
    ],
)
def test_truncated_bodies(data: bytes, version: int) -> None:
    fails(data, MALFORMED, version)


@pytest.mark.parametrize(
    ("data", "version"),
    [
        (b"\x40\x02\x00\x00", 4),  # PUBACK
        (b"\x50\x02\x00\x00", 5),  # PUBREC
        (b"\x62\x02\x00\x00", 4),  # PUBREL
        (b"\x70\x02\x00\x00", 5),  # PUBCOMP
        (pkt(0x82, b"\x00\x00" + s("a") + b"\x00"), 4),  # SUBSCRIBE
        (pkt(0x82, b"\x00\x00\x00" + s("a") + b"\x00"), 5),
        (pkt(0xA2, b"\x00\x00" + s("a")), 4),  # UNSUBSCRIBE
        (pkt(0xA2, b"\x00\x00\x00" + s("a")), 5),
        (b"\x90\x03\x00\x00\x00", 4),  # SUBACK
        (b"\xb0\x02\x00\x00", 4),  # UNSUBACK
    ],
)
def test_packet_id_0(data: bytes, version: int) -> None:
    fails(data, PROTOCOL, version)


def test_v3_pubrel_with_dup_ok_only_in_v3() -> None:
    assert len(feed(b"\x6a\x02\x00\x01", 3)) == 1
    fails(b"\x6a\x02\x00\x01", MALFORMED, 4)
    fails(b"\x6a\x02\x00\x01", MALFORMED, 5)


# --- CONNECT ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "level"),
    [("MQIsdp", 4), ("MQIsdp", 5), ("MQTT", 3), ("MQTT", 6), ("MQTT", 0), ("MQTT", 0x84)],
)
def test_connect_unsupported_level(name: str, level: int) -> None:
    dec = PacketDecoder()
    with pytest.raises(UnsupportedProtocolVersionError) as info:
        dec.feed(connect(name=s(name), level=level))
    assert info.value.protocol_version == level
    assert info.value.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION


def test_connect_unsupported_level_decodes_nothing_else() -> None:
    # Flags and payload are garbage, but the level is checked first.
    with pytest.raises(UnsupportedProtocolVersionError):
        PacketDecoder().feed(connect(level=7, flags=0xFF, payload=b"\xff"))


@pytest.mark.parametrize("name", ["MQTX", "mqtt", "", "MQIsdpX"])
def test_connect_unknown_protocol_name(name: str) -> None:
    fails(connect(name=s(name)), MALFORMED)


@pytest.mark.parametrize("level", [3, 4, 5])
def test_connect_reserved_flag(level: int) -> None:
    name = s("MQIsdp" if level == 3 else "MQTT")
    props = b"\x00" if level == 5 else b""
    fails(connect(flags=0x03, name=name, level=level, props=props), MALFORMED, level)


@pytest.mark.parametrize("flags", [0x0A, 0x12, 0x22, 0x3A])
def test_connect_will_qos_or_retain_without_will_flag(flags: int) -> None:
    fails(connect(flags=flags), MALFORMED)


def test_connect_will_qos_3() -> None:
    fails(connect(flags=0x1E, payload=s("c") + s("t") + s("m")), MALFORMED)


@pytest.mark.parametrize(("level", "name"), [(3, "MQIsdp"), (4, "MQTT")])
def test_connect_password_without_username_v3_v4(level: int, name: str) -> None:
    fails(connect(flags=0x42, name=s(name), level=level, payload=s("c") + s("pw")), MALFORMED)


def test_connect_password_without_username_allowed_in_v5() -> None:
    [packet] = feed(connect(flags=0x42, level=5, props=b"\x00", payload=s("c") + s("pw")))
    assert packet == Connect("c", 5, password=b"pw")


def test_connect_will_topic_with_wildcard() -> None:
    fails(connect(flags=0x06, payload=s("c") + s("a/#") + s("m")), TOPIC_INVALID)


def test_connect_empty_will_topic() -> None:
    fails(connect(flags=0x06, payload=s("c") + s("") + s("m")), TOPIC_INVALID)


def test_connect_truncated_variable_header() -> None:
    fails(pkt(0x10, s("MQTT") + b"\x04\x02"), MALFORMED)
    fails(pkt(0x10, s("MQTT")), MALFORMED)


def test_connect_sets_version_before_later_errors() -> None:
    # A server must answer a malformed v5 CONNECT in v5, so the level sticks.
    dec = PacketDecoder()
    with pytest.raises(MalformedPacketError):
        dec.feed(connect(flags=0x03, level=5, props=b"\x00"))
    assert dec.protocol_version == 5


# --- SUBSCRIBE / UNSUBSCRIBE ------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 4, 5])
def test_subscribe_without_filters(version: int) -> None:
    fails(pkt(0x82, b"\x00\x01" + (b"\x00" if version == 5 else b"")), PROTOCOL, version)


@pytest.mark.parametrize("version", [3, 4, 5])
def test_unsubscribe_without_filters(version: int) -> None:
    fails(pkt(0xA2, b"\x00\x01" + (b"\x00" if version == 5 else b"")), PROTOCOL, version)


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("options", [0x03, 0x04, 0x08, 0x10, 0x40, 0x80, 0xFF])
def test_subscribe_v3_v4_bad_qos_byte(version: int, options: int) -> None:
    fails(pkt(0x82, b"\x00\x01" + s("a") + bytes((options,))), MALFORMED, version)


@pytest.mark.parametrize("options", [0x40, 0x80, 0xC1])
def test_subscribe_v5_reserved_option_bits(options: int) -> None:
    # MQTT-3.8.3-5: reserved bits set is Malformed.
    fails(pkt(0x82, b"\x00\x01\x00" + s("a") + bytes((options,))), MALFORMED, 5)


def test_subscribe_v5_qos_3() -> None:
    # 5.0 section 3.8.3.1: "It is a Protocol Error if the Maximum QoS field has the value 3".
    fails(pkt(0x82, b"\x00\x01\x00" + s("a") + b"\x03"), PROTOCOL, 5)


def test_subscribe_v5_retain_handling_3() -> None:
    fails(pkt(0x82, b"\x00\x01\x00" + s("a") + b"\x30"), PROTOCOL, 5)


def test_subscribe_filter_without_options() -> None:
    fails(pkt(0x82, b"\x00\x01" + s("a")), MALFORMED)


@pytest.mark.parametrize("version", [3, 4, 5])
@pytest.mark.parametrize(
    ("filters", "match"),
    [
        (s("a/b") + b"\x00" + b"\x00", "string length runs past"),  # a lone length byte
        (s("a/b") + b"\x00" + b"\x00\x09a/", "string runs past"),
        (s("a/b") + b"\x00" + s("a/b"), "without subscription options"),
        (s(b"a/\xff") + b"\x00", "not valid UTF-8"),
        (s(b"a/\xed\xa0\x80") + b"\x00", "not valid UTF-8"),  # a surrogate
        (s("a/\x00") + b"\x00", "U\\+0000"),
    ],
)
def test_subscribe_filter_string_errors(version: int, filters: bytes, match: str) -> None:
    """Every protocol's SUBSCRIBE reads its filters' strings with read_string's checks (3.x
    written out for a fleet's bursts), a bad one after a good one too."""
    head = b"\x00\x01" + (b"\x00" if version == 5 else b"")
    error = fails(pkt(0x82, head + filters), MALFORMED, version)
    assert re.search(match, str(error)), str(error)


def test_subscribe_v3_filters_and_qos_in_order() -> None:
    body = b"\x00\x07" + s("a/+") + b"\x01" + s("b/#") + b"\x02" + s("c") + b"\x00"
    [packet] = feed(pkt(0x82, body))
    assert [(r.topic_filter, r.qos) for r in packet.subscriptions] == [  # type: ignore[union-attr]
        ("a/+", 1),
        ("b/#", 2),
        ("c", 0),
    ]


def test_suback_and_v5_unsuback_without_codes() -> None:
    fails(b"\x90\x02\x00\x01", PROTOCOL, 4)
    fails(b"\xb0\x03\x00\x01\x00", PROTOCOL, 5)


def test_subscribe_filter_syntax_is_not_the_codecs_job() -> None:
    # Wildcard placement is checked elsewhere; the codec passes it through.
    [packet] = feed(pkt(0x82, b"\x00\x01" + s("a/#/b") + b"\x00"))
    assert packet.subscriptions[0].topic_filter == "a/#/b"  # type: ignore[union-attr]


# --- the decoder is dead after an error -------------------------------------------------------


def test_decoder_does_not_keep_an_exported_buffer_after_error() -> None:
    dec = PacketDecoder()
    dec.feed(b"\x30")  # leave a partial tail so the internal buffer is in use
    with pytest.raises(MQTTProtocolError):
        dec.feed(b"\x01\x00")
    # Whatever happens next must not be a BufferError from a still-exported bytearray.
    with contextlib.suppress(MQTTProtocolError):
        dec.feed(b"\xc0\x00")
