"""The AMQP 1.0 bytes of a JMS message, written and read without proton's Message, for the
client's hot path. Pure code over bytes and values; never touches an engine.

proton's Message goes through its engine's Data one wrapped C call per field (and builds a
wrapper per section): measured, most of the client's CPU per message. The encoder here writes
what ``Message.encode`` writes, byte for byte (its choices: a list8 header and properties with
trailing nulls cut, map32 maps, list32 lists, the smallest integer forms; tested against it for
every message and property type), with the sections that depend only on the message's type,
destination and delivery mode built once. The reader takes the sections through
``kittiwake.amqp_values`` (the broker's decoder, which gives proton's values and types). Both
raise :class:`Unsupported` for what they do not handle: the caller then uses proton, as before.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

from proton import (
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

from kittiwake import amqp_values
from kittiwake.amqp_values import Unsupported

__all__ = [
    "Fields",
    "Read",
    "Unsupported",
    "body_section",
    "encode_message",
    "header_section",
    "map_section",
    "properties_section",
    "read_message",
    "value_bytes",
]

_B = struct.Struct(">b").pack
_H = struct.Struct(">H").pack
_h = struct.Struct(">h").pack
_I = struct.Struct(">I").pack
_i = struct.Struct(">i").pack
_Q = struct.Struct(">Q").pack
_q = struct.Struct(">q").pack
_f = struct.Struct(">f").pack
_d = struct.Struct(">d").pack
_SIZE_COUNT = struct.Struct(">II").pack

_NULL = b"\x40"
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78


# -- values ------------------------------------------------------------------------------------


def _variable(small: int, large: int, raw: bytes) -> bytes:
    size = len(raw)
    if size < 256:
        return bytes((small, size)) + raw
    return bytes((large,)) + _I(size) + raw


def _string(value: str) -> bytes:
    return _variable(0xA1, 0xB1, value.encode("utf-8"))


def _symbol(value: str) -> bytes:
    try:
        raw = value.encode("ascii")
    except UnicodeEncodeError:
        raise Unsupported("a symbol that is not ASCII") from None
    return _variable(0xA3, 0xB3, raw)


def _long(value: int) -> bytes:
    if -128 <= value <= 127:
        return b"\x55" + _B(value)
    if not -(2**63) <= value < 2**63:
        raise Unsupported("out of a long's range")
    return b"\x81" + _q(value)


def _int32(value: int) -> bytes:
    if -128 <= value <= 127:
        return b"\x54" + _B(value)
    if not -(2**31) <= value < 2**31:
        raise Unsupported("out of an int's range")
    return b"\x71" + _i(value)


def _uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if 0 < value < 256:
        return bytes((0x52, value))
    if not 0 <= value < 2**32:
        raise Unsupported("out of a uint's range")
    return b"\x70" + _I(value)


def _ulong(value: int) -> bytes:
    if value == 0:
        return b"\x44"
    if 0 < value < 256:
        return bytes((0x53, value))
    if not 0 <= value < 2**64:
        raise Unsupported("out of a ulong's range")
    return b"\x80" + _Q(value)


def _small(code: int, pack: Callable[[int], bytes], low: int, high: int) -> Any:
    def write(value: int) -> bytes:
        if not low <= value <= high:
            raise Unsupported("out of the type's range")
        return bytes((code,)) + pack(value)

    return write


def _list(items: list[Any]) -> bytes:
    if not items:
        return b"\x45"
    body = b"".join([value_bytes(item) for item in items])
    return b"\xd0" + _SIZE_COUNT(len(body) + 4, len(items)) + body


def _map(entries: dict[Any, Any]) -> bytes:
    parts: list[bytes] = []
    for key, value in entries.items():
        parts.append(value_bytes(key))
        parts.append(value_bytes(value))
    body = b"".join(parts)
    return b"\xd1" + _SIZE_COUNT(len(body) + 4, len(parts)) + body


def _char(value: str) -> bytes:
    if len(value) != 1:
        raise Unsupported("a char of more than one code point")
    return b"\x73" + _I(ord(value))


# By exact type: proton's typed values are subclasses of int, float and str, and each has its
# own encoding (bool before int: it is one too).
_WRITERS: dict[type, Any] = {
    type(None): lambda value: _NULL,
    bool: lambda value: b"\x41" if value else b"\x42",
    int: _long,
    float: lambda value: b"\x82" + _d(value),
    str: _string,
    bytes: lambda value: _variable(0xA0, 0xB0, value),
    symbol: _symbol,
    byte: _small(0x51, _B, -(2**7), 2**7 - 1),
    short: _small(0x61, _h, -(2**15), 2**15 - 1),
    int32: _int32,
    float32: lambda value: b"\x72" + _f(value),
    ubyte: _small(0x50, lambda v: bytes((v,)), 0, 255),
    ushort: _small(0x60, _H, 0, 2**16 - 1),
    uint: _uint,
    ulong: _ulong,
    timestamp: lambda value: b"\x83" + _q(value),
    char: _char,
    uuid.UUID: lambda value: b"\x98" + value.bytes,
    list: _list,
    dict: _map,
}


def value_bytes(value: Any) -> bytes:
    """``value`` as proton's ``Data.put_object`` encodes it; Unsupported for a type this does
    not write (arrays, described values, decimals...)."""
    writer = _WRITERS.get(type(value))
    if writer is None:
        raise Unsupported(f"a {type(value).__name__}")
    data: bytes = writer(value)
    return data


# -- sections ----------------------------------------------------------------------------------


def _composite(descriptor: int, fields: list[bytes]) -> bytes:
    """A header or properties section as proton's Message writes it: trailing nulls cut, an
    empty list as list0, else list8 (list32 when it does not fit)."""
    while fields and fields[-1] == _NULL:
        fields.pop()
    prefix = bytes((0x00, 0x53, descriptor))
    if not fields:
        return prefix + b"\x45"
    body = b"".join(fields)
    if len(body) + 1 <= 255 and len(fields) <= 255:
        return prefix + bytes((0xC0, len(body) + 1, len(fields))) + body
    return prefix + b"\xd0" + _SIZE_COUNT(len(body) + 4, len(fields)) + body


def _secs2millis(millis: int) -> int:
    """What proton's Message stores for a time given in seconds as ``millis / 1000.0`` (the
    float round trip of its setters, kept so that both encoders agree to the byte)."""
    return int(millis / 1000.0 * 1000)


_headers: dict[tuple[bool, int], bytes] = {}


def header_section(durable: bool, priority: int, ttl_ms: int) -> bytes:
    """The header (durable, priority, ttl); without a ttl, built once per combination."""
    if not ttl_ms:
        key = (durable, priority)
        cached = _headers.get(key)
        if cached is None:
            cached = _headers[key] = _header(durable, priority, 0)
        return cached
    return _header(durable, priority, ttl_ms)


def _header(durable: bool, priority: int, ttl_ms: int) -> bytes:
    if not 0 <= priority <= 255:
        raise Unsupported("a priority out of a ubyte's range")
    return _composite(
        HEADER,
        [
            b"\x41" if durable else _NULL,
            _NULL if priority == 4 else bytes((0x50, priority)),
            _uint(ttl_ms) if ttl_ms else _NULL,
        ],
    )


def map_section(descriptor: int, entries: dict[Any, Any]) -> bytes:
    return bytes((0x00, 0x53, descriptor)) + _map(entries)


class Fields:
    """The properties section's fields that a JMS message sets (absent: None or 0)."""

    __slots__ = (
        "content_type",
        "correlation_id",
        "creation_ms",
        "expiry_ms",
        "group_id",
        "message_id",
        "reply_to",
        "subject",
        "to",
    )

    def __init__(self) -> None:
        self.message_id: str | None = None
        self.to: str | None = None
        self.subject: str | None = None
        self.reply_to: str | None = None
        self.correlation_id: str | None = None
        self.content_type: str | None = None
        self.expiry_ms = 0
        self.creation_ms = 0
        self.group_id: str | None = None


