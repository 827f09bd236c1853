"""The journal's size retention (``journal.retention_bytes``) without reading the journal.

The journal keeps its newest messages whose payloads fit in so many bytes. Finding the oldest
one to keep by summing payloads from the newest down reads every row of the journal: on a
journal of 2,000,000 rows that is seconds of the writer thread, every sweep (each second), during
which no batch commits. Instead the writer keeps the byte count of the journal's content (rows
above its start) as it writes journal rows, so a sweep knows the excess at once and reads only
the oldest rows that make it up, the rows it drops anyway.

Writer-thread state only: counted when the writer runs a batch, taken back when the batch
rolls back.
"""

from __future__ import annotations

import sqlite3
from typing import Final

# The start of the journal's content: every row at or below it may be gone; kept in meta.
_START = "SELECT CAST(value AS INTEGER) FROM meta WHERE key = ?"
_CONTENT_BYTES = "SELECT COALESCE(SUM(length(payload)), 0) FROM journal WHERE message_id > ?"
# The first row (oldest) at which the running total of payloads from the start reaches the
# excess: SQLite streams the window in id order and stops at it, reading only dropped rows.
_LAST_DROPPED: Final = (
    "SELECT message_id, older FROM (SELECT message_id, SUM(COALESCE(length(payload), 0)) "
    "OVER (ORDER BY message_id ROWS UNBOUNDED PRECEDING) AS older FROM journal "
    "WHERE message_id > ?) WHERE older >= ? LIMIT 1"
)
_BYTES_BETWEEN = (
    "SELECT COALESCE(SUM(length(payload)), 0) FROM journal WHERE message_id > ? AND message_id <= ?"
)
_RAISE_START = "UPDATE meta SET value = ? WHERE key = ? AND CAST(value AS INTEGER) < ?"


class SizeRetention:
    """``limit`` bytes of journal content; ``start_key`` names the start's meta row."""

    __slots__ = ("_before", "_content", "_start", "limit", "start_key")

    def __init__(self, limit: int, start_key: str) -> None:
        self.limit = limit
        self.start_key = start_key
        # Bytes of payload above the start, and the start they were counted from; None until
        # the writer's first batch reads them (once, at start-up).
        self._content: int | None = None
        self._start = 0
        self._before: tuple[int | None, int] = (None, 0)

    def begin(self, connection: sqlite3.Connection) -> None:
        """A batch begins (in its transaction): what to go back to if it rolls back."""
        if self._content is None:
            self._start = _read_start(connection, self.start_key)
            self._content = connection.execute(_CONTENT_BYTES, (self._start,)).fetchone()[0]
        self._before = (self._content, self._start)

    def rollback(self) -> None:
        self._content, self._start = self._before

    def added(self, payload_bytes: int) -> None:
        """Journal rows with so many payload bytes were inserted in this batch."""
        if self._content is not None:
            self._content += payload_bytes

    def sweep(self, connection: sqlite3.Connection) -> None:
        """Raise the journal's start past the oldest rows until its content fits the limit
        (after whatever else raised it in this batch, e.g. the time retention)."""
        assert self._content is not None, "begin() runs first"
        start = _read_start(connection, self.start_key)
        if start > self._start:
            # Raised by the time retention: those rows are no longer content.
            self._content -= connection.execute(_BYTES_BETWEEN, (self._start, start)).fetchone()[0]
            self._start = start
        excess = self._content - self.limit
        if excess <= 0:
            return
        row = connection.execute(_LAST_DROPPED, (start, excess)).fetchone()
        if row is None:  # counted more than the rows hold: count again from the table
            self._content = connection.execute(_CONTENT_BYTES, (start,)).fetchone()[0]
            return
        last, dropped = row
        connection.execute(_RAISE_START, (str(last), self.start_key, last))
        self._content -= dropped
        self._start = last


def _read_start(connection: sqlite3.Connection, key: str) -> int:
    row = connection.execute(_START, (key,)).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else 0
