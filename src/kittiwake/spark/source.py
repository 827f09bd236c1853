"""``format("kittiwake")``: the journal as a PySpark (>= 4.2) Python data source, batch and
stream, and the broker as its sink (spark/sink.py). Offsets are journal sequence numbers, so a
micro-batch's range is exact and a replay reads the same rows. Executors read over Arrow
Flight, never the broker's files.

Planning (offsets, partitions) runs on the driver; ``read`` runs on executors from the
partition alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from kittiwake.flight.protocol import DDL, DDL_WITH_HEADERS, FIRST_OFFSET, PARTITION
from kittiwake.spark.client import DataLossError, JournalClient, data_loss_message
from kittiwake.spark.options import OptionError, SinkOptions, SourceOptions, split_range
from kittiwake.spark.sink import KittiwakeBatchWriter, KittiwakeStreamWriter, check_schema

log = logging.getLogger(__name__)

FORMAT = "kittiwake"


@dataclass
class JournalPartition(InputPartition):
    """One Spark task's exact range [start, end) of the journal."""

    start: int
    end: int


class KittiwakeDataSource(DataSource):
    """Reads the Kittiwake journal (``spark.read`` / ``spark.readStream.format("kittiwake")``)
    and publishes into the broker (``df.write`` / ``df.writeStream.format("kittiwake")``).

    The options are parsed for the side in use: reading and writing take different ones.
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._source_options: SourceOptions | None = None

    @property
    def source_options(self) -> SourceOptions:
        if self._source_options is None:
            self._source_options = SourceOptions.parse(self.options)
        return self._source_options

    def schema(self) -> str:
        return DDL_WITH_HEADERS if self.source_options.include_headers else DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return KittiwakeBatchReader(self.source_options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KittiwakeStreamReader(self.source_options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        # Append or overwrite alike: publishing replaces nothing (retained rows replace the
        # topic's retained message, as any publication does).
        check_schema(schema)
        return KittiwakeBatchWriter(SinkOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        check_schema(schema)
        return KittiwakeStreamWriter(SinkOptions.parse(self.options))


def _read(options: SourceOptions, partition: JournalPartition) -> Iterator[pa.RecordBatch]:
    return JournalClient(options).read(partition.start, partition.end)


def _resolve(client: JournalClient, spec: str | int, bounds: tuple[int, int]) -> int:
    earliest, high_water = bounds
    if spec == "earliest":
        return earliest
    if spec == "latest":
        return high_water
    assert isinstance(spec, int)
    return spec


def _planned(
    options: SourceOptions, client: JournalClient, start: int, end: int
) -> list[JournalPartition]:
    """The partitions of [start, end), after checking the retention still keeps the start."""
    if start < end:
        earliest, _high_water = client.bounds()
        if start < earliest and earliest > FIRST_OFFSET:
            lost = (start, min(end, earliest))
            if options.fail_on_data_loss:
                raise DataLossError(data_loss_message(lost))
            log.warning("skipping: %s", data_loss_message(lost))
            start = min(end, earliest)
    return [JournalPartition(s, e) for s, e in split_range(start, end, options.min_partitions)]


class KittiwakeBatchReader(DataSourceReader):
    """``spark.read``: startingOffsets (default earliest) to endingOffsets (default latest)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        client = JournalClient(options)
        bounds = client.bounds()
        if options.starting_timestamp_ms is not None:
            start = client.offset_for_timestamp(options.starting_timestamp_ms)
        else:
            starting = "earliest" if options.starting is None else options.starting
            start = _resolve(client, starting, bounds)
        end = _resolve(client, options.ending, bounds)
        if end > bounds[1]:
            raise ValueError(
                f"endingOffsets {end} is past the journal's committed high-water mark "
                f"{bounds[1]} (partition {PARTITION})"
            )
        planned = _planned(options, client, start, max(start, end))
        return planned or [JournalPartition(start, start)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, JournalPartition)
        return _read(self.options, partition)


class KittiwakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches of exact offset ranges, checkpointed by Spark."""

    def __init__(self, options: SourceOptions) -> None:
        if options.ending_given:
            # Ignoring it would read past the end the user asked for, without a word.
            raise OptionError(
                "endingOffsets is for batch reads (spark.read) only: a stream "
                "(spark.readStream) reads on as the journal grows; remove the option, or use "
                "Trigger.AvailableNow to stop at the high-water mark the query starts at"
            )
        self.options = options
        # Trigger.AvailableNow: the high-water mark when the query started; never read past it.
        self._target: int | None = None

    def initialOffset(self) -> dict[str, int]:
        options = self.options
        client = JournalClient(options)
        if options.starting_timestamp_ms is not None:
            return {str(PARTITION): client.offset_for_timestamp(options.starting_timestamp_ms)}
        starting = "latest" if options.starting is None else options.starting
        start = _resolve(client, starting, client.bounds())
        return {str(PARTITION): start}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        begin = int(start[str(PARTITION)])
        end = self._target if self._target is not None else JournalClient(self.options).bounds()[1]
        if end < begin:
            # The journal's offsets went back: it was replaced (a new data directory).
            message = (
                f"the journal's high-water mark {end} is below the query's offset {begin} "
                f"(partition {PARTITION}): the broker's journal was replaced"
            )
            if self.options.fail_on_data_loss:
                raise DataLossError(message + "; set failOnDataLoss=false to wait for it")
            log.warning("%s; waiting until it passes %d", message, begin)
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {str(PARTITION): max(begin, end)}

    def reportLatestOffset(self) -> dict[str, int]:
        return {str(PARTITION): JournalClient(self.options).bounds()[1]}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = JournalClient(self.options).bounds()[1]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        client = JournalClient(self.options)
        return _planned(self.options, client, int(start[str(PARTITION)]), int(end[str(PARTITION)]))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, JournalPartition)
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the journal's retention, not the reader, decides what is kept."""
