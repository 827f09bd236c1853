"""The size retention's running count gives the start a full reading of the journal would.

The reference is the rule itself, read from the whole table: the newest rows above the start
whose payloads fit in the limit stay, and the start is raised to the newest row that does not
fit. Random payload sizes, time-retention raises between sweeps and rolled-back batches.
"""

from __future__ import annotations

import random
import sqlite3

import pytest

from kittiwake.store.size_retention import SizeRetention

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
