#!/usr/bin/env python3
"""kittiwake.jms's own CPU per message (issue 12): the client, not the broker. A kittiwake
broker runs in a process of its own on a loopback port; this process is the client, so its
process time (every thread: the caller's and the connections' I/O threads) is what
kittiwake.jms spends. NON_PERSISTENT 100-character TextMessages, AUTO_ACKNOWLEDGE, the blocking
API as an application uses it.

    python bench/jms_client_cpu.py                    # send, receive, topic; 20,000 messages
    python bench/jms_client_cpu.py --repeat 5 --scenarios send,receive
    python bench/jms_client_cpu.py --client-src /work/before/src   # another tree's client

- send: one producer sends N to a queue nobody consumes yet; until ``producer.close()`` has
  the broker's outcome of every send.
- receive: one consumer (its own connection) receives those N with ``receive()``.
- topic: 10 consumers (a connection and a thread each, as bench/run_jms.py's) receive every
  one of N messages a producer in another process publishes: CPU per delivery.

``--client-src`` measures another checkout's kittiwake.jms against this tree's broker (a
before/after comparison of the client alone).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
BODY_CHARS = 100


def _client_src() -> str:
    """The kittiwake whose client is measured: --client-src, else this tree's (read before
    argparse so that the import below takes it)."""
    for i, arg in enumerate(sys.argv):
        if arg == "--client-src" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--client-src="):
            return arg.split("=", 1)[1]
    return str(BENCH_DIR.parent / "src")


sys.path.insert(0, _client_src())
sys.path.insert(0, str(BENCH_DIR))

from kittiwake import jms  # noqa: E402


def body(n: int) -> str:
    return f"{n:016x}" + "x" * (BODY_CHARS - 16)


def measure_send(url: str, queue: str, count: int) -> float:
    """CPU seconds of sending ``count`` messages (connection setup excluded)."""
    factory = jms.ConnectionFactory(url)
    with factory.create_connection() as connection:
        session = connection.create_session(False, jms.AUTO_ACKNOWLEDGE)
        producer = session.create_producer(jms.Queue(queue))
        producer.set_delivery_mode(jms.NON_PERSISTENT)
        cpu0 = time.process_time()
        for n in range(count):
            producer.send(session.create_text_message(body(n)))
        producer.close()  # waits for every send's outcome
        return time.process_time() - cpu0


def measure_receive(url: str, queue: str, count: int) -> float:
    factory = jms.ConnectionFactory(url)
    with factory.create_connection() as connection:
        session = connection.create_session(False, jms.AUTO_ACKNOWLEDGE)
        consumer = session.create_consumer(jms.Queue(queue))
        cpu0 = time.process_time()
        connection.start()
        for n in range(count):
            message = consumer.receive(30)
            if message is None:
                raise SystemExit(f"receive: only {n} of {count} arrived")
            message.get_text()
        cpu = time.process_time() - cpu0
        return cpu


def measure_topic(url: str, topic: str, count: int, consumers: int, client_src: str) -> float:
    """CPU seconds of ``consumers`` consumers receiving ``count`` messages each."""
    factory = jms.ConnectionFactory(url)
    opened = []
    for _ in range(consumers):
        connection = factory.create_connection()
        session = connection.create_session(False, jms.AUTO_ACKNOWLEDGE)
        consumer = session.create_consumer(jms.Topic(topic))
        connection.start()
        opened.append((connection, consumer))
    received = [0] * consumers
    errors: list[str] = []

    def consume(index: int) -> None:
        consumer = opened[index][1]
        try:
            while received[index] < count:
                message = consumer.receive(30)
                if message is None:
                    errors.append(f"consumer {index}: {received[index]} of {count}")
                    return
                message.get_text()
                received[index] += 1
        except Exception as exc:
            errors.append(f"consumer {index}: {exc!r}")

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(consumers)]
    try:
        cpu0 = time.process_time()
        for thread in threads:
            thread.start()
        producer = subprocess.run(
            [sys.executable, __file__, "--client-src", client_src, "--produce", url, topic,
             str(count)],
            check=False,
        )
        for thread in threads:
            thread.join()
        cpu = time.process_time() - cpu0
    finally:
        for connection, _ in opened:
            connection.close()
    if producer.returncode != 0 or errors:
        raise SystemExit(f"topic: producer exit {producer.returncode}, {errors}")
    return cpu


def produce(url: str, topic: str, count: int) -> None:
    factory = jms.ConnectionFactory(url)
    with factory.create_connection() as connection:
        session = connection.create_session(False, jms.AUTO_ACKNOWLEDGE)
        producer = session.create_producer(jms.Topic(topic))
        producer.set_delivery_mode(jms.NON_PERSISTENT)
        for n in range(count):
            producer.send(session.create_text_message(body(n)))
        producer.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--scenarios", default="send,receive,topic")
    p.add_argument("--consumers", type=int, default=10, help="topic consumers")
    p.add_argument("--client-src", default=_client_src(), help="the kittiwake measured")
    p.add_argument("--url", help="an already running broker (default: start this tree's)")
    p.add_argument("--produce", nargs=3, metavar=("URL", "TOPIC", "COUNT"),
                   help=argparse.SUPPRESS)  # the topic scenario's producer process
    args = p.parse_args()
    if args.produce:
        produce(args.produce[0], args.produce[1], int(args.produce[2]))
        return
    scenarios = args.scenarios.split(",")
    broker = None
    url = args.url
    if url is None:
        from kwbench.jms_brokers import KittiwakeAMQP

        broker = KittiwakeAMQP(Path(tempfile.mkdtemp(prefix="jms-client-cpu-")), None,
                               python=sys.executable)
        broker.start()
        url = broker.url
    print(f"client: {jms.__file__}")
    results: dict[str, list[float]] = {name: [] for name in scenarios}
    try:
        for run in range(args.repeat):
            queue = f"cpu-q-{time.monotonic_ns()}"
            if "send" in scenarios or "receive" in scenarios:
                cpu = measure_send(url, queue, args.messages)
                if "send" in scenarios:
                    results["send"].append(cpu / args.messages * 1e6)
            if "receive" in scenarios:
                cpu = measure_receive(url, queue, args.messages)
                results["receive"].append(cpu / args.messages * 1e6)
            if "topic" in scenarios:
                cpu = measure_topic(url, f"cpu/t/{run}/{time.monotonic_ns()}",
                                    args.messages, args.consumers, args.client_src)
                results["topic"].append(cpu / (args.messages * args.consumers) * 1e6)
            print(f"run {run + 1}: " + ", ".join(
                f"{name} {values[-1]:.1f}" for name, values in results.items() if values),
                flush=True)
    finally:
        if broker is not None:
            broker.stop()
    print("client CPU per message (us), median [min-max]:")
    for name, values in results.items():
        if values:
            print(f"  {name:8} {statistics.median(values):7.1f} "
                  f"[{min(values):.1f}-{max(values):.1f}]  n={len(values)}")


if __name__ == "__main__":
    main()
