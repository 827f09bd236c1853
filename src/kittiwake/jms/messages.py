"""JMS messages and their AMQP encoding (the AMQP JMS mapping as Qpid JMS speaks it): typed
properties with the JMS conversion table, the five body types, read-only state after receipt.
Pure code over proton's Message; no I/O. ObjectMessage unpickles only on explicit opt-in:
pickle runs arbitrary code from the sender, so never enable it with untrusted peers."""

from __future__ import annotations

import itertools
import os
import pickle
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from enum import IntEnum
from typing import Any, ClassVar

from proton import Message as ProtonMessage
from proton import byte, float32, int32, short, symbol, timestamp

from kittiwake.jms import wire
from kittiwake.jms.destinations import Destination, destination_of
from kittiwake.jms.exceptions import (
    MessageEOFException,
    MessageFormatException,
    MessageNotReadableException,
    MessageNotWriteableException,
)

JMS_MSG_TYPE = symbol("x-opt-jms-msg-type")
JMS_DEST = symbol("x-opt-jms-dest")
JMS_REPLY_TO = symbol("x-opt-jms-reply-to")
DELIVERY_DELAY = symbol("x-opt-delivery-delay")
DELIVERY_TIME = symbol("x-opt-delivery-time")
PICKLE_CONTENT_TYPE = "application/x-python-pickle"


class DeliveryMode(IntEnum):
    NON_PERSISTENT = 1
    PERSISTENT = 2


DEFAULT_PRIORITY = 4


_RANGES = {
    "byte": (-(2**7), 2**7 - 1),
    "short": (-(2**15), 2**15 - 1),
    "int": (-(2**31), 2**31 - 1),
    "long": (-(2**63), 2**63 - 1),
}
# Which stored kinds each getter reads (JMS 2.0 section 3.5.4 table; strings parse).
_READABLE: dict[str, tuple[str, ...]] = {
    "boolean": ("boolean", "string"),
    "byte": ("byte", "string"),
    "short": ("byte", "short", "string"),
    "int": ("byte", "short", "int", "string"),
    "long": ("byte", "short", "int", "long", "string"),
    "float": ("float", "string"),
    "double": ("float", "double", "string"),
    "string": ("boolean", "byte", "short", "int", "long", "float", "double", "string", "char"),
    "char": ("char",),
    "bytes": ("bytes",),
}

Typed = tuple[Any, str]


def _check_range(kind: str, value: int) -> int:
    low, high = _RANGES[kind]
    if not low <= value <= high:
        raise MessageFormatException(f"{value} is out of range for a {kind}")
    return value


def convert(stored: Typed | None, kind: str, name: str) -> Any:
    """Read a stored typed value as ``kind`` by the JMS conversion rules."""
    if stored is None or stored[0] is None:
        if kind == "boolean":
            return False  # Boolean.valueOf(null)
        if kind == "string" or kind == "bytes":
            return None
        if kind in ("float", "double"):
            raise MessageFormatException(f"{name!r} is not set (NullPointerException)")
        raise MessageFormatException(f"{name!r} is not set (NumberFormatException)")
    value, stored_kind = stored
    if stored_kind not in _READABLE[kind]:
        raise MessageFormatException(f"{name!r} is a {stored_kind}, not readable as a {kind}")
    if kind == "string":
        if stored_kind == "boolean":
            return "true" if value else "false"
        return str(value)
    if stored_kind != "string":
        return value
    text = str(value)
    try:
        if kind == "boolean":
            return text.strip().lower() == "true"
        if kind in ("float", "double"):
            return float(text)
        return _check_range(kind, int(text.strip()))
    except ValueError:
        raise MessageFormatException(f"{name!r}: {text!r} is not a {kind}") from None


