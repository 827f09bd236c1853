"""Range reads of the journal for the data pipeline, on read-only SQLite connections of their own.

Runs on a reader's own thread (the Flight listener's), never on the event loop or the store's
writer thread, and never writes. Serves only what is committed: offsets below the committed
high-water mark and above the retention's start.
"""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kittiwake.broker.message import Message
from kittiwake.broker.topics import MAX_CACHED_TOPIC_CHARS, topic_matches
from kittiwake.store.codec import MESSAGE_COLUMNS, message_from_row
from kittiwake.store.journal_selection import JournalSelection
from kittiwake.store.sqlite import DATABASE_FILE, DROPPED_THROUGH_KEY

# One journal today (one per node later): its partition number in offsets.
PARTITION = 0
# The first offset ever handed out (the store's ids start at 1): nothing below it was lost.
FIRST_OFFSET = 1
# A chunk of a range read closes at whichever comes first (bounds a Flight message's size).
CHUNK_ROWS = 16384
CHUNK_BYTES = 8 * 1024 * 1024
# Rows fetched from SQLite per call while a chunk fills.
_FETCH_ROWS = 4096
_PAYLOAD = operator.itemgetter(2)
# How long a read waits for the writer's lock in the rare cases WAL readers wait (checkpoint
# restart of the WAL file), in milliseconds.
_BUSY_TIMEOUT_MS = 5000

# The columns a range read serves, whether the row has a property blob (the few rows that
# do are read again whole and decoded by the store's codec, message_from_row), and whether
# the message is persistent (what the selection asks, with the topic).
_ROWS = (
    "SELECT message_id, topic, payload, qos, retain, priority, timestamp, "
    "properties IS NOT NULL, persistent FROM journal WHERE message_id >= ? AND message_id < ?{} "
    "ORDER BY message_id"
)
_TOPIC = 1
_PERSISTENT = 8
_WHOLE_ROWS_PER_QUERY = 500
_WHOLE_ROWS = f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM journal WHERE message_id IN ({{}})"
# Every row this condition passes is wanted when the request's filters include "#" and the
# selection keeps every persistent topic and no non-persistent one ("#" never matches a '$'
# topic): then no row is looked at in Python, which is most of a range read's cost. By the
# persistent column, as JournalSelection.keeps decides: a JMS NON_PERSISTENT row has QoS 1.
_EVERYTHING_PERSISTENT = " AND persistent <> 0 AND substr(topic, 1, 1) <> '$'"
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


@dataclass(slots=True)
class JournalChunk:
    """Consecutive journal rows in offset order, column by column (what Arrow wants)."""

    offsets: Sequence[int]
    topics: Sequence[str]
    payloads: Sequence[bytes]
    timestamps: Sequence[int]  # wall-clock ms since the epoch when the broker accepted it
    qos: Sequence[int]
    retain: Sequence[int]  # 0 or 1
    priority: Sequence[int]
    # The decoded message where its row has optional parts (properties, MQTT 5 fields),
    # else None: most rows have none, and decoding is skipped for them.
    extras: Sequence[Message | None]
    # Some row has optional parts (else every extras entry is None).
    has_extras: bool = True

    def __len__(self) -> int:
        return len(self.offsets)


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
        return JournalRange(self._connect(), start, end, TopicFilterSet(topic_filters), self)


