"""The sink's side without Spark running: its options (Spark's own streaming options pass),
the columns it takes, and a Spark Arrow batch turned into a put's batch with the defaults."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    DoubleType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from kittiwake.flight.protocol import WRITE_SCHEMA  # noqa: E402
from kittiwake.spark.options import OptionError, SinkOptions  # noqa: E402
from kittiwake.spark.sink import check_schema, wire_batch  # noqa: E402


def test_defaults_and_spark_own_options() -> None:
    options = SinkOptions.parse(
        {"checkpointLocation": "/tmp/c", "queryName": "q", "path": "ignored"}
    )
    assert (options.url, options.qos, options.retain, options.write_id) == (
        "grpc://127.0.0.1:8815",
        1,
        False,
        None,
    )
    options = SinkOptions.parse({"QOS": "2", "retain": "true", "writeId": "daily-2024-01-01"})
    assert (options.qos, options.retain, options.write_id) == (2, True, "daily-2024-01-01")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"topics": "#"}, "unknown option 'topics' for writing"),
        ({"qos": "3"}, "qos must be 0, 1 or 2"),
        ({"retain": "yes"}, "retain must be true or false"),
        ({"writeId": "has space"}, "writeId"),
        ({"url": "http://x"}, "grpc://host:port"),
    ],
)
def test_bad_options_are_refused(raw: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        SinkOptions.parse(raw)


def schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(name, kind) for name, kind in fields])  # type: ignore[arg-type]


def test_the_columns_a_write_takes() -> None:
    check_schema(schema(("topic", StringType()), ("payload", BinaryType())))
    check_schema(
        schema(
            ("topic", StringType()),
            ("payload", StringType()),
            ("qos", IntegerType()),
            ("properties", MapType(StringType(), StringType())),
        )
    )
    with pytest.raises(OptionError, match="with a 'payload' column"):
        check_schema(schema(("topic", StringType()), ("value", StringType())))
    with pytest.raises(OptionError, match="column 'device' is not one"):
        check_schema(
            schema(("topic", StringType()), ("payload", StringType()), ("device", StringType()))
        )
    with pytest.raises(OptionError, match="column 'payload' is double"):
        check_schema(schema(("topic", StringType()), ("payload", DoubleType())))
    with pytest.raises(OptionError, match="column 'properties'"):
        check_schema(
            schema(
                ("topic", StringType()),
                ("payload", StringType()),
                ("properties", MapType(StringType(), IntegerType())),
            )
        )


def test_a_spark_batch_becomes_a_put_batch_with_the_defaults() -> None:
    options = SinkOptions.parse({"qos": "0", "retain": "true"})
    spark_batch = pa.RecordBatch.from_pydict(
        {"topic": ["a", "b"], "payload": ["x", None], "qos": pa.array([2, None], pa.int64())}
    )
    wire = wire_batch(spark_batch, options)
    assert wire.schema.equals(WRITE_SCHEMA)
    assert wire.to_pylist() == [
        {"topic": "a", "payload": b"x", "qos": 2, "retain": True, "properties": None},
        {"topic": "b", "payload": None, "qos": 0, "retain": True, "properties": None},
    ]


def test_large_arrow_types_are_narrowed() -> None:
    spark_batch = pa.RecordBatch.from_arrays(
        [pa.array(["a"], pa.large_string()), pa.array([b"x"], pa.large_binary())],
        names=["topic", "payload"],
    )
    wire = wire_batch(spark_batch, SinkOptions())
    assert wire.schema.equals(WRITE_SCHEMA)
    assert wire.to_pylist()[0]["topic"] == "a" and wire.to_pylist()[0]["payload"] == b"x"
