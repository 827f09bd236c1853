"""Broker CPU per row of a fenced Flight put (the Spark sink's write path), before vs after a
change in one run: two ``kittiwake serve`` processes, one on this tree's code and one on a
baseline checkout's (``--baseline SRC``), take the same puts in turn; each put's cost is the
broker process's CPU time (every thread: gRPC, event loop, store writer) over the rows.

    python bench/bench_flight_put.py --baseline /tmp/kw-baseline/src [--subscriber]

A put is ``--rows`` rows of ``--payload``-byte payloads over ``--topics`` topics
(``out/<i % 10>/<i>``), QoS 1, sent in record batches of 10,000 rows as Spark's Arrow
batches come. ``--subscriber``: an MQTT client (paho-mqtt, clean session, QoS 1) subscribed to
``out/0/#`` (a tenth of the topics) receives its rows before the put's CPU is read, so the
cost of delivering them is counted too. Medians of ``--repeat`` puts per broker, with the
spread. Not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
sys.path.insert(0, str(SRC))

import pyarrow as pa  # noqa: E402
import pyarrow.flight as flight  # noqa: E402

from kittiwake.flight.protocol import WRITE_SCHEMA, WriteRequest, parse_latest_answer  # noqa: E402
from kittiwake.spark.client import SinkClient  # noqa: E402
from kittiwake.spark.options import SinkOptions  # noqa: E402

BATCH_ROWS = 10_000
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    def __init__(self, name: str, src: Path, workdir: Path) -> None:
        self.name = name
        workdir.mkdir()
        self.mqtt_port = free_port()
        flight_port = free_port()
        config = workdir / "kittiwake.toml"
        config.write_text(
            f"""log_level = "warning"
[[listeners]]
protocol = "flight"
port = {flight_port}
[[listeners]]
port = {self.mqtt_port}
[store]
data_dir = "{workdir / "data"}"
[journal]
retention_seconds = 315360000
[limits]
max_queued_messages = 1000000
"""
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kittiwake", "serve", "--config", str(config)],
            env={**os.environ, "PYTHONPATH": str(src)},
        )
        self.url = f"grpc://127.0.0.1:{flight_port}"
        self.client = SinkClient(SinkOptions.parse({"url": self.url, "retryTimeoutMs": "60000"}))
        deadline = time.monotonic() + 30
        while True:
            try:
                connection = flight.connect(self.url)
                try:
                    (answer,) = list(connection.do_action(flight.Action("latest", b"")))
                    parse_latest_answer(answer.body.to_pybytes())
                finally:
                    connection.close()
                return
            except flight.FlightUnavailableError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.1)

    def cpu(self) -> float:
        """User + system seconds of every thread of the broker process so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


class Subscriber:
    """A paho-mqtt client counting what it receives."""

    def __init__(self, port: int, topic_filter: str) -> None:
        import paho.mqtt.client as mqtt

        self.received = 0
        self.changed = threading.Condition()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, clean_session=True)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.client.subscribe(topic_filter, qos=1)
        time.sleep(0.5)  # the SUBACK; a put before it would only miss copies, never break

    def _on_message(self, *_args: object) -> None:
        with self.changed:
            self.received += 1
            self.changed.notify_all()

    def wait_for(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while self.received < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the subscriber got {self.received} of {count}")
                self.changed.wait(left)

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def unit(rows: int, payload: int, topics: int) -> tuple[list[pa.RecordBatch], int]:
    """The put's batches, and how many of its rows ``out/0/#`` matches."""
    names = [f"out/{i % 10}/{i}" for i in range(topics)]
    body = b"x" * payload
    batches = []
    for start in range(0, rows, BATCH_ROWS):
        count = min(BATCH_ROWS, rows - start)
        batches.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array([names[(start + i) % topics] for i in range(count)]),
                    pa.array([body] * count, pa.binary()),
                    pa.array([1] * count, pa.int32()),
                    pa.array([False] * count),
                    pa.nulls(count, WRITE_SCHEMA.field("properties").type),
                ],
                schema=WRITE_SCHEMA,
            )
        )
    matched = sum(1 for i in range(rows) if (i % topics) % 10 == 0)
    return batches, matched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", type=Path, required=True, metavar="SRC")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--subscriber", action="store_true")
    parser.add_argument(
        "--profile", type=Path, metavar="OUT", help="py-spy this tree's broker (raw stacks)"
    )
    parser.add_argument("--py-spy", default="py-spy", metavar="PATH")
    args = parser.parse_args()
    baseline = args.baseline.resolve()
    if not (baseline / "kittiwake").is_dir():
        sys.exit(f"{baseline} holds no kittiwake package")
    batches, matched = unit(args.rows, args.payload, args.topics)
    with tempfile.TemporaryDirectory(prefix="kw-bench-put-") as tmp:
        brokers = [
            Broker("baseline", baseline, Path(tmp) / "baseline"),
            Broker("this tree", SRC, Path(tmp) / "current"),
        ]
        subscribers: dict[str, Subscriber] = {}
        costs: dict[str, list[float]] = {b.name: [] for b in brokers}
        spy = None
        try:
            for b in brokers if args.subscriber else []:
                subscribers[b.name] = Subscriber(b.mqtt_port, "out/0/#")
            if args.profile is not None:
                spy = subprocess.Popen(
                    [
                        args.py_spy,
                        "record",
                        "--threads",
                        "--nonblocking",
                        "-r",
                        "200",
                        "-f",
                        "raw",
                        "-o",
                        str(args.profile),
                        "--pid",
                        str(brokers[1].process.pid),
                    ]
                )
            for run in range(args.repeat + 1):  # the first round warms up, not counted
                for broker in brokers:
                    subscriber = subscribers.get(broker.name)
                    expected = subscriber.received + matched if subscriber else 0
                    before = broker.cpu()
                    answer = broker.client.put(WriteRequest("bench", run, 0), batches)
                    assert answer.rows == args.rows and not answer.already_committed, answer
                    if subscriber is not None:
                        subscriber.wait_for(expected)
                    used = broker.cpu() - before
                    broker.client.commit("bench", run)
                    if run:
                        costs[broker.name].append(used / args.rows * 1e6)
        finally:
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
            for subscriber in subscribers.values():
                subscriber.stop()
            for broker in brokers:
                broker.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    label = "with a subscriber to a tenth of the topics" if args.subscriber else "no subscriber"
    print(
        f"broker CPU per row of a {args.rows:,}-row put ({args.payload}-byte payloads, "
        f"{args.topics} topics, {label}), medians of {args.repeat}:"
    )
    for name, values in costs.items():
        print(
            f"  {name:10s} {statistics.median(values):6.2f} µs/row "
            f"(min {min(values):.2f}, max {max(values):.2f})"
        )


if __name__ == "__main__":
    main()
