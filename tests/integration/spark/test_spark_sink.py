"""``df.write`` / ``df.writeStream.format("kittiwake")`` on a real local Spark, into a real
broker over Arrow Flight: rows reach MQTT subscribers (paho-mqtt) and the journal exactly once,
retained where asked; a replayed batch, a retried task and a kill -9 of the driver or of the
broker publish nothing twice.

The package's one SparkSession (conftest.py), small data. Marked ``spark``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..brokerproc import SRC_DIR, BrokerProcess
from ..clients import MQTTv5, PahoClient, unique, wait_until

# Each Spark wait is bounded on its own (QUERY_TIMEOUT and the like); a test makes several, so
# the suite-wide 120 s per test is too short on a loaded machine (a driver start alone can take
# a minute there).
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

pyspark = pytest.importorskip("pyspark", reason="needs the spark extra: make test-deps")
flight = pytest.importorskip("pyarrow.flight")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.streaming import StreamingQuery  # noqa: E402

from kittiwake.flight.protocol import RangeRequest, parse_latest_answer  # noqa: E402
from kittiwake.spark import KittiwakeDataSource  # noqa: E402
from kittiwake.spark.options import SinkOptions  # noqa: E402
from kittiwake.spark.sink import KittiwakeBatchWriter, PartitionWritten, check_schema  # noqa: E402

JOURNAL = {"retention_seconds": 3600}
QUERY_TIMEOUT = 120
# A driver process of its own: its start alone can take a minute on a loaded machine.
DRIVER_TIMEOUT = 240
JOB = Path(__file__).with_name("pipeline_job.py")


@pytest.fixture(scope="module")
def sink_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("sink"), flight=True, journal=JOURNAL)
    process.start()
    yield process
    process.stop()


def high_water(url: str) -> int:
    connection = flight.connect(url)
    try:
        (result,) = list(connection.do_action(flight.Action("latest", b"")))
        return parse_latest_answer(result.body.to_pybytes())[0][1]
    finally:
        connection.close()


def journal_rows(url: str, topic_filter: str, start: int = 0) -> list[tuple[str, bytes, int]]:
    """(topic, payload, qos) of every journalled row on the filter, in offset order."""
    connection = flight.connect(url)
    try:
        (result,) = list(connection.do_action(flight.Action("latest", b"")))
        end = parse_latest_answer(result.body.to_pybytes())[0][1]
        ticket = RangeRequest(start, end, (topic_filter,)).to_ticket()
        table = connection.do_get(flight.Ticket(ticket)).read_all()
        return [(r["topic"], r["payload"], r["qos"]) for r in table.to_pylist()]
    finally:
        connection.close()


def publish(paho: Callable[..., PahoClient], address: tuple[str, int], items: list[Any]) -> None:
    publisher = paho(address)
    for topic, payload in items:
        publisher.publish(topic, payload, 1)  # PUBACK'd: committed to the journal


def received(subscriber: PahoClient, count: int) -> list[tuple[str, bytes]]:
    """Exactly ``count`` messages, and then no more."""
    got = [(m.topic, m.payload) for m in subscriber.get_many(count, timeout=30)]
    subscriber.no_message(within=0.5)
    return got


def test_a_batch_write_reaches_subscribers_and_the_journal_once_and_retains(
    spark: SparkSession, sink_broker: BrokerProcess, paho: Callable[..., PahoClient]
) -> None:
    prefix = unique("write")
    url = sink_broker.flight_url
    subscriber = paho(sink_broker.address, protocol=MQTTv5)
    subscriber.subscribe(f"{prefix}/#", 1)
    readings = [
        (f"{prefix}/dev{i % 3}", f"reading {i}", 0 if i % 5 == 0 else None, False, {"n": str(i)})
        for i in range(30)
    ]
    stats = [(f"{prefix}/stats/dev{i}", f"mean {i}", 1, True, None) for i in range(3)]
    df = spark.createDataFrame(
        readings + stats,
        "topic string, payload string, qos int, retain boolean, properties map<string,string>",
    ).repartition(3)
    df.write.format("kittiwake").option("url", url).mode("append").save()

    got = subscriber.get_many(len(readings) + len(stats), timeout=30)
    subscriber.no_message(within=0.5)
    assert sorted((m.topic, m.payload.decode()) for m in got) == sorted(
        (topic, payload) for topic, payload, *_ in readings + stats
    )
    by_payload = {m.payload.decode(): m for m in got}
    assert by_payload["reading 5"].qos == 0 and by_payload["reading 6"].qos == 1
    assert by_payload["reading 7"].properties.UserProperty == [("n", "7")]
    # QoS 0 rows are delivered but, like any QoS 0 publication, not journalled (no opt-in).
    assert sorted(journal_rows(url, f"{prefix}/#")) == sorted(
        (topic, payload.encode(), 1 if qos is None else qos)
        for topic, payload, qos, *_ in readings + stats
        if qos != 0
    )
    late = paho(sink_broker.address)
    late.subscribe(f"{prefix}/stats/#", 1)
    retained = late.get_many(3)
    assert sorted((m.topic, m.payload.decode(), m.retain) for m in retained) == [
        (topic, payload, True) for topic, payload, *_ in stats
    ]


def test_a_replayed_batch_publishes_nothing_twice(
    spark: SparkSession,
    sink_broker: BrokerProcess,
    paho: Callable[..., PahoClient],
    tmp_path: Path,
) -> None:
    """Batch 1 fails after its partition 0 was published (partition 1 fails on every attempt
    until a marker exists); the query restarted from its checkpoint replays batch 1 with the
    same query id and batch id: partition 0 is answered "already committed", partition 1 is
    published, and every row arrives once."""
    prefix = unique("replay")
    url = sink_broker.flight_url
    start = high_water(url)
    items = [(f"{prefix}/in", f"row {i}".encode()) for i in range(20)]
    publish(paho, sink_broker.address, items)
    subscriber = paho(sink_broker.address)
    subscriber.subscribe(f"{prefix}/out/#", 1)
    marker = tmp_path / "may-pass"
    out_filter = f"{prefix}/out/#"

    def fail_batch_1_partition_1(batches: Iterator[Any]) -> Iterator[Any]:
        # Runs on an executor: pickled by value, so it uses nothing of this test module.
        import time as clock

        import pyarrow.flight as executor_flight
        from pyspark import TaskContext as ExecutorTaskContext

        from kittiwake.flight.protocol import RangeRequest as Range
        from kittiwake.flight.protocol import parse_latest_answer as bounds_of

        def published() -> int:
            connection = executor_flight.connect(url)
            try:
                (answer,) = list(connection.do_action(executor_flight.Action("latest", b"")))
                end = bounds_of(answer.body.to_pybytes())[0][1]
                ticket = executor_flight.Ticket(Range(start, end, (out_filter,)).to_ticket())
                return int(connection.do_get(ticket).read_all().num_rows)
            finally:
                connection.close()

        context = ExecutorTaskContext.get()
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        if batch_id == "1" and context.partitionId() == 1 and not marker.exists():
            # Fail once batch 0 (10 rows) and batch 1's partition 0 (5 rows) are published.
            deadline = clock.monotonic() + 60
            while published() < 15 and clock.monotonic() < deadline:
                clock.sleep(0.05)
            raise RuntimeError("injected failure in batch 1, partition 1")
        yield from batches

    def run() -> Any:
        df = (
            spark.readStream.format("kittiwake")
            .option("url", url)
            .option("topics", f"{prefix}/in")
            .option("startingOffsets", json.dumps({"0": start}))
            .option("maxOffsetsPerTrigger", "10")
            .option("minPartitions", "2")
            .load()
            .selectExpr(f"'{prefix}/out/t' AS topic", "payload")
        )
        out = df.mapInArrow(fail_batch_1_partition_1, df.schema)
        return (
            out.writeStream.format("kittiwake")
            .option("url", url)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    failed = run()
    with pytest.raises(Exception, match="injected failure"):
        failed.awaitTermination(QUERY_TIMEOUT)
    assert len(journal_rows(url, out_filter, start)) == 15
    marker.touch()
    restarted = run()
    assert restarted.id == failed.id, "the same query, restarted from its checkpoint"
    assert restarted.awaitTermination(QUERY_TIMEOUT)
    assert restarted.exception() is None

    expected = sorted((f"{prefix}/out/t", payload) for _topic, payload in items)
    assert sorted(received(subscriber, len(items))) == expected
    assert sorted((t, p) for t, p, _q in journal_rows(url, out_filter, start)) == expected
    assert f"writer {failed.id} batch 1 partition 0 was committed before" in (
        sink_broker.log_text()
    ), "batch 1 must have been replayed into the fence"


def test_a_retried_task_publishes_nothing_twice(
    spark: SparkSession, sink_broker: BrokerProcess, paho: Callable[..., PahoClient]
) -> None:
    prefix = unique("retry")
    url = sink_broker.flight_url
    subscriber = paho(sink_broker.address)
    subscriber.subscribe(f"{prefix}/#", 1)
    items = [(f"{prefix}/t{i % 2}", f"value {i}") for i in range(12)]

    # Defined here, so Spark pickles them by value for its executors.
    class FailsAfterItsFirstPut(KittiwakeBatchWriter):
        """A task that dies after its put (its answer lost): Spark runs it again."""

        def write(self, iterator: Iterator[Any]) -> PartitionWritten:
            from pyspark import TaskContext as ExecutorTaskContext

            written = super().write(iterator)
            context = ExecutorTaskContext.get()
            if context.partitionId() == 0 and context.attemptNumber() == 0:
                raise RuntimeError("the task fails after its put")
            return written

    class RetriedTaskSource(KittiwakeDataSource):
        @classmethod
        def name(cls) -> str:
            return "kittiwake_retried_task"

        def writer(self, schema: Any, overwrite: bool) -> KittiwakeBatchWriter:
            check_schema(schema)
            return FailsAfterItsFirstPut(SinkOptions.parse(self.options))

    spark.dataSource.register(RetriedTaskSource)
    df = spark.createDataFrame(items, "topic string, payload string").repartition(2)
    df.write.format("kittiwake_retried_task").option("url", url).mode("append").save()

    expected = sorted((topic, payload.encode()) for topic, payload in items)
    assert sorted(received(subscriber, len(items))) == expected
    assert sorted((t, p) for t, p, _q in journal_rows(url, f"{prefix}/#")) == expected
    assert "batch 0 partition 0 was committed before" in sink_broker.log_text()


def test_every_row_reaches_the_sink_exactly_once_across_a_broker_kill9(
    spark: SparkSession,
    broker: Callable[..., BrokerProcess],
    paho: Callable[..., PahoClient],
    tmp_path: Path,
) -> None:
    """A stream reads from Kittiwake and writes back through format("kittiwake"); the broker
    is killed (-9) while batch 1 is being written (its partition 0 published, partition 1 held
    back until a marker file exists), restarted on the same ports, and the query restarted
    from its checkpoint: batch 1 is replayed, the fence the broker kept through the kill
    refuses its partition 0, and every input row reaches the journal and an offline
    persistent MQTT session exactly once."""
    process = broker(flight=True, journal=JOURNAL)
    url = process.flight_url
    prefix = unique("brokerkill")
    out_filter = f"{prefix}/out/#"
    # Micro-batches of 20 offsets from here, each in 2 partitions of 10.
    start = high_water(url)
    first = [(f"{prefix}/in/{i % 3}", f"reading {i}".encode()) for i in range(60)]
    second = [(f"{prefix}/in/{i % 3}", f"late {i}".encode()) for i in range(20)]
    # Subscribed, then offline: its session keeps every output row for it, each once (an
    # online QoS 1 subscriber could legitimately get a row twice across the kill, marked DUP).
    session = unique("offline")
    subscriber = paho(process.address, session, clean=False)
    subscriber.subscribe(out_filter, 1)
    subscriber.disconnect()
    publish(paho, process.address, first)
    marker = tmp_path / "may-pass"
    checkpoint = tmp_path / "checkpoint"

    def hold_batch_1_partition_1(batches: Iterator[Any]) -> Iterator[Any]:
        # Runs on an executor: pickled by value, so it uses nothing of this test module.
        import os as executor_os
        import time as clock

        from pyspark import TaskContext as ExecutorTaskContext

        context = ExecutorTaskContext.get()
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        if batch_id == "1" and context.partitionId() == 1:
            deadline = clock.monotonic() + 300
            while not executor_os.path.exists(marker) and clock.monotonic() < deadline:
                clock.sleep(0.05)
        yield from batches

    def run(**trigger: Any) -> StreamingQuery:
        df = (
            spark.readStream.format("kittiwake")
            .option("url", url)
            .option("topics", f"{prefix}/in/#")
            .option("startingOffsets", json.dumps({"0": start}))
            .option("maxOffsetsPerTrigger", "20")
            .option("minPartitions", "2")
            .load()
            .selectExpr(
                f"concat('{prefix}/out/', topic) AS topic",
                "upper(CAST(payload AS STRING)) AS payload",
            )
        )
        return (
            df.mapInArrow(hold_batch_1_partition_1, df.schema)
            .writeStream.format("kittiwake")
            .option("url", url)
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    running = run(processingTime="100 milliseconds")
    try:
        # Batch 0 (20 rows) and batch 1's partition 0 (10) are published; partition 1 waits.
        in_flight = wait_until(
            lambda: len(journal_rows(url, out_filter)) >= 30, timeout=QUERY_TIMEOUT
        )
        process.kill()
    finally:
        running.stop()
    assert in_flight, "batch 1's partition 0 was not published in time"
    assert (checkpoint / "offsets" / "1").exists() and not (checkpoint / "commits" / "1").exists()
    process.restart()
    # What the broker had committed before the kill is there, and nothing more came since.
    assert len(journal_rows(url, out_filter)) == 30, "the kill must land with batch 1 half written"
    publish(paho, process.address, second)

    marker.touch()
    restarted = run(availableNow=True)
    assert restarted.id == running.id, "the same query, restarted from its checkpoint"
    assert restarted.awaitTermination(QUERY_TIMEOUT), "the stream did not finish in time"
    assert restarted.exception() is None, restarted.exception()

    items = first + second
    expected = sorted((f"{prefix}/out/{topic}", payload.upper()) for topic, payload in items)
    journalled = [(t, p) for t, p, _q in journal_rows(url, out_filter)]
    assert len(journalled) == len(items)
    assert len(set(journalled)) == len(items)
    assert sorted(journalled) == expected
    assert f"writer {running.id} batch 1 partition 0 was committed before" in (
        process.log_text()
    ), "the replayed batch 1 must have met the fence of its published partition 0"
    subscriber = paho(process.address, session, clean=False)
    assert subscriber.session_present
    assert sorted(received(subscriber, len(items))) == expected


def test_every_row_reaches_the_sink_exactly_once_across_a_driver_kill9(
    sink_broker: BrokerProcess, paho: Callable[..., PahoClient], tmp_path: Path
) -> None:
    """The streaming job runs as its own driver process; it is killed (-9, with its JVM) while
    batch 1 is in flight (its partition 0 published, partition 1 held back by the job until a
    marker file exists) and restarted from its checkpoint: Spark replays batch 1, the broker's
    fence refuses its partition 0 again, and every input row reaches the sink once."""
    prefix = unique("driver")
    url = sink_broker.flight_url
    # 4 micro-batches of 30 offsets from here (the module's broker journalled other tests'
    # rows before), each in 2 partitions of 15: the items' rows, published one after another.
    start = high_water(url)
    items = [(f"{prefix}/in/{i % 4}", f"reading {i}".encode()) for i in range(120)]
    publish(paho, sink_broker.address, items)
    subscriber = paho(sink_broker.address)
    subscriber.subscribe(f"{prefix}/out/#", 1)
    out_filter = f"{prefix}/out/#"
    checkpoint = tmp_path / "checkpoint"
    marker = tmp_path / "may-pass"
    command = [
        sys.executable,
        str(JOB),
        "--master",
        "local[2]",
        "--url",
        url,
        "--topics",
        f"{prefix}/in/#",
        "--out",
        f"{prefix}/out",
        "--checkpoint",
        str(checkpoint),
        "--starting-offset",
        str(start),
        "--max-offsets",
        "30",
        "--hold",
        str(marker),
    ]
    env = {**os.environ, "PYTHONPATH": str(SRC_DIR), "PYSPARK_PYTHON": sys.executable}
    log = open(tmp_path / "driver.log", "wb")  # noqa: SIM115 - closed below
    first = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        # Batch 0 (30 rows) and batch 1's partition 0 (15) are published; partition 1 waits.
        in_flight = wait_until(
            lambda: first.poll() is None and len(journal_rows(url, out_filter)) >= 45,
            timeout=DRIVER_TIMEOUT,
            interval=0.05,
        )
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver: Python and its JVM
        first.wait(10)
    assert in_flight, (
        "batch 1's partition 0 was not published in time:\n"
        + (tmp_path / "driver.log").read_text(errors="replace")[-5000:]
    )
    written_before = len(journal_rows(url, out_filter))
    assert written_before == 45, "the kill must land mid-stream, batch 1 half written"
    # Batch 1 was planned (its offsets logged) and never committed: a restart replays it.
    assert (checkpoint / "offsets" / "1").exists()
    assert not (checkpoint / "commits" / "1").exists()
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]

    marker.touch()
    again = subprocess.run(
        [*command, "--available-now"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        timeout=DRIVER_TIMEOUT,
    )
    log.close()
    assert again.returncode == 0, (tmp_path / "driver.log").read_text()[-5000:]
    expected = sorted((f"{prefix}/out/{topic}", payload.upper()) for topic, payload in items)
    journalled = [(t, p) for t, p, _q in journal_rows(url, out_filter)]
    assert len(journalled) == len(items)
    assert len(set(journalled)) == len(items)
    assert sorted(journalled) == expected
    assert sorted(received(subscriber, len(items))) == expected
    assert f"writer {query_id} batch 1 partition 0 was committed before" in (
        sink_broker.log_text()
    ), "the replayed batch 1 must have met the fence of its published partition 0"
