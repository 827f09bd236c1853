"""The message model: typed properties keep their type, MQTT 5 fields stay apart, timestamps.

A JMS sender declares a property's type (a short 7 is not a long 7); a Python value alone
cannot say which, so the model keeps it. Messages without properties allocate nothing for them.
"""

from __future__ import annotations

import math

import pytest

from kittiwake.broker.message import (
    Message,
    MessageProperties,
    MQTT5Fields,
    PropertyType,
    natural_type,
    wall_timestamp,
)


def test_a_plain_message_carries_no_property_objects() -> None:
    """The MQTT hot path builds messages without properties: nothing is allocated for them."""
    message = Message("t", b"p", qos=1)
    assert message.properties is None
    assert message.mqtt5 is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, PropertyType.BOOLEAN),
        (7, PropertyType.INT),
        (-(2**31), PropertyType.INT),
        (2**31, PropertyType.LONG),
        (1.5, PropertyType.DOUBLE),
        ("s", PropertyType.STRING),
    ],
)
def test_a_value_without_a_declared_type_gets_its_natural_one(
    value: object, expected: object
) -> None:
    assert natural_type(value) is expected  # type: ignore[arg-type]
    properties = MessageProperties.of({"p": value})  # type: ignore[dict-item]
    assert properties.type_of("p") is expected


def test_equal_values_of_different_declared_types_stay_distinct() -> None:
    """A short 7 and a long 7 read the same value and keep their own type."""
    properties = MessageProperties(
        [
            ("b", 7, PropertyType.BYTE),
            ("s", 7, PropertyType.SHORT),
            ("i", 7, PropertyType.INT),
            ("l", 7, PropertyType.LONG),
            ("f", 0.5, PropertyType.FLOAT),
            ("d", 0.5, PropertyType.DOUBLE),
        ]
    )
    assert dict(properties) == {"b": 7, "s": 7, "i": 7, "l": 7, "f": 0.5, "d": 0.5}
    assert [t for _n, _v, t in properties.typed_items()] == [
        PropertyType.BYTE,
        PropertyType.SHORT,
        PropertyType.INT,
        PropertyType.LONG,
        PropertyType.FLOAT,
        PropertyType.DOUBLE,
    ]
    as_long = MessageProperties([("x", 7, PropertyType.LONG)])
    as_short = MessageProperties([("x", 7, PropertyType.SHORT)])
    assert as_long != as_short
    assert as_long == MessageProperties([("x", 7, PropertyType.LONG)])


@pytest.mark.parametrize(
    ("kind", "low", "high"),
    [
        (PropertyType.BYTE, -128, 127),
        (PropertyType.SHORT, -32768, 32767),
        (PropertyType.INT, -(2**31), 2**31 - 1),
        (PropertyType.LONG, -(2**63), 2**63 - 1),
    ],
)
def test_integer_types_hold_exactly_their_range(kind: PropertyType, low: int, high: int) -> None:
    properties = MessageProperties()
    properties.set("low", low, kind)
    properties.set("high", high, kind)
    assert (properties["low"], properties["high"]) == (low, high)
    for outside in (low - 1, high + 1):
        with pytest.raises(ValueError, match=kind.name):
            properties.set("x", outside, kind)
    assert "x" not in properties


def test_a_float_property_holds_what_a_32_bit_float_holds() -> None:
    properties = MessageProperties(
        [("f", 0.1, PropertyType.FLOAT), ("d", 0.1, PropertyType.DOUBLE)]
    )
    assert properties["d"] == 0.1
    assert properties["f"] != 0.1 and math.isclose(properties["f"], 0.1, rel_tol=1e-7)
    with pytest.raises(ValueError, match="FLOAT"):
        properties.set("big", 1e300, PropertyType.FLOAT)


def test_values_of_the_wrong_kind_are_refused() -> None:
    properties = MessageProperties()
    with pytest.raises(TypeError):
        properties.set("x", True, PropertyType.INT)  # a bool is not a number here
    with pytest.raises(TypeError):
        properties.set("x", "7", PropertyType.LONG)
    with pytest.raises(TypeError):
        properties.set("x", 1, PropertyType.BOOLEAN)
    with pytest.raises(TypeError):
        properties.set("x", b"bytes")  # type: ignore[arg-type]
    properties.set("x", 3, PropertyType.DOUBLE)  # an int is a valid double
    assert properties["x"] == 3.0 and isinstance(properties["x"], float)


def test_setting_again_replaces_value_and_type_and_remove_forgets_both() -> None:
    properties = MessageProperties([("x", 7, PropertyType.SHORT)])
    properties.set("x", 7)
    assert properties.type_of("x") is PropertyType.INT
    properties.set("x", "seven")
    assert properties.type_of("x") is PropertyType.STRING
    properties.remove("x")
    assert len(properties) == 0
    with pytest.raises(KeyError):
        properties.type_of("x")


def test_mqtt5_user_properties_keep_order_and_repetitions() -> None:
    fields = MQTT5Fields(user_properties=[("k", "2"), ("a", "1"), ("k", "1")])
    assert fields.user_properties == [("k", "2"), ("a", "1"), ("k", "1")]


def test_the_timestamp_is_the_wall_clock_reading_of_the_publication(harness) -> None:
    """Taken from ``created`` on demand (the store, a JMS consumer): MQTT never pays for it."""
    clock = harness.clock
    offset = clock.wall_ms() - clock.now() * 1000
    clock.advance(2.5)
    published_at = clock.wall_ms()
    message = harness.publish("t", b"x")
    assert message.created == clock.now()
    clock.advance(10)
    assert wall_timestamp(message, offset) == published_at
    assert message.timestamp == published_at  # kept: every copy carries one timestamp
    assert wall_timestamp(message, offset + 5_000) == published_at


def test_a_timestamp_the_front_end_brought_is_kept(harness) -> None:
    """A JMS sender's JMSTimestamp is the sender's; the broker does not overwrite it."""
    message = harness.publish("t", b"x", timestamp=1_234)
    assert message.created == harness.clock.now()
    assert wall_timestamp(message, 0.0) == 1_234