def typed_value(value: Any) -> Typed:
    """A Python value with the JMS type it maps to (int is a long, float a double)."""
    if value is None:
        return (None, "string")
    if isinstance(value, bool):
        return (value, "boolean")
    if isinstance(value, byte):
        return (int(value), "byte")
    if isinstance(value, short):
        return (int(value), "short")
    if isinstance(value, int32):
        return (int(value), "int")
    if isinstance(value, int):
        return (_check_range("long", value), "long")
    if isinstance(value, float32):
        return (float(value), "float")
    if isinstance(value, float):
        return (value, "double")
    if isinstance(value, str):
        return (value, "string")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return (bytes(value), "bytes")
    raise MessageFormatException(f"{type(value).__name__} is not a JMS property type")


def to_amqp_value(value: Any, kind: str) -> Any:
    return {
        "byte": byte,
        "short": short,
        "int": int32,
        "float": float32,
    }.get(kind, lambda v: v)(value)


class Message:
    """A JMS message without a body: headers and typed properties."""

    msg_type: ClassVar[int] = 0

    def __init__(self) -> None:
        self._properties: dict[str, Typed] = {}
        self.jms_message_id: str | None = None
        self.jms_timestamp: int = 0
        self.jms_correlation_id: str | None = None
        self.jms_reply_to: Destination | None = None
        self.jms_destination: Destination | None = None
        self.jms_delivery_mode: DeliveryMode = DeliveryMode.PERSISTENT
        self.jms_redelivered: bool = False
        self.jms_type: str | None = None
        self.jms_expiration: int = 0
        self.jms_priority: int = DEFAULT_PRIORITY
        self.jms_delivery_time: int = 0
        self.delivery_count: int = 1  # JMSXDeliveryCount
        self.group_id: str | None = None
        self._properties_read_only = False
        self._body_read_only = False
        self._acknowledger: Callable[[Message], None] | None = None

    # -- JMS-named accessors ------------------------------------------------------------------

    def get_jms_message_id(self) -> str | None:
        return self.jms_message_id

    def get_jms_correlation_id(self) -> str | None:
        return self.jms_correlation_id

    def set_jms_correlation_id(self, value: str | None) -> None:
        self.jms_correlation_id = value

    def get_jms_reply_to(self) -> Destination | None:
        return self.jms_reply_to

    def set_jms_reply_to(self, value: Destination | None) -> None:
        self.jms_reply_to = value

    def get_jms_destination(self) -> Destination | None:
        return self.jms_destination

    def get_jms_delivery_mode(self) -> DeliveryMode:
        return self.jms_delivery_mode

    def get_jms_redelivered(self) -> bool:
        return self.jms_redelivered

    def get_jms_priority(self) -> int:
        return self.jms_priority

    def get_jms_expiration(self) -> int:
        return self.jms_expiration

    def get_jms_timestamp(self) -> int:
        return self.jms_timestamp

    def get_jms_type(self) -> str | None:
        return self.jms_type

    def set_jms_type(self, value: str | None) -> None:
        self.jms_type = value

    def get_jms_delivery_time(self) -> int:
        return self.jms_delivery_time

    # -- properties ---------------------------------------------------------------------------

    def _set(self, name: str, value: Any, kind: str) -> None:
        if self._properties_read_only:
            raise MessageNotWriteableException("the message's properties are read-only")
        if not name or not (name[0].isalpha() or name[0] in "_$"):
            raise ValueError(f"{name!r} is not a valid property name")
        if kind in _RANGES and not isinstance(value, bool):
            _check_range(kind, int(value))
        self._properties[name] = (value, kind)

    def _get(self, name: str, kind: str) -> Any:
        if name == "JMSXDeliveryCount":
            return convert((self.delivery_count, "int"), kind, name)
        if name == "JMSXGroupID":
            return convert((self.group_id, "string"), kind, name)
        return convert(self._properties.get(name), kind, name)

    def set_boolean_property(self, name: str, value: bool) -> None:
        self._set(name, bool(value), "boolean")

    def set_byte_property(self, name: str, value: int) -> None:
        self._set(name, int(value), "byte")

    def set_short_property(self, name: str, value: int) -> None:
        self._set(name, int(value), "short")

    def set_int_property(self, name: str, value: int) -> None:
        if name == "JMSXGroupID":
            raise MessageFormatException("JMSXGroupID is a string")
        self._set(name, int(value), "int")

    def set_long_property(self, name: str, value: int) -> None:
        self._set(name, int(value), "long")

    def set_float_property(self, name: str, value: float) -> None:
        self._set(name, float(value), "float")

    def set_double_property(self, name: str, value: float) -> None:
        self._set(name, float(value), "double")

    def set_string_property(self, name: str, value: str | None) -> None:
        if name == "JMSXGroupID":
            self.group_id = value
            return
        self._set(name, value, "string")

    def set_object_property(self, name: str, value: Any) -> None:
        typed = typed_value(value)
        if typed[1] == "bytes":
            raise MessageFormatException("bytes are not a valid property type")
        self._set(name, typed[0], typed[1])

    def get_boolean_property(self, name: str) -> bool:
        return bool(self._get(name, "boolean"))

    def get_byte_property(self, name: str) -> int:
        return int(self._get(name, "byte"))

    def get_short_property(self, name: str) -> int:
        return int(self._get(name, "short"))

    def get_int_property(self, name: str) -> int:
        return int(self._get(name, "int"))

    def get_long_property(self, name: str) -> int:
        return int(self._get(name, "long"))

    def get_float_property(self, name: str) -> float:
        return float(self._get(name, "float"))

    def get_double_property(self, name: str) -> float:
        return float(self._get(name, "double"))

    def get_string_property(self, name: str) -> str | None:
        value = self._get(name, "string")
        return None if value is None else str(value)

    def get_object_property(self, name: str) -> Any:
        if name == "JMSXDeliveryCount":
            return self.delivery_count
        if name == "JMSXGroupID":
            return self.group_id
        stored = self._properties.get(name)
        return None if stored is None else stored[0]

    def property_exists(self, name: str) -> bool:
        return (
            name in self._properties
            or name == "JMSXDeliveryCount"
            or (name == "JMSXGroupID" and self.group_id is not None)
        )

    def get_property_names(self) -> list[str]:
        return list(self._properties)

    def clear_properties(self) -> None:
        self._properties.clear()
        self._properties_read_only = False

    # -- body and acknowledgement --------------------------------------------------------------

    def clear_body(self) -> None:
        self._body_read_only = False
        self._clear_body()

    def _clear_body(self) -> None:
        pass

    def _check_writable(self) -> None:
        if self._body_read_only:
            raise MessageNotWriteableException("the message body is read-only after receipt")

    def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: every message the session delivered so far; INDIVIDUAL: this one;
        other modes: nothing (JMS ignores the call)."""
        if self._acknowledger is not None:
            self._acknowledger(self)

    def get_body(self) -> Any:
        return None

    def _body_section(self, allow_pickle: bool) -> tuple[Any, bool, str | None]:
        """(body, inferred, content type): inferred makes bytes a data section and a list an
        amqp-sequence."""
        return (None, False, None)

    def _read_body(self, body: Any, content_type: str | None) -> None:
        pass


class TextMessage(Message):
    msg_type: ClassVar[int] = 5

    def __init__(self, text: str | None = None) -> None:
        super().__init__()
        self.text = text

    def set_text(self, text: str | None) -> None:
        self._check_writable()
        self.text = text

    def get_text(self) -> str | None:
        return self.text

    def get_body(self) -> str | None:
        return self.text

    def _clear_body(self) -> None:
        self.text = None

    def _body_section(self, allow_pickle: bool) -> tuple[Any, bool, str | None]:
        return (self.text, False, None)

    def _read_body(self, body: Any, content_type: str | None) -> None:
        if body is not None and not isinstance(body, str):
            body = bytes(body).decode("utf-8")
        self.text = body


class BytesMessage(Message):
    """Java's DataOutputStream/DataInputStream encoding (big-endian)."""

    msg_type: ClassVar[int] = 3

    def __init__(self, data: bytes = b"") -> None:
        super().__init__()
        self._buffer = bytearray(data)
        self._position = 0

    def _need_read(self) -> None:
        if not self._body_read_only:
            raise MessageNotReadableException("the message is in write-only mode (call reset())")

    def _pack(self, fmt: str, value: Any) -> None:
        self._check_writable()
        self._buffer += struct.pack(fmt, value)

    def _unpack(self, fmt: str) -> Any:
        self._need_read()
        size = struct.calcsize(fmt)
        if self._position + size > len(self._buffer):
            raise MessageEOFException("end of the message body")
        (value,) = struct.unpack_from(fmt, self._buffer, self._position)
        self._position += size
        return value

    def write_bytes(self, value: bytes) -> None:
        self._check_writable()
        self._buffer += value

    def write_boolean(self, value: bool) -> None:
        self._pack(">?", value)

    def write_byte(self, value: int) -> None:
        self._pack(">b", value)

    def write_short(self, value: int) -> None:
        self._pack(">h", value)

    def write_int(self, value: int) -> None:
        self._pack(">i", value)

    def write_long(self, value: int) -> None:
        self._pack(">q", value)

    def write_float(self, value: float) -> None:
        self._pack(">f", value)

    def write_double(self, value: float) -> None:
        self._pack(">d", value)

    def write_utf(self, value: str) -> None:
        data = value.encode("utf-8")
        self._pack(">H", len(data))
        self._buffer += data

    def read_bytes(self, length: int | None = None) -> bytes:
        """Up to ``length`` bytes (the rest when None); b"" at the end (Java's -1)."""
        self._need_read()
        end = (
            len(self._buffer) if length is None else min(len(self._buffer), self._position + length)
        )
        data = bytes(self._buffer[self._position : end])
        self._position = end
        return data

    def read_boolean(self) -> bool:
        return bool(self._unpack(">?"))

    def read_byte(self) -> int:
        return int(self._unpack(">b"))

    def read_short(self) -> int:
        return int(self._unpack(">h"))

    def read_int(self) -> int:
        return int(self._unpack(">i"))

    def read_long(self) -> int:
        return int(self._unpack(">q"))

    def read_float(self) -> float:
        return float(self._unpack(">f"))

    def read_double(self) -> float:
        return float(self._unpack(">d"))

    def read_utf(self) -> str:
        length = int(self._unpack(">H"))
        data = self.read_bytes(length)
        if len(data) < length:
            raise MessageEOFException("end of the message body")
        return data.decode("utf-8")

    def get_body_length(self) -> int:
        self._need_read()
        return len(self._buffer)

    def reset(self) -> None:
        """Make the body read-only and read from the start."""
        self._body_read_only = True
        self._position = 0

    def get_body(self) -> bytes:
        return bytes(self._buffer)

    def _clear_body(self) -> None:
        self._buffer = bytearray()
        self._position = 0

    def _body_section(self, allow_pickle: bool) -> tuple[Any, bool, str | None]:
        return (bytes(self._buffer), True, "application/octet-stream")

    def _read_body(self, body: Any, content_type: str | None) -> None:
        if isinstance(body, str):
            body = body.encode("utf-8")
        self._buffer = bytearray(body or b"")
        self._position = 0


