"""``format("kittiwake")`` on a real Spark standalone cluster: a master and a worker started from
the pyspark package's own classes (``bin/spark-class``), bound to 127.0.0.1; a job submitted to
it the way README.md documents (the pyspark package's ``bin/spark-submit --py-files`` with the
kittiwake package zipped, ``PYSPARK_PYTHON`` for the executors) reads the journal over Flight on
the worker's executors and writes back through the sink. Neither the cluster nor the job gets
this tree's src/ on its PYTHONPATH: they import kittiwake from what was shipped.

Marked ``spark``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from ..brokerproc import SRC_DIR, BrokerProcess, free_port
from ..clients import PahoClient, unique, wait_until

# Each Spark wait is bounded on its own (QUERY_TIMEOUT and the like); a test makes several, so
# the suite-wide 120 s per test is too short on a loaded machine (a driver start alone can take
# a minute there).
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

pyspark = pytest.importorskip("pyspark", reason="needs the spark extra: make test-deps")
flight = pytest.importorskip("pyarrow.flight")

from kittiwake.flight.protocol import RangeRequest, parse_latest_answer  # noqa: E402

SPARK_HOME = Path(pyspark.__file__).parent
JOB = Path(__file__).with_name("pipeline_job.py")
START_TIMEOUT = 90
JOB_TIMEOUT = 360  # a hang guard: under a loaded machine the job took over 180 s


class StandaloneCluster:
    """A master and one worker (2 cores), each a JVM of its own, logging to ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {
            **without_pythonpath(os.environ),
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            # No REST submission server (it would take the fixed port 6066).
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_WORKER_DIR": str(workdir / "work"),
            "PYSPARK_PYTHON": sys.executable,
        }

    def _start(self, name: str, *args: str) -> Path:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            self.processes.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.workdir,
                )
            )
        return log

    def start(self) -> StandaloneCluster:
        master_log = self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(free_port()),
        )
        wait_until(lambda: "ALIVE" in self.log_text(master_log), timeout=START_TIMEOUT)
        self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            self.url,
            "--host",
            "127.0.0.1",
            "--cores",
            "2",
            "--memory",
            "1g",
            "--webui-port",
            str(free_port()),
        )
        wait_until(
            lambda: "Registering worker" in self.log_text(master_log), timeout=START_TIMEOUT
        )
        return self

    def log_text(self, path: Path) -> str:
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def without_pythonpath(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment minus PYTHONPATH (the tests run with this tree's src/ on it): what the
    cluster and the submitted job import must come from ``--py-files``."""
    return {key: value for key, value in environ.items() if key != "PYTHONPATH"}


def zipped_package(directory: Path) -> Path:
    """src/kittiwake as a zip with ``kittiwake/`` at its top, as ``--py-files`` takes it (a
    wheel is such a zip too)."""
    archive = directory / "kittiwake-shipped.zip"
    package = SRC_DIR / "kittiwake"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                out.write(path, path.relative_to(SRC_DIR).as_posix())
    return archive


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def journal_rows(url: str, topic_filter: str) -> list[tuple[str, bytes]]:
    connection = flight.connect(url)
    try:
        (result,) = list(connection.do_action(flight.Action("latest", b"")))
        end = parse_latest_answer(result.body.to_pybytes())[0][1]
        ticket = RangeRequest(0, end, (topic_filter,)).to_ticket()
        table = connection.do_get(flight.Ticket(ticket)).read_all()
        return [(r["topic"], r["payload"]) for r in table.to_pylist()]
    finally:
        connection.close()


def test_a_job_on_a_standalone_cluster_reads_and_writes_exactly_once(
    cluster: StandaloneCluster,
    broker: Callable[..., BrokerProcess],
    paho: Callable[..., PahoClient],
    tmp_path: Path,
) -> None:
    process = broker(flight=True, journal={"retention_seconds": 3600})
    prefix = unique("cluster")
    items = [(f"{prefix}/in/{i % 3}", f"reading {i}") for i in range(40)]
    publisher = paho(process.address)
    for topic, payload in items:
        publisher.publish(topic, payload.encode(), 1)
    subscriber = paho(process.address)
    subscriber.subscribe(f"{prefix}/out/#", 1)

    shipped = zipped_package(tmp_path)
    job = subprocess.run(
        [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--master",
            cluster.url,
            "--py-files",
            str(shipped),
            "--conf",
            f"spark.executorEnv.PYSPARK_PYTHON={sys.executable}",
            str(JOB),
            "--mode",
            "batch",
            "--master",
            cluster.url,
            "--url",
            process.flight_url,
            "--topics",
            f"{prefix}/in/#",
            "--out",
            f"{prefix}/out",
        ],
        capture_output=True,
        env={
            **without_pythonpath(os.environ),
            "SPARK_HOME": str(SPARK_HOME),
            "PYSPARK_PYTHON": sys.executable,
        },
        timeout=JOB_TIMEOUT,
        cwd=tmp_path,
    )
    assert job.returncode == 0, job.stderr.decode(errors="replace")[-5000:]
    report = json.loads(job.stdout.decode().strip().splitlines()[-1])
    assert report["rows"] == sorted([topic, payload] for topic, payload in items)
    # Both imported kittiwake from the shipped zip, not from a source tree; the executor from
    # its own copy, fetched from the driver.
    in_zip = f"{shipped.name}/kittiwake/__init__.py"
    assert report["kittiwake_on_driver"] == str(shipped / "kittiwake" / "__init__.py")
    assert report["kittiwake_on_executor"].endswith(in_zip), report["kittiwake_on_executor"]
    assert report["kittiwake_on_executor"] != report["kittiwake_on_driver"]

    expected = sorted((f"{prefix}/out/{t}", p.upper().encode()) for t, p in items)
    got = subscriber.get_many(len(items), timeout=30)
    subscriber.no_message(within=0.5)
    assert sorted((m.topic, m.payload) for m in got) == expected
    assert sorted(journal_rows(process.flight_url, f"{prefix}/out/#")) == expected
    # The work ran on the worker's executors, not in the driver.
    app_dirs = list((cluster.workdir / "work").glob("app-*"))
    assert app_dirs, "no application ran on the worker"
