"""AMQP 1.0 messages to core messages and back, following the AMQP JMS mapping as Qpid JMS
speaks it (message annotations x-opt-jms-msg-type, x-opt-jms-dest, x-opt-jms-reply-to,
x-opt-delivery-time, x-opt-delivery-delay; header durable/priority/ttl/delivery-count;
properties; typed application properties; data, amqp-value and amqp-sequence bodies).

Pure code over bytes and objects: no socket, no engine state, no broker calls, no delivery
rule. An AMQP message keeps its annotations, bare message and footer as received (the spec
forbids intermediaries to change the bare message), in ``Message.encoded``; the core reads the
fields it routes and filters by, and other protocols get the body as bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from proton import (
    Data,
    Described,
    byte,
    char,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)
from proton import Message as ProtonMessage

from kittiwake.amqp import values as values_codec
from kittiwake.broker.message import (
    DEFAULT_PRIORITY,
    AMQPFields,
    Message,
    MessageProperties,
    PropertyType,
    PropertyValue,
)

# Where a message from AMQP keeps its sections after the header, as received; also where a
# message from elsewhere keeps them once built (a fan-out encodes them once).
SECTIONS_KEY = "amqp-sections"

# Section descriptors (AMQP 1.0 section 3.2).
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

JMS_MSG_TYPE = symbol("x-opt-jms-msg-type")
JMS_DEST = symbol("x-opt-jms-dest")
JMS_REPLY_TO = symbol("x-opt-jms-reply-to")
DELIVERY_TIME = symbol("x-opt-delivery-time")
DELIVERY_DELAY = symbol("x-opt-delivery-delay")

OCTET_STREAM = symbol("application/octet-stream")
SERIALIZED_JAVA_OBJECT = "application/x-java-serialized-object"

# The JMS property that retains a message (DESIGN.md section 2).
RETAIN_PROPERTY = "JMS_IBM_Retain"


class JMSMessageType(IntEnum):
    """x-opt-jms-msg-type values."""

    MESSAGE = 0
    OBJECT = 1
    MAP = 2
    BYTES = 3
    STREAM = 4
    TEXT = 5


class BodyKind(IntEnum):
    """How a message's payload maps back to its AMQP body section (kept in the store as
    :attr:`kittiwake.broker.message.AMQPFields.body`): never renumber."""

    # No body section (the payload is empty).
    NONE = 0
    # Data section(s): the payload is their bytes, in one data section again.
    DATA = 1
    # An amqp-value string (TextMessage): the payload is its UTF-8.
    STRING = 2
    # An amqp-value binary: the payload is its bytes.
    BINARY = 3
    # Any other amqp-value or amqp-sequence(s) (MapMessage, StreamMessage...): the payload is
    # the body sections' own encoding.
    ENCODED = 4
    # An amqp-value null (a JMS Message without a body).
    NULL = 5


class DestinationType(IntEnum):
    """x-opt-jms-dest and x-opt-jms-reply-to values."""

    QUEUE = 0
    TOPIC = 1
    TEMPORARY_QUEUE = 2
    TEMPORARY_TOPIC = 3


class MappingError(ValueError):
    """The message cannot be taken (undecodable, or a field out of range); the link rejects
    it with amqp:decode-error or amqp:invalid-field and this text."""

    def __init__(self, description: str, condition: str = "amqp:decode-error") -> None:
        super().__init__(description)
        self.condition = condition


@dataclass(slots=True)
class Incoming:
    """A received AMQP message as the core sees it, with what only the front end needs."""

    message: Message
    # The "to" address (an anonymous-relay sender names its destination here) and its
    # x-opt-jms-dest type, when given.
    to: str | None
    to_type: DestinationType | None
    durable: bool


class Clocks(NamedTuple):
    """The two readings a translation needs: the core clock (expiry and delivery times are
    clock times) and the wall clock (AMQP times are milliseconds since the epoch). A named
    tuple: one is made per message each way, and a frozen dataclass costs several times more
    to make."""

    now: float
    wall_ms: int

    def to_clock(self, wall_ms: float) -> float:
        return self.now + (wall_ms - self.wall_ms) / 1000.0

    def to_wall_ms(self, clock_time: float) -> int:
        return round(self.wall_ms + (clock_time - self.now) * 1000.0)


# -- AMQP to core ------------------------------------------------------------------------------


def split_sections(encoded: bytes) -> list[tuple[int, bytes]]:
    """The sections of an encoded message: (descriptor code, the section's bytes).

    Walks only the encoding's constructors and sizes (AMQP 1.0 part 1, 1.2: a format code's
    high nibble says how its width is read), never the values: what a section holds is
    decoded by whoever reads it (``from_amqp`` decodes the whole message with proton)."""
    sections: list[tuple[int, bytes]] = []
    position = 0
    end = len(encoded)
    while position < end:
        if encoded[position] != 0x00:
            raise MappingError("a message section must be a described value")
        descriptor_at = position + 1
        value_at = _skip_value(encoded, descriptor_at, end)
        section_end = _skip_value(encoded, value_at, end)
        code = _section_code(encoded, descriptor_at, value_at)
        if not HEADER <= code <= FOOTER:
            raise MappingError(
                f"unknown message section {bytes(encoded[descriptor_at:value_at])!r}"
            )
        sections.append((code, bytes(encoded[position:section_end])))
        position = section_end
    return sections


# Bytes a fixed-width value takes after its format code, by the code's high nibble.
_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}


def _skip_value(encoded: bytes, position: int, end: int) -> int:
    """Where the encoded value starting at ``position`` ends; MappingError when it is cut off
    or has no valid format code."""
    if position >= end:
        raise MappingError("undecodable message section: cut off")
    code = encoded[position]
    position += 1
    if code == 0x00:  # described: a descriptor, then the value it describes
        return _skip_value(encoded, _skip_value(encoded, position, end), end)
    nibble = code >> 4
    width = _FIXED_WIDTH.get(nibble)
    if width is not None:
        size = width
    elif nibble in (0xA, 0xC, 0xE):  # one-byte size
        if position + 1 > end:
            raise MappingError("undecodable message section: cut off")
        size = 1 + encoded[position]
    elif nibble in (0xB, 0xD, 0xF):  # four-byte size
        if position + 4 > end:
            raise MappingError("undecodable message section: cut off")
        size = 4 + int.from_bytes(encoded[position : position + 4], "big")
    else:
        raise MappingError(f"undecodable message section: format code 0x{code:02x}")
    position += size
    if position > end:
        raise MappingError("undecodable message section: cut off")
    return position


def _section_code(encoded: bytes, start: int, end: int) -> int:
    """A section's descriptor as its code (symbolic descriptors mapped), -1 when unknown."""
    code = encoded[start]
    if code == 0x53:  # smallulong
        return encoded[start + 1]
    if code == 0x80:  # ulong
        return int.from_bytes(encoded[start + 1 : end], "big")
    if code == 0x44:  # ulong0
        return 0
    if code in (0xA3, 0xB3):  # sym8, sym32: the name after its one- or four-byte size
        name = bytes(encoded[start + (2 if code == 0xA3 else 5) : end])
        return _SYMBOLIC_SECTIONS.get(name.decode("ascii", "replace"), -1)
    return -1