class MapMessage(Message):
    msg_type: ClassVar[int] = 2

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._map: dict[str, Typed] = {}
        for name, value in (values or {}).items():
            self._map[name] = typed_value(value)

    def _put(self, name: str, value: Any, kind: str) -> None:
        self._check_writable()
        if not name:
            raise ValueError("a map entry needs a name")
        if kind in _RANGES and value is not None:
            _check_range(kind, int(value))
        self._map[name] = (value, kind)

    def set_boolean(self, name: str, value: bool) -> None:
        self._put(name, bool(value), "boolean")

    def set_byte(self, name: str, value: int) -> None:
        self._put(name, value, "byte")

    def set_short(self, name: str, value: int) -> None:
        self._put(name, value, "short")

    def set_int(self, name: str, value: int) -> None:
        self._put(name, value, "int")

    def set_long(self, name: str, value: int) -> None:
        self._put(name, value, "long")

    def set_float(self, name: str, value: float) -> None:
        self._put(name, value, "float")

    def set_double(self, name: str, value: float) -> None:
        self._put(name, value, "double")

    def set_string(self, name: str, value: str | None) -> None:
        self._put(name, value, "string")

    def set_bytes(self, name: str, value: bytes) -> None:
        self._put(name, bytes(value), "bytes")

    def set_object(self, name: str, value: Any) -> None:
        typed = typed_value(value)
        self._put(name, typed[0], typed[1])

    def get_boolean(self, name: str) -> bool:
        return bool(convert(self._map.get(name), "boolean", name))

    def get_byte(self, name: str) -> int:
        return int(convert(self._map.get(name), "byte", name))

    def get_short(self, name: str) -> int:
        return int(convert(self._map.get(name), "short", name))

    def get_int(self, name: str) -> int:
        return int(convert(self._map.get(name), "int", name))

    def get_long(self, name: str) -> int:
        return int(convert(self._map.get(name), "long", name))

    def get_float(self, name: str) -> float:
        return float(convert(self._map.get(name), "float", name))

    def get_double(self, name: str) -> float:
        return float(convert(self._map.get(name), "double", name))

    def get_string(self, name: str) -> str | None:
        value = convert(self._map.get(name), "string", name)
        return None if value is None else str(value)

    def get_bytes(self, name: str) -> bytes | None:
        value = convert(self._map.get(name), "bytes", name)
        return None if value is None else bytes(value)

    def get_object(self, name: str) -> Any:
        stored = self._map.get(name)
        return None if stored is None else stored[0]

    def item_exists(self, name: str) -> bool:
        return name in self._map

    def get_map_names(self) -> list[str]:
        return list(self._map)

    def get_body(self) -> dict[str, Any]:
        return {name: value for name, (value, _) in self._map.items()}

    def _clear_body(self) -> None:
        self._map.clear()

    def _body_section(self, allow_pickle: bool) -> tuple[Any, bool, str | None]:
        return ({k: to_amqp_value(v, t) for k, (v, t) in self._map.items()}, False, None)

    def _read_body(self, body: Any, content_type: str | None) -> None:
        self._map = {str(k): typed_value(v) for k, v in (body or {}).items()}


