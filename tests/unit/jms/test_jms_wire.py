"""kittiwake.jms.wire against proton's Message: the encoder writes the same bytes as
``Message.encode`` for every JMS message type and property type (and the edge cases: empty,
unicode, large, null, nested), the reader gives the same fields as ``Message.decode``, and
what neither handles goes to proton with the same result."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from proton import (
    UNDESCRIBED,
    Array,
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

from kittiwake.jms import (
    BytesMessage,
    MapMessage,
    Message,
    ObjectMessage,
    Queue,
    StreamMessage,
    TemporaryQueue,
    TemporaryTopic,
    TextMessage,
    Topic,
    wire,
)
from kittiwake.jms.destinations import Destination
from kittiwake.jms.messages import (
    DeliveryMode,
    _encode_fast,
    _encode_proton,
    _read_proton,
    decode,
    encode,
)

NOW = 1_764_000_000_123
LONG_TEXT = "ü€𝄞x" * 5000


def _proton_value(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    encoded: bytes = data.encode()
    return encoded


VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    127,
    128,
    -128,
    -129,
    2**31,
    2**63 - 1,
    -(2**63),
    0.0,
    -1.5,
    float("inf"),
    "",
    "x",
    "ü€𝄞",
    "y" * 255,
    "y" * 256,
    LONG_TEXT,
    b"",
    b"\x00\xff",
    b"z" * 256,
    symbol("s"),
    symbol("s" * 300),
    byte(-128),
    byte(127),
    short(-(2**15)),
    short(300),
    int32(0),
    int32(-128),
    int32(127),
    int32(128),
    int32(-(2**31)),
    float32(1.5),
    ubyte(255),
    ushort(65535),
    uint(0),
    uint(255),
    uint(256),
    ulong(0),
    ulong(255),
    ulong(2**64 - 1),
    timestamp(NOW),
    timestamp(-1),
    char("é"),
    uuid.UUID(int=12345),
    [],
    [1, "a", None],
    {},
    {"a": 1, "b": {"c": [1, {"d": b"e"}]}, "f": []},
    {symbol("k"): byte(1), 7: None},
    [[[]], {"x": [None]}] * 100,
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{type(v).__name__}:{str(v)[:20]}")
def test_values_are_encoded_as_proton_encodes_them(value: Any) -> None:
    assert wire.value_bytes(value) == _proton_value(value)


@pytest.mark.parametrize(
    "value",
    [Described(symbol("d"), 1), Array(UNDESCRIBED, Data.INT, 1, 2), 2**64, byte(200), object()],
    ids=["described", "array", "big-int", "byte-range", "object"],
)
def test_values_it_does_not_write_are_left_to_proton(value: Any) -> None:
    with pytest.raises(wire.Unsupported):
        wire.value_bytes(value)


def _stamped(message: Message, **headers: Any) -> Message:
    message.jms_message_id = "ID:0b7e1c4e-6f0e-4d0b-9a7b-2f1f7c9a3e11"
    message.jms_timestamp = NOW
    message.jms_delivery_time = NOW
    message.jms_delivery_mode = DeliveryMode.NON_PERSISTENT
    for name, value in headers.items():
        setattr(message, name, value)
    return message


def _with_properties(message: Message) -> Message:
    message.set_boolean_property("bool", True)
    message.set_byte_property("byte", -7)
    message.set_short_property("short", -300)
    message.set_int_property("int", 2**31 - 1)
    message.set_int_property("small_int", 3)
    message.set_long_property("long", -(2**63))
    message.set_long_property("small_long", -1)
    message.set_float_property("float", 0.25)
    message.set_double_property("double", 1e300)
    message.set_string_property("string", "ü€𝄞")
    message.set_string_property("empty", "")
    message.set_string_property("null", None)
    message.set_string_property("large", LONG_TEXT)
    message.set_object_property("object", int32(5))
    message.set_string_property("JMSXGroupID", "group-1")
    return message


def _stream() -> StreamMessage:
    stream = StreamMessage()
    stream.write_boolean(False)
    stream.write_byte(1)
    stream.write_short(2)
    stream.write_int(3)
    stream.write_long(2**40)
    stream.write_float(1.5)
    stream.write_double(-2.5)
    stream.write_string("ü")
    stream.write_string(None)
    stream.write_bytes(b"\x00" * 300)
    return stream


def _map() -> MapMessage:
    values = MapMessage(
        {"none": None, "text": LONG_TEXT, "int": 1, "float": 0.5, "bytes": b"", "": "empty key"}
    )
    values.set_byte("byte", -1)
    values.set_short("short", 7)
    values.set_int("int32", -(2**31))
    values.set_float("float32", 3.25)
    values.set_bytes("bytes2", b"\xff" * 1000)
    return values


MESSAGES: dict[str, Callable[[], Message]] = {
    "message": lambda: _stamped(Message()),
    "text": lambda: _stamped(TextMessage("x" * 100)),
    "text-empty": lambda: _stamped(TextMessage("")),
    "text-null": lambda: _stamped(TextMessage(None)),
    "text-unicode-large": lambda: _stamped(TextMessage(LONG_TEXT)),
    "bytes": lambda: _stamped(BytesMessage(b"\x01\x02")),
    "bytes-empty": lambda: _stamped(BytesMessage()),
    "bytes-large": lambda: _stamped(BytesMessage(b"b" * 70000)),
    "map": lambda: _stamped(_map()),
    "map-empty": lambda: _stamped(MapMessage()),
    "stream": lambda: _stamped(_stream()),
    "stream-empty": lambda: _stamped(StreamMessage()),
    "object": lambda: _stamped(ObjectMessage({"a": [1, 2], "b": (3,)})),
    "object-none": lambda: _stamped(ObjectMessage(None)),
    "text-properties": lambda: _with_properties(_stamped(TextMessage("p"))),
    "map-properties": lambda: _with_properties(_stamped(_map())),
    "persistent": lambda: _stamped(TextMessage("d"), jms_delivery_mode=DeliveryMode.PERSISTENT),
    "priority-0": lambda: _stamped(TextMessage("d"), jms_priority=0),
    "priority-9": lambda: _stamped(
        TextMessage("d"), jms_priority=9, jms_delivery_mode=DeliveryMode.PERSISTENT
    ),
    "expiring": lambda: _stamped(TextMessage("e"), jms_expiration=NOW + 60_000),
    "expiring-1001ms": lambda: _stamped(TextMessage("e"), jms_expiration=NOW + 1001),
    "expired-at-send": lambda: _stamped(TextMessage("e"), jms_expiration=NOW - 5),
    "small-times": lambda: _stamped(
        TextMessage("e"), jms_timestamp=1001, jms_expiration=2003, jms_delivery_time=1001
    ),
    "no-id-no-timestamp": lambda: _stamped(
        TextMessage("n"), jms_message_id=None, jms_timestamp=0
    ),
    "headers": lambda: _stamped(
        TextMessage("h"),
        jms_correlation_id="corr-ü",
        jms_type="type",
        jms_reply_to=Topic("replies"),
        group_id="g",
    ),
    "empty-strings": lambda: _stamped(
        TextMessage(""), jms_correlation_id="", jms_type="", group_id="", jms_message_id=""
    ),
    "reply-to-temporary": lambda: _stamped(
        TextMessage("r"), jms_reply_to=TemporaryQueue("tmp-q", None)
    ),
    "long-id": lambda: _stamped(TextMessage("l"), jms_message_id="ID:" + "i" * 300),
    "unicode-id": lambda: _stamped(TextMessage("u"), jms_message_id="ID:ü€"),
}

DESTINATIONS: list[tuple[Destination, str | None]] = [
    (Queue("q"), "q"),
    (Topic("a/b"), "a/b"),
    (TemporaryTopic("tmp-t", None), "tmp-t"),
    (Queue("q"), None),
]


def _both(message: Message, destination: Destination, address: str | None, delay: int) -> tuple[
    bytes, bytes
]:
    body, inferred, content_type = message._body_section(True)
    fast = _encode_fast(message, address, destination, delay, body, inferred, content_type)
    slow = _encode_proton(message, address, destination, delay, body, inferred, content_type)
    return fast, slow


@pytest.mark.parametrize("name", list(MESSAGES))
@pytest.mark.parametrize("delay", [0, 1500])
@pytest.mark.parametrize("where", range(len(DESTINATIONS)))
def test_messages_are_encoded_as_proton_encodes_them(name: str, delay: int, where: int) -> None:
    destination, address = DESTINATIONS[where]
    fast, slow = _both(MESSAGES[name](), destination, address, delay)
    assert fast == slow
    # The same message twice (the cached sections are not changed by a send).
    assert _both(MESSAGES[name](), destination, address, delay) == (fast, slow)


def _fields(read: wire.Read) -> dict[str, Any]:
    fields = {
        name: (getattr(read, name), type(getattr(read, name)))
        for name in wire.Read.__slots__
        if name not in ("body", "annotations", "content_type", "source")
    }
    # proton's annotations are its dict subclass; only get() is used.
    fields["annotations"] = None if read.annotations is None else dict(read.annotations)
    # proton's Message gives symbol("None") for no content type (str(None) made a symbol);
    # decode() treats both alike: only an ObjectMessage reads it, and wants the pickle type.
    content_type = read.content_type
    fields["content_type"] = None if content_type in (None, "None") else content_type
    return fields


def _body(read: wire.Read) -> Any:
    body = read.body
    return bytes(body) if isinstance(body, memoryview) else body


@pytest.mark.parametrize("name", list(MESSAGES))
@pytest.mark.parametrize("delay", [0, 1500])
def test_messages_are_read_as_proton_reads_them(name: str, delay: int) -> None:
    data = encode(
        MESSAGES[name](),
        address="q",
        destination=Queue("q"),
        delivery_delay_ms=delay,
        allow_pickle=True,
    )
    fast = wire.read_message(data)
    slow = _read_proton(data)
    assert _fields(fast) == _fields(slow)
    assert _body(fast) == _body(slow)
    assert type(_body(fast)) is type(_body(slow))


def _jms_view(message: Message) -> dict[str, Any]:
    view = {
        name: getattr(message, name)
        for name in (
            "jms_message_id",
            "jms_timestamp",
            "jms_correlation_id",
            "jms_delivery_mode",
            "jms_redelivered",
            "jms_type",
            "jms_expiration",
            "jms_priority",
            "jms_delivery_time",
            "delivery_count",
            "group_id",
        )
    }
    view["destination"] = message.jms_destination
    view["reply_to"] = message.jms_reply_to
    view["type"] = type(message)
    view["properties"] = dict(message._properties)
    view["body"] = message.get_body() if not isinstance(message, ObjectMessage) else None
    return view


@pytest.mark.parametrize("name", list(MESSAGES))
def test_round_trips_keep_every_header_property_and_body(name: str) -> None:
    original = MESSAGES[name]()
    sent = _jms_view(original)
    data = encode(
        original, address="q", destination=Queue("q"), delivery_delay_ms=0, allow_pickle=True
    )
    received = decode(data, fallback=None, allow_pickle=True)
    got = _jms_view(received)
    assert got["body"] == sent["body"]
    assert got["properties"] == sent["properties"]
    assert got["type"] is sent["type"]
    for header in ("jms_message_id", "jms_correlation_id", "jms_type", "jms_priority"):
        assert got[header] == sent[header]
    assert got["jms_delivery_mode"] == sent["jms_delivery_mode"]
    assert got["group_id"] == sent["group_id"]
    assert got["destination"] == Queue("q")
    if isinstance(original, ObjectMessage):
        assert isinstance(received, ObjectMessage)
        assert received.get_object() == original.get_object()


def _proton_decoded(data: bytes) -> Message:
    """decode() as it was: every field through proton's Message."""
    from kittiwake.jms import messages

    fast_reader = messages.wire.read_message

    def refuse(data: bytes) -> wire.Read:
        raise wire.Unsupported("test: proton's way")

    messages.wire.read_message = refuse  # type: ignore[assignment]
    try:
        return decode(data, fallback=Queue("fallback"), allow_pickle=True)
    finally:
        messages.wire.read_message = fast_reader  # type: ignore[assignment]


