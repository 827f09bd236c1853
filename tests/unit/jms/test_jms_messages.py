"""kittiwake.jms messages as pure objects: the JMS property conversion table and its errors,
the body types' encodings and read/write modes, and the AMQP JMS mapping both ways."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message as ProtonMessage
from proton import symbol

from kittiwake.jms import (
    BytesMessage,
    MapMessage,
    Message,
    MessageEOFException,
    MessageFormatException,
    MessageNotReadableException,
    MessageNotWriteableException,
    ObjectMessage,
    Queue,
    StreamMessage,
    TemporaryQueue,
    TextMessage,
    Topic,
)
from kittiwake.jms.messages import decode, encode

QUEUE = Queue("q")


def round_trip(message: Message, *, allow_pickle: bool = False, to: Any = QUEUE) -> Message:
    data = encode(
        message, address=to.name, destination=to, delivery_delay_ms=0, allow_pickle=allow_pickle
    )
    return decode(data, fallback=None, allow_pickle=allow_pickle)


@pytest.mark.parametrize(
    ("setter", "value", "getter", "expected"),
    [
        ("set_boolean_property", True, "get_string_property", "true"),
        ("set_byte_property", 7, "get_short_property", 7),
        ("set_byte_property", 7, "get_long_property", 7),
        ("set_short_property", 300, "get_int_property", 300),
        ("set_int_property", 70000, "get_long_property", 70000),
        ("set_float_property", 1.5, "get_double_property", 1.5),
        ("set_string_property", "42", "get_int_property", 42),
        ("set_string_property", "true", "get_boolean_property", True),
        ("set_string_property", "2.5", "get_double_property", 2.5),
        ("set_long_property", 2**40, "get_string_property", str(2**40)),
    ],
)
def test_property_conversions_allowed(setter: str, value: Any, getter: str, expected: Any) -> None:
    message = Message()
    getattr(message, setter)("p", value)
    assert getattr(message, getter)("p") == expected
    assert getattr(round_trip(message), getter)("p") == expected  # types survive the wire


@pytest.mark.parametrize(
    ("setter", "value", "getter"),
    [
        ("set_int_property", 1, "get_short_property"),
        ("set_long_property", 1, "get_int_property"),
        ("set_double_property", 1.0, "get_float_property"),
        ("set_boolean_property", True, "get_int_property"),
        ("set_int_property", 1, "get_boolean_property"),
        ("set_string_property", "x", "get_int_property"),
        ("set_string_property", "300", "get_byte_property"),
    ],
)
def test_property_conversions_refused(setter: str, value: Any, getter: str) -> None:
    message = Message()
    getattr(message, setter)("p", value)
    with pytest.raises(MessageFormatException):
        getattr(message, getter)("p")


def test_missing_properties() -> None:
    message = Message()
    assert message.get_string_property("none") is None
    assert message.get_boolean_property("none") is False
    with pytest.raises(MessageFormatException):
        message.get_int_property("none")
    assert not message.property_exists("none")


def test_out_of_range_and_invalid_names() -> None:
    message = Message()
    with pytest.raises(MessageFormatException):
        message.set_byte_property("b", 200)
    with pytest.raises(ValueError):
        message.set_int_property("1abc", 1)


def test_received_message_is_read_only_until_cleared() -> None:
    received = round_trip(TextMessage("t"))
    assert isinstance(received, TextMessage)
    with pytest.raises(MessageNotWriteableException):
        received.set_string_property("a", "b")
    with pytest.raises(MessageNotWriteableException):
        received.set_text("u")
    received.clear_properties()
    received.set_string_property("a", "b")
    received.clear_body()
    received.set_text("u")
    assert received.get_text() == "u"


def test_bytes_message_modes_and_encoding() -> None:
    message = BytesMessage()
    message.write_short(-2)
    message.write_double(0.25)
    message.write_utf("é")
    with pytest.raises(MessageNotReadableException):
        message.read_short()
    message.reset()
    assert message.read_short() == -2 and message.read_double() == 0.25
    assert message.read_utf() == "é"
    with pytest.raises(MessageEOFException):
        message.read_int()
    received = round_trip(message)
    assert isinstance(received, BytesMessage) and received.get_body_length() == 2 + 8 + 2 + 2


def test_stream_message_conversion_and_eof() -> None:
    message = StreamMessage()
    message.write_int(5)
    message.write_bytes(b"\x00")
    received = round_trip(message)
    assert isinstance(received, StreamMessage)
    with pytest.raises(MessageFormatException):
        received.read_short()  # an int does not narrow; the position stays
    assert received.read_string() == "5"
    assert received.read_bytes() == b"\x00"
    with pytest.raises(MessageEOFException):
        received.read_object()


def test_map_message_typed_entries() -> None:
    message = MapMessage()
    message.set_short("s", 3)
    message.set_bytes("raw", b"ab")
    message.set_boolean("ok", True)
    received = round_trip(message)
    assert isinstance(received, MapMessage)
    assert received.get_int("s") == 3 and received.get_bytes("raw") == b"ab"
    assert received.get_string("ok") == "true"
    with pytest.raises(MessageFormatException):
        received.get_byte("s")
    assert sorted(received.get_map_names()) == ["ok", "raw", "s"]


def test_object_message_pickle_only_with_opt_in() -> None:
    with pytest.raises(MessageFormatException):
        round_trip(ObjectMessage({"a": 1}))
    data = encode(
        ObjectMessage({"a": 1}),
        address="q",
        destination=Queue("q"),
        delivery_delay_ms=0,
        allow_pickle=True,
    )
    careful = decode(data, fallback=None, allow_pickle=False)
    assert isinstance(careful, ObjectMessage)
    with pytest.raises(MessageFormatException):
        careful.get_object()
    trusting = decode(data, fallback=None, allow_pickle=True)
    assert isinstance(trusting, ObjectMessage) and trusting.get_object() == {"a": 1}


def test_amqp_jms_mapping_annotations() -> None:
    message = TextMessage("x")
    message.set_jms_reply_to(TemporaryQueue("$temp/queue/9"))
    data = encode(
        message, address="t/1", destination=Topic("t/1"), delivery_delay_ms=0, allow_pickle=False
    )
    wire = ProtonMessage()
    wire.decode(data)
    assert wire.annotations[symbol("x-opt-jms-msg-type")] == 5
    assert wire.annotations[symbol("x-opt-jms-dest")] == 1
    assert wire.annotations[symbol("x-opt-jms-reply-to")] == 2
    assert wire.address == "t/1" and wire.reply_to == "$temp/queue/9"
    received = decode(data, fallback=None, allow_pickle=False)
    assert received.get_jms_destination() == Topic("t/1")
    assert received.get_jms_reply_to() == Queue("$temp/queue/9")


def test_message_from_a_plain_amqp_client_gets_its_type_from_the_body() -> None:
    for body, kind in (("s", TextMessage), ({"k": 1}, MapMessage), ([1], StreamMessage)):
        wire = ProtonMessage(body=body, inferred=isinstance(body, list))
        received = decode(wire.encode(), fallback=Queue("q"), allow_pickle=False)
        assert isinstance(received, kind)
        assert received.get_jms_destination() == Queue("q")
    wire = ProtonMessage(body=b"raw", inferred=True, delivery_count=2)
    received = decode(wire.encode(), fallback=None, allow_pickle=False)
    assert isinstance(received, BytesMessage)
    assert received.get_jms_redelivered() and received.get_int_property("JMSXDeliveryCount") == 3
