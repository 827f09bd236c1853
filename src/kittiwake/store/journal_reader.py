"""Range reads of the journal for the data pipeline, on read-only SQLite connections of their own.

Runs on a reader's own thread (the Flight listener's), never on the event loop or the store's
writer thread, and never writes. Serves only what is committed: offsets below the committed
high-water mark and above the retention's start. The range reads themselves are in
:mod:`kittiwake.store.journal_range` (they need pyarrow, which this module must not import:
the broker imports it whether or not a flight listener is configured).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kittiwake.broker.topics import MAX_CACHED_TOPIC_CHARS, topic_matches
from kittiwake.store.journal_selection import JournalSelection
from kittiwake.store.sqlite import DATABASE_FILE, DROPPED_THROUGH_KEY

if TYPE_CHECKING:
    from kittiwake.store.journal_range import JournalRange

# One journal today (one per node later): its partition number in offsets.
PARTITION = 0
# The first offset ever handed out (the store's ids start at 1): nothing below it was lost.
FIRST_OFFSET = 1
# A chunk of a range read closes at whichever comes first (bounds a Flight message's size).
CHUNK_ROWS = 16384
CHUNK_BYTES = 8 * 1024 * 1024
# How long a read waits for the writer's lock in the rare cases WAL readers wait (checkpoint
# restart of the WAL file), in milliseconds.
_BUSY_TIMEOUT_MS = 5000
# The bounds: what meta says was last committed and what the retention dropped through.
BOUNDS_QUERY = (
    "SELECT key, value FROM meta WHERE key IN ('last_message_id', ?)",
    (DROPPED_THROUGH_KEY,),
)
# Requests with at most this many filters, none with '+', are matched in SQL too (exact
# topics and "prefix/#"); others row by row in Python.
_SQL_FILTERS = 64


class JournalError(RuntimeError):
    """The journal cannot be read as asked; the message says what to change."""


class JournalRangeError(JournalError):
    """A range that is not (yet) readable: it ends past the committed high-water mark."""


@dataclass(frozen=True, slots=True)
class JournalBounds:
    """What may be read right now: offsets in [earliest, high_water)."""

    # The first offset the retention still keeps; below it rows are gone (or never existed).
    earliest: int
    # One past the last committed offset: nothing at or above it is committed yet.
    high_water: int


class TopicFilterSet:
    """A set of MQTT topic filters, answered per topic with a cache (the broker's matcher)."""

    def __init__(self, filters: Iterable[str]) -> None:
        self.filters = tuple(filters)
        self._cache: dict[str, bool] = {}

    def matches(self, topic: str) -> bool:
        answer = self._cache.get(topic)
        if answer is None:
            answer = any(topic_matches(f, topic) for f in self.filters)
            if len(topic) <= MAX_CACHED_TOPIC_CHARS:
                if len(self._cache) >= 4096:
                    self._cache.clear()
                self._cache[topic] = answer
        return answer


class JournalReader:
    """Opens a read-only connection per read, so any number of threads may read at once."""

    def __init__(self, data_dir: str | Path, selection: JournalSelection) -> None:
        self.path = Path(data_dir) / DATABASE_FILE
        self.selection = selection
        self.busy_timeout_ms = _BUSY_TIMEOUT_MS

    def _connect(self) -> sqlite3.Connection:
        try:
            # One thread at a time, but not always the one that opened it: a Flight stream's
            # batches may be pulled by another gRPC thread than the call's.
            connection = sqlite3.connect(
                f"file:{self.path}?mode=ro",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open the journal {self.path}: {exc}") from exc
        connection.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        return connection

    def bounds(self) -> JournalBounds:
        connection = self._connect()
        try:
            return _bounds(connection)
        finally:
            connection.close()

    def offset_for_time(self, wall_time: float) -> int:
        """The first offset stored at or after ``wall_time`` (the high-water mark if none)."""
        connection = self._connect()
        try:
            connection.execute("BEGIN")
            bounds = _bounds(connection)
            row = connection.execute(
                "SELECT MIN(message_id) FROM journal WHERE stored_at >= ? AND message_id >= ? "
                "AND message_id < ?",
                (round(wall_time * 1000), bounds.earliest, bounds.high_water),
            ).fetchone()
            connection.execute("COMMIT")
        except sqlite3.Error as exc:
            raise JournalError(f"cannot read the journal {self.path}: {exc}") from exc
        finally:
            connection.close()
        return bounds.high_water if row[0] is None else int(row[0])

    def read(self, start: int, end: int, topic_filters: Iterable[str]) -> JournalRange:
        """A snapshot of offsets [start, end) on the given filters; raises JournalRangeError
        when ``end`` is past the committed high-water mark (the range is not final yet)."""
        if start < 0 or end < start:
            raise JournalRangeError(f"[{start}, {end}) is not a range of offsets")
        from kittiwake.store.journal_range import JournalRange

        return JournalRange(
            str(self.path),
            start,
            end,
            TopicFilterSet(topic_filters),
            self.selection,
            _BUSY_TIMEOUT_MS,
        )


def sql_topic_condition(filters: Sequence[str]) -> tuple[str, list[Any]] | None:
    """An SQL condition (and its parameters) passing exactly the topics ``filters`` match,
    or None when one has a '+' (or there are many): then rows are matched in Python.

    Only for rows the default selection keeps (no '$' topic, which no wildcard matches):
    "#" passes everything, "a/b/#" passes "a/b" and what starts with "a/b/", others are exact.
    """
    if "#" in filters:
        return "", []
    if len(filters) > _SQL_FILTERS or any("+" in f for f in filters):
        return None
    parts: list[str] = []
    params: list[Any] = []
    for topic_filter in filters:
        if topic_filter.endswith("/#"):
            prefix = topic_filter[:-1]
            # substr counts characters, as len() does.
            parts.append("topic = ? OR substr(topic, 1, ?) = ?")
            params += [topic_filter[:-2], len(prefix), prefix]
        else:
            parts.append("topic = ?")
            params.append(topic_filter)
    return f" AND ({' OR '.join(parts)})", params


def _bounds(connection: sqlite3.Connection) -> JournalBounds:
    return bounds_from_meta(dict(connection.execute(*BOUNDS_QUERY).fetchall()))


def bounds_from_meta(values: Mapping[str, Any]) -> JournalBounds:
    """The bounds from the answer to :data:`BOUNDS_QUERY` (key -> value)."""
    high_water = int(values.get("last_message_id") or 0) + 1
    earliest = min(int(values.get(DROPPED_THROUGH_KEY) or 0) + 1, high_water)
    return JournalBounds(earliest=earliest, high_water=high_water)