_SYMBOLIC_SECTIONS = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}


@dataclass(slots=True)
class _Read:
    """The fields of an incoming message the mapping uses, however they were decoded."""

    durable: bool = False
    priority: int = DEFAULT_PRIORITY
    ttl_ms: int | None = None
    annotations: dict[Any, Any] | None = None
    to: str | None = None
    expiry_ms: int | None = None
    creation_ms: int | None = None
    group_id: object = None
    properties: dict[Any, Any] | None = None
    # The body when it is one amqp-value section: its value when a string, binary or null,
    # else ENCODED_BODY (kept as its encoding).
    body: object = None
    values: int = 0
    # The binaries of the data sections, when the fast path read them.
    data: list[bytes] | None = None
    # A string amqp-value's UTF-8, when the fast path read it (``body`` is then _TEXT_BODY).
    text: bytes | None = None


# A body value that is neither a string, a binary nor null: the mapping keeps its encoding.
ENCODED_BODY = object()
# A string body read as its UTF-8 (see ``_Read.text``).
_TEXT_BODY = object()


def _scan_fast(encoded: bytes) -> tuple[list[tuple[int, bytes]], _Read]:
    """The sections and the fields in one pass over the bytes (what split_sections and
    _read_fast do in two); Unsupported for a section whose descriptor is not the small code
    (the caller then takes the two-pass way)."""
    sections: list[tuple[int, bytes]] = []
    append = sections.append
    read = _Read()
    decode = values_codec.decode
    cache = _SECTION_VALUES
    position = 0
    end = len(encoded)
    while position < end:
        if position + 3 > end or encoded[position] != 0x00 or encoded[position + 1] != 0x53:
            raise values_codec.Unsupported("not a section with a small descriptor")
        code = encoded[position + 2]
        if code == PROPERTIES:
            # A new message id and creation time in every message: not worth keeping, and
            # only four of its fields are read (the rest are skipped, not decoded).
            stop = _read_properties(read, encoded, position + 3, end)
            append((code, encoded[position:stop]))
            position = stop
            continue
        if code == AMQP_VALUE and position + 3 < end and encoded[position + 3] in _STRINGS:
            # A TextMessage's body: its UTF-8 is the payload as it is (checked, not copied
            # through a str and back).
            stop = _read_text(read, encoded, position + 4, end)
            append((code, encoded[position:stop]))
            position = stop
            continue
        stop = _cacheable_end(encoded, position, end) if code in _CACHED_SECTIONS else 0
        if stop:
            section = encoded[position:stop]
            value = cache.get(section, _MISSING)
            if value is _MISSING:
                value, decoded_stop = decode(encoded, position + 3)
                if decoded_stop != stop:
                    raise values_codec.Unsupported("size and items disagree")
                if len(cache) >= _SECTION_CACHE_SIZE:
                    cache.clear()
                cache[section] = value
        else:
            value, stop = decode(encoded, position + 3)
            section = encoded[position:stop]
        append((code, section))
        _read_section(read, code, value)
        position = stop
    if not sections:
        raise values_codec.Unsupported("no sections")
    return sections, read


