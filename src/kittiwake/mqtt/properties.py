"""MQTT 5 properties and the wire primitives they share with the packet codec.

Pure bytes in, values out: this module never touches a socket and never applies broker policy
(whether a property is *acceptable* to this server is the session's business, not ours).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from operator import attrgetter
from typing import Final

from kittiwake.mqtt.errors import MalformedPacketError, MQTTProtocolError
from kittiwake.mqtt.reason_codes import ReasonCode

# Anything the decoders index and slice; all three give ints when indexed.
Buffer = memoryview | bytes | bytearray

# Will properties live inside CONNECT but have their own allowed set (spec table 2.2.2.2), so
# they are decoded under this pseudo packet type. 0 is the reserved packet type, never real.
WILL_PROPERTIES: Final = 0

# Packet type numbers, repeated here so packets.py can import this module without a cycle.
_CONNECT, _CONNACK, _PUBLISH, _PUBACK, _PUBREC, _PUBREL, _PUBCOMP = 1, 2, 3, 4, 5, 6, 7
_SUBSCRIBE, _SUBACK, _UNSUBSCRIBE, _UNSUBACK, _DISCONNECT, _AUTH = 8, 9, 10, 11, 14, 15

VARINT_MAX: Final = 268_435_455


class PropertyId(IntEnum):
    """The 27 MQTT 5 property identifiers (spec section 2.2.2.2)."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


