"""Journal retention: what the Spark source will read stays after acknowledgement, bounded.

With no retention a message lives while a queue references it; a time or size retention keeps
every persistent publication (referenced or not) and sweeps the old ones, never a referenced one.
The journal is append-only: a number is never reused, never written again after a sweep, and
reaches the journal after every lower one. Time is the store's manual clock: no test sleeps.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage
from kittiwake.clock import ManualClock
from kittiwake.store.sqlite import DATABASE_FILE, SWEEP_INTERVAL, SQLiteStore


def journal_ids(directory: Path) -> list[int]:
    connection = sqlite3.connect(directory / DATABASE_FILE)
    try:
        return [
            row[0]
            for row in connection.execute("SELECT message_id FROM journal ORDER BY message_id")
        ]
    finally:
        connection.close()


def inline_ids(directory: Path) -> list[int]:
    """Messages stored inside their (only) queue entry instead of the journal."""
    connection = sqlite3.connect(directory / DATABASE_FILE)
    try:
        return [
            row[0]
            for row in connection.execute(
                "SELECT message_id FROM queue_entries WHERE topic IS NOT NULL ORDER BY message_id"
            )
        ]
    finally:
        connection.close()


async def settle(store: SQLiteStore) -> None:
    future = store.commit()
    if future is not None:
        await asyncio.wait_for(future, 10)


def publish(store: SQLiteStore, payload: bytes) -> Message:
    message = Message("t", payload, qos=1, persistent=True)
    store.journal(message)
    return message


def test_without_retention_unreferenced_messages_are_not_journalled(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        kept = publish(store, b"referenced")
        publish(store, b"nobody durable wants this")
        store.enqueue("durable", QueuedMessage(kept, 1, True))
        await settle(store)
        # The one referenced message rides inline in its queue entry: no journal row at all.
        assert journal_ids(tmp_path) == []
        assert inline_ids(tmp_path) == [kept.message_id]
        store.remove("durable", kept.message_id)
        await settle(store)
        assert journal_ids(tmp_path) == []
        assert inline_ids(tmp_path) == []
        store.close()

    asyncio.run(body())


def test_time_retention_keeps_messages_for_the_retention_then_sweeps_them(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        clock = ManualClock()
        store = SQLiteStore(tmp_path, clock=clock, journal_retention_seconds=3600)
        first = publish(store, b"acknowledged later")
        second = publish(store, b"never referenced")
        held = publish(store, b"still referenced")
        store.enqueue("durable", QueuedMessage(first, 1, True))
        store.enqueue("slow", QueuedMessage(held, 1, True))
        commit = store.commit()
        assert commit is not None, "a journalled publication must be committed before its ack"
        await settle(store)
        # With a retention the journal holds every message; queue entries only point to it.
        assert inline_ids(tmp_path) == []
        clock.advance(SWEEP_INTERVAL)
        store.remove("durable", first.message_id)
        await settle(store)
        assert journal_ids(tmp_path) == [first.message_id, second.message_id, held.message_id]
        clock.advance(3600 - SWEEP_INTERVAL - 1)
        publish(store, b"the next batch carries the sweep")
        await settle(store)
        assert first.message_id in journal_ids(tmp_path), "swept before its retention"
        clock.advance(SWEEP_INTERVAL + 1)
        last = publish(store, b"newer than the retention")
        await settle(store)
        assert journal_ids(tmp_path) == [held.message_id, last.message_id - 1, last.message_id]
        store.close()

    asyncio.run(body())


def test_the_sweep_runs_at_most_once_per_interval_of_the_clock(tmp_path: Path) -> None:
    async def body() -> None:
        clock = ManualClock()
        store = SQLiteStore(tmp_path, clock=clock, journal_retention_bytes=1)
        old = publish(store, b"old")
        await settle(store)
        publish(store, b"next batch, same second")
        await settle(store)
        assert old.message_id in journal_ids(tmp_path)
        clock.advance(SWEEP_INTERVAL)
        publish(store, b"next batch, a second later")
        await settle(store)
        assert old.message_id not in journal_ids(tmp_path)
        store.close()

    asyncio.run(body())


def test_size_retention_keeps_the_newest_and_every_referenced_message(tmp_path: Path) -> None:
    async def body() -> None:
        clock = ManualClock()
        store = SQLiteStore(tmp_path, clock=clock, journal_retention_bytes=250)
        messages = [publish(store, bytes([65 + i]) * 100) for i in range(5)]
        # The oldest stays referenced by a durable queue: it must survive any trimming.
        store.enqueue("durable", QueuedMessage(messages[0], 1, True))
        await settle(store)
        clock.advance(SWEEP_INTERVAL)
        publish(store, b"z")  # a later batch runs the sweep over the first five
        await settle(store)
        ids = journal_ids(tmp_path)
        assert messages[0].message_id in ids
        # Newest first, payloads of 100 bytes: only the two newest fit in 250 bytes.
        assert messages[3].message_id in ids and messages[4].message_id in ids
        assert messages[1].message_id not in ids and messages[2].message_id not in ids
        store.close()

    asyncio.run(body())


def test_a_swept_journal_row_is_never_inserted_again(tmp_path: Path) -> None:
    """Append-only: once the sweep removed a message's row, queueing the same message again
    (a retained message sent to a later subscriber) must not bring its old number back."""

    async def body() -> int:
        clock = ManualClock()
        # A size retention of one byte sweeps every unreferenced row.
        store = SQLiteStore(tmp_path, clock=clock, journal_retention_bytes=1)
        retained = publish(store, b"retained payload")
        store.enqueue("early", QueuedMessage(retained, 1, True))
        await settle(store)
        clock.advance(SWEEP_INTERVAL)
        store.remove("early", retained.message_id)
        await settle(store)
        assert retained.message_id not in journal_ids(tmp_path), "the sweep did not run"
        store.enqueue("late", QueuedMessage(retained, 1, True, retain=True))
        await settle(store)
        assert retained.message_id not in journal_ids(tmp_path), "a swept number came back"
        store.close()
        return retained.message_id

    message_id = asyncio.run(body())
    # The late entry carries its own copy of the message.
    recovered = SQLiteStore(tmp_path, clock=ManualClock())
    state = recovered.recover()
    recovered.close()
    assert [(r.queue, r.message_id) for r in state.queued] == [("late", message_id)]
    assert state.messages[message_id].payload == b"retained payload"


def test_a_reader_never_finds_a_lower_number_after_a_higher_one(tmp_path: Path) -> None:
    """Numbers reach the journal in the order they were handed out: everything below what a
    reader has seen is already there (or swept), never added later."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        seen: list[int] = []

        def read() -> None:
            ids = journal_ids(tmp_path)
            new = [i for i in ids if i not in seen]
            assert not seen or all(i > max(seen) for i in new), (seen, ids)
            seen.extend(new)

        older = publish(store, b"older, kept in memory (retained)")
        store.enqueue("a", QueuedMessage(older, 1, True))
        await settle(store)
        read()
        newer = publish(store, b"newer, two queues reference it")
        store.enqueue("a", QueuedMessage(newer, 1, True))
        store.enqueue("b", QueuedMessage(newer, 1, True))
        await settle(store)
        read()
        assert newer.message_id in seen
        # Two later subscribers of the older (retained) message, in one turn.
        store.enqueue("c", QueuedMessage(older, 1, True, retain=True))
        store.enqueue("d", QueuedMessage(older, 1, True, retain=True))
        await settle(store)
        read()
        store.close()

    asyncio.run(body())
    recovered = SQLiteStore(tmp_path, clock=ManualClock())
    state = recovered.recover()
    recovered.close()
    assert sorted(r.queue for r in state.queued) == ["a", "a", "b", "c", "d"]
    assert all(r.message_id in state.messages for r in state.queued)


def test_the_time_sweep_reads_the_age_index_not_the_whole_journal(tmp_path: Path) -> None:
    """The sweep runs every second: finding the newest row past the retention must read only
    the rows past it (the age index), never walk the journal row by row (SQLite's MAX()
    shortcut would, when nothing is past the retention)."""
    from kittiwake.store.sqlite import _PAST_TIME_RETENTION

    SQLiteStore(tmp_path, clock=ManualClock(), journal_retention_seconds=60).close()
    connection = sqlite3.connect(tmp_path / DATABASE_FILE)
    try:
        plan = connection.execute("EXPLAIN QUERY PLAN " + _PAST_TIME_RETENTION, (0,)).fetchall()
    finally:
        connection.close()
    assert [row[3] for row in plan] == [
        "SEARCH journal USING COVERING INDEX journal_by_age (stored_at<?)"
    ]