# The constructors of a string (str8-utf8, str32-utf8).
_STRINGS = frozenset((0xA1, 0xB1))


def _read_text(read: _Read, encoded: bytes, position: int, end: int) -> int:
    """An amqp-value string whose size starts at ``position``: its UTF-8 into ``read``;
    returns where the section ends."""
    if read.values:
        raise values_codec.Unsupported("more than one amqp-value")
    if encoded[position - 1] & 0x10:  # str32
        if position + 4 > end:
            raise values_codec.Unsupported("cut off")
        start = position + 4
        stop = start + int.from_bytes(encoded[position:start], "big")
    else:
        start = position + 1
        stop = start + encoded[position]
    if stop > end:
        raise values_codec.Unsupported("cut off")
    text = encoded[start:stop]
    if not text.isascii():
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            raise values_codec.Unsupported("not UTF-8") from None
    read.values += 1
    read.text = text
    read.body = _TEXT_BODY
    return stop


# The properties' fields the mapping reads, by their index: to, absolute-expiry-time,
# creation-time, group-id.
_PROPERTY_TO = 2
_PROPERTY_EXPIRY = 8
_PROPERTY_CREATION = 9
_PROPERTY_GROUP = 10


def _read_properties(read: _Read, encoded: bytes, position: int, end: int) -> int:
    """The properties list whose constructor is at ``position``: the fields the mapping
    reads into ``read``, the others skipped by their size; returns where the section ends.
    A field read must be null or of its type in the spec (else Unsupported, as ``_typed``);
    one skipped is not decoded, as proton does not decode it either."""
    if position >= end:
        raise values_codec.Unsupported("cut off")
    constructor = encoded[position]
    if constructor == 0x45:  # list0
        return position + 1
    if constructor == 0xC0:  # list8
        if position + 3 > end:
            raise values_codec.Unsupported("cut off")
        stop = position + 2 + encoded[position + 1]
        count = encoded[position + 2]
        at = position + 3
    elif constructor == 0xD0:  # list32
        if position + 9 > end:
            raise values_codec.Unsupported("cut off")
        stop = position + 5 + int.from_bytes(encoded[position + 1 : position + 5], "big")
        count = int.from_bytes(encoded[position + 5 : position + 9], "big")
        at = position + 9
    else:
        raise values_codec.Unsupported("a properties section that is not a list")
    if stop > end:
        raise values_codec.Unsupported("cut off")
    decode = values_codec.decode
    for index in range(count):
        if at >= stop:
            raise values_codec.Unsupported("size and items disagree")
        code = encoded[at]
        if code == 0x40:
            at += 1
            continue
        if index in (_PROPERTY_TO, _PROPERTY_GROUP):
            value, at = decode(encoded, at)
            if not isinstance(value, str):
                raise values_codec.Unsupported("a field of another type")
            if index == _PROPERTY_TO:
                read.to = value
            else:
                read.group_id = value
        elif index in (_PROPERTY_EXPIRY, _PROPERTY_CREATION):
            if code != 0x83 or at + 9 > stop:  # timestamp
                raise values_codec.Unsupported("a field of another type")
            milliseconds = int.from_bytes(encoded[at + 1 : at + 9], "big", signed=True)
            at += 9
            if index == _PROPERTY_EXPIRY:
                read.expiry_ms = milliseconds
            else:
                read.creation_ms = milliseconds
        else:
            at = _skip(encoded, at, stop)
    if at != stop:
        raise values_codec.Unsupported("size and items disagree")
    return stop


def _skip(encoded: bytes, position: int, stop: int) -> int:
    """Past a scalar value (a string, symbol, binary or fixed-width value) at ``position``;
    Unsupported for anything else (the caller then decodes it all another way)."""
    code = encoded[position]
    nibble = code >> 4
    if nibble == 0xA:
        if position + 2 > stop:
            raise values_codec.Unsupported("cut off")
        after = position + 2 + encoded[position + 1]
    elif nibble == 0xB:
        if position + 5 > stop:
            raise values_codec.Unsupported("cut off")
        after = position + 5 + int.from_bytes(encoded[position + 1 : position + 5], "big")
    else:
        fixed = _FIXED_CODES.get(code)
        if fixed is None:
            raise values_codec.Unsupported(f"format code 0x{code:02x}")
        after = position + 1 + fixed
    if after > stop:
        raise values_codec.Unsupported("cut off")
    return after


# The fixed-width format codes (AMQP 1.0 part 1, 1.6) and the bytes after each.
_FIXED_CODES = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8, 0x94: 16, 0x98: 16,
}  # fmt: skip


