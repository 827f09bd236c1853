"""``format("kittiwake")`` on a real local Spark (``local[2,2]``), reading a real broker over
Arrow Flight; the input is published by paho-mqtt at QoS 1.

One SparkSession for the Spark suite (conftest.py), small data. Marked ``spark``:
``-m 'not spark'`` skips it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..brokerproc import BrokerProcess
from ..clients import PahoClient, unique, wait_until

# Each Spark wait is bounded on its own (QUERY_TIMEOUT and the like); a test makes several, so
# the suite-wide 120 s per test is too short on a loaded machine (a driver start alone can take
# a minute there).
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

pyspark = pytest.importorskip("pyspark", reason="needs the spark extra: make test-deps")
flight = pytest.importorskip("pyarrow.flight")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql.streaming import StreamingQuery  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

from kittiwake.flight.protocol import parse_latest_answer  # noqa: E402
from kittiwake.spark import KittiwakeDataSource  # noqa: E402

JOURNAL = {"retention_seconds": 3600}
QUERY_TIMEOUT = 120
# The schema README.md and the issue document, as text (not the code's own constant).
DOCUMENTED_SCHEMA = (
    "topic string, payload binary, offset long, timestamp timestamp, qos int, "
    "retain boolean, priority int, properties map<string,string>"
)
DOCUMENTED_HEADERS = "headers array<struct<key:string,value:binary>>"


@pytest.fixture(scope="module")
def journal_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("spark"), flight=True, journal=JOURNAL)
    process.start()
    yield process
    process.stop()


def latest(url: str) -> tuple[int, int]:
    client = flight.connect(url)
    try:
        (result,) = list(client.do_action(flight.Action("latest", b"")))
        return parse_latest_answer(result.body.to_pybytes())[0]
    finally:
        client.close()


def publish(
    paho: Callable[..., PahoClient], address: tuple[str, int], items: list[tuple[str, bytes]]
) -> None:
    publisher = paho(address)
    for topic, payload in items:
        publisher.publish(topic, payload, 1)  # PUBACK'd: committed to the journal


def rows_of(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(
        (row.offset, row.topic, bytes(row.payload), row.qos)
        for row in df.select("offset", "topic", "payload", "qos").collect()
    )


def stream(spark: SparkSession, url: str, topics: str, start: int, **options: str) -> DataFrame:
    reader = (
        spark.readStream.format("kittiwake")
        .option("url", url)
        .option("topics", topics)
        .option("startingOffsets", json.dumps({"0": start}))
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(df: DataFrame, sink: Path, checkpoint: Path) -> StreamingQuery:
    query = (
        df.writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT), "the stream did not finish in time"
    assert query.exception() is None, query.exception()
    return query


def test_a_stream_to_a_sink_equals_a_batch_read_of_the_same_range(
    spark: SparkSession,
    journal_broker: BrokerProcess,
    paho: Callable[..., PahoClient],
    tmp_path: Path,
) -> None:
    prefix = unique("same")
    url = journal_broker.flight_url
    _e, start = latest(url)
    items = [(f"{prefix}/{i % 4}", f"reading {i}".encode()) for i in range(80)]
    publish(paho, journal_broker.address, items)
    publish(paho, journal_broker.address, [(unique("other"), b"not on the filter")])
    _e, end = latest(url)

    batch = (
        spark.read.format("kittiwake")
        .option("url", url)
        .option("topics", f"{prefix}/#")
        .option("startingOffsets", json.dumps({"0": start}))
        .option("endingOffsets", json.dumps({"0": end}))
        .option("minPartitions", "3")
        .load()
    )
    assert batch.rdd.getNumPartitions() == 3
    batch_rows = rows_of(batch)
    assert [(topic, payload) for _o, topic, payload, _q in batch_rows] == items
    assert {qos for *_rest, qos in batch_rows} == {1}

    # The stream, in several micro-batches (read limit), checkpointed into a parquet sink.
    df = stream(spark, url, f"{prefix}/#", start, maxOffsetsPerTrigger="25", minPartitions="2")
    query = run_available_now(df, tmp_path / "sink", tmp_path / "checkpoint")
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3
    assert rows_of(spark.read.parquet(str(tmp_path / "sink"))) == batch_rows

    payloads_as_text = batch.selectExpr("CAST(payload AS STRING) AS text").collect()
    assert sorted(r.text for r in payloads_as_text) == sorted(p.decode() for _t, p in items)

    # From a timestamp before everything, with headers: the same rows, and a headers column.
    since_epoch = (
        spark.read.format("kittiwake")
        .option("url", url)
        .option("topics", f"{prefix}/#")
        .option("startingTimestamp", "0")
        .option("endingOffsets", json.dumps({"0": end}))
        .option("includeHeaders", "true")
        .load()
    )
    assert since_epoch.columns[-1] == "headers"
    assert rows_of(since_epoch) == batch_rows
    assert {len(row.headers) for row in since_epoch.select("headers").collect()} == {0}


def test_a_read_has_the_documented_schema_with_and_without_headers(
    spark: SparkSession, journal_broker: BrokerProcess
) -> None:
    without = StructType.fromDDL(DOCUMENTED_SCHEMA)
    with_headers = StructType.fromDDL(f"{DOCUMENTED_SCHEMA}, {DOCUMENTED_HEADERS}")
    for reader in (spark.read, spark.readStream):
        plain = reader.format("kittiwake").option("url", journal_broker.flight_url).load()
        assert plain.schema == without
        headers = (
            reader.format("kittiwake")
            .option("url", journal_broker.flight_url)
            .option("includeHeaders", "true")
            .load()
        )
        assert headers.schema == with_headers


def test_a_replayed_micro_batch_returns_the_same_rows_exactly_once(
    spark: SparkSession,
    journal_broker: BrokerProcess,
    paho: Callable[..., PahoClient],
    tmp_path: Path,
) -> None:
    """The sink fails on batch 1 after seeing its rows; restarted from the checkpoint, Spark
    replays batch 1 from the offsets it logged, and the source returns the same rows."""
    prefix = unique("replay")
    url = journal_broker.flight_url
    _e, start = latest(url)
    items = [(f"{prefix}/t", f"row {i}".encode()) for i in range(45)]
    publish(paho, journal_broker.address, items)
    seen: dict[int, list[list[tuple[Any, ...]]]] = {}
    fail_once = {"armed": True}
    sink = tmp_path / "sink"

    def write(batch: DataFrame, batch_id: int) -> None:
        rows = rows_of(batch)
        seen.setdefault(batch_id, []).append(rows)
        if batch_id == 1 and fail_once["armed"]:
            fail_once["armed"] = False
            raise RuntimeError("the sink fails once, on batch 1")
        # Idempotent per batch id, as a foreachBatch sink must be.
        (sink / f"{batch_id}.json").parent.mkdir(parents=True, exist_ok=True)
        (sink / f"{batch_id}.json").write_text(
            json.dumps([[o, t, p.decode(), q] for o, t, p, q in rows])
        )

    def run() -> StreamingQuery:
        df = stream(spark, url, f"{prefix}/#", start, maxOffsetsPerTrigger="15")
        return (
            df.writeStream.foreachBatch(write)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    failed = run()
    with pytest.raises(Exception, match="fails once"):
        failed.awaitTermination(QUERY_TIMEOUT)
    assert 1 in seen and len(seen[1]) == 1
    restarted = run()
    assert restarted.awaitTermination(QUERY_TIMEOUT)
    assert restarted.exception() is None
    assert len(seen[1]) == 2, "batch 1 must have been replayed"
    assert seen[1][0] == seen[1][1] and seen[1][0], "a replayed batch returns the same rows"
    written = sorted(
        (o, t, p.encode(), q)
        for path in sink.glob("*.json")
        for o, t, p, q in json.loads(path.read_text())
    )
    assert [(t, p) for _o, t, p, _q in written] == items  # every row once, none twice


@dataclass
class DroppedRange:
    """A broker whose retention dropped the journal's first offsets, ``[start, earliest)``."""

    process: BrokerProcess
    start: int
    earliest: int
    high_water: int


