"""Journal chunks as Arrow record batches of the data source's schema.

Column by column, never row by row: a chunk's columns become Arrow arrays in C; only rows
with optional parts (properties, MQTT 5 fields) are looked at one by one.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kittiwake.broker.message import Message
from kittiwake.flight.protocol import (
    HEADERS_TYPE,
    PROPERTIES_TYPE,
    SCHEMA,
    SCHEMA_WITH_HEADERS,
    TIMESTAMP_TYPE,
)
from kittiwake.store.journal_range import JournalChunk


def record_batch(chunk: JournalChunk, include_headers: bool) -> pa.RecordBatch:
    raw = chunk.columns
    count = raw.num_rows
    micros = pc.multiply(raw.column("timestamp"), 1000)
    columns: list[Any] = [
        raw.column("topic"),
        raw.column("payload"),
        raw.column("message_id"),
        micros.cast(TIMESTAMP_TYPE),
        raw.column("qos").cast(pa.int32()),
        raw.column("retain").cast(pa.bool_()),
        raw.column("priority").cast(pa.int32()),
    ]
    extras = chunk.extras
    if extras is not None:
        columns.append(
            pa.array([() if m is None else _properties(m) for m in extras], PROPERTIES_TYPE)
        )
    else:
        columns.append(_empty_lists(count, PROPERTIES_TYPE))
    if not include_headers:
        return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)
    if extras is not None:
        columns.append(
            pa.array([[] if m is None else _headers(m) for m in extras], HEADERS_TYPE)
        )
    else:
        columns.append(_empty_lists(count, HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA_WITH_HEADERS)


def _empty_lists(count: int, list_type: pa.DataType) -> pa.Array:
    """``count`` empty lists (or maps), built in C: every offset is 0."""
    offsets = pa.nulls(count + 1, pa.int32()).fill_null(0)
    empty = pa.array([], list_type)
    if isinstance(list_type, pa.MapType):
        return pa.MapArray.from_arrays(offsets, empty.keys, empty.items, type=list_type)
    return pa.ListArray.from_arrays(offsets, empty.flatten(), type=list_type)


def _properties(message: Message) -> list[tuple[str, str]]:
    """Application properties as strings: typed (JMS) properties, then MQTT 5 user
    properties (a repeated name keeps its last value, as a map must)."""
    pairs = [(name, _text(value)) for name, value in (message.properties or {}).items()]
    if message.mqtt5 is not None:
        pairs.extend(message.mqtt5.user_properties)
    return list(dict(pairs).items())


def _headers(message: Message) -> list[dict[str, Any]]:
    """MQTT 5 user properties in order with repeats (Kafka's headers), then the MQTT 5
    fields that are set."""
    mqtt5 = message.mqtt5
    if mqtt5 is None:
        return []
    headers: list[dict[str, Any]] = [
        {"key": name, "value": value.encode()} for name, value in mqtt5.user_properties
    ]
    if mqtt5.content_type is not None:
        headers.append({"key": "content_type", "value": mqtt5.content_type.encode()})
    if mqtt5.response_topic is not None:
        headers.append({"key": "response_topic", "value": mqtt5.response_topic.encode()})
    if mqtt5.correlation_data is not None:
        headers.append({"key": "correlation_data", "value": mqtt5.correlation_data})
    if mqtt5.payload_format_indicator is not None:
        headers.append(
            {"key": "payload_format", "value": str(mqtt5.payload_format_indicator).encode()}
        )
    return headers


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