# The header and the message annotations of a stream of messages are mostly the same bytes
# message after message (a JMS producer's durable flag, message type and destination type):
# decoded once and kept by their bytes, so the next message with the same bytes looks them
# up. The values kept are only read (``_read_section`` and ``from_amqp`` never change them).
_CACHED_SECTIONS = frozenset((HEADER, MESSAGE_ANNOTATIONS))
_SECTION_CACHE_SIZE = 256
_SECTION_VALUES: dict[bytes, Any] = {}
_MISSING = object()


def _cacheable_end(encoded: bytes, position: int, end: int) -> int:
    """Where a section whose value is a list or map with a size (read from the size alone,
    not the items) ends; 0 when it is another value, too long to be worth keeping, or cut
    off (the section is then decoded as any other)."""
    stop = values_codec.sized_end(encoded, position + 3, end)
    return stop if stop and stop - position <= _CACHED_SECTION_BYTES else 0


# Longer sections are rare (annotations carrying data of their own): not kept.
_CACHED_SECTION_BYTES = 256


def _read_fast(sections: list[tuple[int, bytes]]) -> _Read:
    """The fields through kittiwake.amqp.values; Unsupported when a section needs proton."""
    read = _Read()
    for code, section in sections:
        _, value = values_codec.decode_described(section)
        _read_section(read, code, value)
    return read


def _read_section(read: _Read, code: int, value: Any) -> None:
    """Take what the mapping uses from one decoded section into ``read``."""
    if code == HEADER:
        fields = _typed(_as_list(value), _HEADER_TYPES)
        n = len(fields)
        read.durable = bool(fields[0]) if n > 0 and fields[0] is not None else False
        if n > 1 and fields[1] is not None:
            read.priority = int(fields[1])
        if n > 2 and fields[2] is not None:
            read.ttl_ms = int(fields[2])
    elif code == MESSAGE_ANNOTATIONS:
        read.annotations = _as_map(value)
    elif code == PROPERTIES:
        fields = _typed(_as_list(value), _PROPERTIES_TYPES)
        n = len(fields)
        read.to = fields[2] if n > 2 else None
        if n > 8 and fields[8] is not None:
            read.expiry_ms = int(fields[8])
        if n > 9 and fields[9] is not None:
            read.creation_ms = int(fields[9])
        read.group_id = fields[10] if n > 10 else None
    elif code == APPLICATION_PROPERTIES:
        read.properties = _as_map(value)
    elif code == DATA:
        if not isinstance(value, bytes):
            raise values_codec.Unsupported("a data section that is not a binary")
        if read.data is None:
            read.data = []
        read.data.append(value)
    elif code == AMQP_VALUE:
        if read.values:
            raise values_codec.Unsupported("more than one amqp-value")
        read.values += 1
        read.body = value if value is None or isinstance(value, (str, bytes)) else ENCODED_BODY
    elif code in (DELIVERY_ANNOTATIONS, FOOTER):
        _as_map(value)  # read, not used: malformed is refused as proton does
    else:  # an amqp-sequence, or not a section
        raise values_codec.Unsupported(f"section 0x{code:02x}")


def _typed(fields: list[Any], types: tuple[type | tuple[type, ...], ...]) -> list[Any]:
    """``fields`` when each one the mapping reads is null or of its type in the spec."""
    for value, expected in zip(fields, types, strict=False):
        if value is not None and not isinstance(value, expected):
            raise values_codec.Unsupported("a field of another type")
    return fields


# The header's and properties' fields up to the last one read, as the spec types them
# (object: not read here, any type).
_HEADER_TYPES: tuple[type | tuple[type, ...], ...] = (bool, ubyte, uint)
_PROPERTIES_TYPES: tuple[type | tuple[type, ...], ...] = (
    object,
    object,
    str,
    object,
    object,
    object,
    object,
    object,
    timestamp,
    timestamp,
    str,
)


def _as_list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise values_codec.Unsupported("a section that is not a list")
    return value


def _as_map(value: Any) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise values_codec.Unsupported("a section that is not a map")
    return value


def _read_proton(encoded: bytes) -> _Read:
    """The fields through proton's Message (what the fast path does not read)."""
    decoded = ProtonMessage()
    try:
        decoded.decode(encoded)
    except Exception as exc:
        raise MappingError(f"undecodable message: {exc}") from None
    # A section of the wrong type (annotations sent as a list, say) is the sender's error:
    # refused with this transfer, never let through to code that reads it as a map.
    for name, section in (
        ("message-annotations", decoded.annotations),
        ("application-properties", decoded.properties),
    ):
        if section is not None and not isinstance(section, dict):
            raise MappingError(f"undecodable message: {name} is not a map")
    body: object = decoded.body
    if isinstance(body, memoryview):
        body = bytes(body)  # a view into the decoder's memory, which goes with it
    elif not (body is None or isinstance(body, (str, bytes))):
        body = ENCODED_BODY
    try:
        return _read_fields(decoded, body)
    except (ValueError, TypeError) as exc:  # a string that is not UTF-8, say: proton reads
        # the fields only when asked, so its errors come from here, not from decode()
        raise MappingError(f"undecodable message: {exc}") from None


