"""Journal retention: what the Spark source will read stays after acknowledgement, bounded.

With no retention a message lives while a queue references it; a time or size retention keeps
every persistent publication (referenced or not) and sweeps the old ones, never a referenced one.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage
from kittiwake.clock import ManualClock
from kittiwake.store import sqlite as sqlite_module
from kittiwake.store.sqlite import DATABASE_FILE, SQLiteStore


def journal_ids(directory: Path) -> list[int]:
    connection = sqlite3.connect(directory / DATABASE_FILE)
    try:
        return [row[0] for row in connection.execute("SELECT id FROM messages ORDER BY id")]
    finally:
        connection.close()


def inline_ids(directory: Path) -> list[int]:
    """Messages stored inside their (only) queue row instead of the journal."""
    connection = sqlite3.connect(directory / DATABASE_FILE)
    try:
        return [
            row[0]
            for row in connection.execute(
                "SELECT message_id FROM queued WHERE topic IS NOT NULL ORDER BY message_id"
            )
        ]
    finally:
        connection.close()


async def settle(store: SQLiteStore) -> None:
    for _ in range(3):  # the sweep rides on the next batch
        future = store.commit()
        if future is not None:
            await asyncio.wait_for(future, 10)
        await asyncio.sleep(0)


def publish(store: SQLiteStore, payload: bytes) -> Message:
    message = Message("t", payload, qos=1, persistent=True)
    store.journal(message)
    return message


@pytest.fixture(autouse=True)
def sweep_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweep on every hand-off instead of once a second, so the test need not wait."""
    monkeypatch.setattr(sqlite_module, "SWEEP_INTERVAL", 0.0)


def test_without_retention_unreferenced_messages_are_not_journalled(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        kept = publish(store, b"referenced")
        publish(store, b"nobody durable wants this")
        store.enqueue("durable", QueuedMessage(kept, 1, True))
        await settle(store)
        # The one referenced message rides inline in its queue row: no journal row at all.
        assert journal_ids(tmp_path) == []
        assert inline_ids(tmp_path) == [kept.message_id]
        store.release("durable", kept.message_id)
        await settle(store)
        assert journal_ids(tmp_path) == []
        assert inline_ids(tmp_path) == []
        store.close()

    asyncio.run(body())


def test_time_retention_keeps_acknowledged_and_unreferenced_messages(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), journal_retention_seconds=3600)
        first = publish(store, b"acknowledged later")
        second = publish(store, b"never referenced")
        store.enqueue("durable", QueuedMessage(first, 1, True))
        commit = store.commit()
        assert commit is not None, "a journalled publication must be committed before its ack"
        await settle(store)
        # With a retention the journal holds every message; queue rows only point to it.
        assert inline_ids(tmp_path) == []
        store.release("durable", first.message_id)
        await settle(store)
        assert journal_ids(tmp_path) == [first.message_id, second.message_id]
        store.close()

    asyncio.run(body())


def test_size_retention_keeps_the_newest_and_every_referenced_message(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), journal_retention_bytes=250)
        messages = [publish(store, bytes([65 + i]) * 100) for i in range(5)]
        # The oldest stays referenced by a durable queue: it must survive any trimming.
        store.enqueue("durable", QueuedMessage(messages[0], 1, True))
        await settle(store)
        publish(store, b"z")  # a later batch runs the sweep over the first five
        await settle(store)
        ids = journal_ids(tmp_path)
        assert messages[0].message_id in ids
        # Newest first, payloads of 100 bytes: only the two newest fit in 250 bytes.
        assert messages[3].message_id in ids and messages[4].message_id in ids
        assert messages[1].message_id not in ids and messages[2].message_id not in ids
        store.close()

    asyncio.run(body())