class StreamMessage(Message):
    """A sequence of typed values read back in order with the stream conversion rules."""

    msg_type: ClassVar[int] = 4

    def __init__(self) -> None:
        super().__init__()
        self._items: list[Typed] = []
        self._position = 0

    def _write(self, value: Any, kind: str) -> None:
        self._check_writable()
        if kind in _RANGES and value is not None:
            _check_range(kind, int(value))
        self._items.append((value, kind))

    def _read(self, kind: str) -> Any:
        if not self._body_read_only:
            raise MessageNotReadableException("the message is in write-only mode (call reset())")
        if self._position >= len(self._items):
            raise MessageEOFException("end of the stream")
        value = convert(self._items[self._position], kind, f"item {self._position}")
        self._position += 1  # a failed conversion leaves the position (JMS)
        return value

    def write_boolean(self, value: bool) -> None:
        self._write(bool(value), "boolean")

    def write_byte(self, value: int) -> None:
        self._write(value, "byte")

    def write_short(self, value: int) -> None:
        self._write(value, "short")

    def write_int(self, value: int) -> None:
        self._write(value, "int")

    def write_long(self, value: int) -> None:
        self._write(value, "long")

    def write_float(self, value: float) -> None:
        self._write(value, "float")

    def write_double(self, value: float) -> None:
        self._write(value, "double")

    def write_string(self, value: str | None) -> None:
        self._write(value, "string")

    def write_bytes(self, value: bytes) -> None:
        self._write(bytes(value), "bytes")

    def write_object(self, value: Any) -> None:
        typed = typed_value(value)
        self._write(typed[0], typed[1])

    def read_boolean(self) -> bool:
        return bool(self._read("boolean"))

    def read_byte(self) -> int:
        return int(self._read("byte"))

    def read_short(self) -> int:
        return int(self._read("short"))

    def read_int(self) -> int:
        return int(self._read("int"))

    def read_long(self) -> int:
        return int(self._read("long"))

    def read_float(self) -> float:
        return float(self._read("float"))

    def read_double(self) -> float:
        return float(self._read("double"))

    def read_string(self) -> str | None:
        value = self._read("string")
        return None if value is None else str(value)

    def read_bytes(self) -> bytes | None:
        value = self._read("bytes")
        return None if value is None else bytes(value)

    def read_object(self) -> Any:
        if not self._body_read_only:
            raise MessageNotReadableException("the message is in write-only mode (call reset())")
        if self._position >= len(self._items):
            raise MessageEOFException("end of the stream")
        value = self._items[self._position][0]
        self._position += 1
        return value

    def reset(self) -> None:
        self._body_read_only = True
        self._position = 0

    def get_body(self) -> list[Any]:
        return [value for value, _ in self._items]

    def _clear_body(self) -> None:
        self._items = []
        self._position = 0

    def _body_section(self, allow_pickle: bool) -> tuple[Any, bool, str | None]:
        return ([to_amqp_value(v, t) for v, t in self._items], True, None)

    def _read_body(self, body: Any, content_type: str | None) -> None:
        self._items = [typed_value(v) for v in (body or [])]
        self._position = 0