class JournalRange:
    """One read of [start, end): a read transaction held until :meth:`close`, so the rows,
    the bounds and the lost part all come from one committed state."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        start: int,
        end: int,
        topics: TopicFilterSet,
        reader: JournalReader,
    ) -> None:
        self._connection = connection
        self._topics = topics
        self._selection = reader.selection
        try:
            connection.execute("BEGIN")
            self.bounds = _bounds(connection)
        except sqlite3.Error as exc:
            connection.close()
            raise JournalError(f"cannot read the journal {reader.path}: {exc}") from exc
        if end > self.bounds.high_water:
            connection.close()
            raise JournalRangeError(
                f"offsets [{start}, {end}) of partition {PARTITION} end past the committed "
                f"high-water mark {self.bounds.high_water}: ask `latest` for a readable end"
            )
        self.start = start
        self.end = end
        # The part of the range the retention already dropped, if any.
        self.lost: tuple[int, int] | None = None
        if start < self.bounds.earliest and self.bounds.earliest > FIRST_OFFSET:
            self.lost = (start, min(end, self.bounds.earliest))
        self._first = max(start, self.bounds.earliest)

    def chunks(self) -> Iterator[JournalChunk]:
        """The kept rows of the range matching the filters, in offset order."""
        if self._first >= self.end:
            return
        if self._selection.keeps_every_persistent_only:
            condition = sql_topic_condition(self._topics.filters)
            if condition is not None:
                yield from self._unfiltered_chunks(*condition)
                return
        cursor = self._connection.execute(_ROWS.format(""), (self._first, self.end))
        # Per topic and persistence: is the row journal content the filters want?
        kept: dict[tuple[str, bool], bool] = {}
        pending: list[Any] = []
        size = 0
        while True:
            rows = cursor.fetchmany(_FETCH_ROWS)
            if not rows:
                break
            for row in rows:
                key = (row[_TOPIC], row[_PERSISTENT] != 0)
                answer = kept.get(key)
                if answer is None:
                    if len(kept) >= 4096:
                        kept.clear()
                    answer = kept[key] = self._topic_kept(*key)
                if answer:
                    pending.append(row)
                    size += len(row[2])
                    if len(pending) >= CHUNK_ROWS or size >= CHUNK_BYTES:
                        yield _chunk(self._connection, pending)
                        pending = []
                        size = 0
        if pending:
            yield _chunk(self._connection, pending)

    def _unfiltered_chunks(self, condition: str, params: list[Any]) -> Iterator[JournalChunk]:
        cursor = self._connection.execute(
            _ROWS.format(_EVERYTHING_PERSISTENT + condition), (self._first, self.end, *params)
        )
        pending: list[Any] = []
        size = 0
        while True:
            rows = cursor.fetchmany(_FETCH_ROWS)
            if not rows:
                break
            pending += rows
            size += sum(map(len, map(_PAYLOAD, rows)))
            if len(pending) >= CHUNK_ROWS or size >= CHUNK_BYTES:
                yield _chunk(self._connection, pending)
                pending = []
                size = 0
        if pending:
            yield _chunk(self._connection, pending)

    def close(self) -> None:
        try:
            self._connection.execute("COMMIT")
        except sqlite3.Error:
            pass
        finally:
            self._connection.close()

    def _topic_kept(self, topic: str, persistent: bool) -> bool:
        return self._topics.matches(topic) and self._selection.keeps(topic, persistent)

    def __enter__(self) -> JournalRange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    values = dict(
        connection.execute(
            "SELECT key, value FROM meta WHERE key IN ('last_message_id', ?)",
            (DROPPED_THROUGH_KEY,),
        ).fetchall()
    )
    high_water = int(values.get("last_message_id") or 0) + 1
    earliest = min(int(values.get(DROPPED_THROUGH_KEY) or 0) + 1, high_water)
    return JournalBounds(earliest=earliest, high_water=high_water)


def _chunk(connection: sqlite3.Connection, rows: list[Any]) -> JournalChunk:
    offsets, topics, payloads, qos, retain, priority, timestamps, flags, _persistent = zip(
        *rows, strict=True
    )
    has_extras = any(flags)
    extras: list[Message | None] = [None] * len(offsets)
    if has_extras:
        flagged = {offsets[i]: i for i, flag in enumerate(flags) if flag}
        ids = list(flagged)
        for start in range(0, len(ids), _WHOLE_ROWS_PER_QUERY):
            part = ids[start : start + _WHOLE_ROWS_PER_QUERY]
            query = _WHOLE_ROWS.format(", ".join("?" * len(part)))
            for row in connection.execute(query, part):
                extras[flagged[row[0]]] = message_from_row(row)
    return JournalChunk(
        offsets=offsets,
        topics=topics,
        payloads=payloads,
        timestamps=timestamps,
        qos=qos,
        retain=retain,
        priority=priority,
        extras=extras,
        has_extras=has_extras,
    )