@dataclass(slots=True)
class Properties:
    """Every MQTT 5 property a packet may carry; None (or an empty list) means absent.

    One flat class for all packet types keeps the packet dataclasses uniform; which fields are
    legal where is enforced by :func:`encode_properties` / :func:`decode_properties`. Field
    order follows the property identifiers, which the encoder relies on.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    # PUBLISH may carry several (one per matching subscription); SUBSCRIBE at most one.
    subscription_identifiers: list[int] = field(default_factory=list)
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    # Order matters to applications and the same name may repeat, hence a list of pairs.
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __repr__(self) -> str:
        # Only what is set: 27 mostly-None fields drown test failures and log lines otherwise.
        shown = []
        for name in self.__slots__:
            value = getattr(self, name)
            if value is not None and value != []:
                shown.append(f"{name}={value!r}")
        return f"Properties({', '.join(shown)})"


# ---------------------------------------------------------------------------------------------
# Wire primitives (spec section 1.5), shared with the packet codec.


def encode_varint(n: int) -> bytes:
    """Encode a Variable Byte Integer; ValueError outside 0..268,435,455 (a caller bug)."""
    if n < 128:
        if n < 0:
            raise ValueError(f"variable byte integer {n} is negative")
        return bytes((n,))
    if n > VARINT_MAX:
        raise ValueError(f"variable byte integer {n} exceeds {VARINT_MAX}")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """Decode a Variable Byte Integer that must lie within ``buf[pos:end]``.

    More than four bytes, or running past ``end``, is a Malformed Packet (spec 1.5.5).
    """
    value = 0
    shift = 0
    for i in range(pos, min(pos + 4, end)):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    if end - pos >= 4:
        raise MalformedPacketError("variable byte integer longer than 4 bytes")
    raise MalformedPacketError("variable byte integer runs past the end of the packet")


def encode_string(s: str) -> bytes:
    """Length-prefixed UTF-8; ValueError beyond 65,535 bytes (a caller bug, not a peer's)."""
    raw = s.encode("utf-8")
    n = len(raw)
    if n > 0xFFFF:
        raise ValueError(f"string of {n} bytes is too long for MQTT")
    return n.to_bytes(2, "big") + raw


def encode_binary(b: bytes) -> bytes:
    """Length-prefixed binary data; ValueError beyond 65,535 bytes."""
    n = len(b)
    if n > 0xFFFF:
        raise ValueError(f"binary data of {n} bytes is too long for MQTT")
    return n.to_bytes(2, "big") + b


def read_string(buf: Buffer, pos: int, end: int) -> tuple[str, int]:
    """Read a UTF-8 Encoded String (spec 1.5.4) from ``buf[pos:end]``.

    Invalid UTF-8, a surrogate (Python's strict codec rejects those) or U+0000 is Malformed.
    """
    if pos + 2 > end:
        raise MalformedPacketError("string length runs past the end of the packet")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacketError("string runs past the end of the packet")
    try:
        s = str(buf[pos + 2 : stop], "utf-8")
    except UnicodeDecodeError:
        raise MalformedPacketError("string is not valid UTF-8") from None
    if "\x00" in s:
        raise MalformedPacketError("string contains U+0000")
    return s, stop


def read_binary(buf: Buffer, pos: int, end: int) -> tuple[bytes, int]:
    """Read length-prefixed Binary Data (spec 1.5.6) from ``buf[pos:end]``."""
    if pos + 2 > end:
        raise MalformedPacketError("binary length runs past the end of the packet")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacketError("binary data runs past the end of the packet")
    return bytes(buf[pos + 2 : stop]), stop


# ---------------------------------------------------------------------------------------------
# The property table (spec 2.2.2.2): identifier, field, data type, packets allowed in.

_BYTE, _TWO, _FOUR, _VARINT, _STRING, _BINARY, _PAIR = range(7)


def _mask(*packet_types: int) -> int:
    bits = 0
    for t in packet_types:
        bits |= 1 << t
    return bits


_ACKS = (_PUBACK, _PUBREC, _PUBREL, _PUBCOMP)
_MESSAGE = _mask(_PUBLISH, WILL_PROPERTIES)

# (identifier, field name, data type, allowed-packet bitmask), in identifier = field order.
_TABLE: Final[tuple[tuple[PropertyId, str, int, int], ...]] = (
    (PropertyId.PAYLOAD_FORMAT_INDICATOR, "payload_format_indicator", _BYTE, _MESSAGE),
    (PropertyId.MESSAGE_EXPIRY_INTERVAL, "message_expiry_interval", _FOUR, _MESSAGE),
    (PropertyId.CONTENT_TYPE, "content_type", _STRING, _MESSAGE),
    (PropertyId.RESPONSE_TOPIC, "response_topic", _STRING, _MESSAGE),
    (PropertyId.CORRELATION_DATA, "correlation_data", _BINARY, _MESSAGE),
    (
        PropertyId.SUBSCRIPTION_IDENTIFIER,
        "subscription_identifiers",
        _VARINT,
        _mask(_PUBLISH, _SUBSCRIBE),
    ),
    (
        PropertyId.SESSION_EXPIRY_INTERVAL,
        "session_expiry_interval",
        _FOUR,
        _mask(_CONNECT, _CONNACK, _DISCONNECT),
    ),
    (PropertyId.ASSIGNED_CLIENT_IDENTIFIER, "assigned_client_identifier", _STRING, _mask(_CONNACK)),
    (PropertyId.SERVER_KEEP_ALIVE, "server_keep_alive", _TWO, _mask(_CONNACK)),
    (
        PropertyId.AUTHENTICATION_METHOD,
        "authentication_method",
        _STRING,
        _mask(_CONNECT, _CONNACK, _AUTH),
    ),
    (
        PropertyId.AUTHENTICATION_DATA,
        "authentication_data",
        _BINARY,
        _mask(_CONNECT, _CONNACK, _AUTH),
    ),
    (PropertyId.REQUEST_PROBLEM_INFORMATION, "request_problem_information", _BYTE, _mask(_CONNECT)),
    (PropertyId.WILL_DELAY_INTERVAL, "will_delay_interval", _FOUR, _mask(WILL_PROPERTIES)),
    (
        PropertyId.REQUEST_RESPONSE_INFORMATION,
        "request_response_information",
        _BYTE,
        _mask(_CONNECT),
    ),
    (PropertyId.RESPONSE_INFORMATION, "response_information", _STRING, _mask(_CONNACK)),
    (PropertyId.SERVER_REFERENCE, "server_reference", _STRING, _mask(_CONNACK, _DISCONNECT)),
    (
        PropertyId.REASON_STRING,
        "reason_string",
        _STRING,
        _mask(_CONNACK, *_ACKS, _SUBACK, _UNSUBACK, _DISCONNECT, _AUTH),
    ),
    (PropertyId.RECEIVE_MAXIMUM, "receive_maximum", _TWO, _mask(_CONNECT, _CONNACK)),
    (PropertyId.TOPIC_ALIAS_MAXIMUM, "topic_alias_maximum", _TWO, _mask(_CONNECT, _CONNACK)),
    (PropertyId.TOPIC_ALIAS, "topic_alias", _TWO, _mask(_PUBLISH)),
    (PropertyId.MAXIMUM_QOS, "maximum_qos", _BYTE, _mask(_CONNACK)),
    (PropertyId.RETAIN_AVAILABLE, "retain_available", _BYTE, _mask(_CONNACK)),
    (
        PropertyId.USER_PROPERTY,
        "user_properties",
        _PAIR,
        _mask(
            _CONNECT,
            _CONNACK,
            _PUBLISH,
            WILL_PROPERTIES,
            *_ACKS,
            _SUBSCRIBE,
            _SUBACK,
            _UNSUBSCRIBE,
            _UNSUBACK,
            _DISCONNECT,
            _AUTH,
        ),
    ),
    (PropertyId.MAXIMUM_PACKET_SIZE, "maximum_packet_size", _FOUR, _mask(_CONNECT, _CONNACK)),
    (
        PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE,
        "wildcard_subscription_available",
        _BYTE,
        _mask(_CONNACK),
    ),
    (
        PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        "subscription_identifier_available",
        _BYTE,
        _mask(_CONNACK),
    ),
    (
        PropertyId.SHARED_SUBSCRIPTION_AVAILABLE,
        "shared_subscription_available",
        _BYTE,
        _mask(_CONNACK),
    ),
)

# Byte properties whose only legal values are 0 and 1 (anything else is a Protocol Error).
_BOOLEAN_BYTES: Final = frozenset(
    {
        PropertyId.PAYLOAD_FORMAT_INDICATOR,
        PropertyId.REQUEST_PROBLEM_INFORMATION,
        PropertyId.REQUEST_RESPONSE_INFORMATION,
        PropertyId.MAXIMUM_QOS,
        PropertyId.RETAIN_AVAILABLE,
        PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE,
        PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        PropertyId.SHARED_SUBSCRIPTION_AVAILABLE,
    }
)
# Integer properties for which the value 0 is a Protocol Error.
_NONZERO: Final = frozenset(
    {
        PropertyId.RECEIVE_MAXIMUM,
        PropertyId.MAXIMUM_PACKET_SIZE,
        PropertyId.TOPIC_ALIAS,
        PropertyId.SUBSCRIPTION_IDENTIFIER,
    }
)

assert tuple(name for _, name, _, _ in _TABLE) == Properties.__slots__

# Decode lookup indexed by identifier byte: (field, type, mask, boolean-only, nonzero) or None.
_BY_ID: list[tuple[str, int, int, bool, bool] | None] = [None] * 256
for _pid, _name, _kind, _allowed in _TABLE:
    _BY_ID[_pid] = (_name, _kind, _allowed, _pid in _BOOLEAN_BYTES, _pid in _NONZERO)

_get_all = attrgetter(*Properties.__slots__)
_EMPTY_VALUES: Final = _get_all(Properties())
_SUBSCRIPTION_ID_BIT: Final = 1 << PropertyId.SUBSCRIPTION_IDENTIFIER
_USER_PROPERTY_BIT: Final = 1 << PropertyId.USER_PROPERTY


def encode_properties(props: Properties, packet_type: int) -> bytes:
    """Encode the property block (length varint + properties) for ``packet_type``.

    Returns ``b"\\x00"`` when nothing is set. A property that the spec does not allow in this
    packet type raises ValueError: it is a bug in our own code, and sending it would get the
    connection dropped by a conforming peer.
    """
    values = _get_all(props)
    if values == _EMPTY_VALUES:
        return b"\x00"
    out = bytearray()
    for (pid, name, kind, allowed), value in zip(_TABLE, values, strict=True):
        if value is None or (kind in (_PAIR, _VARINT) and not value):
            continue  # absent: None for scalars, an empty list for the two repeatable ones
        if not (allowed >> packet_type) & 1:
            raise ValueError(f"property {name} is not allowed in packet type {packet_type}")
        if kind == _STRING:
            out.append(pid)
            out += encode_string(value)
        elif kind == _BYTE:
            out.append(pid)
            out.append(value)
        elif kind == _FOUR:
            out.append(pid)
            out += value.to_bytes(4, "big")
        elif kind == _TWO:
            out.append(pid)
            out += value.to_bytes(2, "big")
        elif kind == _BINARY:
            out.append(pid)
            out += encode_binary(value)
        elif kind == _PAIR:
            for key, val in value:
                out.append(pid)
                out += encode_string(key)
                out += encode_string(val)
        else:  # subscription identifiers
            if packet_type != _PUBLISH and len(value) > 1:
                raise ValueError("SUBSCRIBE may carry at most one subscription identifier")
            for sub_id in value:
                if sub_id < 1:
                    raise ValueError(f"subscription identifier {sub_id} must be >= 1")
                out.append(pid)
                out += encode_varint(sub_id)
    return encode_varint(len(out)) + out


def decode_properties(buf: Buffer, offset: int, packet_type: int) -> tuple[Properties, int]:
    """Decode a property block starting at ``offset``; ``len(buf)`` is the end of the packet.

    Returns the properties and the offset just past the block. Identifiers not allowed in this
    packet type and values overrunning the block are Malformed (spec 2.2.2.2); repeats and
    forbidden values are Protocol Errors, as the spec names them property by property.
    """
    packet_end = len(buf)
    length, pos = decode_varint(buf, offset, packet_end)
    end = pos + length
    if end > packet_end:
        raise MalformedPacketError("property length runs past the end of the packet")
    props = Properties()
    if not length:
        return props, end
    seen = 0
    value: object
    while pos < end:
        pid = buf[pos]
        pos += 1
        spec = _BY_ID[pid]
        if spec is None:
            raise MalformedPacketError(f"unknown property identifier 0x{pid:02X}")
        name, kind, allowed, boolean_only, nonzero = spec
        if not (allowed >> packet_type) & 1:
            raise MalformedPacketError(
                f"property {PropertyId(pid).name} is not allowed in packet type {packet_type}"
            )
        bit = 1 << pid
        if seen & bit and not (
            bit == _USER_PROPERTY_BIT or (bit == _SUBSCRIPTION_ID_BIT and packet_type == _PUBLISH)
        ):
            raise MQTTProtocolError(
                ReasonCode.PROTOCOL_ERROR, f"property {PropertyId(pid).name} appears twice"
            )
        seen |= bit
        if kind == _STRING:
            value, pos = read_string(buf, pos, end)
        elif kind == _BYTE:
            if pos >= end:
                raise MalformedPacketError("property value runs past the property block")
            byte = buf[pos]
            pos += 1
            if boolean_only and byte > 1:
                raise MQTTProtocolError(
                    ReasonCode.PROTOCOL_ERROR,
                    f"property {PropertyId(pid).name} must be 0 or 1, got {byte}",
                )
            value = byte
        elif kind == _FOUR:
            if pos + 4 > end:
                raise MalformedPacketError("property value runs past the property block")
            value = int.from_bytes(buf[pos : pos + 4], "big")
            pos += 4
        elif kind == _TWO:
            if pos + 2 > end:
                raise MalformedPacketError("property value runs past the property block")
            value = (buf[pos] << 8) | buf[pos + 1]
            pos += 2
        elif kind == _BINARY:
            value, pos = read_binary(buf, pos, end)
        elif kind == _PAIR:
            key, pos = read_string(buf, pos, end)
            val, pos = read_string(buf, pos, end)
            props.user_properties.append((key, val))
            continue
        else:  # subscription identifier
            sub_id, pos = decode_varint(buf, pos, end)
            if not sub_id:
                raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, "subscription identifier 0")
            props.subscription_identifiers.append(sub_id)
            continue
        if nonzero and not value:
            raise MQTTProtocolError(
                ReasonCode.PROTOCOL_ERROR, f"property {PropertyId(pid).name} must not be 0"
            )
        setattr(props, name, value)
    if pos != end:
        raise MalformedPacketError("property value runs past the property block")
    if props.response_topic is not None and (
        "+" in props.response_topic or "#" in props.response_topic
    ):
        # MQTT-3.3.2-14: a Response Topic is a topic name, never a filter.
        raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, "response topic contains a wildcard")
    return props, end
