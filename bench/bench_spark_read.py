"""Read throughput of ``format("kittiwake")``: rows/s for a batch read of a 1,000,000-message
journal over Arrow Flight, and for a stream read of it to a no-op sink, on Spark ``local[2]``.

A standalone script, not a test: ``python bench/bench_spark_read.py [--messages N] [--repeat 3]``
(``make bench-spark``). The peer, in the same run, is a Python data source reading the SQLite
file directly in the executor (what was measured before the Flight service existed): the
network hop's price is the ratio between the two.

The journal is written once by the store's own code (no MQTT, to keep set-up short), then
served by a real ``kittiwake serve`` with a flight listener.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parent.parent / "src"
sys.path.insert(0, str(SRC))

import pyarrow.flight as flight  # noqa: E402

from kittiwake.broker.message import Message  # noqa: E402
from kittiwake.flight.protocol import RangeRequest, parse_latest_answer  # noqa: E402
from kittiwake.store.journal_selection import JournalSelection  # noqa: E402
from kittiwake.store.sqlite import DATABASE_FILE, SQLiteStore  # noqa: E402


def write_journal(data_dir: Path, messages: int, payload_size: int) -> None:
    async def fill() -> None:
        store = SQLiteStore(
            data_dir,
            journal_retention_seconds=10 * 365 * 86400,
            journal_selection=JournalSelection(enabled=True),
            synchronous="NORMAL",
        )
        payload = b"x" * payload_size
        written = 0
        while written < messages:
            for i in range(written, min(messages, written + 5000)):
                store.journal(
                    Message(f"sensors/dev{i % 500}/temp", payload, qos=1, persistent=True)
                )
            written = min(messages, written + 5000)
            commit = store.commit()
            if commit is not None:
                await commit
        store.close()

    asyncio.run(fill())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FlightBroker:
    """``kittiwake serve`` over ``data_dir`` with flight and MQTT listeners on free ports; its
    config file goes beside ``data_dir``. Both Spark benches start their broker this way."""

    def __init__(self, data_dir: Path) -> None:
        self.mqtt_port = free_port()
        flight_port = free_port()
        config = data_dir.parent / "kittiwake.toml"
        config.write_text(
            f"""log_level = "warning"
[[listeners]]
protocol = "flight"
port = {flight_port}
[[listeners]]
port = {self.mqtt_port}
[store]
data_dir = "{data_dir}"
[journal]
retention_seconds = 315360000
"""
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kittiwake", "serve", "--config", str(config)],
            env={**os.environ, "PYTHONPATH": str(SRC)},
        )
        self.url = f"grpc://127.0.0.1:{flight_port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                self.bounds()
                return
            except flight.FlightUnavailableError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise
                time.sleep(0.1)

    def bounds(self) -> tuple[int, int]:
        """The journal's (earliest, high water) offsets, from the service's ``latest`` action."""
        client = flight.connect(self.url)
        try:
            (answer,) = list(client.do_action(flight.Action("latest", b"")))
            return parse_latest_answer(answer.body.to_pybytes())[0]
        finally:
            client.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(30)


def flight_only(url: str, start: int, end: int) -> int:
    """Rows pulled by one plain Flight client (no Spark): the service's own ceiling."""
    client = flight.connect(url)
    reader = client.do_get(flight.Ticket(RangeRequest(start, end, ("#",)).to_ticket()))
    rows = sum(chunk.data.num_rows for chunk in reader)
    client.close()
    return rows


class DirectSQLiteReaderPeer:
    """The peer: a Python data source reading SQLite directly in the executor."""

    @staticmethod
    def define() -> Any:
        from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

        class Part(InputPartition):  # type: ignore[misc]
            def __init__(self, path: str, start: int, end: int) -> None:
                self.path, self.start, self.end = path, start, end

        class Reader(DataSourceReader):  # type: ignore[misc]
            def __init__(self, options: dict[str, str]) -> None:
                self.options = options

            def partitions(self) -> list[Any]:
                start, end, parts = (int(self.options[k]) for k in ("start", "end", "parts"))
                step = (end - start + parts - 1) // parts
                return [
                    Part(self.options["path"], s, min(end, s + step))
                    for s in range(start, end, step)
                ]

            def read(self, partition: Any) -> Iterator[Any]:
                import pyarrow as pa

                from kittiwake.flight.batches import record_batch
                from kittiwake.store.journal_range import JournalChunk

                names = ("message_id", "topic", "payload", "qos", "retain", "priority")

                connection = sqlite3.connect(f"file:{partition.path}?mode=ro", uri=True)
                cursor = connection.execute(
                    "SELECT message_id, topic, payload, qos, retain, priority, timestamp "
                    "FROM journal WHERE message_id >= ? AND message_id < ? ORDER BY message_id",
                    (partition.start, partition.end),
                )
                while rows := cursor.fetchmany(65536):
                    columns = zip(*rows, strict=True)
                    raw = pa.record_batch(list(columns), names=[*names, "timestamp"])
                    yield record_batch(JournalChunk(raw), False)
                connection.close()

        class Source(DataSource):  # type: ignore[misc]
            @classmethod
            def name(cls) -> str:
                return "sqlite_direct"

            def schema(self) -> str:
                from kittiwake.flight.protocol import DDL

                return DDL

            def reader(self, schema: Any) -> Reader:
                return Reader(self.options)

        return Source