class ObjectMessage(Message):
    """A pickled Python object. UNSAFE with untrusted peers: unpickling runs the sender's code,
    so it happens only when the connection factory was created with ``allow_pickle=True``."""

    msg_type: ClassVar[int] = 1

    def __init__(self, value: Any = None, *, allow_pickle: bool = False) -> None:
        super().__init__()
        self._object = value
        self._pickled: bytes | None = None
        self._allow_pickle = allow_pickle

    def set_object(self, value: Any) -> None:
        self._check_writable()
        self._object = value
        self._pickled = None

    def get_object(self) -> Any:
        if self._pickled is not None:
            if not self._allow_pickle:
                raise MessageFormatException(
                    "ObjectMessage bodies are pickles: enable allow_pickle=True on the "
                    "ConnectionFactory only when every sender is trusted"
                )
            self._object = pickle.loads(self._pickled)
            self._pickled = None
        return self._object

    def get_body(self) -> Any:
        return self.get_object()

    def _clear_body(self) -> None:
        self._object = None
        self._pickled = None

    def _body_section(self, allow_pickle: bool) -> tuple[Any, bool, str | None]:
        if not allow_pickle:
            raise MessageFormatException(
                "sending an ObjectMessage pickles it: enable allow_pickle=True on the "
                "ConnectionFactory (unsafe with untrusted peers)"
            )
        return (pickle.dumps(self._object), True, PICKLE_CONTENT_TYPE)

    def _read_body(self, body: Any, content_type: str | None) -> None:
        self._object = None
        self._pickled = bytes(body) if body is not None else None
        if content_type != PICKLE_CONTENT_TYPE and self._pickled is not None:
            self._pickled = None
            raise MessageFormatException(f"an ObjectMessage of {content_type!r} cannot be read")