def _read_fields(decoded: ProtonMessage, body: object) -> _Read:
    return _Read(
        durable=bool(decoded.durable),
        priority=int(decoded.priority if decoded.priority is not None else DEFAULT_PRIORITY),
        # proton gives seconds; the wire has milliseconds.
        ttl_ms=round(decoded.ttl * 1000) if decoded.ttl else None,
        annotations=decoded.annotations,
        to=decoded.address,
        expiry_ms=round(decoded.expiry_time * 1000) if decoded.expiry_time else None,
        creation_ms=round(decoded.creation_time * 1000) if decoded.creation_time else None,
        group_id=decoded.group_id,
        properties=decoded.properties,
        body=body,
    )


def from_amqp(encoded: bytes, *, topic: str, clocks: Clocks, origin: str | None) -> Incoming:
    """The core message for an AMQP message received on a link to ``topic`` (the link's
    address; the caller replaces it with ``to`` for an anonymous relay)."""
    read: _Read | None = None
    try:
        sections, read = _scan_fast(encoded)
    except (values_codec.Unsupported, ValueError, TypeError):
        sections = split_sections(encoded)
        if sections:
            try:
                read = _read_fast(sections)
            except (values_codec.Unsupported, ValueError, TypeError):
                read = None
    if read is None:
        read = _read_proton(encoded)
    annotations: dict[Any, Any] = read.annotations or {}
    durable = read.durable
    # AMQP's default priority is JMS's (4); AMQP allows 0-255, JMS 0-9.
    priority = min(read.priority, 9)
    expiry: float | None = None
    if read.expiry_ms:
        expiry = clocks.to_clock(float(read.expiry_ms))
    elif read.ttl_ms:
        expiry = clocks.now + read.ttl_ms / 1000.0
    delivery_time: float | None = None
    at = annotations.get(DELIVERY_TIME)
    delay = annotations.get(DELIVERY_DELAY)
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        if at > clocks.wall_ms:
            delivery_time = clocks.to_clock(float(at))
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay > 0:
        delivery_time = clocks.now + delay / 1000.0
    properties = typed_properties(read.properties)
    retain = properties is not None and properties.get(RETAIN_PROPERTY) == 1
    kept, head, footer = _kept_head_footer(encoded, sections)
    if read.data is not None:
        payload, kind = b"".join(read.data), BodyKind.DATA
    elif read.text is not None:  # one amqp-value string, read as UTF-8: a TextMessage
        payload, kind = read.text, BodyKind.STRING
    elif read.values and isinstance(read.body, str):  # one amqp-value: a TextMessage
        payload, kind = read.body.encode("utf-8"), BodyKind.STRING
    else:
        payload, kind = body_bytes(read.body, sections)
    group = read.group_id
    message = Message(
        topic=topic,
        payload=payload,
        qos=2 if durable else 1,
        retain=retain,
        persistent=durable,
        priority=priority,
        expiry=expiry,
        delivery_time=delivery_time,
        created=clocks.now,
        timestamp=read.creation_ms or 0,
        origin=origin,
        properties=properties,
        encoded={SECTIONS_KEY: kept},
        amqp=AMQPFields(head=head, body=kind, footer=footer),
        group_id=group if isinstance(group, str) and group else None,
    )
    to_type = annotations.get(JMS_DEST)
    return Incoming(
        message,
        to=read.to or None,
        to_type=_destination_type(to_type),
        durable=durable,
    )


def _kept_head_footer(
    encoded: bytes, sections: list[tuple[int, bytes]]
) -> tuple[bytes, bytes, bytes]:
    """What a message keeps of its sections: all but the header and delivery annotations
    (what it is sent with again); the annotations, properties and application properties
    (``AMQPFields.head``); the footer. ``sections`` cover ``encoded`` from end to end, so
    when the header and delivery annotations come first (as the spec orders them), what is
    kept is the bytes after them, sliced rather than joined."""
    kept: list[bytes] = []
    head: list[bytes] = []
    footer: list[bytes] = []
    # Bytes of the header and delivery annotations before the first section kept; False
    # once one comes after it (the kept sections are then joined).
    prefix: int | bool = 0
    for code, section in sections:
        if code in _NOT_KEPT:
            if kept:
                prefix = False
            elif prefix is not False:
                prefix += len(section)
            continue
        kept.append(section)
        if code in _HEAD_SECTIONS:
            head.append(section)
        elif code == FOOTER:
            footer.append(section)
    return (
        b"".join(kept) if prefix is False else encoded[prefix:],
        head[0] if len(head) == 1 else b"".join(head),
        footer[0] if len(footer) == 1 else b"".join(footer),
    )


_NOT_KEPT = (HEADER, DELIVERY_ANNOTATIONS)


def _destination_type(value: object) -> DestinationType | None:
    if isinstance(value, int) and not isinstance(value, bool):
        # A lookup, not the enum's call (about a microsecond on every JMS message); an int
        # subclass (proton's byte) hashes and compares as its value.
        return _DESTINATION_TYPES.get(value)
    return None


