"""The data source's options and planning, without Spark running: option parsing (Kafka's names
and markers), the deterministic split of a range, and what planning does with a range the
retention dropped.
"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import itertools

from pyspark.sql.types import StructType

from kittiwake.spark.client import DataLossError
from kittiwake.spark.options import OptionError, SourceOptions, split_range
from kittiwake.spark.source import (
    JournalPartition,
    KittiwakeDataSource,
    KittiwakeStreamReader,
    _planned,
)


def test_defaults() -> None:
    options = SourceOptions.parse({})
    assert options.url == "grpc://127.0.0.1:8815"
    assert options.topics == ("#",)
    assert options.starting is None and options.ending == "latest"
    assert options.fail_on_data_loss is True and options.include_headers is False
    assert options.min_partitions == 1 and options.max_offsets_per_trigger is None


def test_values_are_parsed_case_insensitively() -> None:
    options = SourceOptions.parse(
        {
            "url": "grpc://broker:9000",
            "topics": "sensors/+/temp, alerts/#",
            "startingOffsets": '{"0": 42}',
            "endingoffsets": '{"0": -1}',
            "maxOffsetsPerTrigger": "500",
            "MINPARTITIONS": "4",
            "failOnDataLoss": "False",
            "includeHeaders": "true",
            "startingTimestamp": "1700000000000",
        }
    )
    assert options.url == "grpc://broker:9000"
    assert options.topics == ("sensors/+/temp", "alerts/#")
    assert options.starting == 42 and options.ending == "latest"
    assert options.max_offsets_per_trigger == 500 and options.min_partitions == 4
    assert options.fail_on_data_loss is False and options.include_headers is True
    assert options.starting_timestamp_ms == 1_700_000_000_000
    assert SourceOptions.parse({"startingOffsets": '{"0": -2}'}).starting == "earliest"
    assert SourceOptions.parse({"startingOffsets": "LATEST"}).starting == "latest"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"url": "http://x:1"}, "grpc://"),
        ({"topics": "a/#/b"}, "topics"),
        ({"topics": " , "}, "topics"),
        ({"startingOffsets": "soon"}, "startingOffsets"),
        ({"startingOffsets": '{"1": 5}'}, "partition 0"),
        ({"endingOffsets": '{"0": -3}'}, "endingOffsets"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"minPartitions": "two"}, "minPartitions"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"subscribe": "a"}, "unknown option 'subscribe'"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        SourceOptions.parse(options)


def test_split_range_is_exact_and_deterministic() -> None:
    assert split_range(10, 10, 3) == []
    assert split_range(10, 12, 5) == [(10, 11), (11, 12)]
    parts = split_range(100, 1000, 4)
    assert parts == split_range(100, 1000, 4)
    assert parts[0][0] == 100 and parts[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))


class FakeClient:
    def __init__(self, earliest: int, high_water: int) -> None:
        self.answer = (earliest, high_water)

    def bounds(self) -> tuple[int, int]:
        return self.answer


def test_planning_a_dropped_range_fails_naming_it() -> None:
    options = SourceOptions.parse({})
    with pytest.raises(DataLossError, match=r"offsets \[5, 20\) of partition 0 .*failOnDataLoss"):
        _planned(options, FakeClient(20, 100), 5, 50)  # type: ignore[arg-type]


def test_planning_a_dropped_range_skips_it_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    options = SourceOptions.parse({"failOnDataLoss": "false", "minPartitions": "2"})
    with caplog.at_level(logging.WARNING, logger="kittiwake.spark"):
        planned = _planned(options, FakeClient(20, 100), 5, 50)  # type: ignore[arg-type]
    assert planned == [JournalPartition(20, 35), JournalPartition(35, 50)]
    assert "offsets [5, 20) of partition 0 were dropped" in caplog.text


def test_nothing_before_the_first_offset_counts_as_lost() -> None:
    """Offsets start at 1: reading from 0 on a journal that dropped nothing loses nothing."""
    planned = _planned(SourceOptions.parse({}), FakeClient(1, 10), 0, 10)  # type: ignore[arg-type]
    assert planned == [JournalPartition(0, 10)]


def test_the_read_limit_caps_a_micro_batch() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    reader = KittiwakeStreamReader(SourceOptions.parse({"maxOffsetsPerTrigger": "10"}))
    assert reader.getDefaultReadLimit() == ReadMaxRows(10)
    reader._target = 100  # as Trigger.AvailableNow fixes it
    assert reader.latestOffset({"0": 40}, ReadMaxRows(10)) == {"0": 50}
    assert reader.latestOffset({"0": 95}, ReadMaxRows(10)) == {"0": 100}
    assert reader.latestOffset({"0": 40}, ReadAllAvailable()) == {"0": 100}


def test_a_journal_whose_offsets_went_back_fails_or_waits() -> None:
    """A high-water mark below the query's offset means the journal was replaced."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    reader = KittiwakeStreamReader(SourceOptions.parse({}))
    reader._target = 5
    with pytest.raises(DataLossError, match="high-water mark 5 is below the query's offset 10"):
        reader.latestOffset({"0": 10}, ReadAllAvailable())
    lenient = KittiwakeStreamReader(SourceOptions.parse({"failOnDataLoss": "false"}))
    lenient._target = 5
    assert lenient.latestOffset({"0": 10}, ReadAllAvailable()) == {"0": 10}


@pytest.mark.parametrize("ending", ["latest", '{"0": 2000}', '{"0": -1}'])
def test_a_stream_refuses_ending_offsets_naming_the_option(ending: str) -> None:
    """endingOffsets bounds a batch read only; a stream reads on as the journal grows, so it
    refuses the option (as Kafka's source does) instead of ignoring it silently."""
    options = SourceOptions.parse({"endingOffsets": ending})
    with pytest.raises(OptionError, match=r"endingOffsets is for batch reads"):
        KittiwakeStreamReader(options)
    with pytest.raises(OptionError, match=r"endingOffsets is for batch reads"):
        KittiwakeDataSource({"url": "grpc://x:1", "EndingOffsets": ending}).streamReader(
            StructType()
        )
    # A batch read takes it; a stream without it is planned as before.
    KittiwakeDataSource({"endingOffsets": ending}).reader(StructType())
    KittiwakeStreamReader(SourceOptions.parse({"startingOffsets": "earliest"}))
