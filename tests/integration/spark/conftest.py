"""One real local Spark for the whole Spark suite (starting one costs seconds): ``local[2,2]``,
two cores and a second attempt for a failed task, as a cluster would retry it."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip("pyspark", reason="needs the spark extra: make test-deps")
pytest.importorskip("pyarrow.flight")

from pyspark.sql import SparkSession  # noqa: E402

from kittiwake.spark import register  # noqa: E402


@pytest.fixture(scope="package")
def spark() -> Iterator[SparkSession]:
    assert shutil.which("java"), "Spark needs Java 17: run `make test-deps`"
    # Executors' Python workers must import kittiwake: the same interpreter as the tests.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("kittiwake-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