def _optional_string(value: str | None) -> bytes:
    return _NULL if value is None else _string(value)


def properties_section(fields: Fields) -> bytes:
    group_id = fields.group_id
    return _composite(
        PROPERTIES,
        [
            _optional_string(fields.message_id),
            _NULL,  # user-id
            _optional_string(fields.to),
            _optional_string(fields.subject),
            _optional_string(fields.reply_to),
            _optional_string(fields.correlation_id),
            _NULL if fields.content_type is None else _symbol(fields.content_type),
            _NULL,  # content-encoding
            _NULL if not fields.expiry_ms else b"\x83" + _q(_secs2millis(fields.expiry_ms)),
            _NULL if not fields.creation_ms else b"\x83" + _q(_secs2millis(fields.creation_ms)),
            _NULL if group_id is None else _string(group_id),
            # proton's Message writes its group-sequence (0) with a group-id.
            _NULL if group_id is None else b"\x43",
        ],
    )


def body_section(body: Any, inferred: bool) -> bytes:
    """A data section for bytes and an amqp-sequence for a list when ``inferred``, else one
    amqp-value; nothing for no body."""
    if body is None:
        return b""
    if inferred and type(body) is bytes:
        return b"\x00\x53\x75" + _variable(0xA0, 0xB0, body)
    if inferred and type(body) is list:
        return b"\x00\x53\x76" + _list(body)
    return b"\x00\x53\x77" + value_bytes(body)


