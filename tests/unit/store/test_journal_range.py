"""A range read into Arrow: chunks cut at their row and byte bounds in offset order, one
snapshot for the whole read (a sweep after it opened removes nothing from it), rows with
optional parts decoded whole, and rows filtered in Arrow where SQL cannot filter them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kittiwake.broker.message import Message, MQTT5Fields
from kittiwake.clock import ManualClock
from kittiwake.store import journal_range
from kittiwake.store import sqlite as sqlite_module
from kittiwake.store.journal_reader import JournalReader
from kittiwake.store.journal_selection import JournalSelection
from kittiwake.store.sqlite import SQLiteStore


@pytest.fixture(autouse=True)
def sweep_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_module, "SWEEP_INTERVAL", 0.0)


def open_store(directory: Path, retention_bytes: int = 0) -> SQLiteStore:
    return SQLiteStore(
        directory,
        clock=ManualClock(),
        journal_selection=JournalSelection(enabled=True),
        journal_retention_seconds=3600,
        journal_retention_bytes=retention_bytes,
    )


async def settle(store: SQLiteStore) -> None:
    for _ in range(3):  # the sweep rides on the next batch
        future = store.commit()
        if future is not None:
            await asyncio.wait_for(future, 10)
        await asyncio.sleep(0)


def test_chunks_close_at_their_row_and_byte_bounds_in_offset_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_range, "_FETCH_ROWS", 3)
    monkeypatch.setattr(journal_range, "CHUNK_ROWS", 7)
    monkeypatch.setattr(journal_range, "CHUNK_BYTES", 1000)

    async def body() -> None:
        store = open_store(tmp_path)
        small = [Message("a/b", b"s%d" % i, qos=1, persistent=True) for i in range(20)]
        large = [Message("a/c", b"L" * 600, qos=1, persistent=True) for _ in range(3)]
        after = [Message("a/b", b"t%d" % i, qos=1, persistent=True) for i in range(3)]
        for message in small + large + after:
            store.journal(message)
        await settle(store)
        reader = JournalReader(tmp_path, JournalSelection(enabled=True))
        bounds = reader.bounds()
        with reader.read(0, bounds.high_water, ("#",)) as read:
            chunks = list(read.chunks())
        # Batches of 3 rows gather until a chunk has 7 rows or 1000 bytes of payload: the
        # third closes at 6 rows (two large payloads in its second batch).
        assert [len(c) for c in chunks] == [9, 9, 6, 2]
        served = [(o, p) for c in chunks for o, p in zip(c.offsets, c.payloads, strict=True)]
        assert served == [(m.message_id, m.payload) for m in small + large + after]
        assert all(c.extras is None for c in chunks)
        store.close()

    asyncio.run(body())


def test_a_read_serves_its_snapshot_even_when_a_sweep_runs_during_it(tmp_path: Path) -> None:
    async def body() -> None:
        store = open_store(tmp_path, retention_bytes=250)
        messages = [Message("t", bytes([65 + i]) * 100, qos=1, persistent=True) for i in range(2)]
        for message in messages:
            store.journal(message)
        await settle(store)
        reader = JournalReader(tmp_path, JournalSelection(enabled=True))
        bounds = reader.bounds()
        assert bounds.earliest == messages[0].message_id
        with reader.read(bounds.earliest, bounds.high_water, ("#",)) as read:
            store.journal(Message("t", b"z" * 200, qos=1, persistent=True))
            await settle(store)  # sweeps both rows
            assert reader.bounds().earliest > messages[1].message_id
            served = [o for chunk in read.chunks() for o in chunk.offsets]
        assert served == [m.message_id for m in messages]
        store.close()

    asyncio.run(body())


def test_rows_with_optional_parts_are_decoded_and_plus_filters_match_in_arrow(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        store = open_store(tmp_path)
        plain = Message("s/1/t", b"p", qos=1, persistent=True)
        with_fields = Message(
            "s/2/t",
            b"q",
            qos=1,
            persistent=True,
            mqtt5=MQTT5Fields(content_type="text/plain", user_properties=[("k", "v")]),
        )
        other = Message("s/2/x", b"r", qos=1, persistent=True)
        for message in (plain, with_fields, other):
            store.journal(message)
        await settle(store)
        reader = JournalReader(tmp_path, JournalSelection(enabled=True))
        bounds = reader.bounds()
        with reader.read(0, bounds.high_water, ("s/+/t",)) as read:
            (chunk,) = list(read.chunks())
        assert chunk.offsets == [plain.message_id, with_fields.message_id]
        assert chunk.extras is not None and chunk.extras[0] is None
        decoded = chunk.extras[1]
        assert decoded is not None and decoded.mqtt5 is not None
        assert decoded.mqtt5.content_type == "text/plain"
        assert decoded.mqtt5.user_properties == [("k", "v")]
        store.close()

    asyncio.run(body())
