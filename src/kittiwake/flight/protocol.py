"""What the journal's Flight service and its clients say to each other: tickets, actions, the
Arrow schema of a range read and its metadata, and the fenced writes of the Spark sink
(descriptors, their schema, their answers). Sans-IO, shared by the server and the Spark data
source (which runs on executors); must never open a socket or import the broker.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from kittiwake.broker.topics import TopicError, validate_topic_filter

# The journal's partition and first offset, as clients see them (re-exported).
from kittiwake.store.journal_reader import FIRST_OFFSET as FIRST_OFFSET
from kittiwake.store.journal_reader import PARTITION as PARTITION

# Actions: the committed high-water mark and the retention's start, per partition; and the
# first offset at or after a wall-clock time.
ACTION_LATEST = "latest"
ACTION_OFFSET_FOR_TIMESTAMP = "offset_for_timestamp"
# The sink's driver: every batch of a writer up to N is committed (its fences may go).
ACTION_COMMIT_WRITES = "commit_writes"
ACTIONS = {
    ACTION_LATEST: "per partition: the committed high-water mark (one past the last readable "
    "offset) and the earliest offset still kept",
    ACTION_OFFSET_FOR_TIMESTAMP: 'body {"timestamp_ms": N}: per partition, the first offset '
    "stored at or after that time",
    ACTION_COMMIT_WRITES: 'body {"writer": W, "batch": N, "finished": false}: every batch of '
    "writer W up to N is committed; a later put for one of them publishes nothing. "
    '"finished": true: W never writes again (a batch write); it is remembered for '
    "journal.finished_write_retention, then forgotten",
}
# Schema metadata of a range read: the bounds at the read's snapshot and, when the retention
# dropped part of the range, that part [lost_start, lost_end).
META_EARLIEST = b"kittiwake.earliest"
META_HIGH_WATER = b"kittiwake.high_water"
META_LOST_START = b"kittiwake.lost_start"
META_LOST_END = b"kittiwake.lost_end"
# The most topic filters one request may carry (a request is one small JSON document).
MAX_FILTERS = 1000
MAX_REQUEST_BYTES = 1024 * 1024


class RequestError(ValueError):
    """A request the service refuses as malformed; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """Rows of offsets [start, end) of one partition on any of ``topics`` (MQTT filters)."""

    start: int
    end: int
    topics: tuple[str, ...]
    partition: int = PARTITION
    include_headers: bool = False

    def to_ticket(self) -> bytes:
        return json.dumps(
            {
                "partition": self.partition,
                "start": self.start,
                "end": self.end,
                "topics": list(self.topics),
                "include_headers": self.include_headers,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_ticket(cls, ticket: bytes) -> RangeRequest:
        doc = _json_object(ticket, "ticket")
        unknown = sorted(set(doc) - {"partition", "start", "end", "topics", "include_headers"})
        if unknown:
            raise RequestError(f"the ticket has unknown fields {unknown}")
        start = _offset(doc, "start")
        end = _offset(doc, "end")
        if end < start:
            raise RequestError(f"the ticket's range [{start}, {end}) ends before it starts")
        partition = doc.get("partition", PARTITION)
        if partition != PARTITION or isinstance(partition, bool):
            raise RequestError(f"partition {partition!r} does not exist; this journal has {{0}}")
        include_headers = doc.get("include_headers", False)
        if not isinstance(include_headers, bool):
            raise RequestError("the ticket's include_headers must be true or false")
        return cls(
            start=start,
            end=end,
            topics=parse_topics(doc.get("topics")),
            partition=partition,
            include_headers=include_headers,
        )


def parse_topics(value: Any) -> tuple[str, ...]:
    """A non-empty list of valid MQTT topic filters (a comma-separated string is split)."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not value:
        raise RequestError("topics must be a non-empty list of MQTT topic filters, e.g. ['#']")
    if len(value) > MAX_FILTERS:
        raise RequestError(f"at most {MAX_FILTERS} topic filters per request")
    for topic_filter in value:
        if not isinstance(topic_filter, str):
            raise RequestError(f"topic filter {topic_filter!r} is not a string")
        try:
            validate_topic_filter(topic_filter)
        except TopicError as exc:
            raise RequestError(str(exc)) from None
    return tuple(value)


def parse_offset_for_timestamp(body: bytes) -> float:
    """The wall-clock time (seconds) an offset_for_timestamp action asks about."""
    doc = _json_object(body, "action body")
    value = doc.get("timestamp_ms")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError('the action body must be {"timestamp_ms": <milliseconds>}')
    return float(value) / 1000.0


def latest_answer(earliest: int, high_water: int) -> bytes:
    return json.dumps(
        {str(PARTITION): {"earliest": earliest, "high_water": high_water}},
        separators=(",", ":"),
    ).encode()


def parse_latest_answer(body: bytes) -> dict[int, tuple[int, int]]:
    """Partition -> (earliest, high_water) from a ``latest`` answer."""
    doc = json.loads(body)
    return {
        int(partition): (int(bounds["earliest"]), int(bounds["high_water"]))
        for partition, bounds in doc.items()
    }


def offsets_answer(offset: int) -> bytes:
    return json.dumps({str(PARTITION): offset}, separators=(",", ":")).encode()


def parse_offsets_answer(body: bytes) -> dict[int, int]:
    return {int(partition): int(offset) for partition, offset in json.loads(body).items()}


# The row schema, exactly as Spark's Arrow conversion spells the data source's schema (the
# map's entries and the list's element are named as Spark names them), so executors hand
# the batches on without a cast.
PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
_FIELDS = [
    pa.field("topic", pa.string()),
    pa.field("payload", pa.binary()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("qos", pa.int32()),
    pa.field("retain", pa.bool_()),
    pa.field("priority", pa.int32()),
    pa.field("properties", PROPERTIES_TYPE),
]
SCHEMA = pa.schema(_FIELDS)
SCHEMA_WITH_HEADERS = pa.schema([*_FIELDS, pa.field("headers", HEADERS_TYPE)])
# The same schemas as Spark DDL (the data source's schema()).
DDL = (
    "topic string, payload binary, offset long, timestamp timestamp, qos int, "
    "retain boolean, priority int, properties map<string,string>"
)
DDL_WITH_HEADERS = DDL + ", headers array<struct<key:string,value:binary>>"


def range_schema(
    include_headers: bool, earliest: int, high_water: int, lost: tuple[int, int] | None
) -> pa.Schema:
    metadata = {META_EARLIEST: str(earliest).encode(), META_HIGH_WATER: str(high_water).encode()}
    if lost is not None:
        metadata[META_LOST_START] = str(lost[0]).encode()
        metadata[META_LOST_END] = str(lost[1]).encode()
    schema = SCHEMA_WITH_HEADERS if include_headers else SCHEMA
    return schema.with_metadata(metadata)


def lost_range(metadata: Mapping[bytes, bytes] | None) -> tuple[int, int] | None:
    """The range a read's schema metadata says the retention dropped, if any."""
    if not metadata or META_LOST_START not in metadata:
        return None
    return int(metadata[META_LOST_START]), int(metadata[META_LOST_END])


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > MAX_REQUEST_BYTES:
        raise RequestError(f"the {what} is larger than {MAX_REQUEST_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RequestError(f"the {what} is not a JSON document") from None
    if not isinstance(doc, dict):
        raise RequestError(f"the {what} must be a JSON object")
    return doc


def _offset(doc: dict[str, Any], name: str) -> int:
    value = doc.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"the ticket's {name} must be an offset (an integer >= 0)")
    return value


# -- writes (the Spark sink) ----------------------------------------------------------------

# What a writer id may hold: a Spark query id (a UUID) or a batch write's id.
_WRITER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
# The qos a row gets when its qos is null.
DEFAULT_WRITE_QOS = 1
WRITE_FIELDS = [
    pa.field("topic", pa.string()),
    pa.field("payload", pa.binary()),
    pa.field("qos", pa.int32()),
    pa.field("retain", pa.bool_()),
    pa.field("properties", PROPERTIES_TYPE),
]
# What a put carries: a topic and a payload per row; qos, retain and properties may be left
# out (or null): qos 1, not retained, no properties.
WRITE_SCHEMA = pa.schema(WRITE_FIELDS)
WRITE_REQUIRED = ("topic", "payload")


def check_writer_id(writer: object) -> str:
    if not isinstance(writer, str) or not _WRITER_ID.fullmatch(writer):
        raise RequestError(
            f"writer id {writer!r} must be 1 to 128 letters, digits or ._:- "
            "(a streaming query's id, or a batch write's writeId option)"
        )
    return writer


@dataclass(frozen=True, slots=True)
class WriteRequest:
    """One fenced unit of a sink's output (a put's descriptor): the rows of Spark partition
    ``partition`` of batch ``batch`` of ``writer`` (a streaming query's id, or the id of one
    batch write). The broker takes each unit once."""

    writer: str
    batch: int
    partition: int

    def to_descriptor(self) -> bytes:
        return json.dumps(
            {"writer": self.writer, "batch": self.batch, "partition": self.partition},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_descriptor(cls, command: bytes) -> WriteRequest:
        doc = _json_object(command, "put descriptor")
        unknown = sorted(set(doc) - {"writer", "batch", "partition"})
        if unknown:
            raise RequestError(f"the put descriptor has unknown fields {unknown}")
        return cls(
            writer=check_writer_id(doc.get("writer")),
            batch=_counter(doc, "batch", "put descriptor"),
            partition=_counter(doc, "partition", "put descriptor"),
        )


@dataclass(frozen=True, slots=True)
class WriteAnswer:
    """A put's answer (its metadata): rows received, and whether the unit had been taken
    before (then nothing was published)."""

    rows: int
    already_committed: bool

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"rows": self.rows, "already_committed": self.already_committed},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> WriteAnswer:
        doc = json.loads(data)
        return cls(int(doc["rows"]), bool(doc["already_committed"]))


def commit_writes_body(writer: str, batch: int, finished: bool = False) -> bytes:
    doc: dict[str, Any] = {"writer": writer, "batch": batch}
    if finished:
        doc["finished"] = True
    return json.dumps(doc, separators=(",", ":")).encode()


def parse_commit_writes(body: bytes) -> tuple[str, int, bool]:
    """(writer, batch, finished); ``finished`` is absent from older senders' bodies."""
    doc = _json_object(body, "action body")
    finished = doc.get("finished", False)
    if not isinstance(finished, bool):
        raise RequestError(f"action body: finished must be true or false, got {finished!r}")
    return (
        check_writer_id(doc.get("writer")),
        _counter(doc, "batch", "action body"),
        finished,
    )


def check_write_schema(schema: pa.Schema) -> None:
    """A put's columns: ``topic`` (string) and ``payload`` (binary or string) required; ``qos``
    (an integer type), ``retain`` (boolean) and ``properties`` (map<string,string>) optional;
    nothing else (a misspelt column must not be dropped silently)."""
    names = schema.names
    for name in WRITE_REQUIRED:
        if name not in names:
            raise RequestError(f"a write needs a {name!r} column; it has {names}")
    known = {f.name for f in WRITE_FIELDS}
    unknown = [n for n in names if n not in known]
    if unknown or len(set(names)) != len(names):
        raise RequestError(
            f"a write takes the columns {sorted(known)} (each once); it has {names}: "
            "select or rename the columns before writing"
        )
    for field in schema:
        kind = field.type
        if field.name == "topic":
            ok = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        elif field.name == "payload":
            ok = any(
                check(kind)
                for check in (
                    pa.types.is_binary,
                    pa.types.is_large_binary,
                    pa.types.is_string,
                    pa.types.is_large_string,
                )
            )
        elif field.name == "qos":
            ok = pa.types.is_integer(kind)
        elif field.name == "retain":
            ok = pa.types.is_boolean(kind)
        else:
            ok = (
                pa.types.is_map(kind)
                and pa.types.is_string(kind.key_type)
                and pa.types.is_string(kind.item_type)
            )
        if not ok:
            raise RequestError(
                f"column {field.name!r} has type {kind}; a write takes topic string, payload "
                "binary or string, qos int, retain boolean, properties map<string,string>"
            )


def _counter(doc: dict[str, Any], name: str, what: str) -> int:
    value = doc.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise RequestError(f"the {what}'s {name} must be an integer >= 0")
    return value
