"""Write cancellation in the SQLite store (DESIGN.md section 3): a queue entry removed before
its insert is taken by the writer is never written, and neither is its delete; an entry whose
insert the writer has taken gets its delete; journal rows are always written.

The writer thread is held on a gate while the test builds the turns it has not taken yet, so
which insert is "pending" is decided by the test, not by timing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage
from kittiwake.broker.store import SessionRecord
from kittiwake.clock import ManualClock
from kittiwake.store import sqlite as sqlite_module
from kittiwake.store.sqlite import SQLiteStore

TIMEOUT = 10.0


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), TIMEOUT * 3))


def message(payload: bytes, topic: str = "a/b") -> Message:
    return Message(topic=topic, payload=payload, qos=1, persistent=True)


def entry(m: Message) -> QueuedMessage:
    return QueuedMessage(m, 1, True)


class HeldWriter:
    """Wraps the writer's batch write: records every row it is given and, while ``gate`` is
    clear, blocks the writer thread (the writer is busy: later turns wait on the loop)."""

    def __init__(self, store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = threading.Event()
        self.batches = 0
        self.rows: list[tuple[str, tuple[Any, ...]]] = []
        original = store._write_batch

        def write(connection: Any, ops: list[tuple[str, list[tuple[Any, ...]]]]) -> Any:
            assert self.gate.wait(TIMEOUT), "the test never released the writer"
            self.batches += 1
            self.rows.extend((sql, row) for sql, rows in ops for row in rows)
            return original(connection, ops)

        monkeypatch.setattr(store, "_write_batch", write)

    def inserted(self, message_id: int) -> bool:
        return any(
            sql.startswith("INSERT OR REPLACE INTO queue_entries") and row[1] == message_id
            for sql, row in self.rows
        )

    def deleted(self, message_id: int) -> bool:
        return any(
            sql.startswith("DELETE FROM queue_entries") and message_id in row[1:]
            for sql, row in self.rows
        )


async def busy_writer(store: SQLiteStore) -> asyncio.Future[None]:
    """Give the (gated) writer a batch, so the next turns wait for it; its commit future."""
    store.save_session(SessionRecord("other", 1))
    future = store.commit()
    assert future is not None
    await asyncio.sleep(0)  # the turn ends: handed to the writer, which blocks on the gate
    return future


def queued(store_dir: Path) -> list[tuple[str, int]]:
    store = SQLiteStore(store_dir, clock=ManualClock())
    try:
        return [(r.queue, r.message_id) for r in store.recover().queued]
    finally:
        store.close()


def test_an_entry_removed_while_its_turn_waits_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept_ids: list[int] = []

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        writer = HeldWriter(store, monkeypatch)
        first = await busy_writer(store)
        acked, kept = message(b"acked"), message(b"kept")
        for m in (acked, kept):
            store.journal(m)
            store.enqueue("c", entry(m))
        turn = store.commit()
        assert turn is not None
        await asyncio.sleep(0)  # sealed, waiting for the writer
        store.remove("c", acked.message_id)  # accepted before the writer took it
        assert store.commit() is turn, "the removal added nothing to write"
        writer.gate.set()
        await asyncio.wait_for(turn, TIMEOUT)
        assert first.done()
        assert store.cancelled_writes == 1
        assert not writer.inserted(acked.message_id)
        assert not writer.deleted(acked.message_id)
        assert writer.inserted(kept.message_id)
        kept_ids.append(kept.message_id)
        store.close()

    run(body)
    assert queued(tmp_path) == [("c", kept_ids[0])]


def test_an_entry_removed_in_its_own_turn_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        writer = HeldWriter(store, monkeypatch)
        writer.gate.set()
        m = message(b"m")
        store.journal(m)
        store.enqueue("c", entry(m))
        store.remove("c", m.message_id)
        store.close()
        assert not writer.inserted(m.message_id)
        assert not writer.deleted(m.message_id)

    run(body)
    assert queued(tmp_path) == []


def test_an_entry_the_writer_has_taken_gets_its_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        writer = HeldWriter(store, monkeypatch)
        m = message(b"m")
        store.journal(m)
        store.enqueue("c", entry(m))
        taken = store.commit()
        assert taken is not None
        await asyncio.sleep(0)  # handed to the (idle, now gated) writer: taken
        store.remove("c", m.message_id)
        removal = store.commit()
        assert removal is not None and removal is not taken
        writer.gate.set()
        await asyncio.wait_for(removal, TIMEOUT)
        assert store.cancelled_writes == 0
        assert writer.inserted(m.message_id) and writer.deleted(m.message_id)
        store.close()

    run(body)
    assert queued(tmp_path) == []


def test_a_turn_left_with_nothing_to_write_resolves_after_the_earlier_ones_without_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publisher acknowledged through a turn whose copies were all accepted: its future
    still means everything before it is durable, and no transaction is spent on it."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        writer = HeldWriter(store, monkeypatch)
        first = await busy_writer(store)
        m = message(b"m")
        store.journal(m)
        store.enqueue("c", entry(m))
        turn = store.commit()
        assert turn is not None
        await asyncio.sleep(0)
        store.remove("c", m.message_id)
        await asyncio.sleep(0)
        assert not turn.done(), "done before the turn ahead of it"
        writer.gate.set()
        await asyncio.wait_for(turn, TIMEOUT)
        assert first.done()
        assert writer.batches == 1
        assert not writer.inserted(m.message_id)
        store.close()

    run(body)
    assert queued(tmp_path) == []


def test_a_second_insert_of_a_pending_entry_keeps_both_and_the_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same entry inserted again (a later turn) while its first insert waits: cancelling
    only one insert would leave the other on disk with no delete."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        writer = HeldWriter(store, monkeypatch)
        await busy_writer(store)
        m = message(b"m")
        store.journal(m)
        store.enqueue("c", entry(m))
        await asyncio.sleep(0)  # sealed
        store.enqueue("c", entry(m))
        await asyncio.sleep(0)  # sealed too
        store.remove("c", m.message_id)
        removal = store.commit()
        assert removal is not None
        writer.gate.set()
        await asyncio.wait_for(removal, TIMEOUT)
        assert store.cancelled_writes == 0
        assert writer.deleted(m.message_id)
        store.close()

    run(body)
    assert queued(tmp_path) == []


def test_a_journal_kept_message_is_written_when_its_entry_is_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), journal_retention_seconds=3600)
        writer = HeldWriter(store, monkeypatch)
        await busy_writer(store)
        m = message(b"kept by the journal")
        store.journal(m)
        store.enqueue("c", entry(m))
        turn = store.commit()
        assert turn is not None
        await asyncio.sleep(0)
        store.remove("c", m.message_id)
        writer.gate.set()
        await asyncio.wait_for(turn, TIMEOUT)
        assert store.cancelled_writes == 1
        assert not writer.inserted(m.message_id)
        assert any(sql.startswith("INSERT INTO journal") for sql, _row in writer.rows)
        store.close()

    run(body)
    rows = sqlite_module.sqlite3.connect(tmp_path / sqlite_module.DATABASE_FILE).execute(
        "SELECT payload FROM journal"
    )
    assert [r[0] for r in rows] == [b"kept by the journal"]
    assert queued(tmp_path) == []


def test_one_of_two_references_cancelled_keeps_the_other_and_the_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids: list[int] = []

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        writer = HeldWriter(store, monkeypatch)
        await busy_writer(store)
        m = message(b"two queues")
        store.journal(m)
        ids.append(m.message_id)
        store.enqueue("c1", entry(m))
        store.enqueue("c2", entry(m))
        turn = store.commit()
        assert turn is not None
        await asyncio.sleep(0)
        store.remove("c1", m.message_id)
        writer.gate.set()
        await asyncio.wait_for(turn, TIMEOUT)
        assert store.cancelled_writes == 1
        store.close()

    run(body)
    store = SQLiteStore(tmp_path, clock=ManualClock())
    try:
        state = store.recover()
    finally:
        store.close()
    assert [(r.queue, r.message_id) for r in state.queued] == [("c2", ids[0])]
    assert state.messages[ids[0]].payload == b"two queues"


# -- the acceptance window: a batch only unhurried callers wait on, with entries that may yet
# be accepted, waits for an idle writer that long (store.acceptance_window).


def test_an_unhurried_batch_waits_for_its_entries_acceptance_and_writes_none_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=3600)
        writer = HeldWriter(store, monkeypatch)
        writer.gate.set()
        first, second = message(b"1"), message(b"2")
        for m in (first, second):
            store.journal(m)
            store.enqueue("c", entry(m))
        turn = store.commit_unhurried()
        assert turn is not None
        for _ in range(3):
            await asyncio.sleep(0)
        assert not turn.done() and writer.batches == 0, "held for the acceptances"
        store.remove("c", first.message_id)
        await asyncio.sleep(0)
        assert not turn.done(), "one entry may still be accepted"
        store.remove("c", second.message_id)  # the last one: nothing left to wait for
        await asyncio.wait_for(turn, TIMEOUT)
        assert store.cancelled_writes == 2
        assert not writer.inserted(first.message_id) and not writer.inserted(second.message_id)
        store.close()

    run(body)
    assert queued(tmp_path) == []


def test_an_unhurried_batch_is_written_once_its_window_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=0.01)
        writer = HeldWriter(store, monkeypatch)
        writer.gate.set()
        m = message(b"m")
        turn = unhurried_turn(store, "c", [m])
        await asyncio.wait_for(turn, TIMEOUT)  # the window's timer ran on the loop's clock
        assert writer.inserted(m.message_id)
        store.close()

    run(body)
    assert len(queued(tmp_path)) == 1


def test_a_commit_someone_waits_for_is_not_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """commit() (a QoS 2 publisher, a subscription, ...) on the open turn, or on a turn
    already held: it goes to the writer at once, held entries and all."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=3600)
        writer = HeldWriter(store, monkeypatch)
        writer.gate.set()
        held = message(b"held")
        turn = unhurried_turn(store, "c", [held])
        await asyncio.sleep(0)
        assert not turn.done()
        assert store.commit() is turn  # nothing new: the held turn is what it waits for
        await asyncio.wait_for(turn, TIMEOUT)
        assert writer.inserted(held.message_id)
        urgent = message(b"urgent")
        store.journal(urgent)
        store.enqueue("c", entry(urgent))
        waited = store.commit()
        assert waited is not None
        await asyncio.wait_for(waited, TIMEOUT)
        assert writer.inserted(urgent.message_id)
        store.close()

    run(body)
    assert len(queued(tmp_path)) == 2