def _amqp(**fields: Any) -> bytes:
    message = ProtonMessage()
    for name, value in fields.items():
        setattr(message, name, value)
    encoded: bytes = message.encode()
    return encoded


FOREIGN: dict[str, bytes] = {
    # What other AMQP clients send: no JMS annotations, other id types, other sections.
    "plain-text": _amqp(body="hi"),
    "plain-binary": _amqp(body=b"\x00\x01", inferred=True),
    "plain-amqp-value-binary": _amqp(body=b"\x00\x01"),
    "plain-map": _amqp(body={"k": 1}),
    "plain-list": _amqp(body=[1, 2], inferred=True),
    "plain-list-value": _amqp(body=[1, 2]),
    "plain-empty": _amqp(),
    "uuid-ids": _amqp(id=uuid.UUID(int=5), correlation_id=uuid.UUID(int=6), body="x"),
    "ulong-id": _amqp(id=ulong(42), correlation_id=b"binary-correlation", body="x"),
    "redelivered": _amqp(delivery_count=3, durable=True, priority=2, body="x"),
    "delivery-annotations": _amqp(instructions={symbol("x-opt-a"): 1}, body="x"),
    "described-body": _amqp(body=Described(symbol("d"), "v")),
    "array-property": _amqp(properties={"a": Array(UNDESCRIBED, Data.INT, 1, 2)}, body="x"),
    "nested-map-body": _amqp(body={"a": {"b": [1, {"c": None}]}}),
    "nested-list-body": _amqp(body=[[1, [2]], {"m": []}], inferred=True),
    "typed-properties": _amqp(
        properties={"u": ubyte(1), "c": char("x"), "t": timestamp(5), "s": symbol("y")},
        body="x",
    ),
    "footer": _amqp(body="x") + bytes.fromhex("0053 78 d1 00000004 00000000"),
    "times": _amqp(creation_time=1.001, expiry_time=2.003, body="x"),
}


