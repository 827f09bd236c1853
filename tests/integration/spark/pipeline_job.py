"""A Spark job of its own (its driver is a process the tests can kill -9, or a client of a
standalone cluster): reads ``--topics`` from Kittiwake, upper-cases each payload and writes it
back under ``--out/<topic>``, exactly once.

``--mode stream`` runs a Structured Streaming query checkpointed in ``--checkpoint`` (until
killed, or with ``--available-now`` until it has caught up); ``--hold MARKER`` makes batch 1's
partition 1 wait (bounded) until the file MARKER exists, so a test can kill the driver while
batch 1 is in flight with its partition 0 published. ``--mode batch`` reads the journal as a
batch, writes the result with ``df.write`` and prints as JSON what it read and where the driver
and an executor imported kittiwake from.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

from kittiwake.spark import register


def transformed(df: DataFrame, out: str) -> DataFrame:
    return df.selectExpr(
        f"concat('{out}/', topic) AS topic", "upper(CAST(payload AS STRING)) AS payload"
    )


HOLD_TIMEOUT = 300


def held_until(marker: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function (pickled by value from __main__ for the executors) that passes
    rows through, except that batch 1's partition 1 first waits for ``marker`` to exist."""

    def hold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        assert context is not None
        if context.getLocalProperty("streaming.sql.batchId") == "1" and context.partitionId() == 1:
            deadline = time.monotonic() + HOLD_TIMEOUT
            while not os.path.exists(marker):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{marker} did not appear within {HOLD_TIMEOUT}s")
                time.sleep(0.05)
        yield from batches

    return hold


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--topics", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=("stream", "batch"), default="stream")
    parser.add_argument("--checkpoint")
    parser.add_argument("--starting-offset", help="the stream's first offset (default earliest)")
    parser.add_argument("--max-offsets", default="20")
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--hold")
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(args.master)
        .appName("kittiwake-pipeline-job")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    if args.mode == "batch":
        source = (
            spark.read.format("kittiwake")
            .option("url", args.url)
            .option("topics", args.topics)
            .option("minPartitions", "2")
            .load()
        )
        rows = source.selectExpr("topic", "CAST(payload AS STRING) AS payload").collect()
        transformed(source, args.out).write.format("kittiwake").option("url", args.url).mode(
            "append"
        ).save()
        (on_executor,) = (
            spark.sparkContext.parallelize([0], 1)
            .map(lambda _: importlib.import_module("kittiwake").__file__)
            .collect()
        )
        import kittiwake

        report = {
            "rows": sorted([row.topic, row.payload] for row in rows),
            "kittiwake_on_driver": kittiwake.__file__,
            "kittiwake_on_executor": on_executor,
        }
        print(json.dumps(report), flush=True)
        spark.stop()
        return
    stream = (
        spark.readStream.format("kittiwake")
        .option("url", args.url)
        .option("topics", args.topics)
        .option(
            "startingOffsets",
            "earliest"
            if args.starting_offset is None
            else json.dumps({"0": int(args.starting_offset)}),
        )
        .option("maxOffsetsPerTrigger", args.max_offsets)
        .option("minPartitions", "2")
        .load()
    )
    out = transformed(stream, args.out)
    if args.hold:
        out = out.mapInArrow(held_until(args.hold), out.schema)
    writer = (
        out.writeStream.format("kittiwake")
        .option("url", args.url)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="100 milliseconds")
    query = writer.start()
    print("started", flush=True)
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
