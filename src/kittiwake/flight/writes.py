"""A put's record batches as the broker's publication rows: read within the put's bounds,
checked (schema, topic names, QoS, publish rights) and converted column by column, on the gRPC
thread that received them; no row becomes a message object here. Must never touch the event
loop or the broker's state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kittiwake.broker.publication_rows import PublicationRows
from kittiwake.broker.topics import TopicError, validate_topic_name
from kittiwake.flight.protocol import DEFAULT_WRITE_QOS, RequestError, check_write_schema


class WriteTooLarge(RequestError):
    """A put holds more rows or bytes than the broker takes in one unit."""


class WriteRefused(RequestError):
    """A put names a topic its caller may not publish to (``topic``, for the log)."""

    def __init__(self, message: str, topic: str) -> None:
        super().__init__(message)
        self.topic = topic


def read_rows(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    may_publish: Callable[[str], bool],
    max_rows: int,
    max_bytes: int,
    max_topic_levels: int | None = None,
) -> PublicationRows:
    """Every row of a put, as columns, converted batch by batch as the batches arrive (so
    the conversion overlaps the sender's work); refused as soon as the put passes
    ``max_rows`` or ``max_bytes`` (a Spark partition is one unit, taken whole or not at all:
    it must fit)."""
    check_write_schema(schema)
    unit = PublicationRows([], [], [], [], None, DEFAULT_WRITE_QOS, False, [])
    allowed: dict[str, None] = {}
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
            _add_rows(unit, batch, may_publish, max_topic_levels, allowed)
    unit.distinct_topics = list(allowed)
    return unit


def rows_of(
    batch: pa.RecordBatch,
    may_publish: Callable[[str], bool],
    max_topic_levels: int | None = None,
) -> PublicationRows:
    """The rows of one batch: qos 1 and not retained unless a row says otherwise."""
    unit = PublicationRows([], [], [], [], None, DEFAULT_WRITE_QOS, False, [])
    allowed: dict[str, None] = {}
    _add_rows(unit, batch, may_publish, max_topic_levels, allowed)
    unit.distinct_topics = list(allowed)
    return unit


def _add_rows(
    unit: PublicationRows,
    batch: pa.RecordBatch,
    may_publish: Callable[[str], bool],
    max_topic_levels: int | None,
    allowed: dict[str, None],
) -> None:
    """Append the batch's rows to ``unit``, column by column (a row is never looked at alone
    unless it has properties). Each topic is checked once per put (``allowed``: the topics
    checked already, in first-seen order)."""
    names = batch.schema.names
    topic_column = batch.column("topic")
    if topic_column.null_count:
        raise RequestError("a write's topic must not be null")
    for topic in pc.unique(topic_column).to_pylist():
        if topic in allowed:
            continue
        try:
            validate_topic_name(topic, max_topic_levels)
        except TopicError as exc:
            raise RequestError(f"cannot publish to {topic!r}: {exc}") from None
        if not may_publish(topic):
            raise WriteRefused(
                f"publishing to {topic!r} is not authorised (auth rules, ACLs)", topic
            )
        allowed[topic] = None
    count = batch.num_rows
    start = len(unit.topics)
    unit.topics.extend(topic_column.to_pylist())
    payload_column = batch.column("payload")
    if pa.types.is_string(payload_column.type) or pa.types.is_large_string(payload_column.type):
        payload_column = payload_column.cast(pa.binary())
    if payload_column.null_count:  # fill_null copies every payload even when none is null
        payload_column = payload_column.fill_null(b"")
    unit.payloads.extend(payload_column.to_pylist())
    level: int | None = DEFAULT_WRITE_QOS
    if "qos" in names:
        qos_column = batch.column("qos").fill_null(DEFAULT_WRITE_QOS)
        low_high = pc.min_max(qos_column).as_py()
        low, high = low_high["min"], low_high["max"]
        if low < 0 or high > 2:
            raise RequestError(f"a row's qos must be 0, 1 or 2; this write has {low}...{high}")
        if low == high:
            level = low
            unit.qos.extend([low] * count)
        else:
            level = None
            unit.qos.extend(qos_column.cast(pa.int64()).to_pylist())
    else:
        unit.qos.extend([DEFAULT_WRITE_QOS] * count)
    if start == 0:
        unit.uniform_qos = level
    elif level != unit.uniform_qos:
        unit.uniform_qos = None
    retain_column = batch.column("retain").fill_null(False) if "retain" in names else None
    if retain_column is not None and pc.any(retain_column).as_py():
        unit.retain.extend(retain_column.to_pylist())
        unit.any_retained = True
    else:
        unit.retain.extend([False] * count)
    properties_column = batch.column("properties") if "properties" in names else None
    if properties_column is not None and properties_column.null_count < count:
        pairs: list[Any] = properties_column.to_pylist()
        if any(pairs):
            if unit.user_properties is None:
                unit.user_properties = [None] * start
            unit.user_properties.extend(pairs)
            return
    if unit.user_properties is not None:
        unit.user_properties.extend([None] * count)
