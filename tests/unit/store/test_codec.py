"""The one row encoding of a message: every field comes back as it went in, with its type.

Pure code (no database): rows are the tuples the store writes, blobs the bytes it stores.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kittiwake.broker.message import (
    AMQPFields,
    Message,
    MessageProperties,
    MQTT5Fields,
    PropertyType,
)
from kittiwake.store.codec import (
    MESSAGE_COLUMNS,
    decode_fields,
    decode_properties,
    encode_properties,
    message_from_row,
    message_row,
)

# The wall clock reads 1.7e12 ms when the monotonic clock reads 1000 s.
TO_WALL_MS = 1_700_000_000_000 - 1_000_000.0

_values = {
    PropertyType.BOOLEAN: st.booleans(),
    PropertyType.BYTE: st.integers(-(2**7), 2**7 - 1),
    PropertyType.SHORT: st.integers(-(2**15), 2**15 - 1),
    PropertyType.INT: st.integers(-(2**31), 2**31 - 1),
    PropertyType.LONG: st.integers(-(2**63), 2**63 - 1),
    PropertyType.FLOAT: st.floats(width=32, allow_nan=False),
    PropertyType.DOUBLE: st.floats(allow_nan=False),
    PropertyType.STRING: st.text(),
}
typed_properties = st.lists(
    st.sampled_from(list(PropertyType)).flatmap(
        lambda kind: st.tuples(st.text(max_size=20), _values[kind], st.just(kind))
    ),
    max_size=8,
).map(MessageProperties)
mqtt5_fields = st.builds(
    MQTT5Fields,
    payload_format_indicator=st.none() | st.sampled_from([0, 1]),
    content_type=st.none() | st.text(),
    response_topic=st.none() | st.text(min_size=1),
    correlation_data=st.none() | st.binary(),
    user_properties=st.lists(st.tuples(st.text(), st.text())),
)


@given(typed_properties, st.none() | mqtt5_fields)
def test_properties_and_mqtt5_fields_survive_the_blob(
    properties: MessageProperties, mqtt5: MQTT5Fields | None
) -> None:
    blob = encode_properties(properties, mqtt5)
    got_properties, got_mqtt5 = decode_properties(blob)
    assert (got_properties or MessageProperties()) == properties
    empty = MQTT5Fields()
    assert (got_mqtt5 or empty) == (mqtt5 or empty)


def test_a_message_with_nothing_optional_has_no_blob() -> None:
    assert encode_properties(None, None) is None
    assert encode_properties(MessageProperties(), MQTT5Fields()) is None
    assert decode_properties(None) == (None, None)
    assert message_row(Message("t", b"p"), TO_WALL_MS)[MESSAGE_COLUMNS.index("properties")] is None


def test_the_blob_keeps_the_declared_type_not_only_the_value() -> None:
    properties = MessageProperties(
        [("s", 7, PropertyType.SHORT), ("l", 7, PropertyType.LONG), ("f", 0.5, PropertyType.FLOAT)]
    )
    got, _ = decode_properties(encode_properties(properties, None))
    assert got is not None
    assert [(n, v, t) for n, v, t in got.typed_items()] == [
        ("s", 7, PropertyType.SHORT),
        ("l", 7, PropertyType.LONG),
        ("f", 0.5, PropertyType.FLOAT),
    ]


def test_user_properties_keep_order_and_repetitions_beside_typed_properties() -> None:
    """MQTT user properties stay apart from the typed ones, even under the same name."""
    properties = MessageProperties.of({"k": 1})
    mqtt5 = MQTT5Fields(user_properties=[("k", "b"), ("a", "x"), ("k", "a")])
    got_properties, got_mqtt5 = decode_properties(encode_properties(properties, mqtt5))
    assert got_properties == properties
    assert got_mqtt5 == mqtt5


@pytest.mark.parametrize(
    "damaged",
    [
        b"\xff",  # an unknown tag
        b"\x04\x01a",  # an INT property whose value is missing
        b"\x21\x05abc",  # a content type longer than the blob
        b"\x08\x01a\x01\xff",  # a STRING that is not UTF-8
        b"\x21" + b"\x80" * 8,  # a length that never ends
    ],
)
def test_a_damaged_blob_is_a_value_error(damaged: bytes) -> None:
    with pytest.raises(ValueError):
        decode_properties(damaged)


def test_a_message_row_round_trips_every_field() -> None:
    message = Message(
        "a/b",
        b"\x00payload",
        qos=2,
        retain=True,
        persistent=True,
        priority=9,
        expiry=1_000.0 + 60,
        delivery_time=1_000.0 + 5,
        created=1_000.0,
        origin="pub",
        properties=MessageProperties([("n", 3, PropertyType.BYTE)]),
        mqtt5=MQTT5Fields(content_type="text/plain", correlation_data=b"\x01"),
        message_id=42,
    )
    row = message_row(message, TO_WALL_MS)
    assert len(row) == len(MESSAGE_COLUMNS)
    named = dict(zip(MESSAGE_COLUMNS, row, strict=True))
    # Times on disk are wall-clock milliseconds since the epoch.
    assert named["timestamp"] == 1_700_000_000_000
    assert named["expiry"] == 1_700_000_060_000
    assert named["delivery_time"] == 1_700_000_005_000
    got = message_from_row(row, TO_WALL_MS)
    assert (got.topic, got.payload, got.qos, got.retain, got.persistent, got.priority) == (
        "a/b", b"\x00payload", 2, True, True, 9,
    )
    assert (got.expiry, got.delivery_time, got.created) == (1_060.0, 1_005.0, 1_000.0)
    assert (got.timestamp, got.origin, got.message_id) == (1_700_000_000_000, "pub", 42)
    assert got.properties == message.properties
    assert got.mqtt5 == message.mqtt5


def test_without_an_offset_a_row_decodes_to_wall_seconds() -> None:
    """What a reader outside the broker (the Spark journal reader) gets."""
    message = Message("t", b"p", created=1_000.0, expiry=1_010.0, persistent=True, message_id=1)
    got = message_from_row(message_row(message, TO_WALL_MS))
    assert got.created == 1_700_000_000.0
    assert got.expiry == 1_700_000_010.0


def test_a_message_not_yet_published_keeps_no_timestamp() -> None:
    """A stored will has no time until it is published; it gets one then."""
    will = Message("w", b"bye", qos=1, persistent=True)
    row = message_row(will, TO_WALL_MS)
    assert row[MESSAGE_COLUMNS.index("timestamp")] == 0
    got = message_from_row(row, TO_WALL_MS)
    assert (got.timestamp, got.created) == (0, 0.0)


def test_a_timestamp_the_sender_brought_is_stored_as_is() -> None:
    message = Message("t", b"p", created=1_000.0, timestamp=1_234, persistent=True)
    assert message_row(message, TO_WALL_MS)[MESSAGE_COLUMNS.index("timestamp")] == 1_234


def test_float_properties_are_stored_in_32_bits() -> None:
    properties = MessageProperties([("f", 1.1, PropertyType.FLOAT)])
    blob = encode_properties(properties, None)
    assert blob is not None
    # tag, name, then four bytes of IEEE 754 single precision.
    assert blob == bytes([PropertyType.FLOAT, 1]) + b"f" + struct.pack(">f", 1.1)


def test_amqp_fields_round_trip_beside_properties_and_mqtt5() -> None:
    amqp = AMQPFields(head=b"\x00Sr\xc1\x01\x00", body=2, footer=b"\x00Sx\xc1\x01\x00")
    properties = MessageProperties.of({"a": 1})
    blob = encode_properties(properties, None, amqp)
    assert decode_fields(blob) == (properties, None, amqp)
    assert decode_properties(blob) == (properties, None)
    no_footer = AMQPFields(head=b"", body=0)
    assert decode_fields(encode_properties(None, None, no_footer)) == (None, None, no_footer)


def test_a_message_row_keeps_its_amqp_fields() -> None:
    amqp = AMQPFields(head=b"head", body=4)
    message = Message("q", b"\x00Sw\xa1\x01x", qos=2, persistent=True, amqp=amqp)
    got = message_from_row(message_row(message, TO_WALL_MS), TO_WALL_MS)
    assert got.amqp == amqp


def test_a_message_row_keeps_its_message_group() -> None:
    """The group id rides in the blob (its own tag), alone or beside the AMQP sections."""
    alone = Message("q", b"x", group_id="orders-7")
    assert message_from_row(message_row(alone, TO_WALL_MS), TO_WALL_MS).group_id == "orders-7"
    amqp = AMQPFields(head=b"\x00S\x73", body=1)
    both = Message("q", b"x", amqp=amqp, group_id="G")
    got = message_from_row(message_row(both, TO_WALL_MS), TO_WALL_MS)
    assert (got.group_id, got.amqp) == ("G", amqp)
    assert message_from_row(message_row(Message("q", b"x"), TO_WALL_MS)).group_id is None