def test_a_graceful_stop_writes_a_turn_held_for_acceptances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() within the acceptance window: the held turn is written and its waiters are
    answered, not dropped with the writer (a restart recovers the copy)."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=3600)
        writer = HeldWriter(store, monkeypatch)
        writer.gate.set()
        m = message(b"held at stop")
        turn = unhurried_turn(store, "c", [m])
        await asyncio.sleep(0)
        assert not turn.done(), "held for the acceptance"
        store.close()
        await asyncio.wait_for(turn, TIMEOUT)
        assert writer.inserted(m.message_id)

    run(body)
    assert len(queued(tmp_path)) == 1


def test_a_commit_on_a_turn_waiting_for_a_busy_writer_is_not_held_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unhurried turn sealed while the writer is busy, then commit() with nothing new:
    once the writer is free the turn goes at once, not after the acceptance window."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=3600)
        writer = HeldWriter(store, monkeypatch)
        first = await busy_writer(store)
        m = message(b"waits for the writer")
        turn = unhurried_turn(store, "c", [m])
        await asyncio.sleep(0)  # sealed, behind the busy writer
        assert store.commit() is turn
        writer.gate.set()
        await asyncio.wait_for(first, TIMEOUT)
        await asyncio.wait_for(turn, TIMEOUT)  # within the test's timeout, not the hour
        assert writer.inserted(m.message_id)
        store.close()

    run(body)
    assert len(queued(tmp_path)) == 1


