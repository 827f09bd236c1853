"""The size retention's running count gives the start a full reading of the journal would.

The reference is the rule itself, read from the whole table: the newest rows above the start
whose payloads fit in the limit stay, and the start is raised to the newest row that does not
fit. Random payload sizes, time-retention raises between sweeps and rolled-back batches.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from kittiwake.broker.message import Message
from kittiwake.clock import ManualClock
from kittiwake.store import sqlite as sqlite_store
from kittiwake.store.codec import message_row
from kittiwake.store.size_retention import SizeRetention
from kittiwake.store.sqlite import SQLiteStore

KEY = "journal_dropped_through"


def journal() -> sqlite3.Connection:
    connection = sqlite3.connect(":memory:", isolation_level=None)
    connection.execute("CREATE TABLE journal (message_id INTEGER PRIMARY KEY, payload BLOB)")
    connection.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    connection.execute("INSERT INTO meta VALUES (?, '0')", (KEY,))
    return connection


def start(connection: sqlite3.Connection) -> int:
    return int(connection.execute("SELECT value FROM meta WHERE key=?", (KEY,)).fetchone()[0])


def reference_start(connection: sqlite3.Connection, limit: int) -> int:
    """The start as the rule says, from every row above the current one."""
    current = start(connection)
    rows = connection.execute(
        "SELECT message_id, length(payload) FROM journal WHERE message_id > ? "
        "ORDER BY message_id DESC",
        (current,),
    ).fetchall()
    newer = 0
    for message_id, size in rows:
        newer += size or 0
        if newer > limit:
            return message_id
    return current


@pytest.mark.parametrize("seed", range(6))
def test_the_running_count_raises_the_start_as_a_full_reading_would(seed: int) -> None:
    rng = random.Random(seed)
    limit = rng.choice([1, 100, 1_000, 5_000])
    connection = journal()
    retention = SizeRetention(limit, KEY)
    next_id = 1
    for _batch in range(60):
        connection.execute("BEGIN")
        retention.begin(connection)
        rows = []
        for _ in range(rng.randrange(0, 20)):
            payload = None if rng.random() < 0.05 else bytes(rng.randrange(0, 400))
            rows.append((next_id, payload))
            next_id += 1
        connection.executemany("INSERT INTO journal VALUES (?, ?)", rows)
        retention.added(sum(len(p) for _, p in rows if p is not None))
        if rng.random() < 0.2 and next_id > 2:
            # The time retention raised the start in the same batch, before this sweep.
            raised = rng.randrange(start(connection), next_id)
            connection.execute(
                "UPDATE meta SET value = MAX(CAST(value AS INTEGER), ?) WHERE key = ?",
                (raised, KEY),
            )
        expected = reference_start(connection, limit)
        retention.sweep(connection)
        assert start(connection) == expected
        if rng.random() < 0.2:
            connection.execute("ROLLBACK")
            retention.rollback()
            next_id -= len(rows)
        else:
            connection.execute("COMMIT")
        if rng.random() < 0.3:
            # Rows at or below the start may go (unreferenced ones do), others stay.
            connection.execute(
                "DELETE FROM journal WHERE message_id <= ? AND message_id % 2 = 0",
                (start(connection),),
            )


def test_a_new_writer_counts_the_journal_it_finds() -> None:
    connection = journal()
    connection.executemany(
        "INSERT INTO journal VALUES (?, ?)", [(i, bytes(100)) for i in range(1, 11)]
    )
    retention = SizeRetention(250, KEY)
    connection.execute("BEGIN")
    retention.begin(connection)
    retention.sweep(connection)
    connection.execute("COMMIT")
    assert start(connection) == 8, "the two newest fit in 250 bytes"


class FailingBegin:
    """The writer's connection, whose next BEGIN fails once (what SQLite says when a
    transaction is still open after a failed ROLLBACK)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.fail_next_begin = False

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql == "BEGIN" and self.fail_next_begin:
            self.fail_next_begin = False
            raise sqlite3.OperationalError("cannot start a transaction within a transaction")
        return self.connection.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self.connection, name)


def test_a_batch_that_never_began_takes_back_nothing_counted(tmp_path: Path) -> None:
    """A batch whose BEGIN fails counted nothing: the committed batch before it stays counted,
    so the journal keeps to the limit afterwards."""
    store = SQLiteStore(tmp_path, clock=ManualClock(), journal_retention_bytes=1000)
    connection = FailingBegin(store._connect())
    sweep = [(sqlite_store._SWEEP_BY_SIZE, [()]), (sqlite_store._DELETE_DROPPED, [()])]

    def batch(message_id: int, with_sweep: bool = True) -> BaseException | None:
        message = Message("t", bytes(900), qos=1, persistent=True)
        message.message_id = message_id
        row = (*message_row(message, 0.0), 0)
        ops = [(sqlite_store._INSERT_JOURNAL, [row]), *(sweep if with_sweep else [])]
        return store._write_batch(connection, ops)  # type: ignore[arg-type]

    assert batch(1) is None
    connection.fail_next_begin = True
    assert batch(2, with_sweep=False) is not None
    for message_id in range(3, 7):
        assert batch(message_id) is None
    content = connection.execute(
        "SELECT SUM(length(payload)) FROM journal WHERE message_id > "
        "(SELECT CAST(value AS INTEGER) FROM meta WHERE key = ?)",
        (sqlite_store.DROPPED_THROUGH_KEY,),
    ).fetchone()[0]
    assert content <= 1000
    store.close()