_DESTINATION_TYPES: dict[int, DestinationType] = {kind.value: kind for kind in DestinationType}


def typed_properties(values: dict[Any, Any] | None) -> MessageProperties | None:
    """Application properties with their AMQP types mapped onto the core's (JMS) types.

    The JMS types map one to one; the unsigned AMQP types take the smallest signed JMS type
    that holds every value (ubyte -> short, ushort -> int, uint and ulong -> long), symbols and
    chars become strings, timestamps longs. Other values (binary, lists, maps, uuids) have no
    JMS property type: they are left out of the core's properties (an AMQP consumer still
    gets them, in the message as sent).
    """
    if not values:
        return None
    properties = MessageProperties()
    for name, value in values.items():
        typed = _property(value)
        if typed is not None:
            try:
                properties.set(str(name), typed[0], typed[1])
            except (TypeError, ValueError):
                continue  # a ulong beyond a long: not representable in JMS
    return properties or None


def _property(value: object) -> tuple[PropertyValue, PropertyType] | None:
    # Order matters: proton's typed ints are int subclasses, and bool is an int too.
    if isinstance(value, bool):
        return value, PropertyType.BOOLEAN
    if isinstance(value, byte):
        return int(value), PropertyType.BYTE
    if isinstance(value, short):
        return int(value), PropertyType.SHORT
    if isinstance(value, int32):
        return int(value), PropertyType.INT
    if isinstance(value, ubyte):
        return int(value), PropertyType.SHORT
    if isinstance(value, ushort):
        return int(value), PropertyType.INT
    if isinstance(value, (uint, ulong)):
        return int(value), PropertyType.LONG
    if isinstance(value, timestamp):
        return int(value), PropertyType.LONG
    if isinstance(value, int):
        return int(value), PropertyType.LONG
    if isinstance(value, float32):
        return float(value), PropertyType.FLOAT
    if isinstance(value, float):
        return float(value), PropertyType.DOUBLE
    if isinstance(value, (symbol, char)):
        return str(value), PropertyType.STRING
    if isinstance(value, str):
        return value, PropertyType.STRING
    return None


_HEAD_SECTIONS = (MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES)


def body_bytes(body: object, sections: list[tuple[int, bytes]]) -> tuple[bytes, BodyKind]:
    """The body as bytes for the core (and so for MQTT subscribers): data sections as they
    are, a string value as UTF-8, a binary value as it is, anything else (a map, a list, a
    sequence) as its AMQP encoding; and how to make the body section from them again.
    ``body``: the amqp-value's value when it is a string, binary or null (see ``_Read``)."""
    data = [s for code, s in sections if code == DATA]
    if data:
        return b"".join(_data_bytes(section) for section in data), BodyKind.DATA
    has_value = any(code == AMQP_VALUE for code, _ in sections)
    if has_value and isinstance(body, str):
        return body.encode("utf-8"), BodyKind.STRING
    if has_value and isinstance(body, (bytes, memoryview)):
        return bytes(body), BodyKind.BINARY
    if body is None and not any(code == AMQP_SEQUENCE for code, _ in sections):
        return b"", BodyKind.NULL if has_value else BodyKind.NONE
    values = [s for code, s in sections if code in (AMQP_VALUE, AMQP_SEQUENCE)]
    return b"".join(values), BodyKind.ENCODED


def _data_bytes(section: bytes) -> bytes:
    """A data section's binary (read in place when its descriptor is the small code)."""
    try:
        _, value = values_codec.decode_described(section)
    except values_codec.Unsupported:
        value = None
    if isinstance(value, bytes):
        return value
    holder = Data()
    try:
        holder.decode(section)
        holder.rewind()
        holder.next()
        holder.enter()
        holder.next()
        holder.next()
        return bytes(holder.get_binary())
    except Exception as exc:  # proton raises DataException and friends
        raise MappingError(f"undecodable data section: {exc}") from None


def restored_sections(message: Message, amqp: AMQPFields) -> bytes:
    """The sections of a message that came from AMQP and lost its encoding on the way (read
    back from the store, moved to a dead-letter queue): its own annotations, properties and
    body kind again, with the application properties the core added since (a dead letter's
    reason) and no absolute expiry when it no longer expires."""
    out: list[bytes] = []
    had_properties = False
    for code, section in split_sections(amqp.head) if amqp.head else ():
        if code == APPLICATION_PROPERTIES:
            had_properties = True
            section = _merged_properties(section, message.properties)
        elif code == PROPERTIES and message.expiry is None:
            section = _without_expiry(section)
        out.append(section)
    if message.properties and not had_properties:
        data = Data()
        data.put_object(
            Described(ulong(APPLICATION_PROPERTIES), amqp_properties(message.properties))
        )
        out.append(bytes(data.encode()))
    out.append(_body_section(message.payload, amqp.body))
    out.append(amqp.footer)
    return b"".join(out)


