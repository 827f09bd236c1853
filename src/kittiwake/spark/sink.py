"""``df.write`` / ``df.writeStream.format("kittiwake")``: rows published into the broker, exactly
once per (writer, batch, partition). Each task sends its partition's rows in one fenced put;
the broker publishes them with the fence in one commit, so a replayed batch or a retried task
publishes nothing twice.

The writer is the streaming query's id (stable across restarts from its checkpoint) with
Spark's batch id, both read from the task's local properties; a batch ``df.write`` gets a
writer id made once on the driver (or the ``writeId`` option) and batch 0. ``write`` runs on
executors; ``commit``/``abort`` on the driver.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from kittiwake.flight.protocol import PROPERTIES_TYPE, WRITE_SCHEMA, WriteRequest
from kittiwake.spark.client import SinkClient
from kittiwake.spark.options import OptionError, SinkOptions

log = logging.getLogger(__name__)

# Where Spark's micro-batch execution tells its tasks which query and batch they run.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# A batch write is one batch.
BATCH_WRITE_BATCH = 0

_COLUMNS = {
    "topic": (StringType,),
    "payload": (BinaryType, StringType),
    "qos": (ByteType, ShortType, IntegerType, LongType),
    "retain": (BooleanType,),
    "properties": (MapType,),
}


@dataclass
class PartitionWritten(WriterCommitMessage):
    """What one task did: its unit, the rows it sent, and whether the broker had taken the
    unit before (a replay or a retry: nothing published)."""

    writer: str
    batch: int
    partition: int
    rows: int
    already_committed: bool


def check_schema(schema: StructType) -> None:
    """The columns a write takes, checked on the driver before any task runs."""
    names = [field.name for field in schema.fields]
    for required in ("topic", "payload"):
        if required not in names:
            raise OptionError(
                f"format kittiwake writes rows with a {required!r} column; this DataFrame has "
                f"{names} (e.g. df.selectExpr('topic', 'to_json(struct(*)) AS payload'))"
            )
    for field in schema.fields:
        allowed = _COLUMNS.get(field.name)
        if allowed is None:
            raise OptionError(
                f"format kittiwake writes the columns {sorted(_COLUMNS)}; column "
                f"{field.name!r} is not one (select or rename the columns before writing)"
            )
        kind = field.dataType
        ok = isinstance(kind, allowed)
        if isinstance(kind, MapType):
            ok = isinstance(kind.keyType, StringType) and isinstance(kind.valueType, StringType)
        if not ok:
            raise OptionError(
                f"column {field.name!r} is {kind.simpleString()}; format kittiwake takes topic "
                "string, payload binary or string, qos int, retain boolean, "
                "properties map<string,string>"
            )


def wire_batch(batch: pa.RecordBatch, options: SinkOptions) -> pa.RecordBatch:
    """A Spark Arrow batch in the put's schema, with the options' defaults filled in."""
    rows = batch.num_rows
    names = batch.schema.names
    topic = batch.column("topic")
    if not pa.types.is_string(topic.type):  # large_string with Spark's large var types
        topic = topic.cast(pa.string())
    payload = batch.column("payload")
    if not pa.types.is_binary(payload.type):
        payload = payload.cast(pa.binary())
    if "qos" in names:
        qos = pc.fill_null(batch.column("qos"), options.qos).cast(pa.int32())
    else:
        qos = pa.array([options.qos] * rows, pa.int32())
    if "retain" in names:
        retain = pc.fill_null(batch.column("retain"), options.retain)
    else:
        retain = pa.array([options.retain] * rows, pa.bool_())
    if "properties" in names:
        properties = batch.column("properties").cast(PROPERTIES_TYPE)
    else:
        properties = pa.nulls(rows, PROPERTIES_TYPE)
    return pa.RecordBatch.from_arrays(
        [topic, payload, qos, retain, properties], schema=WRITE_SCHEMA
    )


def write_partition(
    options: SinkOptions, writer: str, batch: int, iterator: Iterator[pa.RecordBatch]
) -> PartitionWritten:
    """Send this task's partition as one fenced unit, streamed while Spark produces it
    (nothing when it is empty)."""
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    rows = (wire_batch(b, options) for b in iterator if b.num_rows)
    first = next(rows, None)
    if first is None:
        return PartitionWritten(writer, batch, partition, 0, False)
    answer = SinkClient(options).put(
        WriteRequest(writer, batch, partition), itertools.chain((first,), rows)
    )
    if answer.already_committed:
        log.info(
            "kittiwake: writer %s batch %d partition %d was committed before; nothing "
            "published again",
            writer,
            batch,
            partition,
        )
    return PartitionWritten(writer, batch, partition, answer.rows, answer.already_committed)


def commit_writer(
    options: SinkOptions, messages: Sequence[object], batch: int, *, finished: bool = False
) -> None:
    """Tell the broker the batch is committed, so it can drop the batch's fences (``finished``:
    a batch write, whose writer never writes again). Not needed for exactly once (the fences
    alone give it): a failure is logged, never raised."""
    writers = {m.writer for m in messages if isinstance(m, PartitionWritten)}
    for writer in writers:
        try:
            SinkClient(options).commit(writer, batch, finished=finished)
        except Exception as exc:
            log.warning(
                "kittiwake: could not tell the broker that batch %d of %s is committed (%s); "
                "its fences stay until a later commit",
                batch,
                writer,
                exc,
            )


class KittiwakeStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("kittiwake")``: writer = the query's id, batch = Spark's."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartitionWritten:
        context = TaskContext.get()
        query = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        if query is None or batch is None:
            raise RuntimeError(
                "format kittiwake's stream writer runs inside a streaming query's task; "
                "its query id and batch id were not found"
            )
        return write_partition(self.options, query, int(batch), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_writer(self.options, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_abort(messages, f"batch {batchId}", "Its replay publishes only the others.")


class KittiwakeBatchWriter(DataSourceArrowWriter):
    """``df.write.format("kittiwake")``: one batch under a writer id made here, on the driver,
    and pickled to every task with this object (or the ``writeId`` option: the same id on a
    rerun of the job publishes nothing that run already published)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.write_id = options.write_id or f"write-{uuid.uuid4()}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartitionWritten:
        return write_partition(self.options, self.write_id, BATCH_WRITE_BATCH, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_writer(
            self.options,
            [*messages, _placeholder(self.write_id)],
            BATCH_WRITE_BATCH,
            finished=True,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_abort(
            messages,
            f"write {self.write_id}",
            f"Rerun it with .option('writeId', '{self.write_id}') to publish only the others.",
        )


def _placeholder(writer: str) -> PartitionWritten:
    """Names the writer to commit even when every partition was empty."""
    return PartitionWritten(writer, BATCH_WRITE_BATCH, -1, 0, False)


def _log_abort(messages: Sequence[object], what: str, hint: str) -> None:
    done = [m for m in messages if isinstance(m, PartitionWritten)]
    log.warning(
        "kittiwake: %s failed; %d of %d partitions were already published (each once). %s",
        what,
        len(done),
        len(messages),
        hint,
    )