def encode_message(
    header: bytes,
    annotations: bytes,
    fields: Fields,
    application_properties: dict[str, Any] | None,
    body: Any,
    inferred: bool,
) -> bytes:
    parts = [header, annotations, properties_section(fields)]
    if application_properties:
        parts.append(map_section(APPLICATION_PROPERTIES, application_properties))
    parts.append(body_section(body, inferred))
    return b"".join(parts)


# -- reading -----------------------------------------------------------------------------------


class Read:
    """What a received message's sections hold, as proton's Message getters give it."""

    __slots__ = (
        "annotations",
        "body",
        "content_type",
        "correlation_id",
        "creation_ms",
        "delivery_count",
        "durable",
        "expiry_ms",
        "group_id",
        "inferred",
        "message_id",
        "priority",
        "properties",
        "reply_to",
        "source",
        "subject",
        "to",
    )

    def __init__(self) -> None:
        # What the values may be views into (proton's Message): kept while they are read.
        self.source: Any = None
        self.durable = False
        self.priority = 4
        self.delivery_count = 0
        self.annotations: dict[Any, Any] | None = None
        self.message_id: Any = None
        self.to: str | None = None
        self.subject: str | None = None
        self.reply_to: str | None = None
        self.correlation_id: Any = None
        self.content_type: str | None = None
        self.expiry_ms = 0
        self.creation_ms = 0
        self.group_id: str | None = None
        self.properties: dict[Any, Any] | None = None
        self.body: Any = None
        self.inferred = False


def _field(fields: list[Any], index: int, kind: type | tuple[type, ...]) -> Any:
    if index >= len(fields):
        return None
    value = fields[index]
    if value is not None and not isinstance(value, kind):
        raise Unsupported("a field of another type")
    return value


_ID_TYPES = (str, bytes, ulong, uuid.UUID)


def _id(value: Any) -> Any:
    """A message or correlation id as proton's Message gives it (a ulong as a plain int)."""
    return int(value) if type(value) is ulong else value