def _described(section: bytes) -> Any:
    holder = Data()
    holder.decode(section)
    holder.rewind()
    holder.next()
    described = holder.get_object()
    return described.value if isinstance(described, Described) else None


def _merged_properties(section: bytes, properties: MessageProperties | None) -> bytes:
    """The application properties as received, with the core's new or changed ones."""
    if not properties:
        return section
    original = _described(section)
    if not isinstance(original, dict):
        return section
    merged = dict(original)
    changed = False
    for name, value, kind in properties.typed_items():
        if name in original:
            typed = _property(original[name])
            if typed is not None and typed[0] == value:
                continue
        merged[name] = _AMQP_TYPES[kind](value)
        changed = True
    if not changed:
        return section
    data = Data()
    data.put_object(Described(ulong(APPLICATION_PROPERTIES), merged))
    return bytes(data.encode())


def _without_expiry(section: bytes) -> bytes:
    """The properties section without its absolute-expiry-time (field 8)."""
    fields = _described(section)
    if not isinstance(fields, list) or len(fields) <= 8 or fields[8] is None:
        return section
    fields = list(fields)
    fields[8] = None
    data = Data()
    data.put_object(Described(ulong(PROPERTIES), fields))
    return bytes(data.encode())


def _body_section(payload: bytes, kind: int) -> bytes:
    if kind == BodyKind.ENCODED:
        return payload
    if kind == BodyKind.NONE:
        return b""
    data = Data()
    if kind == BodyKind.STRING:
        data.put_object(Described(ulong(AMQP_VALUE), payload.decode("utf-8")))
    elif kind == BodyKind.BINARY:
        data.put_object(Described(ulong(AMQP_VALUE), payload))
    elif kind == BodyKind.NULL:
        data.put_object(Described(ulong(AMQP_VALUE), None))
    else:
        data.put_object(Described(ulong(DATA), payload))
    return bytes(data.encode())


# -- core to AMQP ------------------------------------------------------------------------------


def to_amqp(
    message: Message,
    *,
    durable: bool,
    delivery_count: int,
    clocks: Clocks | Callable[[], Clocks],
    destination_type: DestinationType = DestinationType.TOPIC,
    retained: bool | None = None,
) -> bytes:
    """The encoded AMQP message for one delivery: a header of this delivery's own, then the
    message's sections (kept as received from AMQP, or built once from the core fields).

    ``clocks`` may be a function that reads them: most deliveries need no clock (no ttl, the
    sections built already), so a front end passes that rather than reading two clocks per
    delivery."""
    encoded = message.encoded
    sections = encoded.get(SECTIONS_KEY) if encoded is not None else None
    if sections is None:
        amqp = message.amqp
        if amqp is not None:
            sections = restored_sections(message, amqp)
        else:
            clocks = _read_clocks(clocks)
            sections = build_sections(message, clocks, destination_type)
        if encoded is None:
            encoded = message.encoded = {SECTIONS_KEY: sections}
        else:
            encoded[SECTIONS_KEY] = sections
    if message.retain and retained is not None:
        # JMS_IBM_Retain says how this copy arrives: 1 retained, 0 live (DESIGN.md section 2).
        key = (SECTIONS_KEY, retained)
        assert encoded is not None
        variant = encoded.get(key)
        if variant is None:
            variant = encoded[key] = with_property(sections, RETAIN_PROPERTY, int32(retained))
        sections = variant
    if message.expiry is None and delivery_count < _CACHED_DELIVERY_COUNTS:
        header = _HEADERS.get((durable, message.priority, delivery_count))
        if header is not None:
            return header + sections
    return header_section(message, durable, delivery_count, _read_clocks(clocks)) + sections


def _read_clocks(clocks: Clocks | Callable[[], Clocks]) -> Clocks:
    return clocks if isinstance(clocks, Clocks) else clocks()


def with_property(sections: bytes, name: str, value: object) -> bytes:
    """``sections`` with one application property set (the section added if missing)."""
    parts = split_sections(sections)
    properties: dict[Any, Any] = {}
    for code, section in parts:
        if code == APPLICATION_PROPERTIES:
            holder = Data()
            holder.decode(section)
            holder.rewind()
            holder.next()
            described = holder.get_object()
            if isinstance(described, Described) and isinstance(described.value, dict):
                properties = dict(described.value)
    properties[name] = value
    data = Data()
    data.put_object(Described(ulong(APPLICATION_PROPERTIES), properties))
    replacement = bytes(data.encode())
    out = []
    placed = False
    for code, section in parts:
        if code == APPLICATION_PROPERTIES:
            out.append(replacement)
            placed = True
            continue
        if not placed and code > APPLICATION_PROPERTIES:
            out.append(replacement)
            placed = True
        out.append(section)
    if not placed:
        out.append(replacement)
    return b"".join(out)


