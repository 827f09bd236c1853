"""A put's record batches as the broker's messages: read within the put's bounds, checked
(schema, topic names, QoS, publish rights) and converted column by column, on the gRPC thread
that received them. Must never touch the event loop or the broker's state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kittiwake.broker.message import Message, MQTT5Fields
from kittiwake.broker.topics import TopicError, validate_topic_name
from kittiwake.flight.protocol import DEFAULT_WRITE_QOS, RequestError, check_write_schema


class WriteTooLarge(RequestError):
    """A put holds more rows or bytes than the broker takes in one unit."""


class WriteRefused(RequestError):
    """A put names a topic its caller may not publish to (``topic``, for the log)."""

    def __init__(self, message: str, topic: str) -> None:
        super().__init__(message)
        self.topic = topic


def read_messages(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    may_publish: Callable[[str], bool],
    max_rows: int,
    max_bytes: int,
    max_topic_levels: int | None = None,
) -> list[Message]:
    """Every row of a put as a message, converted batch by batch as the batches arrive (so
    the conversion overlaps the sender's work); refused as soon as the put passes
    ``max_rows`` or ``max_bytes`` (a Spark partition is one unit, taken whole or not at all:
    it must fit)."""
    check_write_schema(schema)
    messages: list[Message] = []
    allowed: set[str] = set()
    rows = size = 0
    for batch in batches:
        rows += batch.num_rows
        size += batch.nbytes
        if rows > max_rows or size > max_bytes:
            raise WriteTooLarge(
                f"a write unit (one Spark partition of one batch) holds at most {max_rows} rows "
                f"and {max_bytes} bytes (limits.max_put_rows / limits.max_put_bytes); this one "
                f"has more ({rows} rows, {size} bytes so far): spread the rows over more "
                "partitions (df.repartition(n), or maxOffsetsPerTrigger on a kittiwake source) "
                "or raise the limits"
            )
        if batch.num_rows:
            messages.extend(messages_of(batch, may_publish, max_topic_levels, allowed))
    return messages


def messages_of(
    batch: pa.RecordBatch,
    may_publish: Callable[[str], bool],
    max_topic_levels: int | None = None,
    allowed: set[str] | None = None,
) -> list[Message]:
    """The rows as messages, in order: qos 1 and not retained unless a row says otherwise; QoS
    1 and 2 are persistent (as MQTT's are). Each topic is checked once per batch, or once per
    put with ``allowed`` (the topics already checked)."""
    names = batch.schema.names
    topic_column = batch.column("topic")
    if topic_column.null_count:
        raise RequestError("a write's topic must not be null")
    for topic in pc.unique(topic_column).to_pylist():
        if allowed is not None and topic in allowed:
            continue
        try:
            validate_topic_name(topic, max_topic_levels)
        except TopicError as exc:
            raise RequestError(f"cannot publish to {topic!r}: {exc}") from None
        if not may_publish(topic):
            raise WriteRefused(
                f"publishing to {topic!r} is not authorised (auth rules, ACLs)", topic
            )
        if allowed is not None:
            allowed.add(topic)
    topics = topic_column.to_pylist()
    count = len(topics)
    payload_column = batch.column("payload")
    if pa.types.is_string(payload_column.type) or pa.types.is_large_string(payload_column.type):
        payload_column = payload_column.cast(pa.binary())
    payloads = payload_column.fill_null(b"").to_pylist()
    if "qos" in names:
        qos_column = batch.column("qos").fill_null(DEFAULT_WRITE_QOS)
        low_high = pc.min_max(qos_column).as_py()
        if low_high["min"] is not None and (low_high["min"] < 0 or low_high["max"] > 2):
            raise RequestError(
                f"a row's qos must be 0, 1 or 2; this write has {low_high['min']}..."
                f"{low_high['max']}"
            )
        qos: list[int] = qos_column.to_pylist()
    else:
        qos = [DEFAULT_WRITE_QOS] * count
    if "retain" in names:
        retain: list[bool] = batch.column("retain").fill_null(False).to_pylist()
    else:
        retain = [False] * count
    properties_column = batch.column("properties") if "properties" in names else None
    if properties_column is None or properties_column.null_count == count:
        # The common case: positional arguments (topic, payload, qos, retain, persistent).
        return [
            Message(topic, payload, level, kept, level > 0)
            for topic, payload, level, kept in zip(topics, payloads, qos, retain, strict=True)
        ]
    properties: list[Any] = properties_column.to_pylist()
    return [
        Message(
            topic,
            payload,
            level,
            kept,
            level > 0,
            mqtt5=MQTT5Fields(user_properties=list(pairs)) if pairs else None,
        )
        for topic, payload, level, kept, pairs in zip(
            topics, payloads, qos, retain, properties, strict=True
        )
    ]