@pytest.fixture(scope="module")
def dropped_range(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DroppedRange]:
    process = BrokerProcess(
        tmp_path_factory.mktemp("retention"), flight=True, journal={"retention_bytes": 3000}
    )
    process.start()
    publisher = PahoClient(process.address, unique("fill"))
    try:
        publisher.connect()
        url = process.flight_url
        _e, start = latest(url)

        def dropped() -> bool:
            publisher.publish(unique("fill"), b"x" * 500, 1)
            return latest(url)[0] > start

        # The sweep runs at most once a second: publish until it has dropped `start`.
        wait_until(dropped, timeout=20, interval=0.05)
        earliest, high_water = latest(url)
        yield DroppedRange(process, start, earliest, high_water)
    finally:
        publisher.stop()
        process.stop()


def logging_source(name: str, log_file: Path) -> type[KittiwakeDataSource]:
    """``format(name)``: the kittiwake source, whose planning (on the driver's side, in a
    Python worker its JVM starts) also writes the ``kittiwake.spark`` log to ``log_file``. That
    worker's stderr goes wherever the JVM's goes; a file is where a test can read the warning
    deterministically. Made here, so Spark pickles the class by value for that worker."""

    class LoggingSource(KittiwakeDataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def _log_to_file(self) -> None:
            import logging

            logger = logging.getLogger("kittiwake.spark")
            if not any(getattr(h, "baseFilename", None) == str(log_file) for h in logger.handlers):
                handler = logging.FileHandler(log_file)
                handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
                logger.addHandler(handler)

        def reader(self, schema: Any) -> Any:
            self._log_to_file()
            return super().reader(schema)

        def streamReader(self, schema: Any) -> Any:
            self._log_to_file()
            return super().streamReader(schema)

    return LoggingSource


def test_a_range_dropped_by_retention_fails_or_is_skipped(
    spark: SparkSession, dropped_range: DroppedRange, tmp_path: Path
) -> None:
    url = dropped_range.process.flight_url
    start, earliest = dropped_range.start, dropped_range.earliest
    high_water = dropped_range.high_water
    log_file = tmp_path / "planning.log"
    spark.dataSource.register(logging_source("kittiwake_logged_batch", log_file))

    def read(fail_on_data_loss: str) -> DataFrame:
        return (
            spark.read.format("kittiwake_logged_batch")
            .option("url", url)
            .option("topics", "#")
            .option("startingOffsets", json.dumps({"0": start}))
            .option("failOnDataLoss", fail_on_data_loss)
            .load()
        )

    with pytest.raises(Exception, match=rf"offsets \[{start}, {earliest}\) .*dropped"):
        read("true").count()
    offsets = [row.offset for row in read("false").select("offset").collect()]
    assert offsets and min(offsets) >= earliest and max(offsets) < high_water + 1000
    assert re.search(
        rf"WARNING kittiwake\.spark\.source skipping: offsets \[{start}, {earliest}\) .*dropped",
        log_file.read_text(),
    ), log_file.read_text()


def test_a_stream_over_a_range_dropped_by_retention_fails_or_skips_it_with_a_warning(
    spark: SparkSession, dropped_range: DroppedRange, tmp_path: Path
) -> None:
    """Trigger.AvailableNow from an offset the retention dropped: failOnDataLoss=true fails
    the query naming the range; false reads what is left and the driver's side warns, naming
    the range it skipped."""
    url = dropped_range.process.flight_url
    start, earliest = dropped_range.start, dropped_range.earliest
    high_water = dropped_range.high_water
    log_file = tmp_path / "planning.log"
    spark.dataSource.register(logging_source("kittiwake_logged_stream", log_file))

    def run(fail_on_data_loss: str, sink_name: str) -> StreamingQuery:
        df = (
            spark.readStream.format("kittiwake_logged_stream")
            .option("url", url)
            .option("topics", "#")
            .option("startingOffsets", json.dumps({"0": start}))
            .option("failOnDataLoss", fail_on_data_loss)
            .load()
        )
        return (
            df.select("offset")
            .writeStream.format("memory")
            .queryName(sink_name)
            .option("checkpointLocation", str(tmp_path / sink_name))
            .trigger(availableNow=True)
            .start()
        )

    failing = run("true", "dropped_fails")
    with pytest.raises(Exception, match=rf"offsets \[{start}, {earliest}\) .*dropped"):
        failing.awaitTermination(QUERY_TIMEOUT)
    assert "WARNING" not in (log_file.read_text() if log_file.exists() else "")

    skipping = run("false", "dropped_skipped")
    assert skipping.awaitTermination(QUERY_TIMEOUT), "the stream did not finish in time"
    assert skipping.exception() is None, skipping.exception()
    offsets = [row.offset for row in spark.table("dropped_skipped").collect()]
    assert offsets and min(offsets) >= earliest and max(offsets) < high_water + 1000
    assert re.search(
        rf"WARNING kittiwake\.spark\.source skipping: offsets \[{start}, {earliest}\) .*dropped",
        log_file.read_text(),
    ), log_file.read_text()


def test_every_row_reaches_the_sink_exactly_once_across_a_broker_kill9(
    spark: SparkSession,
    broker: Callable[..., BrokerProcess],
    paho: Callable[..., PahoClient],
    tmp_path: Path,
) -> None:
    """kill -9 of the broker mid-stream, then a restart on the same address: the running
    query waits for it, resumes, and the sink holds every input row exactly once."""
    process = broker(flight=True, journal=JOURNAL)
    url = process.flight_url
    prefix = unique("kill")
    # 15 micro-batches of 10 (each takes a good fraction of a second): the kill, after the
    # third, lands mid-stream.
    first = [(f"{prefix}/a", f"before {i}".encode()) for i in range(150)]
    second = [(f"{prefix}/b", f"after {i}".encode()) for i in range(60)]
    publish(paho, process.address, first)
    df = stream(spark, url, f"{prefix}/#", 0, maxOffsetsPerTrigger="10")
    query = (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "sink"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:

        def processed() -> int:
            progress = query.lastProgress
            if not progress or not progress["sources"][0]["endOffset"]:
                return 0
            end = progress["sources"][0]["endOffset"]
            return int((json.loads(end) if isinstance(end, str) else end)["0"])

        wait_until(lambda: processed() > 20, timeout=QUERY_TIMEOUT)
        process.kill()
        assert processed() < latest_known_end(first), "the kill must land mid-stream"
        process.restart()
        publish(paho, process.address, second)
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    rows = rows_of(spark.read.parquet(str(tmp_path / "sink")))
    assert sorted((t, p) for _o, t, p, _q in rows) == sorted(first + second)
    assert len({o for o, *_rest in rows}) == len(rows) == len(first) + len(second)


def latest_known_end(items: list[Any]) -> int:
    """The first batch's end offset: ids start at 1 on a fresh broker."""
    return len(items) + 1