def timed(runs: int, body: Callable[[], int]) -> list[tuple[float, int]]:
    results = []
    for _ in range(runs):
        started = time.perf_counter()
        rows = body()
        results.append((time.perf_counter() - started, rows))
    return results


def report(name: str, results: list[tuple[float, int]]) -> float:
    rates = [rows / seconds for seconds, rows in results]
    median = statistics.median(rates)
    print(
        f"{name:<44} {median:>12,.0f} rows/s   (min {min(rates):,.0f}, max {max(rates):,.0f}; "
        f"{len(rates)} runs of {results[0][1]:,} rows)"
    )
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--partitions",
        default="1,2",
        help="Spark partitions per read, comma-separated (1 is the source's default)",
    )
    parser.add_argument("--smoke", action="store_true", help="50,000 messages, one run each")
    args = parser.parse_args()
    if args.smoke:
        args.messages, args.repeat = 50_000, 1
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Spark's Python workers import kittiwake from this tree too, not from wherever the
    # virtualenv has it installed (another checkout).
    os.environ["PYTHONPATH"] = str(SRC)
    with tempfile.TemporaryDirectory(prefix="kw-bench-spark-") as tmp:
        data_dir = Path(tmp) / "data"
        started = time.perf_counter()
        write_journal(data_dir, args.messages, args.payload)
        print(
            f"journal of {args.messages:,} messages written in {time.perf_counter() - started:.1f}s"
        )
        broker = FlightBroker(data_dir)
        try:
            earliest, high_water = broker.bounds()
            run_all(args, broker.url, earliest, high_water, str(data_dir / DATABASE_FILE))
        finally:
            broker.stop()


def run_all(args: Any, url: str, start: int, end: int, db_path: str) -> None:
    from pyspark.sql import SparkSession

    from kittiwake.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(DirectSQLiteReaderPeer.define())

    def kittiwake_batch(partitions: int) -> int:
        df = (
            spark.read.format("kittiwake")
            .option("url", url)
            .option("topics", "#")
            .option("minPartitions", str(partitions))
            .load()
        )
        df.write.format("noop").mode("overwrite").save()
        return end - start

    def direct_batch(partitions: int) -> int:
        df = (
            spark.read.format("sqlite_direct")
            .option("path", db_path)
            .option("start", str(start))
            .option("end", str(end))
            .option("parts", str(partitions))
            .load()
        )
        df.write.format("noop").mode("overwrite").save()
        return end - start

    def kittiwake_stream(partitions: int) -> int:
        checkpoint = tempfile.mkdtemp(prefix="kw-bench-checkpoint-")
        query = (
            spark.readStream.format("kittiwake")
            .option("url", url)
            .option("topics", "#")
            .option("startingOffsets", "earliest")
            .option("minPartitions", str(partitions))
            .option("maxOffsetsPerTrigger", str(max(1, (end - start) // 4)))
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        assert rows == end - start, (rows, end - start)
        return rows

    kittiwake_batch(1)  # warm-up: JVM, Python workers
    direct_batch(1)
    print(f"Spark local[2], {args.payload}-byte payloads, rows/s: median (min, max)")
    plain = timed(args.repeat, lambda: flight_only(url, start, end))
    report("Flight do_get, one plain client (no Spark)", plain)
    for partitions in (int(p) for p in str(args.partitions).split(",")):
        ours = report(
            f"kittiwake batch read, {partitions} partition(s) -> noop",
            timed(args.repeat, lambda p=partitions: kittiwake_batch(p)),
        )
        peer = report(
            f"peer: SQLite in the executor, {partitions} partition(s)",
            timed(args.repeat, lambda p=partitions: direct_batch(p)),
        )
        report(
            f"kittiwake stream read, {partitions} partition(s), 4 batches",
            timed(args.repeat, lambda p=partitions: kittiwake_stream(p)),
        )
        print(f"{'':<4}batch over Flight / direct SQLite peer ({partitions}): {ours / peer:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