@pytest.mark.parametrize("name", list(FOREIGN))
def test_foreign_messages_decode_as_through_proton(name: str) -> None:
    data = FOREIGN[name]
    try:
        expected: Any = _jms_view(_proton_decoded(data))
    except Exception as exc:
        with pytest.raises(type(exc)):
            decode(data, fallback=Queue("fallback"), allow_pickle=True)
        return
    assert _jms_view(decode(data, fallback=Queue("fallback"), allow_pickle=True)) == expected


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", b"\x00\x53\x77", b"\x00\x53\x77\xa1\x05ab", b"\x00\x53\x77\xa1\x02\xff\xfe"],
    ids=["empty", "cut-descriptor", "no-value", "cut-string", "not-utf8"],
)
def test_malformed_messages_are_refused_as_proton_refuses_them(data: bytes) -> None:
    try:
        expected: Any = _jms_view(_proton_decoded(data))
    except Exception as exc:
        with pytest.raises(type(exc)):
            decode(data, fallback=Queue("fallback"), allow_pickle=True)
        return
    assert _jms_view(decode(data, fallback=Queue("fallback"), allow_pickle=True)) == expected


def test_values_the_encoder_does_not_write_go_through_proton() -> None:
    message = _stamped(MapMessage())
    message._map["described"] = (Described(symbol("d"), 1), "string")
    data = encode(
        message, address="q", destination=Queue("q"), delivery_delay_ms=0, allow_pickle=False
    )
    body, inferred, content_type = message._body_section(False)
    assert data == _encode_proton(message, "q", Queue("q"), 0, body, inferred, content_type)


