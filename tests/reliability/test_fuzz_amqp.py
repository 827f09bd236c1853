"""Fuzzing the AMQP 1.0 listener over sockets: byte streams recorded from real
python-qpid-proton clients (SASL, open, begin, attach, transfers, dispositions, detach, close),
mutated by Hypothesis-drawn edits, each sent on its own connection to a real broker process.

What must hold: the broker never dies and never logs an internal error, it ends every such
connection by itself (no connection left hanging once the client has sent everything), and an
AMQP client and an MQTT client connected the whole time keep working. The count and the time
are printed.
"""

from __future__ import annotations

import contextlib
import random
import selectors
import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from proton import Message
from proton.utils import BlockingConnection

from tests.integration.brokerproc import BrokerProcess
from tests.integration.clients import PahoClient, unique

# Mutated streams to send; each is one connection.
TARGET_STREAMS = 10_000
STREAMS_PER_EXAMPLE = 20
RUN_DEADLINE = 300.0
BUG_MARKERS = ("Traceback", "internal error", "Fatal error", "Exception in callback")


class Recorder:
    """A TCP relay in front of the broker that keeps what each client sent."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.streams: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        sent = bytearray()
        upstream = socket.create_connection(self.target)
        deadline = time.monotonic() + 30
        with client, upstream, selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ, upstream)
            selector.register(upstream, selectors.EVENT_READ, client)
            while time.monotonic() < deadline:
                for key, _ in selector.select(1):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = source.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        self.streams.append(bytes(sent))
                        return
                    if source is client:
                        sent += data
                    with contextlib.suppress(OSError):
                        key.data.sendall(data)
        self.streams.append(bytes(sent))

    def close(self) -> None:
        self.listener.close()


def record_streams(broker_amqp: tuple[str, int]) -> list[bytes]:
    """What real clients send: a producer and a consumer, anonymous SASL, and one with no SASL."""
    recorder = Recorder(broker_amqp)
    url = f"amqp://{recorder.address[0]}:{recorder.address[1]}"
    try:
        connection = BlockingConnection(url, timeout=10)
        sender = connection.create_sender("fuzz.queue")
        for n in range(3):
            sender.send(Message(body=f"seed {n}", properties={"n": n}, durable=n % 2 == 0))
        connection.close()
        connection = BlockingConnection(url, timeout=10)
        receiver = connection.create_receiver("fuzz.queue", credit=10)
        for _ in range(3):
            receiver.receive(timeout=10)
            receiver.accept()
        connection.close()
        deadline = time.monotonic() + 10
        while len(recorder.streams) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        recorder.close()
    assert len(recorder.streams) >= 2, "the relay recorded no streams"
    return recorder.streams


def mutate(rng: random.Random, stream: bytes) -> bytes:
    data = bytearray(stream)
    for _ in range(rng.randint(1, 4)):
        how = rng.choice(["flip", "flip", "truncate", "insert", "delete", "duplicate", "noise"])
        if how == "flip" and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif how == "truncate" and data:
            del data[rng.randrange(len(data)) :]
        elif how == "insert":
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif how == "delete" and data:
            at = rng.randrange(len(data))
            del data[at : at + rng.randint(1, 16)]
        elif how == "duplicate" and data:
            at = rng.randrange(len(data))
            data[at:at] = data[at : at + rng.randint(1, 64)]
        else:
            data[:] = data[: rng.randrange(len(data) + 1)] + rng.randbytes(rng.randint(1, 64))
    return bytes(data)


def send_stream(address: tuple[str, int], data: bytes, timeout: float = 15.0) -> None:
    """Send, half-close, read until the broker ends the connection (it must, by itself)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"connection left open; input {data[:120].hex()}"
            try:
                if not sock.recv(65536):
                    return
            except ConnectionResetError:
                return
            except TimeoutError:
                continue


def test_mutated_amqp_streams_harm_no_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    broker = BrokerProcess(
        tmp_path / "broker", amqp=True, log_level="warning",  # type: ignore[arg-type]
        sys={"interval": 0}, store={"data_dir": str(tmp_path / "data")},
    ).start()
    try:
        amqp_address = (broker.host, broker.amqp_port)
        seeds = record_streams(amqp_address)
        # Bystanders: an AMQP consumer with its producer, and an MQTT subscriber.
        watcher_connection = BlockingConnection(broker.amqp_url, timeout=10)
        watcher = watcher_connection.create_receiver("fuzz.bystander", credit=100)
        producer_connection = BlockingConnection(broker.amqp_url, timeout=10)
        producer = producer_connection.create_sender("fuzz.bystander")
        mqtt = PahoClient(broker.address, unique("amqp-fuzz-mqtt"), protocol=5)
        mqtt.connect(keepalive=60)
        mqtt.subscribe("amqp-fuzz/keep", 1)
        mqtt_publisher = PahoClient(broker.address, unique("amqp-fuzz-pub"))
        mqtt_publisher.connect(keepalive=60)
        counts = {"streams": 0, "examples": 0}
        log_offset = [0]

        def check_log() -> None:
            with open(broker.log_path, "rb") as log:
                log.seek(log_offset[0])
                new = log.read()
            log_offset[0] += len(new)
            text = new.decode("utf-8", "replace")
            for marker in BUG_MARKERS:
                assert marker not in text, f"the broker met a bug ({marker!r}):\n{text[-5000:]}"

        @settings(
            max_examples=25, deadline=None, database=None, phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(st.sampled_from(range(len(seeds))), st.integers(0, 2**32))
        def fuzz(seed_index: int, seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(STREAMS_PER_EXAMPLE):
                send_stream(amqp_address, mutate(rng, seeds[seed_index]))
                counts["streams"] += 1
            counts["examples"] += 1
            assert broker.alive(), f"the broker died:\n{broker.log_text()[-5000:]}"
            check_log()
            n = counts["examples"]
            producer.send(Message(body=f"keep {n}"))
            mqtt_publisher.publish("amqp-fuzz/keep", b"keep %d" % n, 1)

        started = time.monotonic()
        while counts["streams"] < TARGET_STREAMS:
            assert time.monotonic() - started < RUN_DEADLINE
            fuzz()
        elapsed = time.monotonic() - started
        expected = {f"keep {n}" for n in range(1, counts["examples"] + 1)}
        got = set()
        for _ in expected:
            got.add(watcher.receive(timeout=30).body)
            watcher.accept()
        assert got == expected
        assert {m.payload.decode() for m in mqtt.get_many(len(expected), timeout=30)} == expected
        with capsys.disabled():
            print(
                f"\namqp fuzzing: {counts['streams']} mutated streams from {len(seeds)} recorded "
                f"client sessions in {elapsed:.1f}s; AMQP and MQTT bystanders got all "
                f"{len(expected)} messages"
            )
        mqtt.stop()
        mqtt_publisher.stop()
        watcher_connection.close()
        producer_connection.close()
    finally:
        broker.stop()
