"""``make demo``: the whole pipeline on this machine, for ``DEMO_SECONDS`` (default 60).

1. ``kittiwake serve`` with its embedded store, an MQTT listener and a Flight listener, the
   journal keeping a few minutes;
2. a fleet of ``DEMO_DEVICES`` (default 300) simulated sensors publishing readings over MQTT
   at QoS 1 (examples/sensor_simulator.py);
3. the Structured Streaming job (examples/sensor_pipeline.py) on Spark ``local[2]``, reading
   the readings from Kittiwake and writing ``stats/<device>`` (retained) and
   ``alerts/<device>`` (QoS 1) back into it, exactly once;
4. ``mosquitto_sub -t 'stats/#' -v`` watching the results, as any MQTT client would.

It prints live progress (rows in, batches, lag) and what mosquitto_sub shows, then stops
everything. Ports: ``DEMO_MQTT_PORT`` (1883) and ``DEMO_FLIGHT_PORT`` (8815), or free ones
when those are taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent
sys.path.insert(0, str(EXAMPLES))

import paho.mqtt.client as mqtt  # noqa: E402
import sensor_pipeline  # noqa: E402
from sensor_simulator import Simulator  # noqa: E402

from kittiwake.spark.client import JournalClient  # noqa: E402
from kittiwake.spark.options import SourceOptions  # noqa: E402

HOST = "127.0.0.1"
START_TIMEOUT = 30.0


def port_or_free(preferred: int) -> int:
    """``preferred`` when nobody listens there, else a free port."""
    with socket.socket() as probe:
        try:
            probe.bind((HOST, preferred))
            return preferred
        except OSError:
            probe.bind((HOST, 0))
            return int(probe.getsockname()[1])


@dataclass
class Broker:
    process: subprocess.Popen[bytes]
    mqtt_port: int
    flight_url: str

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()


@contextlib.contextmanager
def broker(workdir: Path, mqtt_port: int, flight_port: int) -> Iterator[Broker]:
    """``kittiwake serve`` with an MQTT and a Flight listener, until the block ends."""
    config = workdir / "kittiwake.toml"
    config.write_text(
        f"""log_level = "warning"