def held_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offset: list[float]
) -> tuple[SQLiteStore, HeldWriter]:
    """A store with an acceptance window of 100 s on the running loop, whose clock the test
    moves on by ``offset[0]`` (its timers follow it), and its writer, let through."""
    loop = asyncio.get_running_loop()
    real_time = loop.time
    monkeypatch.setattr(loop, "time", lambda: real_time() + offset[0])
    store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=100)
    writer = HeldWriter(store, monkeypatch)
    writer.gate.set()
    return store, writer


def unhurried_turn(
    store: SQLiteStore, queue: str, messages: list[Message]
) -> asyncio.Future[None]:
    """The messages journalled and queued, and their turn committed unhurried (held)."""
    for m in messages:
        store.journal(m)
        store.enqueue(queue, entry(m))
    turn = store.commit_unhurried()
    assert turn is not None
    return turn


def test_a_release_writes_only_the_turns_whose_window_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each held turn waits the whole acceptance window: once the oldest's is over, a turn
    sealed later stays held, and an entry of it accepted meanwhile is never written. (Not
    every turn sealed so far: a steady flow would write the entries sealed just before each
    release, accepted a moment later.)"""
    offset = [0.0]
    old, young = message(b"old"), message(b"young")

    async def body() -> None:
        store, writer = held_store(tmp_path, monkeypatch, offset)
        old_turn = unhurried_turn(store, "c", [old])
        await asyncio.sleep(0)  # sealed and held
        offset[0] += 60
        young_turn = unhurried_turn(store, "c", [young])
        assert young_turn is not old_turn
        await asyncio.sleep(0)  # sealed and held too
        offset[0] += 50  # the old turn's window is over, not the young one's
        await asyncio.wait_for(old_turn, TIMEOUT)
        assert writer.inserted(old.message_id)
        for _ in range(3):
            await asyncio.sleep(0)
        assert not young_turn.done() and not writer.inserted(young.message_id)
        store.remove("c", young.message_id)  # accepted within its own window
        await asyncio.wait_for(young_turn, TIMEOUT)
        assert store.cancelled_writes == 1 and store.written_entries == 1
        assert not writer.inserted(young.message_id)
        store.close()

    asyncio.run(body())
    assert queued(tmp_path) == [("c", old.message_id)]


def test_a_turn_past_its_window_stays_held_while_held_entries_are_being_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscriber taking a flood in order accepts each copy once those queued ahead of it
    are: past the window, a turn still stays held while held entries are being accepted, and
    goes without a write once all of its entries are; a turn whose entries nobody accepts
    for a window (a stalled subscriber) is written then."""
    offset = [0.0]
    first, second, later = message(b"first"), message(b"second"), message(b"later")

    async def turns() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    async def body() -> None:
        store, writer = held_store(tmp_path, monkeypatch, offset)
        old_turn = unhurried_turn(store, "c", [first, second])
        await asyncio.sleep(0)  # sealed and held
        offset[0] += 60
        young_turn = unhurried_turn(store, "c", [later])
        assert young_turn is not old_turn
        await asyncio.sleep(0)  # sealed and held too
        store.remove("c", first.message_id)  # accepted: the subscriber makes progress
        offset[0] += 50  # the old turn's window is over
        await turns()
        assert not old_turn.done(), "written while its entries were being accepted"
        store.remove("c", second.message_id)
        offset[0] += 20  # the next look: the old turn has nothing left to write
        await asyncio.wait_for(old_turn, TIMEOUT)
        assert not writer.inserted(first.message_id)
        assert not writer.inserted(second.message_id)
        await turns()
        assert not young_turn.done()
        offset[0] += 200  # nothing accepted for more than a window: the young turn goes
        await asyncio.wait_for(young_turn, TIMEOUT)
        assert writer.inserted(later.message_id)
        assert store.cancelled_writes == 2 and store.written_entries == 1
        store.close()

    asyncio.run(body())
    assert queued(tmp_path) == [("c", later.message_id)]