_BY_TYPE: dict[int, type[Message]] = {
    0: Message,
    1: ObjectMessage,
    2: MapMessage,
    3: BytesMessage,
    4: StreamMessage,
    5: TextMessage,
}


class _MessageIds:
    """Message ids as Qpid JMS makes them, a random prefix and a counter, not a uuid4 per
    message (os.urandom: a system call per send, measured as a fifth of a send's CPU).
    Unique per process; a forked child draws a prefix of its own."""

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self.prefix = f"ID:{uuid.uuid4()}:"
        self.counter = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}{next(self.counter)}"


_ids = _MessageIds()
os.register_at_fork(after_in_child=_ids.renew)


def new_message_id() -> str:
    return _ids.next()


def encode(
    message: Message,
    *,
    address: str | None,
    destination: Destination,
    delivery_delay_ms: int,
    allow_pickle: bool,
) -> bytes:
    """The AMQP message for ``message`` (its JMS headers already set by the producer):
    written by kittiwake.jms.wire, or, for a value it does not write, by proton's Message
    (the same bytes either way)."""
    body, inferred, content_type = message._body_section(allow_pickle)
    try:
        return _encode_fast(message, address, destination, delivery_delay_ms, body, inferred,
                            content_type)
    except (wire.Unsupported, UnicodeEncodeError, struct.error, OverflowError):
        return _encode_proton(message, address, destination, delivery_delay_ms, body, inferred,
                              content_type)