[[listeners]]
protocol = "mqtt"
host = "{HOST}"
port = {mqtt_port}
[[listeners]]
protocol = "flight"
host = "{HOST}"
port = {flight_port}
[store]
data_dir = "{workdir / "data"}"
[journal]
retention_seconds = 600
""",
        encoding="utf-8",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "kittiwake", "serve", "--config", str(config)],
        stdout=open(workdir / "broker.log", "wb"),  # noqa: SIM115 - lives as long as the broker
        stderr=subprocess.STDOUT,
    )
    running = Broker(process, mqtt_port, f"grpc://{HOST}:{flight_port}")
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError((workdir / "broker.log").read_text(errors="replace"))
            try:
                with socket.create_connection((HOST, mqtt_port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the broker did not start in time") from None
                time.sleep(0.1)
        yield running
    finally:
        running.stop()


@dataclass
class Watcher:
    """What a subscriber sees: ``mosquitto_sub -t FILTER -v`` when installed, else paho."""

    port: int
    topic_filter: str
    qos: int = 0
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=5))
    topics: set[str] = field(default_factory=set)
    count: int = 0

    def __post_init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self._client: mqtt.Client | None = None
        self.command = f"mosquitto_sub -h {HOST} -p {self.port} -t '{self.topic_filter}' -v"
        executable = shutil.which("mosquitto_sub")
        if executable is not None:
            self._process = subprocess.Popen(
                [
                    executable,
                    "-h",
                    HOST,
                    "-p",
                    str(self.port),
                    "-t",
                    self.topic_filter,
                    "-v",
                    "-q",
                    str(self.qos),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            threading.Thread(target=self._read, daemon=True).start()
        else:
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
            client.on_message = lambda _c, _u, message: self._seen(
                f"{message.topic} {message.payload.decode(errors='replace')}"
            )
            client.connect(HOST, self.port)
            client.subscribe(self.topic_filter, self.qos)
            client.loop_start()
            self._client = client

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            self._seen(line.rstrip("\n"))

    def _seen(self, line: str) -> None:
        self.count += 1
        self.topics.add(line.split(" ", 1)[0])
        self.lines.append(line)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(5)
        if self._client is not None:
            self._client.disconnect()
            self._client.loop_stop()


def retained_snapshot(port: int, topic_filter: str, expected: int) -> list[str]:
    """What a subscriber arriving now gets at once: the retained messages."""
    got: list[str] = []
    done = threading.Event()

    def on_message(_client: Any, _userdata: Any, message: Any) -> None:
        if message.retain:
            got.append(f"{message.topic} {message.payload.decode(errors='replace')}")
            if len(got) >= expected:
                done.set()

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.on_message = on_message
    client.connect(HOST, port)
    client.subscribe(topic_filter, 0)
    client.loop_start()
    done.wait(5)  # retained messages come at once; stop early once all are in
    client.disconnect()
    client.loop_stop()
    return sorted(got)


@dataclass
class Progress:
    """Rows and batches a query has done, from its progress reports (none are missed)."""

    rows: int = 0
    batches: int = 0
    end_offset: int = 0
    _seen: set[int] = field(default_factory=set)

    def update(self, query: Any) -> None:
        for report in query.recentProgress:
            if report["batchId"] in self._seen:
                continue
            self._seen.add(report["batchId"])
            self.rows += report["numInputRows"]
            self.batches += 1
            end = report["sources"][0]["endOffset"]
            if end:
                offsets = json.loads(end) if isinstance(end, str) else end
                self.end_offset = max(self.end_offset, int(offsets["0"]))


def drain(queries: list[Any], journal: JournalClient, timeout: float = 30.0) -> None:
    """Let the queries read what was published (bounded), so they stop between batches."""
    target = journal.bounds()[1]
    deadline = time.monotonic() + timeout
    for query in queries:
        progress = Progress()
        while time.monotonic() < deadline and query.exception() is None:
            progress.update(query)
            # Past the target (the sink's own output is journalled too), and idle.
            if progress.end_offset >= target and not query.status["isTriggerActive"]:
                break
            time.sleep(0.2)


def run(
    spark: Any,
    seconds: float,
    devices: int,
    workdir: Path,
    mqtt_port: int,
    flight_port: int,
    say: Callable[[str], None] = print,
    progress_every: float = 3.0,
    window: str = sensor_pipeline.WINDOW,
    lateness: str = sensor_pipeline.LATENESS,
    enough: Callable[[Watcher], bool] | None = None,
    drain_timeout: float = 30.0,
) -> dict[str, int]:
    """The demo on ``spark`` for ``seconds`` (or until ``enough`` says so of what the stats
    subscriber saw); returns its figures (the smoke test reads them)."""
    from kittiwake.spark import register

    register(spark)
    with broker(workdir, mqtt_port, flight_port) as running:
        say(f"kittiwake: MQTT on {HOST}:{mqtt_port}, Flight on {running.flight_url}")
        journal = JournalClient(SourceOptions.parse({"url": running.flight_url}))
        stats_watch = Watcher(mqtt_port, "stats/#")
        alerts_watch = Watcher(mqtt_port, "alerts/#", qos=1)
        say(f"watching: {stats_watch.command}")
        stats_query, alerts_query = sensor_pipeline.start(
            spark,
            running.flight_url,
            str(workdir / "checkpoints"),
            window=window,
            lateness=lateness,
        )
        say(f"spark: sensor-stats and sensor-alerts running on {spark.sparkContext.master}")
        simulator = Simulator(HOST, mqtt_port, devices=devices).start()
        say(f"simulator: {devices} devices publishing sensors/<device>/reading at QoS 1")
        progress = Progress()
        started = time.monotonic()
        shown = 0
        try:
            while (elapsed := time.monotonic() - started) < seconds:
                if enough is not None and enough(stats_watch):
                    break
                time.sleep(min(progress_every, max(0.0, seconds - elapsed)))
                for query in (stats_query, alerts_query):
                    if query.exception() is not None:
                        raise RuntimeError(f"{query.name} failed: {query.exception()}")
                progress.update(stats_query)
                high_water = journal.bounds()[1]
                lag = max(0, high_water - progress.end_offset) if progress.batches else high_water
                say(
                    f"[{elapsed:5.1f}s] published {simulator.acknowledged:>7,} | rows in "
                    f"{progress.rows:>7,} | batches {progress.batches:>3} | lag {lag:>6,} "
                    f"offsets | stats/# seen {stats_watch.count:>6,} "
                    f"({len(stats_watch.topics)} devices) | alerts {alerts_watch.count}"
                )
                fresh = min(stats_watch.count - shown, 2)
                shown = stats_watch.count
                for line in list(stats_watch.lines)[-fresh:] if fresh > 0 else []:
                    say(f"         mosquitto_sub: {line}")
        finally:
            simulator.stop()
            drain([stats_query, alerts_query], journal, drain_timeout)
            for query in (stats_query, alerts_query):
                query.stop()
            stats_watch.stop()
            alerts_watch.stop()
        progress.update(stats_query)
        retained = retained_snapshot(mqtt_port, "stats/#", devices)
        say("")
        say(
            f"{stats_watch.command}  (a subscriber arriving now) shows {len(retained)} "
            "retained stats, one per device, e.g.:"
        )
        for line in retained[:5]:
            say(f"  {line}")
        alerts = list(alerts_watch.lines)
        say(
            f"alerts/# received {alerts_watch.count} alerts at QoS 1"
            + (", e.g.:" if alerts else "")
        )
        for line in alerts[-3:]:
            say(f"  {line}")
        return {
            "published": simulator.acknowledged,
            "rows_in": progress.rows,
            "batches": progress.batches,
            "stats_seen": stats_watch.count,
            "retained_devices": len(retained),
            "alerts": alerts_watch.count,
        }


def main() -> None:
    from pyspark.sql import SparkSession

    seconds = float(os.environ.get("DEMO_SECONDS", "60"))
    devices = int(os.environ.get("DEMO_DEVICES", "300"))
    mqtt_port = port_or_free(int(os.environ.get("DEMO_MQTT_PORT", "1883")))
    flight_port = port_or_free(int(os.environ.get("DEMO_FLIGHT_PORT", "8815")))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kittiwake-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", HOST)
        .config("spark.driver.host", HOST)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory(prefix="kittiwake-demo-") as workdir:
        try:
            figures = run(spark, seconds, devices, Path(workdir), mqtt_port, flight_port)
        finally:
            spark.stop()
    print(f"\ndone: {json.dumps(figures)}")


if __name__ == "__main__":
    main()