def test_a_held_turn_whose_entries_are_all_accepted_is_done_before_its_window_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With entries of a later turn still held (a steady flood: the held entries are never
    all accepted at once), a turn whose every entry was accepted is done at the next look,
    not kept (with its messages) until its window is over."""
    offset = [0.0]
    old, young = message(b"old"), message(b"young")

    async def body() -> None:
        store, writer = held_store(tmp_path, monkeypatch, offset)
        old_turn = unhurried_turn(store, "c", [old])
        await asyncio.sleep(0)  # sealed and held
        young_turn = unhurried_turn(store, "c", [young])
        assert young_turn is not old_turn
        await asyncio.sleep(0)  # sealed and held too
        store.remove("c", old.message_id)  # accepted; the young entry is not
        offset[0] += 20  # a look (every eighth of the window), well within the window
        await asyncio.wait_for(old_turn, TIMEOUT)
        assert not young_turn.done()
        assert store.written_entries == 0 and not writer.inserted(old.message_id)
        store.remove("c", young.message_id)
        await asyncio.wait_for(young_turn, TIMEOUT)
        assert store.written_entries == 0 and store.cancelled_writes == 2
        store.close()

    asyncio.run(body())
    assert queued(tmp_path) == []


def test_a_turn_held_while_others_entries_are_accepted_is_written_after_a_bounded_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry nobody accepts (a stalled subscriber's) while other held entries keep being
    accepted is written once its turn has waited _ACCEPTING_HOLD windows, not held on."""
    offset = [0.0]
    stalled = message(b"stalled")
    flowing = [message(b"%d" % n) for n in range(2 * sqlite_module._ACCEPTING_HOLD + 2)]

    async def body() -> None:
        store, writer = held_store(tmp_path, monkeypatch, offset)
        old_turn = unhurried_turn(store, "stalled", [stalled])
        await asyncio.sleep(0)  # sealed and held
        offset[0] += 1
        young_turn = unhurried_turn(store, "flowing", flowing)
        assert young_turn is not old_turn
        await asyncio.sleep(0)
        held_until = 100 * sqlite_module._ACCEPTING_HOLD
        accepted = iter(flowing)
        while offset[0] + 50 < held_until:
            store.remove("flowing", next(accepted).message_id)  # the other queue moves
            offset[0] += 50
            for _ in range(3):
                await asyncio.sleep(0)
            if offset[0] > 100:
                assert not old_turn.done(), "written while held entries were being accepted"
        store.remove("flowing", next(accepted).message_id)
        offset[0] = held_until + 10  # the wait's bound is over: accepted or not
        await asyncio.wait_for(old_turn, TIMEOUT)
        assert writer.inserted(stalled.message_id)
        store.close()

    asyncio.run(body())
    assert ("stalled", stalled.message_id) in queued(tmp_path)