# The message annotations of a message without reply-to and delivery delay, by (message type,
# destination type): every send of a producer uses one.
_plain_annotations: dict[tuple[int, int], bytes] = {}


def _annotations(
    message: Message, destination: Destination, delivery_delay_ms: int
) -> dict[symbol, Any]:
    annotations: dict[symbol, Any] = {
        JMS_MSG_TYPE: byte(message.msg_type),
        JMS_DEST: byte(destination.type_code),
    }
    if message.jms_reply_to is not None:
        annotations[JMS_REPLY_TO] = byte(message.jms_reply_to.type_code)
    if delivery_delay_ms > 0:
        # Absolute, as Qpid JMS sends it: the delay counts from the send, not the arrival.
        annotations[DELIVERY_TIME] = timestamp(message.jms_delivery_time)
    return annotations


def _ttl_ms(message: Message) -> int:
    """proton's ttl for the expiration (seconds as a float, at least a millisecond)."""
    seconds = max(0.001, (message.jms_expiration - message.jms_timestamp) / 1000.0)
    return int(seconds * 1000)


def _encode_fast(
    message: Message,
    address: str | None,
    destination: Destination,
    delivery_delay_ms: int,
    body: Any,
    inferred: bool,
    content_type: str | None,
) -> bytes:
    expiration = message.jms_expiration
    header = wire.header_section(
        message.jms_delivery_mode == DeliveryMode.PERSISTENT,
        message.jms_priority,
        _ttl_ms(message) if expiration else 0,
    )
    if message.jms_reply_to is None and delivery_delay_ms <= 0:
        key = (message.msg_type, destination.type_code)
        annotations = _plain_annotations.get(key)
        if annotations is None:
            annotations = _plain_annotations[key] = wire.map_section(
                wire.MESSAGE_ANNOTATIONS, _annotations(message, destination, 0)
            )
    else:
        annotations = wire.map_section(
            wire.MESSAGE_ANNOTATIONS, _annotations(message, destination, delivery_delay_ms)
        )
    fields = wire.Fields()
    fields.message_id = message.jms_message_id
    fields.to = address
    fields.subject = message.jms_type
    if message.jms_reply_to is not None:
        fields.reply_to = message.jms_reply_to.name
    fields.correlation_id = message.jms_correlation_id
    fields.content_type = content_type
    fields.expiry_ms = expiration
    fields.creation_ms = message.jms_timestamp
    fields.group_id = message.group_id
    properties = (
        {k: to_amqp_value(v, t) for k, (v, t) in message._properties.items()}
        if message._properties
        else None
    )
    return wire.encode_message(header, annotations, fields, properties, body, inferred)


def _encode_proton(
    message: Message,
    address: str | None,
    destination: Destination,
    delivery_delay_ms: int,
    body: Any,
    inferred: bool,
    content_type: str | None,
) -> bytes:
    out: Any = ProtonMessage()
    out.durable = message.jms_delivery_mode == DeliveryMode.PERSISTENT
    out.priority = message.jms_priority
    if message.jms_expiration:
        out.expiry_time = message.jms_expiration / 1000.0
        out.ttl = max(0.001, (message.jms_expiration - message.jms_timestamp) / 1000.0)
    if message.jms_message_id is not None:
        out.id = message.jms_message_id
    if message.jms_timestamp:
        out.creation_time = message.jms_timestamp / 1000.0
    out.correlation_id = message.jms_correlation_id
    out.subject = message.jms_type
    out.address = address
    out.group_id = message.group_id
    if message.jms_reply_to is not None:
        out.reply_to = message.jms_reply_to.name
    out.annotations = _annotations(message, destination, delivery_delay_ms)
    if message._properties:
        out.properties = {k: to_amqp_value(v, t) for k, (v, t) in message._properties.items()}
    out.body = body
    out.inferred = inferred
    if content_type is not None:
        out.content_type = content_type
    data: bytes = out.encode()
    return data


