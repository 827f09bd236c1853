"""The Flight service's reader process: its answers equal the in-process read's (rows, filters
SQL cannot express, rows with optional parts, the lost part and bounds in the metadata), its
refusals are the same errors, a killed worker is started again and the next read succeeds, and
a stream cut short by its death is an error, never a short answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("adbc_driver_sqlite")

from kittiwake.broker.message import Message, MQTT5Fields  # noqa: E402
from kittiwake.clock import ManualClock  # noqa: E402
from kittiwake.flight.batches import record_batch  # noqa: E402
from kittiwake.flight.protocol import RangeRequest, range_schema  # noqa: E402
from kittiwake.flight.range_reads import RangeReads  # noqa: E402
from kittiwake.store import sqlite as sqlite_module  # noqa: E402
from kittiwake.store.journal_reader import (  # noqa: E402
    JournalError,
    JournalRangeError,
    JournalReader,
)
from kittiwake.store.journal_selection import JournalSelection  # noqa: E402
from kittiwake.store.sqlite import SQLiteStore  # noqa: E402

from .brokerproc import BrokerProcess  # noqa: E402
from .clients import PahoClient, unique  # noqa: E402

flight = pytest.importorskip("pyarrow.flight")

SELECTION = JournalSelection(enabled=True)


@pytest.fixture(autouse=True)
def sweep_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_module, "SWEEP_INTERVAL", 0.0)


def write_journal(directory: Path, batches: list[list[Message]], retention_bytes: int) -> None:
    """Each list committed on its own (the retention sweeps between them)."""

    async def body() -> None:
        store = SQLiteStore(
            directory,
            clock=ManualClock(),
            journal_selection=SELECTION,
            journal_retention_seconds=3600,
            journal_retention_bytes=retention_bytes,
        )
        for messages in batches:
            for message in messages:
                store.journal(message)
            for _ in range(3):  # the sweep rides on the next batch
                future = store.commit()
                if future is not None:
                    await asyncio.wait_for(future, 10)
                await asyncio.sleep(0)
        store.close()

    asyncio.run(body())


@pytest.fixture
def reads(tmp_path: Path) -> Iterator[RangeReads]:
    range_reads = RangeReads(JournalReader(tmp_path, SELECTION).path, SELECTION, 5000)
    range_reads.start()
    yield range_reads
    range_reads.stop()


def in_process(
    reader: JournalReader, start: int, end: int, topics: tuple[str, ...], headers: bool
) -> Any:
    with reader.read(start, end, topics) as journal_range:
        bounds = journal_range.bounds
        schema = range_schema(headers, bounds.earliest, bounds.high_water, journal_range.lost)
        batches = [record_batch(chunk, headers) for chunk in journal_range.chunks()]
    return pa.Table.from_batches(batches, schema)


def from_worker(
    reads: RangeReads, start: int, end: int, topics: tuple[str, ...], headers: bool
) -> Any:
    worker_range = reads.read(start, end, topics, headers)
    assert worker_range is not None
    return pa.Table.from_batches(list(worker_range.batches()), worker_range.schema)


def mixed_messages() -> list[Message]:
    fields = MQTT5Fields(content_type="text/plain", user_properties=[("k", "v"), ("k", "w")])
    messages: list[Message] = []
    for i in range(30):
        messages += [
            Message(f"s/{i % 3}/t", b"t%d" % i, qos=1, persistent=True),
            Message(f"s/{i % 3}/x", b"x%d" % i, qos=1, persistent=True, mqtt5=fields),
            Message("a/b", b"j%d" % i, qos=1, persistent=False, properties={"n": i}),
            Message("$SYS/z", b"z", qos=1, persistent=True),
            Message("a", b"", qos=2, retain=True, persistent=True, priority=7),
        ]
    return messages


def test_worker_reads_equal_in_process_reads(tmp_path: Path, reads: RangeReads) -> None:
    first = [Message("old", b"o" * 200, qos=1, persistent=True) for _ in range(3)]
    # The retention drops the first rows: reads from 0 have a lost part.
    write_journal(tmp_path, [first, mixed_messages()], retention_bytes=400)
    reader = JournalReader(tmp_path, SELECTION)
    bounds = reader.bounds()
    assert bounds.earliest > first[0].message_id
    middle = (bounds.earliest + bounds.high_water) // 2
    ranges = [(0, bounds.high_water), (middle, bounds.high_water), (0, middle), (middle, middle)]
    filters = [("#",), ("s/+/t",), ("s/#",), ("a/b", "s/2/x"), ("$SYS/#", "a"), ("+",)]
    for start, end in ranges:
        for topics in filters:
            for headers in (False, True):
                expected = in_process(reader, start, end, topics, headers)
                served = from_worker(reads, start, end, topics, headers)
                where = (start, end, topics, headers)
                assert served.schema.equals(expected.schema, check_metadata=True), where
                assert served.equals(expected), where
    assert from_worker(reads, 0, bounds.high_water, ("#",), True).num_rows > 0


def test_refusals_are_the_in_process_errors(tmp_path: Path, reads: RangeReads) -> None:
    write_journal(tmp_path, [[Message("t", b"p", qos=1, persistent=True)]], 0)
    reader = JournalReader(tmp_path, SELECTION)
    high_water = reader.bounds().high_water
    with pytest.raises(JournalRangeError) as expected:
        reader.read(0, high_water + 1, ("#",))
    with pytest.raises(JournalRangeError) as served:
        reads.read(0, high_water + 1, ("#",), False)
    assert str(served.value) == str(expected.value)
    with pytest.raises(JournalRangeError, match="not a range of offsets"):
        reads.read(5, 2, ("#",), False)


def test_a_missing_journal_is_a_journal_error(tmp_path: Path) -> None:
    range_reads = RangeReads(tmp_path / "absent" / "kittiwake.db", SELECTION, 5000)
    try:
        with pytest.raises(JournalError, match="cannot open the journal") as refused:
            range_reads.read(0, 0, ("#",), False)
        assert not isinstance(refused.value, JournalRangeError)
    finally:
        range_reads.stop()
    assert not (tmp_path / "absent").exists()  # read-only: nothing is created


def test_a_killed_worker_is_started_again_and_the_next_read_succeeds(
    tmp_path: Path, reads: RangeReads
) -> None:
    messages = [Message("t", b"p%d" % i, qos=1, persistent=True) for i in range(10)]
    write_journal(tmp_path, [messages], 0)
    high_water = JournalReader(tmp_path, SELECTION).bounds().high_water
    assert from_worker(reads, 0, high_water, ("#",), False).num_rows == 10
    killed = reads.pid
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    served = from_worker(reads, 0, high_water, ("#",), False)
    assert served.column("offset").to_pylist() == [m.message_id for m in messages]
    assert reads.pid not in (None, killed)


def test_a_stream_cut_short_by_the_workers_death_is_an_error(
    tmp_path: Path, reads: RangeReads
) -> None:
    # Far more than the first batch and a full pipe: the worker is still writing when killed.
    messages = [Message("t", b"p" * 100, qos=1, persistent=True) for _ in range(60_000)]
    write_journal(tmp_path, [messages], 0)
    high_water = JournalReader(tmp_path, SELECTION).bounds().high_water
    worker_range = reads.read(0, high_water, ("#",), False)
    assert worker_range is not None
    batches = worker_range.batches()
    first = next(batches)
    assert 0 < first.num_rows < len(messages)
    assert reads.pid is not None
    os.kill(reads.pid, signal.SIGKILL)
    with pytest.raises(JournalError):
        for _batch in batches:
            pass
    assert from_worker(reads, 0, high_water, ("#",), False).num_rows == len(messages)


def test_filters_too_long_to_send_are_left_to_the_caller(tmp_path: Path, reads: RangeReads) -> None:
    write_journal(tmp_path, [[Message("t", b"p", qos=1, persistent=True)]], 0)
    high_water = JournalReader(tmp_path, SELECTION).bounds().high_water
    long_filters = tuple(f"{'x' * 200}/{i}" for i in range(1000))
    assert reads.read(0, high_water, long_filters, False) is None
    assert from_worker(reads, 0, high_water, ("#",), False).num_rows == 1


def range_workers_of(pid: int) -> list[int]:
    """The broker's child processes that are range readers."""
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        children += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return [
        child
        for child in children
        if b"kittiwake.flight.range_worker" in Path(f"/proc/{child}/cmdline").read_bytes()
    ]


def test_the_broker_serves_reads_again_after_its_worker_is_killed_and_stops_it_on_exit(
    broker: Callable[..., BrokerProcess], paho: Callable[..., PahoClient]
) -> None:
    process = broker(flight=True, journal={"retention_seconds": 3600})
    assert process.proc is not None
    (worker,) = range_workers_of(process.proc.pid)
    topic = unique("rw")
    publisher = paho(process.address)
    for i in range(5):
        publisher.publish(topic, b"%d" % i, 1)  # returns once PUBACK'd: committed
    connection = flight.connect(process.flight_url)
    try:
        (result,) = list(connection.do_action(flight.Action("latest", b"")))
        high_water = json.loads(result.body.to_pybytes())["0"]["high_water"]
        os.kill(worker, signal.SIGKILL)
        ticket = flight.Ticket(RangeRequest(0, high_water, (topic,)).to_ticket())
        rows = connection.do_get(ticket).read_all().to_pylist()
        assert [r["payload"] for r in rows] == [b"%d" % i for i in range(5)]
    finally:
        connection.close()
    (restarted,) = range_workers_of(process.proc.pid)
    assert restarted != worker
    process.stop()
    assert not Path(f"/proc/{restarted}").exists()