def recovered_marks(store_dir: Path) -> list[tuple[int, str, int]]:
    """(delivery id, state, delivery count) of every stored entry."""
    store = SQLiteStore(store_dir, clock=ManualClock())
    try:
        return [(r.delivery_id, r.state, r.delivery_count) for r in store.recover().queued]
    finally:
        store.close()


def test_a_lazy_mark_of_an_entry_accepted_before_its_insert_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery's lazy mark waits with the pending insert and goes with it: neither the
    insert nor the mark reaches the writer."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=3600)
        writer = HeldWriter(store, monkeypatch)
        writer.gate.set()
        m = message(b"accepted in time")
        turn = unhurried_turn(store, "c", [m])
        await asyncio.sleep(0)  # sealed and held
        store.mark_delivery("c", m.message_id, 7, "sent", lazy=True)
        store.remove("c", m.message_id)
        await asyncio.wait_for(turn, TIMEOUT)
        store.close()
        assert store.cancelled_writes == 1
        assert not any(sql.startswith("UPDATE queue_entries") for sql, _row in writer.rows)
        assert not writer.inserted(m.message_id)

    run(body)
    assert queued(tmp_path) == []


def test_a_lazy_mark_of_an_entry_written_later_is_written_after_its_insert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry whose window is over is written as queued; the mark it got meanwhile is a
    lazy mark from then on (a graceful stop writes it), as if made after the insert."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=0.01)
        writer = HeldWriter(store, monkeypatch)
        writer.gate.set()
        m = message(b"not accepted in time")
        turn = unhurried_turn(store, "c", [m])
        await asyncio.sleep(0)  # sealed and held
        store.mark_delivery("c", m.message_id, 7, "sent", lazy=True)
        await asyncio.wait_for(turn, TIMEOUT)  # the window's timer ran on the loop's clock
        assert writer.inserted(m.message_id)
        store.close()

    run(body)
    assert recovered_marks(tmp_path) == [(7, "sent", 1)]


