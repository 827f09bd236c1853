"""The one row encoding of a message, shared by the journal, queue entries, retained messages
and wills, plus the rows of sessions and subscriptions. Pure code: no SQL runs here.

A message is a fixed set of columns (:data:`MESSAGE_COLUMNS`) plus one typed property blob
holding its application properties, MQTT 5 fields and AMQP sections. Times are stored as wall-clock
milliseconds since the epoch so they keep their meaning across a restart; the core's
monotonic clock readings are converted at this boundary and nowhere else. Readers other than
the broker (the Spark journal reader) decode rows with :func:`message_from_row` too.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from kittiwake.broker.message import (
    AMQPFields,
    Message,
    MessageProperties,
    MQTT5Fields,
    PropertyType,
    PropertyValue,
)
from kittiwake.broker.store import SubscriptionRecord

# The columns of a message, in row order, wherever a message is stored. ``timestamp``,
# ``expiry`` and ``delivery_time`` are wall-clock ms since the epoch; ``properties`` is the
# blob of :func:`encode_properties`, NULL when the message has none.
MESSAGE_COLUMNS = (
    "message_id",
    "topic",
    "payload",
    "qos",
    "retain",
    "persistent",
    "priority",
    "timestamp",
    "expiry",
    "delivery_time",
    "origin",
    "properties",
)

# -- the property blob ------------------------------------------------------------------------
#
#   blob  = item*
#   item  = tag:u8 body
#   tag 1..8 (a PropertyType): an application property; body = name:str value, where value
#            is u8 0/1 (BOOLEAN), i8, i16, i32, i64, f32, f64 (big-endian) or str (STRING)
#   tag 32: payload format indicator, u8     tag 33: content type, str
#   tag 34: response topic, str              tag 35: correlation data, bin
#   tag 36: one user property, str str (repeated, in order)
#   tag 48: AMQP sections before the body, bin   tag 49: AMQP body kind, u8
#   tag 50: AMQP footer, bin               tag 51: message group (JMSXGroupID), str
#   str   = bin holding UTF-8;   bin = length:varint bytes   (varint: LEB128, unsigned)
#
# Tags are never renumbered; a new field gets a new tag.

_PAYLOAD_FORMAT = 32
_CONTENT_TYPE = 33
_RESPONSE_TOPIC = 34
_CORRELATION_DATA = 35
_USER_PROPERTY = 36
_AMQP_HEAD = 48
_AMQP_BODY = 49
_AMQP_FOOTER = 50
_GROUP_ID = 51

_NUMBERS: dict[PropertyType, struct.Struct] = {
    PropertyType.BYTE: struct.Struct(">b"),
    PropertyType.SHORT: struct.Struct(">h"),
    PropertyType.INT: struct.Struct(">i"),
    PropertyType.LONG: struct.Struct(">q"),
    PropertyType.FLOAT: struct.Struct(">f"),
    PropertyType.DOUBLE: struct.Struct(">d"),
}


def encode_properties(
    properties: MessageProperties | None,
    mqtt5: MQTT5Fields | None,
    amqp: AMQPFields | None = None,
    group_id: str | None = None,
) -> bytes | None:
    """The property blob of a message; None when it has no properties, MQTT 5 fields, AMQP
    sections or message group."""
    if not properties and mqtt5 is None and amqp is None and group_id is None:
        return None
    out = bytearray()
    if properties:
        for name, value, kind in properties.typed_items():
            out.append(kind)
            _put_text(out, name)
            if kind is PropertyType.STRING:
                _put_text(out, value)  # type: ignore[arg-type]
            elif kind is PropertyType.BOOLEAN:
                out.append(1 if value else 0)
            else:
                out += _NUMBERS[kind].pack(value)
    if mqtt5 is not None:
        if mqtt5.payload_format_indicator is not None:
            out.append(_PAYLOAD_FORMAT)
            out.append(mqtt5.payload_format_indicator)
        if mqtt5.content_type is not None:
            out.append(_CONTENT_TYPE)
            _put_text(out, mqtt5.content_type)
        if mqtt5.response_topic is not None:
            out.append(_RESPONSE_TOPIC)
            _put_text(out, mqtt5.response_topic)
        if mqtt5.correlation_data is not None:
            out.append(_CORRELATION_DATA)
            _put_bytes(out, mqtt5.correlation_data)
        for name, value in mqtt5.user_properties:
            out.append(_USER_PROPERTY)
            _put_text(out, name)
            _put_text(out, value)
    if amqp is not None:
        out.append(_AMQP_HEAD)
        _put_bytes(out, amqp.head)
        out.append(_AMQP_BODY)
        out.append(amqp.body)
        if amqp.footer:
            out.append(_AMQP_FOOTER)
            _put_bytes(out, amqp.footer)
    if group_id is not None:
        out.append(_GROUP_ID)
        _put_text(out, group_id)
    # Empty MQTT 5 fields are no fields: they come back as None.
    return bytes(out) if out else None


def decode_properties(blob: bytes | None) -> tuple[MessageProperties | None, MQTT5Fields | None]:
    """The application properties and MQTT 5 fields of a blob; ValueError if it is damaged."""
    properties, mqtt5, _ = decode_fields(blob)
    return properties, mqtt5


def decode_fields(
    blob: bytes | None,
) -> tuple[MessageProperties | None, MQTT5Fields | None, AMQPFields | None]:
    """Everything a blob holds: properties, MQTT 5 fields, AMQP sections (ValueError if it is
    damaged)."""
    properties, mqtt5, amqp, _ = decode_blob(blob)
    return properties, mqtt5, amqp


def decode_blob(
    blob: bytes | None,
) -> tuple[MessageProperties | None, MQTT5Fields | None, AMQPFields | None, str | None]:
    """Everything a blob holds, its message group too (ValueError if it is damaged)."""
    if not blob:
        return None, None, None, None
    try:
        return _decode_fields(blob)
    except (IndexError, struct.error, KeyError) as exc:
        raise ValueError(f"damaged property blob ({type(exc).__name__}: {exc})") from None


def _decode_fields(
    blob: bytes,
) -> tuple[MessageProperties | None, MQTT5Fields | None, AMQPFields | None, str | None]:
    properties: MessageProperties | None = None
    mqtt5: MQTT5Fields | None = None
    amqp: AMQPFields | None = None
    group_id: str | None = None
    view = memoryview(blob)
    at = 0
    end = len(blob)
    while at < end:
        tag = blob[at]
        at += 1
        if 1 <= tag <= 8:
            kind = PropertyType(tag)
            name, at = _get_text(view, at)
            value: PropertyValue
            if kind is PropertyType.STRING:
                value, at = _get_text(view, at)
            elif kind is PropertyType.BOOLEAN:
                value = blob[at] != 0
                at += 1
            else:
                number = _NUMBERS[kind]
                value = number.unpack_from(blob, at)[0]
                at += number.size
            if properties is None:
                properties = MessageProperties()
            properties.set(name, value, kind)
            continue
        if tag == _GROUP_ID:
            group_id, at = _get_text(view, at)
            continue
        if tag >= _AMQP_HEAD:
            if amqp is None:
                amqp = AMQPFields()
            if tag == _AMQP_HEAD:
                head, at = _get_bytes(view, at)
                amqp.head = bytes(head)
            elif tag == _AMQP_BODY:
                amqp.body = blob[at]
                at += 1
            elif tag == _AMQP_FOOTER:
                footer, at = _get_bytes(view, at)
                amqp.footer = bytes(footer)
            else:
                raise ValueError(f"unknown property tag {tag} at byte {at - 1}")
            continue
        if mqtt5 is None:
            mqtt5 = MQTT5Fields()
        if tag == _PAYLOAD_FORMAT:
            mqtt5.payload_format_indicator = blob[at]
            at += 1
        elif tag == _CONTENT_TYPE:
            mqtt5.content_type, at = _get_text(view, at)
        elif tag == _RESPONSE_TOPIC:
            mqtt5.response_topic, at = _get_text(view, at)
        elif tag == _CORRELATION_DATA:
            mqtt5.correlation_data, at = _get_bytes(view, at)
        elif tag == _USER_PROPERTY:
            name, at = _get_text(view, at)
            value_text, at = _get_text(view, at)
            mqtt5.user_properties.append((name, value_text))
        else:
            raise ValueError(f"unknown property tag {tag} at byte {at - 1}")
    return properties, mqtt5, amqp, group_id


def _put_bytes(out: bytearray, data: bytes) -> None:
    length = len(data)
    while length >= 0x80:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    out.append(length)
    out += data


def _put_text(out: bytearray, text: str) -> None:
    _put_bytes(out, text.encode())


def _get_bytes(view: memoryview, at: int) -> tuple[bytes, int]:
    length = 0
    shift = 0
    while True:
        byte = view[at]
        at += 1
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift > 35:
            raise ValueError("a length in the property blob is too long")
    end = at + length
    if end > len(view):
        raise ValueError("the property blob ends inside a value")
    return bytes(view[at:end]), end


def _get_text(view: memoryview, at: int) -> tuple[str, int]:
    data, at = _get_bytes(view, at)
    return data.decode(), at


# -- messages ---------------------------------------------------------------------------------


def message_row(message: Message, clock_to_wall_ms: float) -> tuple[Any, ...]:
    """A message as a row in :data:`MESSAGE_COLUMNS` order.

    ``clock_to_wall_ms`` is ``clock.wall_ms() - clock.now() * 1000``, read once by the store.
    """
    return (message.message_id, *message_columns(message, clock_to_wall_ms))


def message_columns(message: Message, clock_to_wall_ms: float) -> tuple[Any, ...]:
    """The columns of a message after its id (:data:`MESSAGE_COLUMNS` ``[1:]``): the form a
    queue entry carries inline, built once per durable message on the event loop.

    A published message without a timestamp gets its ``created`` time on the wall clock, kept
    on the message so every row of it agrees; one not yet published (a will) keeps 0.
    """
    timestamp = message.timestamp
    if not timestamp and message.created:
        timestamp = message.timestamp = round(message.created * 1000 + clock_to_wall_ms)
    expiry = message.expiry
    delivery_time = message.delivery_time
    return (
        message.topic,
        message.payload,
        message.qos,
        # Exact ints, not bools: sqlite3 binds a bool through its adapter lookup, several
        # times slower on the writer thread.
        1 if message.retain else 0,
        1 if message.persistent else 0,
        message.priority,
        timestamp,
        None if expiry is None else round(expiry * 1000 + clock_to_wall_ms),
        None if delivery_time is None else round(delivery_time * 1000 + clock_to_wall_ms),
        message.origin,
        None
        if message.properties is None
        and message.mqtt5 is None
        and message.amqp is None
        and message.group_id is None
        else encode_properties(message.properties, message.mqtt5, message.amqp, message.group_id),
    )


def message_from_row(row: Sequence[Any], clock_to_wall_ms: float = 0.0) -> Message:
    """A message from a row in :data:`MESSAGE_COLUMNS` order.

    With the store's ``clock_to_wall_ms`` the message's times are the broker's clock times;
    with the default 0 they are wall-clock seconds since the epoch (what a reader outside the
    broker, such as the Spark journal reader, wants).
    """
    properties, mqtt5, amqp, group_id = decode_blob(row[11])
    timestamp = row[7]
    expiry = row[8]
    delivery_time = row[9]
    return Message(
        topic=row[1],
        payload=bytes(row[2]),
        qos=row[3],
        retain=bool(row[4]),
        persistent=bool(row[5]),
        priority=row[6],
        expiry=None if expiry is None else (expiry - clock_to_wall_ms) / 1000,
        delivery_time=None if delivery_time is None else (delivery_time - clock_to_wall_ms) / 1000,
        created=(timestamp - clock_to_wall_ms) / 1000 if timestamp else 0.0,
        timestamp=timestamp,
        origin=row[10],
        properties=properties,
        mqtt5=mqtt5,
        message_id=row[0],
        amqp=amqp,
        group_id=group_id,
    )


# -- sessions ---------------------------------------------------------------------------------

# The columns of a subscription row after its client id.
SUBSCRIPTION_COLUMNS = (
    "topic_filter",
    "max_qos",
    "no_local",
    "retain_as_published",
    "retain_handling",
    "subscription_id",
)


def subscription_row(client_id: str, subscription: SubscriptionRecord) -> tuple[Any, ...]:
    return (
        client_id,
        subscription.topic_filter,
        subscription.max_qos,
        int(subscription.no_local),
        int(subscription.retain_as_published),
        subscription.retain_handling,
        subscription.subscription_id,
    )


def subscription_from_row(row: Sequence[Any]) -> SubscriptionRecord:
    """A subscription from a row in :data:`SUBSCRIPTION_COLUMNS` order."""
    return SubscriptionRecord(row[0], row[1], bool(row[2]), bool(row[3]), row[4], row[5])


def subscription_ids_text(ids: tuple[int, ...]) -> str:
    """The subscription identifiers of a queue entry, as stored: "3,7" ("" for none)."""
    return ",".join(map(str, ids)) if ids else ""


def subscription_ids_from_text(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text else ()
