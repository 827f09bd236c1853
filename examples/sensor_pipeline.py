"""The sensor pipeline on Spark Structured Streaming, from Kittiwake back to Kittiwake.

Reads the readings the devices publish (``sensors/+/reading``, JSON) from the broker's
journal, and writes two results back into the broker, exactly once:

* ``stats/<device>``: per device and 10-second window, the count, mean, min and max
  temperature and mean humidity, as a **retained** MQTT message (a subscriber that comes
  later gets every device's latest window at once), published once per window when the
  window closes (when readings ``LATENESS`` newer than its end have been seen);
* ``alerts/<device>`` at **QoS 1**: an anomalous reading: a temperature above
  ``MAX_TEMPERATURE`` (the devices run at 18-26 °C) or a humidity outside 0-100 %.

Two streaming queries, each checkpointed: restarted with the same checkpoint directory they
go on where they stopped, and what they publish is published once (the sink's fences).

    python examples/sensor_pipeline.py grpc://127.0.0.1:8815 /tmp/sensor-checkpoints
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from kittiwake.spark import register

READING = "device string, ts long, temperature double, humidity double"
WINDOW = "10 seconds"
# A reading may arrive this late and still count in its window.
LATENESS = "5 seconds"
MAX_TEMPERATURE = 40.0


def readings(spark: SparkSession, url: str, **options: str) -> DataFrame:
    """The devices' readings, parsed, with their event time."""
    reader = (
        spark.readStream.format("kittiwake")
        .option("url", url)
        .option("topics", "sensors/+/reading")
        .option("startingOffsets", "earliest")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .select(F.from_json(F.col("payload").cast("string"), READING).alias("r"))
        .select("r.*")
        .where(F.col("device").isNotNull())
        .withColumn("event_time", F.timestamp_millis("ts"))
    )


def window_stats(readings: DataFrame, window: str = WINDOW, lateness: str = LATENESS) -> DataFrame:
    """Per device and window: the rows of ``stats/<device>`` (retained)."""
    stats = (
        readings.withWatermark("event_time", lateness)
        .groupBy(F.window("event_time", window), "device")
        .agg(
            F.count("*").alias("readings"),
            F.round(F.avg("temperature"), 2).alias("mean"),
            F.min("temperature").alias("min"),
            F.max("temperature").alias("max"),
            F.round(F.avg("humidity"), 1).alias("humidity"),
        )
    )
    return stats.select(
        F.concat(F.lit("stats/"), "device").alias("topic"),
        F.to_json(
            F.struct(
                "device",
                F.col("window.start").cast("string").alias("window_start"),
                "readings",
                "mean",
                "min",
                "max",
                "humidity",
            )
        ).alias("payload"),
        F.lit(True).alias("retain"),
    )


def anomalies(readings: DataFrame) -> DataFrame:
    """Readings out of range: the rows of ``alerts/<device>`` (QoS 1)."""
    flagged = readings.where(
        (F.col("temperature") > MAX_TEMPERATURE) | ~F.col("humidity").between(0.0, 100.0)
    )
    return flagged.select(
        F.concat(F.lit("alerts/"), "device").alias("topic"),
        F.to_json(
            F.struct(
                "device",
                "ts",
                "temperature",
                "humidity",
                F.lit(f"temperature above {MAX_TEMPERATURE:g} °C or humidity out of range").alias(
                    "reason"
                ),
            )
        ).alias("payload"),
        F.lit(1).alias("qos"),
    )


def start(
    spark: SparkSession,
    url: str,
    checkpoints: str,
    trigger: str = "1 second",
    window: str = WINDOW,
    lateness: str = LATENESS,
    **options: str,
) -> tuple[StreamingQuery, StreamingQuery]:
    """Start both queries (``options`` go to the kittiwake source, e.g. maxOffsetsPerTrigger)."""
    stats = (
        window_stats(readings(spark, url, **options), window, lateness)
        .writeStream.format("kittiwake")
        .queryName("sensor-stats")
        .option("url", url)
        .option("checkpointLocation", f"{checkpoints}/stats")
        # Each window once, when it closes (the sink appends; it has no update mode).
        .outputMode("append")
        .trigger(processingTime=trigger)
        .start()
    )
    alerts = (
        anomalies(readings(spark, url, **options))
        .writeStream.format("kittiwake")
        .queryName("sensor-alerts")
        .option("url", url)
        .option("checkpointLocation", f"{checkpoints}/alerts")
        .trigger(processingTime=trigger)
        .start()
    )
    return stats, alerts


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: sensor_pipeline.py grpc://broker:8815 CHECKPOINT_DIR")
    spark = SparkSession.builder.appName("kittiwake-sensor-pipeline").getOrCreate()
    register(spark)
    start(spark, sys.argv[1], sys.argv[2])
    spark.streams.awaitAnyTermination()


if __name__ == "__main__":
    main()
