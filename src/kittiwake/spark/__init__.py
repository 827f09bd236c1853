"""The Kittiwake journal as a PySpark data source: ``format("kittiwake")``, batch and stream.

Needs the ``spark`` extra (pyspark >= 4.2 and pyarrow) on the driver and every executor::

    from kittiwake.spark import register
    register(spark)
    df = spark.readStream.format("kittiwake").option("url", "grpc://broker:8815") \\
        .option("topics", "sensors/#").load()
"""

from __future__ import annotations

from typing import Any

from kittiwake.spark.source import FORMAT, KittiwakeDataSource

__all__ = ["FORMAT", "KittiwakeDataSource", "register"]


def register(spark: Any) -> None:
    """Make ``format("kittiwake")`` known to this SparkSession (same as
    ``spark.dataSource.register(KittiwakeDataSource)``)."""
    spark.dataSource.register(KittiwakeDataSource)
