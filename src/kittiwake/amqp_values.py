"""AMQP 1.0 encoded values (part 1) to Python values, for the message sections read on every
transfer (header, annotations, properties, application properties): by the broker's AMQP front
end (``kittiwake.amqp.message_mapping``, through its old name ``kittiwake.amqp.values``) and by
the client library (``kittiwake.jms.wire``), which imports no broker module, hence a module
of its own outside both.

proton's Message.decode builds its message through the engine's Data and then converts each
field with one wrapped C call after another; measured, that was the largest part of mapping an
incoming message. This decoder reads the bytes directly and gives the same values, of the same
types, as proton's ``Data.get_object`` (its typed ints, ``symbol``, ``timestamp``...), so the
mapping does not depend on who decoded. What it does not read (arrays, decimals, described
values inside a section) raises :class:`Unsupported`: the caller then decodes with proton, as
before. Pure code over bytes.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from proton import (
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


class Unsupported(Exception):
    """A value this decoder does not read (or cut off, or not valid UTF-8): decode it with
    proton instead, which reads everything and reports what is malformed."""


_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_I64 = struct.Struct(">q").unpack_from
_F32 = struct.Struct(">f").unpack_from
_F64 = struct.Struct(">d").unpack_from


# Lists and maps nested deeper than this are left to proton (no recursion limit to reach).
MAX_DEPTH = 16


def decode(data: bytes, position: int, depth: int = 0) -> tuple[Any, int]:
    """The value encoded at ``position`` and where it ends."""
    end = len(data)
    if position >= end:
        raise Unsupported("cut off")
    code = data[position]
    position += 1
    if code == 0x40:  # null: most of a properties section
        return None, position
    # Variable width: strings, symbols, binaries (the most frequent in message sections).
    if code in _VARIABLE:
        if code & 0x10:  # four-byte size
            if position + 4 > end:
                raise Unsupported("cut off")
            (size,) = _U32(data, position)
            position += 4
        else:
            if position >= end:
                raise Unsupported("cut off")
            size = data[position]
            position += 1
        stop = position + size
        if stop > end:
            raise Unsupported("cut off")
        raw = data[position:stop]
        kind = code & 0x0F
        if kind == 0x1:
            try:
                return raw.decode("utf-8"), stop
            except UnicodeDecodeError:
                raise Unsupported("not UTF-8") from None
        if kind == 0x3:
            try:
                return symbol(raw.decode("ascii")), stop
            except UnicodeDecodeError:
                raise Unsupported("not ASCII") from None
        return bytes(raw), stop
    if code in _COMPOUND:
        if depth >= MAX_DEPTH:
            raise Unsupported("nested too deep")
        return _compound(data, position, end, code, depth + 1)
    fixed = _FIXED.get(code)
    if fixed is None:
        raise Unsupported(f"format code 0x{code:02x}")
    width, read = fixed
    stop = position + width
    if stop > end:
        raise Unsupported("cut off")
    return read(data, position), stop


def _compound(
    data: bytes, position: int, end: int, code: int, depth: int
) -> tuple[Any, int]:
    """A list or a map (count then items; a map's count is keys and values together)."""
    if code & 0x10:  # list32, map32
        if position + 8 > end:
            raise Unsupported("cut off")
        (size,) = _U32(data, position)
        (count,) = _U32(data, position + 4)
        stop = position + 4 + size
        position += 8
    else:
        if position + 2 > end:
            raise Unsupported("cut off")
        size = data[position]
        count = data[position + 1]
        stop = position + 1 + size
        position += 2
    if stop > end or count > size:
        raise Unsupported("cut off")
    items: list[Any] = []
    append = items.append
    for _ in range(count):
        if position < stop and data[position] == 0x40:  # null, read here: no call
            append(None)
            position += 1
            continue
        value, position = decode(data, position, depth)
        append(value)
    if position != stop:
        raise Unsupported("size and items disagree")
    if code & 0x01:  # map
        if count % 2:
            raise Unsupported("a map with an odd count")
        pairs = iter(items)
        try:
            return dict(zip(pairs, pairs, strict=True)), stop
        except TypeError:
            raise Unsupported("an unhashable map key") from None
    return items, stop


def decode_described(data: bytes) -> tuple[int, Any]:
    """A message section: its numeric descriptor and its value (one section, nothing after)."""
    if len(data) < 3 or data[0] != 0x00:
        raise Unsupported("not a described value")
    code = data[1]
    if code == 0x53:
        descriptor = data[2]
        position = 3
    elif code == 0x80 and len(data) >= 10:
        (descriptor,) = _U64(data, 2)
        position = 10
    else:
        raise Unsupported("a symbolic descriptor")
    value, position = decode(data, position)
    if position != len(data):
        raise Unsupported("bytes after the section")
    return descriptor, value


def sized_end(data: bytes, at: int, end: int) -> int:
    """Where the list or map whose constructor is at ``at`` ends, read from its size alone
    (not its items); 0 for any other value or one cut off. For the readers that keep a
    section's decoded value by its bytes (a message stream's header and annotations are the
    same bytes message after message), which must know those bytes before decoding them."""
    if at >= end:
        return 0
    constructor = data[at]
    if constructor == 0xC0 or constructor == 0xC1:  # list8, map8
        if at + 1 >= end:
            return 0
        stop = at + 2 + data[at + 1]
    elif constructor == 0xD0 or constructor == 0xD1:  # list32, map32
        if at + 5 > end:
            return 0
        stop = at + 5 + int.from_bytes(data[at + 1 : at + 5], "big")
    elif constructor == 0x45:  # list0: an empty header
        stop = at + 1
    else:
        return 0
    return stop if stop <= end else 0


def decode_fields(encoded: bytes) -> list[Any]:
    """The fields of a delivery state (a list: a transactional state's [txn-id, outcome]),
    each value plain or described (an outcome), as proton's ``Data.get_object`` reads them,
    except that a binary is bytes (proton gives a memoryview). Read on every transactional
    transfer and outcome, by the broker's coordinator and by the client; Unsupported when this
    reader does not read them (the caller then asks proton)."""
    try:
        constructor = encoded[0]
        if constructor == 0x45:  # list0
            at, stop, count = 1, 1, 0
        elif constructor == 0xC0:  # list8
            at, stop, count = 3, 2 + encoded[1], encoded[2]
        elif constructor == 0xD0:  # list32
            at, stop = 9, 5 + int.from_bytes(encoded[1:5], "big")
            count = int.from_bytes(encoded[5:9], "big")
        else:
            raise Unsupported("not a list")
        if stop != len(encoded):
            raise Unsupported("size and bytes disagree")
        fields: list[Any] = []
        for _ in range(count):
            if encoded[at] == 0x00:  # described: an outcome
                descriptor, at = decode(encoded, at + 1)
                value, at = decode(encoded, at)
                fields.append(Described(descriptor, value))
            else:
                value, at = decode(encoded, at)
                fields.append(value)
    except IndexError:
        raise Unsupported("cut off") from None
    if at != stop:
        raise Unsupported("size and items disagree")
    return fields


def _char(data: bytes, position: int) -> char:
    try:
        return char(chr(_U32(data, position)[0]))
    except (ValueError, OverflowError):  # past 0x10FFFF, or past what chr() takes at all
        raise Unsupported("not a code point") from None


_VARIABLE = frozenset((0xA0, 0xB0, 0xA1, 0xB1, 0xA3, 0xB3))
_COMPOUND = frozenset((0xC0, 0xD0, 0xC1, 0xD1))

# Fixed-width codes: (bytes after the code, how they read).
_FIXED: dict[int, tuple[int, Any]] = {
    0x40: (0, lambda d, p: None),
    0x41: (0, lambda d, p: True),
    0x42: (0, lambda d, p: False),
    0x56: (1, lambda d, p: d[p] != 0),
    0x50: (1, lambda d, p: ubyte(d[p])),
    0x51: (1, lambda d, p: byte(d[p] - 256 if d[p] > 127 else d[p])),
    0x60: (2, lambda d, p: ushort(_U16(d, p)[0])),
    0x61: (2, lambda d, p: short(_I16(d, p)[0])),
    0x70: (4, lambda d, p: uint(_U32(d, p)[0])),
    0x52: (1, lambda d, p: uint(d[p])),
    0x43: (0, lambda d, p: uint(0)),
    0x71: (4, lambda d, p: int32(_I32(d, p)[0])),
    0x54: (1, lambda d, p: int32(d[p] - 256 if d[p] > 127 else d[p])),
    0x80: (8, lambda d, p: ulong(_U64(d, p)[0])),
    0x53: (1, lambda d, p: ulong(d[p])),
    0x44: (0, lambda d, p: ulong(0)),
    0x81: (8, lambda d, p: _I64(d, p)[0]),
    0x55: (1, lambda d, p: d[p] - 256 if d[p] > 127 else d[p]),
    0x72: (4, lambda d, p: float32(_F32(d, p)[0])),
    0x82: (8, lambda d, p: _F64(d, p)[0]),
    0x73: (4, _char),
    0x83: (8, lambda d, p: timestamp(_I64(d, p)[0])),
    0x98: (16, lambda d, p: uuid.UUID(bytes=bytes(d[p : p + 16]))),
    0x45: (0, lambda d, p: []),
}