def decode(data: bytes, *, fallback: Destination | None, allow_pickle: bool) -> Message:
    """A received AMQP message as the JMS message Qpid JMS would make of it; read-only.
    Read by kittiwake.jms.wire, or by proton's Message for what that does not read."""
    try:
        read = wire.read_message(data)
    except (wire.Unsupported, ValueError, TypeError):
        read = _read_proton(data)
    annotations: dict[Any, Any] = read.annotations or {}
    kind = annotations.get(JMS_MSG_TYPE)
    body = read.body
    if kind is None:
        if isinstance(body, str):
            kind = 5
        elif isinstance(body, (bytes, memoryview)) or (body is None and read.inferred):
            kind = 3
        elif isinstance(body, dict):
            kind = 2
        elif isinstance(body, list):
            kind = 4
        else:
            kind = 0 if body is None else 3
    cls = _BY_TYPE.get(int(kind), BytesMessage)
    message: Message = ObjectMessage(allow_pickle=allow_pickle) if cls is ObjectMessage else cls()
    content_type = str(read.content_type) if read.content_type else None
    message._read_body(body, content_type)
    message.jms_message_id = None if read.message_id is None else str(read.message_id)
    message.jms_correlation_id = (
        None if read.correlation_id is None else _text(read.correlation_id)
    )
    message.jms_type = read.subject
    message.jms_priority = int(read.priority if read.priority is not None else 4)
    message.jms_delivery_mode = (
        DeliveryMode.PERSISTENT if read.durable else DeliveryMode.NON_PERSISTENT
    )
    message.delivery_count = int(read.delivery_count or 0) + 1
    message.jms_redelivered = message.delivery_count > 1
    message.jms_timestamp = read.creation_ms
    message.jms_expiration = read.expiry_ms
    delivery_time = annotations.get(DELIVERY_TIME)
    message.jms_delivery_time = int(delivery_time) if delivery_time else message.jms_timestamp
    message.group_id = read.group_id
    dest_type = annotations.get(JMS_DEST)
    message.jms_destination = (
        destination_of(read.to, None if dest_type is None else int(dest_type)) or fallback
    )
    reply_type = annotations.get(JMS_REPLY_TO)
    message.jms_reply_to = destination_of(
        read.reply_to, None if reply_type is None else int(reply_type)
    )
    for name, value in (read.properties or {}).items():
        message._properties[str(name)] = typed_value(value)
    message._properties_read_only = True
    message._body_read_only = True
    return message


def _read_proton(data: bytes) -> wire.Read:
    """The fields as proton's Message gives them (what wire.read_message does not read)."""
    incoming: Any = ProtonMessage()
    incoming.decode(data)
    read = wire.Read()
    read.source = incoming  # its binaries are views into it: alive until decode() is done
    read.durable = bool(incoming.durable)
    read.priority = int(incoming.priority if incoming.priority is not None else 4)
    read.delivery_count = int(incoming.delivery_count or 0)
    read.annotations = incoming.annotations
    read.message_id = _copied(incoming.id)
    read.to = incoming.address
    read.subject = incoming.subject
    read.reply_to = incoming.reply_to
    read.correlation_id = _copied(incoming.correlation_id)
    read.content_type = incoming.content_type
    # proton gives seconds (a float of the milliseconds on the wire).
    read.expiry_ms = round((incoming.expiry_time or 0) * 1000)
    read.creation_ms = round((incoming.creation_time or 0) * 1000)
    read.group_id = incoming.group_id
    read.properties = incoming.properties
    read.body = incoming.body
    read.inferred = bool(incoming.inferred)
    return read


def _copied(value: Any) -> Any:
    """A binary id as bytes: proton's is a view into its decoder (whose str() was an address)."""
    return bytes(value) if isinstance(value, memoryview) else value


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def now_ms() -> int:
    return int(time.time() * 1000)


def message_types() -> Iterator[type[Message]]:
    yield from _BY_TYPE.values()