def header_section(
    message: Message, durable: bool, delivery_count: int, clocks: Clocks
) -> bytes:
    """The header (durable, priority, ttl, first-acquirer, delivery-count); ttl is what is
    left of the message's life."""
    ttl: uint | None = None
    if message.expiry is not None:
        ttl = uint(max(1, min(0xFFFFFFFF, round((message.expiry - clocks.now) * 1000))))
    elif delivery_count < _CACHED_DELIVERY_COUNTS:
        key = (durable, message.priority, delivery_count)
        header = _HEADERS.get(key)
        if header is None:
            header = _HEADERS[key] = _encoded_header(durable, message.priority, None,
                                                     delivery_count)
        return header
    return _encoded_header(durable, message.priority, ttl, delivery_count)


# Headers without a ttl depend on three small values only: encoded once each (a delivery's
# header is otherwise the one section built per delivery).
_CACHED_DELIVERY_COUNTS = 16
_HEADERS: dict[tuple[bool, int, int], bytes] = {}


def _encoded_header(durable: bool, priority: int, ttl: uint | None, delivery_count: int) -> bytes:
    fields: list[Any] = [
        durable,
        ubyte(priority),
        ttl,
        False,
        uint(delivery_count),
    ]
    data = Data()
    data.put_object(Described(ulong(HEADER), fields))
    return bytes(data.encode())


def build_sections(message: Message, clocks: Clocks, destination_type: DestinationType) -> bytes:
    """The sections of a message that did not come from AMQP (MQTT's): a BytesMessage to its
    topic, typed properties, the MQTT 5 fields where AMQP has a place for them."""
    annotations: dict[Any, Any] = {
        JMS_MSG_TYPE: byte(JMSMessageType.BYTES),
        JMS_DEST: byte(destination_type),
    }
    mqtt5 = message.mqtt5
    reply_to = None
    correlation_id: object = None
    content_type: symbol | None = None
    if mqtt5 is not None:
        if mqtt5.response_topic is not None:
            reply_to = mqtt5.response_topic
            annotations[JMS_REPLY_TO] = byte(DestinationType.TOPIC)
        if mqtt5.correlation_data is not None:
            correlation_id = mqtt5.correlation_data
        if mqtt5.content_type is not None:
            content_type = symbol(mqtt5.content_type)
    if message.delivery_time is not None:
        annotations[DELIVERY_TIME] = timestamp(clocks.to_wall_ms(message.delivery_time))
    expiry = None
    if message.expiry is not None:
        expiry = timestamp(clocks.to_wall_ms(message.expiry))
    created = message.timestamp or clocks.to_wall_ms(message.created)
    properties: list[Any] = [
        None,  # message-id
        None,  # user-id
        message.topic,  # to
        None,  # subject
        reply_to,
        correlation_id,
        content_type,
        None,  # content-encoding
        expiry,
        timestamp(created),
    ]
    data = Data()
    data.put_object(Described(ulong(MESSAGE_ANNOTATIONS), annotations))
    data.put_object(Described(ulong(PROPERTIES), properties))
    application = amqp_properties(message.properties, mqtt5)
    if application:
        data.put_object(Described(ulong(APPLICATION_PROPERTIES), application))
    data.put_object(Described(ulong(DATA), message.payload))
    return bytes(data.encode())


def amqp_properties(
    properties: MessageProperties | None, mqtt5: Any = None
) -> dict[Any, Any]:
    """Typed core properties as AMQP values of the same type; MQTT 5 user properties as
    strings (the last value of a repeated name wins: AMQP keys are unique)."""
    out: dict[Any, Any] = {}
    if mqtt5 is not None:
        for name, value in mqtt5.user_properties:
            out[name] = value
    if properties:
        for name, value, kind in properties.typed_items():
            out[name] = _AMQP_TYPES[kind](value)
    return out


_AMQP_TYPES: dict[PropertyType, Any] = {
    PropertyType.BOOLEAN: bool,
    PropertyType.BYTE: byte,
    PropertyType.SHORT: short,
    PropertyType.INT: int32,
    PropertyType.LONG: int,
    PropertyType.FLOAT: float32,
    PropertyType.DOUBLE: float,
    PropertyType.STRING: str,
}


def decode(encoded: bytes) -> ProtonMessage:
    """An encoded AMQP message as proton's Message (for tests and the selector's headers)."""
    message = ProtonMessage()
    message.decode(encoded)
    return message


def jms_headers(message: Message) -> dict[str, object]:
    """JMSMessageID, JMSCorrelationID and JMSType of a message received over AMQP (from its
    properties section: message-id, correlation-id, subject), for selectors; empty for
    others. Decoded on demand: only selectors that name these headers pay for it."""
    encoded = message.encoded
    sections = encoded.get(SECTIONS_KEY) if encoded is not None else None
    if sections is None:
        return {}
    decoded = ProtonMessage()
    try:
        decoded.decode(sections)
    except Exception:
        return {}
    headers: dict[str, object] = {}
    for name, value in (
        ("JMSMessageID", decoded.id),
        ("JMSCorrelationID", decoded.correlation_id),
        ("JMSType", decoded.subject),
    ):
        if isinstance(value, str):
            headers[name] = value
        elif value is not None and not isinstance(value, (bytes, memoryview)):
            headers[name] = str(value)
    return headers
