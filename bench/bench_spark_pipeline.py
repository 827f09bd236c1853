"""End-to-end exactly-once throughput of ``format("kittiwake")``: a Structured Streaming query on
Spark ``local[2]`` reads a journal of 1,000,000 messages over Arrow Flight, transforms every row
and writes it back into the broker through the sink (fenced puts: every row published once,
journalled, fsync'd), in rows/s from the query's start to its end.

A standalone script, not a test: ``python bench/bench_spark_pipeline.py [--repeat 3]``
(part of ``make bench-spark``). Each run starts from the same journal (a copy of one written
once by the store's own code) on a fresh ``kittiwake serve``, and checks that exactly one row
came back per row read. In the same run, for comparison:

* the same query to Spark's ``noop`` sink: the read and the transform alone (the ceiling);
* the same transform as a batch job (``spark.read`` ... ``df.write.format("kittiwake")``);
* the peer: what a pipeline does without the sink, publishing each row with paho-mqtt at
  QoS 1 from ``foreachPartition`` (at least once: a retried task publishes again), on a
  tenth of the rows (it is that much slower).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_spark_read import SRC, FlightBroker, report, write_journal

# Rows per micro-batch, split into partitions of at most limits.max_put_rows (200,000) each.
BATCH_ROWS = 250_000
PARTITIONS = 2


class Broker(FlightBroker):
    """``kittiwake serve`` over a fresh copy of a journal, so every run starts from the same one."""

    def __init__(self, template: Path, workdir: Path) -> None:
        data_dir = workdir / "data"
        shutil.copytree(template, data_dir)
        super().__init__(data_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="50,000 messages, one run each")
    args = parser.parse_args()
    if args.smoke:
        args.messages, args.repeat = 50_000, 1
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Spark's Python workers import kittiwake from this tree too, not from wherever the
    # virtualenv has it installed (another checkout).
    os.environ["PYTHONPATH"] = str(SRC)
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
    with tempfile.TemporaryDirectory(prefix="kw-bench-pipeline-") as tmp:
        template = Path(tmp) / "template"
        started = time.perf_counter()
        write_journal(template, args.messages, args.payload)
        took = time.perf_counter() - started
        print(f"journal of {args.messages:,} messages written in {took:.1f}s")
        runs = iter(range(1_000_000))

        def on_fresh_broker(body: Callable[[Broker], int]) -> Callable[[], tuple[float, int]]:
            def run() -> tuple[float, int]:
                workdir = Path(tmp) / f"run{next(runs)}"
                workdir.mkdir()
                broker = Broker(template, workdir)
                try:
                    started = time.perf_counter()
                    rows = body(broker)
                    elapsed = time.perf_counter() - started
                finally:
                    broker.stop()
                    shutil.rmtree(workdir, ignore_errors=True)
                return elapsed, rows

            return run

        def stream(sink: str) -> Callable[[Broker], int]:
            def body(broker: Broker) -> int:
                start, end = broker.bounds()
                writer = (
                    transformed(
                        spark.readStream.format("kittiwake")
                        .option("url", broker.url)
                        .option("topics", "sensors/#")
                        .option("startingOffsets", "earliest")
                        .option("maxOffsetsPerTrigger", str(BATCH_ROWS))
                        .option("minPartitions", str(PARTITIONS))
                        .load()
                    )
                    .writeStream.format(sink)
                    .option("checkpointLocation", tempfile.mkdtemp(dir=tmp))
                    .trigger(availableNow=True)
                )
                if sink == "kittiwake":
                    writer = writer.option("url", broker.url)
                query = writer.start()
                query.awaitTermination()
                if query.exception() is not None:
                    raise RuntimeError(query.exception())
                rows = sum(p["numInputRows"] for p in query.recentProgress)
                assert rows == end - start, (rows, end - start)
                if sink == "kittiwake":
                    written = broker.bounds()[1] - end
                    assert written == rows, f"{written} rows came back for {rows} read"
                return rows

            return body

        def batch(broker: Broker) -> int:
            start, end = broker.bounds()
            df = (
                spark.read.format("kittiwake")
                .option("url", broker.url)
                .option("topics", "sensors/#")
                .option("minPartitions", str(max(PARTITIONS, -(-(end - start) // 125_000))))
                .load()
            )
            transformed(df).write.format("kittiwake").option("url", broker.url).mode(
                "append"
            ).save()
            written = broker.bounds()[1] - end
            assert written == end - start, f"{written} rows came back for {end - start} read"
            return written

        def paho_peer(broker: Broker) -> int:
            start, end = broker.bounds()
            limit = max(1, (end - start) // 10)
            df = (
                spark.read.format("kittiwake")
                .option("url", broker.url)
                .option("topics", "sensors/#")
                .option("endingOffsets", f'{{"0": {start + limit}}}')
                .option("minPartitions", str(PARTITIONS))
                .load()
            )
            port = broker.mqtt_port
            transformed(df).foreachPartition(lambda rows: publish_with_paho(port, rows))
            written = broker.bounds()[1] - end
            assert written == limit, f"{written} rows came back for {limit} read"
            return written

        on_fresh_broker(stream("noop"))()  # warm-up: JVM, Python workers
        print(
            f"Spark local[2], {args.payload}-byte payloads, micro-batches of {BATCH_ROWS:,} rows "
            f"in {PARTITIONS} partitions; rows/s: median (min, max)"
        )
        ours = report(
            "stream: read, transform, write back (exactly once)",
            [on_fresh_broker(stream("kittiwake"))() for _ in range(args.repeat)],
        )
        ceiling = report(
            "stream: read, transform -> noop (no write)",
            [on_fresh_broker(stream("noop"))() for _ in range(args.repeat)],
        )
        report(
            "batch: read, transform, df.write back",
            [on_fresh_broker(batch)() for _ in range(args.repeat)],
        )
        peer = report(
            "peer: read, transform, paho QoS 1 per row (1/10)",
            [on_fresh_broker(paho_peer)() for _ in range(args.repeat)],
        )
        print(f"{'':<4}exactly-once write back / no write: {ours / ceiling:.2f}")
        print(f"{'':<4}exactly-once sink / paho QoS 1 peer: {ours / peer:.2f}")
    spark.stop()


def transformed(df: Any) -> Any:
    """The pipeline's transform: a new topic, the payload upper-cased."""
    return df.selectExpr(
        "concat('out/', topic) AS topic", "upper(CAST(payload AS STRING)) AS payload"
    )


def publish_with_paho(port: int, rows: Any) -> None:
    """The peer's writer: one MQTT connection per partition, each row at QoS 1, acknowledged."""
    import paho.mqtt.client as mqtt

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", port)
    client.loop_start()
    sent = [client.publish(row.topic, row.payload, qos=1) for row in rows]
    for info in sent:
        info.wait_for_publish(120)
    client.disconnect()
    client.loop_stop()


if __name__ == "__main__":
    main()