def _text_message(text: str, priority: int, kind: type[Message] = TextMessage) -> bytes:
    message = kind()
    if isinstance(message, TextMessage):
        message.set_text(text)
    message.jms_message_id = f"ID:{text}"
    message.jms_timestamp = NOW
    message.jms_priority = priority
    message.jms_delivery_mode = DeliveryMode.NON_PERSISTENT
    return encode(
        message, address="q", destination=Queue("q"), delivery_delay_ms=0, allow_pickle=False
    )


def test_a_streams_repeated_header_and_annotations_are_decoded_once_and_read_alike() -> None:
    """Message after message of a stream carries the same header and annotations bytes: the
    second read takes the values the first decoded (the same objects), and every read still
    gives what proton reads, for its own id, body and priority."""
    first, second = _text_message("one", 4), _text_message("two", 4)
    other_priority = _text_message("three", 7)
    other_type = _text_message("four", 4, BytesMessage)
    reads = [wire.read_message(data) for data in (first, second, other_priority, other_type)]
    assert reads[1].annotations is reads[0].annotations  # kept, not decoded again
    assert reads[3].annotations != reads[0].annotations  # another message type: its own
    for data, read in zip((first, second, other_priority, other_type), reads, strict=True):
        slow = _read_proton(data)
        assert _fields(read) == _fields(slow)
        assert _body(read) == _body(slow)
    assert [read.priority for read in reads] == [4, 4, 7, 4]
    texts = [decode(data, fallback=None, allow_pickle=False) for data in (first, second)]
    assert [t.jms_message_id for t in texts] == ["ID:one", "ID:two"]
    assert [t.get_body() for t in texts] == ["one", "two"]