def test_a_graceful_stop_writes_the_lazy_mark_of_a_held_entry_beside_an_open_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() while a turn is held and another publication waits in the open turn: the held
    entry's lazy mark (made while its insert was pending) is written with it, so a restart
    knows the delivery happened (a resend carries DUP; the delivery count holds)."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=3600)
        writer = HeldWriter(store, monkeypatch)
        writer.gate.set()
        m = message(b"sent, not acknowledged")
        turn = unhurried_turn(store, "c", [m])
        await asyncio.sleep(0)  # sealed and held
        store.mark_delivery("c", m.message_id, 7, "sent", lazy=True)
        other = message(b"in the open turn", topic="c/d")
        store.journal(other)
        store.enqueue("d", entry(other))
        store.close()
        await asyncio.wait_for(turn, TIMEOUT)

    run(body)
    assert sorted(recovered_marks(tmp_path)) == [(0, "queued", 0), (7, "sent", 1)]


def test_a_mark_made_on_a_pending_insert_then_another_keeps_the_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lazy mark waiting with its insert, then a second attempt's mark that is not lazy:
    the written count holds both attempts and the newer delivery id."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=3600)
        writer = HeldWriter(store, monkeypatch)
        writer.gate.set()
        m = message(b"sent twice")
        store.journal(m)
        store.enqueue("c", entry(m))
        assert store.commit_unhurried() is not None
        await asyncio.sleep(0)  # sealed and held
        store.mark_delivery("c", m.message_id, 7, "sent", lazy=True)
        store.mark_delivery("c", m.message_id, 8, "sent")
        waited = store.commit()
        assert waited is not None
        await asyncio.wait_for(waited, TIMEOUT)
        store.close()

    run(body)
    assert recovered_marks(tmp_path) == [(8, "sent", 2)]


def test_every_reference_of_a_fanned_out_message_cancelled_writes_none_and_marks_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message's copies on three queues, pending together: each lazy mark joins its own
    queue's insert; the two accepted copies are never written (nor their marks), the third
    is written with its own mark, and nothing else of the others is touched."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=3600)
        writer = HeldWriter(store, monkeypatch)
        writer.gate.set()
        m = message(b"three queues")
        store.journal(m)
        for name in ("c1", "c2", "c3"):
            store.enqueue(name, entry(m))
        assert store.commit_unhurried() is not None
        await asyncio.sleep(0)  # sealed and held
        for tag, name in enumerate(("c1", "c2", "c3"), start=1):
            store.mark_delivery(name, m.message_id, tag, "sent", lazy=True)
        store.remove("c1", m.message_id)
        store.remove("c3", m.message_id)
        assert store.cancelled_writes == 2
        waited = store.commit()
        assert waited is not None
        await asyncio.wait_for(waited, TIMEOUT)
        assert not any(sql.startswith("DELETE FROM queue_entries") for sql, _r in writer.rows)
        store.close()

    run(body)
    assert queued(tmp_path) == [("c2", 1)]
    assert recovered_marks(tmp_path) == [(2, "sent", 1)]


def test_an_entry_inserted_twice_in_one_turn_keeps_both_and_the_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same entry inserted twice in one turn (beside another queue's copy): a removal
    cancels neither of its inserts but writes the delete, and the other queue's copy is
    still cancellable."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        writer = HeldWriter(store, monkeypatch)
        await busy_writer(store)
        m = message(b"m")
        store.journal(m)
        store.enqueue("c", entry(m))
        store.enqueue("d", entry(m))
        store.enqueue("c", entry(m))
        await asyncio.sleep(0)  # sealed
        store.remove("d", m.message_id)
        store.remove("c", m.message_id)
        removal = store.commit()
        assert removal is not None
        writer.gate.set()
        await asyncio.wait_for(removal, TIMEOUT)
        assert store.cancelled_writes == 1
        assert writer.deleted(m.message_id)
        store.close()

    run(body)
    assert queued(tmp_path) == []
