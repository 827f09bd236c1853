"""AMQP 1.0 framing as the connection sees it before the engine does: protocol headers, the
frame-header check that turns bad input into a framing error, and the few frames the broker
writes by hand (SASL, a last close). Pure code over bytes; never touches a socket.
"""

from __future__ import annotations

import struct
from typing import Any

from proton import Data, Described, symbol, ulong

# Protocol headers (AMQP 1.0 section 2.2): "AMQP", protocol id, major, minor, revision.
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
HEADER_SIZE = 8

FRAME_TYPE_AMQP = 0
FRAME_TYPE_SASL = 1
# Frame header: size (4), data offset in 4-byte words (1), type (1), channel (2).
FRAME_HEADER = struct.Struct(">IBBH")
MIN_FRAME_SIZE = 8

# Performative descriptors the broker builds or reads itself.
SASL_MECHANISMS = 0x40
SASL_INIT = 0x41
SASL_OUTCOME = 0x44
OPEN = 0x10
CLOSE = 0x18
ERROR = 0x1D

# Error conditions (AMQP 1.0 section 2.8.15-2.8.17).
FRAMING_ERROR = "amqp:connection:framing-error"
DECODE_ERROR = "amqp:decode-error"
RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
INTERNAL_ERROR = "amqp:internal-error"
NOT_FOUND = "amqp:not-found"
NOT_ALLOWED = "amqp:not-allowed"
NOT_IMPLEMENTED = "amqp:not-implemented"
INVALID_FIELD = "amqp:invalid-field"
UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
PRECONDITION_FAILED = "amqp:precondition-failed"
RESOURCE_DELETED = "amqp:resource-deleted"


class FramingError(Exception):
    """The peer sent bytes that are not AMQP frames; the connection must end."""

    def __init__(self, description: str, condition: str = FRAMING_ERROR) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


def encode_frame(frame_type: int, channel: int, performative: Any) -> bytes:
    """One frame holding one described performative (no payload)."""
    data = Data()
    data.put_object(performative)
    body = bytes(data.encode())
    return FRAME_HEADER.pack(MIN_FRAME_SIZE + len(body), 2, frame_type, channel) + body


def decode_performative(body: bytes) -> Described:
    """The described list a frame body starts with; FramingError when it is not one."""
    data = Data()
    try:
        data.decode(body)
        value = data.get_object()
        if isinstance(value, Described) and isinstance(value.value, list):
            # Binary fields are views into the decoder's memory, which goes with it.
            fields = [bytes(f) if isinstance(f, memoryview) else f for f in value.value]
            value = Described(value.descriptor, fields)
    except Exception as exc:  # proton raises DataException and friends, all "undecodable"
        raise FramingError(f"undecodable frame body: {exc}", DECODE_ERROR) from None
    if not isinstance(value, Described) or not isinstance(value.value, list):
        raise FramingError("a frame body must be a described list", DECODE_ERROR)
    return value


def open_frame(container_id: str) -> bytes:
    return encode_frame(FRAME_TYPE_AMQP, 0, Described(ulong(OPEN), [container_id]))


def close_frame(condition: str, description: str) -> bytes:
    """A close carrying an error, for when the engine cannot write one itself."""
    error = Described(ulong(ERROR), [symbol(condition), description, None])
    return encode_frame(FRAME_TYPE_AMQP, 0, Described(ulong(CLOSE), [error]))


class FrameGate:
    """Follows frame boundaries of an incoming AMQP stream and checks each frame header.

    The engine silently stops at some malformed input (an undecodable body ends its input
    without an error condition) and never notices a frame cut off by the end of the stream;
    the gate names both, so the connection can close with a framing error that says why.
    Only headers are read: the bodies pass through untouched.
    """

    __slots__ = ("_header", "_remaining", "max_frame_size")

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        # Bytes of the current frame still to come (0 between frames).
        self._remaining = 0
        # The part of a frame header received so far.
        self._header = b""

    @property
    def mid_frame(self) -> bool:
        """Is a frame partly received (a stream ending now is cut off)?"""
        return bool(self._remaining or self._header)

    def check(self, data: bytes) -> None:
        """Follow ``data``; raises FramingError at the first bad frame header.

        Whole headers are read in place (the usual case: a read holds whole frames); only a
        header split across reads is gathered."""
        end = len(data)
        # Where the next frame header starts: past the body of the frame in progress.
        position = self._remaining
        if self._header:
            needed = MIN_FRAME_SIZE - len(self._header)
            self._header += data[:needed]
            if len(self._header) < MIN_FRAME_SIZE:
                return
            header, self._header = self._header, b""
            position = needed + self._frame_size(*FRAME_HEADER.unpack(header)) - MIN_FRAME_SIZE
        unpack_from = FRAME_HEADER.unpack_from
        limit = self.max_frame_size
        while position + MIN_FRAME_SIZE <= end:
            size, offset, frame_type, channel = unpack_from(data, position)
            if (
                size < MIN_FRAME_SIZE
                or size > limit
                or offset < 2
                or offset * 4 > size
                or frame_type != FRAME_TYPE_AMQP
            ):
                self._frame_size(size, offset, frame_type, channel)  # raises, saying why
            # A good header (every frame of a read, nearly always) costs no call.
            position += size
        if position < end:
            self._header = bytes(data[position:])
            self._remaining = 0
        else:
            self._remaining = position - end

    def _frame_size(self, size: int, offset: int, frame_type: int, _channel: int) -> int:
        """A frame header's size, once the header is found valid."""
        if size < MIN_FRAME_SIZE:
            raise FramingError(f"frame size {size} is below the minimum of 8")
        if size > self.max_frame_size:
            raise FramingError(
                f"frame size {size} exceeds the maximum frame size {self.max_frame_size}"
            )
        if offset < 2 or offset * 4 > size:
            raise FramingError(f"bad data offset {offset} in a frame of {size} bytes")
        if frame_type != FRAME_TYPE_AMQP:
            raise FramingError(f"unexpected frame type {frame_type} after the AMQP header")
        return size