# The header and the message annotations of the messages a consumer receives are mostly the
# same bytes message after message (the broker's header for a first delivery, a producer's
# message type and destination type): decoded once and kept by their bytes, as the broker's
# front end keeps them (amqp/message_mapping.py), so the next message with the same bytes
# looks them up (measured: about half of decoding a TextMessage). The values kept are only
# read (``read_message`` and ``messages.decode`` never change them). One cache for the
# process: its threads (one I/O thread a connection) only get and set whole entries.
_KEPT_SECTIONS = frozenset((HEADER, MESSAGE_ANNOTATIONS))
_KEPT_SECTIONS_COUNT = 256
_KEPT_SECTION_BYTES = 256  # longer ones are rare (annotations carrying data of their own)
_KEPT_VALUES: dict[bytes, Any] = {}
_MISSING: Any = object()


def read_message(data: bytes) -> Read:
    """The sections of ``data`` (each with a small descriptor, in the spec's order, one body
    section); Unsupported for anything else, which proton then reads."""
    read = Read()
    decode = amqp_values.decode
    sized_end = amqp_values.sized_end
    kept = _KEPT_VALUES
    position = 0
    end = len(data)
    last = 0
    body_seen = False
    while position < end:
        if position + 3 > end or data[position] != 0x00 or data[position + 1] != 0x53:
            raise Unsupported("not a section with a small descriptor")
        code = data[position + 2]
        if code <= last or body_seen or not HEADER <= code <= AMQP_VALUE:
            raise Unsupported("sections out of order, repeated, or a footer")
        last = code
        stop = sized_end(data, position + 3, end) if code in _KEPT_SECTIONS else 0
        if stop and stop - position <= _KEPT_SECTION_BYTES:
            section = data[position:stop]
            value = kept.get(section, _MISSING)
            if value is _MISSING:
                value, position = decode(data, position + 3)
                if position != stop:
                    raise Unsupported("size and items disagree")
                if len(kept) >= _KEPT_SECTIONS_COUNT:
                    kept.clear()
                kept[section] = value
            position = stop
        else:
            value, position = decode(data, position + 3)
        if code == HEADER:
            if not isinstance(value, list):
                raise Unsupported("a header that is not a list")
            durable = _field(value, 0, bool)
            read.durable = bool(durable)
            priority = _field(value, 1, ubyte)
            read.priority = 4 if priority is None else int(priority)
            count = _field(value, 4, uint)
            read.delivery_count = 0 if count is None else int(count)
        elif code == MESSAGE_ANNOTATIONS:
            if value is not None and not isinstance(value, dict):
                raise Unsupported("annotations that are not a map")
            read.annotations = value
        elif code == PROPERTIES:
            if not isinstance(value, list):
                raise Unsupported("properties that are not a list")
            read.message_id = _id(_field(value, 0, _ID_TYPES))
            read.to = _field(value, 2, str)
            read.subject = _field(value, 3, str)
            read.reply_to = _field(value, 4, str)
            read.correlation_id = _id(_field(value, 5, _ID_TYPES))
            read.content_type = _field(value, 6, symbol)
            expiry = _field(value, 8, timestamp)
            read.expiry_ms = 0 if expiry is None else int(expiry)
            creation = _field(value, 9, timestamp)
            read.creation_ms = 0 if creation is None else int(creation)
            read.group_id = _field(value, 10, str)
        elif code == APPLICATION_PROPERTIES:
            if value is not None and not isinstance(value, dict):
                raise Unsupported("application properties that are not a map")
            read.properties = value
        elif code == DELIVERY_ANNOTATIONS:
            if value is not None and not isinstance(value, dict):
                raise Unsupported("delivery annotations that are not a map")
        else:  # a body section: proton's Message reads one
            body_seen = True
            if code == DATA:
                if not isinstance(value, bytes):
                    raise Unsupported("a data section that is not a binary")
                read.inferred = True
            elif code == AMQP_SEQUENCE:
                if not isinstance(value, list):
                    raise Unsupported("an amqp-sequence that is not a list")
                read.inferred = True
            read.body = value
    return read
