"""One range read of the journal as Arrow columns. The rows SQLite hands to Python become Arrow
columns in one pass in C (a struct array built from the row tuples, then split), not by
transposing them in Python and converting each column again: the reads run on the broker's
gRPC threads under its GIL, so their cost per row is what the Flight service can serve.

Imports pyarrow (only the Flight service, which needs it anyway, reads ranges). Like every
journal read it has a read-only connection of its own, one transaction for the bounds and the
rows, and never writes. Uses Python's own sqlite3, the library the store's writer uses: a
second copy of SQLite in the broker's process (e.g. ADBC's driver, which links its own) would
not see the writer's locks on the same file, and its last close truncates the WAL index the
writer has mapped (the broker dies of SIGBUS). The Flight listener's reader process, which
opens the journal with nothing else, reads with ADBC (journal_range_adbc.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kittiwake.broker.message import Message
from kittiwake.store.codec import MESSAGE_COLUMNS, message_from_row
from kittiwake.store.journal_reader import (
    BOUNDS_QUERY,
    CHUNK_BYTES,
    CHUNK_ROWS,
    FIRST_OFFSET,
    PARTITION,
    JournalBounds,
    JournalError,
    JournalRangeError,
    TopicFilterSet,
    bounds_from_meta,
    sql_topic_condition,
)
from kittiwake.store.journal_selection import JournalSelection

# Rows fetched from SQLite per call: what a range read holds before it looks at the rows (a
# chunk is cut from these, at CHUNK_ROWS or CHUNK_BYTES).
_FETCH_ROWS = 4096
# The small columns come packed in one integer: Python's sqlite3 makes an object per cell,
# most of a read's cost, so a row is five cells instead of nine. Each field of the packed
# "flags": (column, shift, bits, SQL); the last (the priority) takes every bit left.
_FLAGS = (
    ("qos", 0, 0b11, "qos"),
    ("retain", 2, 0b1, "retain <> 0"),
    ("extras", 3, 0b1, "properties IS NOT NULL"),  # 1 where the row has optional parts
    ("persistent", 4, 0b1, "persistent <> 0"),
    ("priority", 5, None, "priority"),
)
_PACKED = " | ".join(f"(({sql}) << {shift})" for _name, shift, _bits, sql in _FLAGS)
_ROWS = (
    f"SELECT message_id, topic, payload, timestamp, {_PACKED} FROM journal "
    "WHERE message_id >= ? AND message_id < ?{} ORDER BY message_id"
)
# Every row this condition passes is wanted when the request's filters include "#" and the
# selection keeps every persistent topic and no non-persistent one ("#" never matches a '$'
# topic): then no topic is looked at in Python. By the persistent column, as
# JournalSelection.keeps decides: a JMS NON_PERSISTENT row has QoS 1.
_EVERYTHING_PERSISTENT = " AND persistent <> 0 AND substr(topic, 1, 1) <> '$'"
# The type of a row of _ROWS: how SQLite's row tuples become Arrow columns.
_ROW_TYPE = pa.struct(
    [
        ("message_id", pa.int64()),
        ("topic", pa.string()),
        ("payload", pa.binary()),
        ("timestamp", pa.int64()),
        ("flags", pa.int64()),
    ]
)
# The few rows with optional parts are read again whole, by id, and decoded by the store's
# codec.
_WHOLE_ROWS_PER_QUERY = 500
_WHOLE_ROWS = f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM journal WHERE message_id IN ({{}})"


@dataclass(slots=True)
class JournalChunk:
    """Consecutive journal rows in offset order, as Arrow columns: ``message_id``, ``topic``,
    ``payload``, ``qos``, ``retain`` (0 or 1), ``priority``, ``timestamp`` (wall-clock ms
    since the epoch when the broker accepted the row), ``extras`` (1 where the row has optional
    parts) and ``persistent``; int64 but for the topic (string) and payload (binary)."""

    columns: pa.RecordBatch
    # The decoded message where its row has optional parts (properties, MQTT 5 fields),
    # else None; None as a whole when no row of the chunk has any (the usual case).
    extras: Sequence[Message | None] | None = None

    def __len__(self) -> int:
        return int(self.columns.num_rows)

    # Python lists of single columns, for readers that want Python values (tests, tools).
    @property
    def offsets(self) -> list[int]:
        return list(self.columns.column("message_id").to_pylist())

    @property
    def topics(self) -> list[str]:
        return list(self.columns.column("topic").to_pylist())

    @property
    def payloads(self) -> list[bytes]:
        return list(self.columns.column("payload").to_pylist())


class JournalRange:
    """One read of [start, end): a read transaction held until :meth:`close`, so the rows,
    the bounds and the lost part all come from one committed state."""

    def __init__(
        self,
        path: str,
        start: int,
        end: int,
        topics: TopicFilterSet,
        selection: JournalSelection,
        busy_timeout_ms: int,
    ) -> None:
        self._choose(topics, selection)
        try:
            # One thread at a time, but not always the one that opened it: a Flight stream's
            # batches may be pulled by another gRPC thread than the call's.
            self._connection = sqlite3.connect(
                f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open the journal {path}: {exc}") from exc
        try:
            self._connection.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            self._connection.execute("BEGIN")
            meta = self._connection.execute(*BOUNDS_QUERY).fetchall()
            bounds = bounds_from_meta(dict(meta))
        except sqlite3.Error as exc:
            self._connection.close()
            raise JournalError(f"cannot read the journal {path}: {exc}") from exc
        try:
            self._take_bounds(bounds, start, end)
        except JournalRangeError:
            self._connection.close()
            raise

    def _choose(self, topics: TopicFilterSet, selection: JournalSelection) -> None:
        """Which rows the read keeps: the request's filters and the journal's selection, each
        topic decided once per read."""
        self._topics = topics
        self._selection = selection
        self._kept_cache: dict[tuple[str, bool], bool] = {}

    def _take_bounds(self, bounds: JournalBounds, start: int, end: int) -> None:
        """The range against the bounds its transaction saw: refused when it ends past the
        committed high-water mark, else its lost part (if any) and its first readable row."""
        if end > bounds.high_water:
            raise JournalRangeError(
                f"offsets [{start}, {end}) of partition {PARTITION} end past the committed "
                f"high-water mark {bounds.high_water}: ask `latest` for a readable end"
            )
        self.bounds: JournalBounds = bounds
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
        condition = None
        if self._selection.keeps_every_persistent_only:
            condition = sql_topic_condition(self._topics.filters)
        if condition is not None:
            where, params = _EVERYTHING_PERSISTENT + condition[0], condition[1]
        else:
            where, params = "", []
        pending: list[pa.RecordBatch] = []
        rows = size = 0
        for batch in self._row_batches(where, [self._first, self.end, *params]):
            if condition is None:
                batch = self._kept(batch)
            if not batch.num_rows:
                continue
            pending.append(batch)
            rows += batch.num_rows
            size += _payload_bytes(batch)
            if rows >= CHUNK_ROWS or size >= CHUNK_BYTES:
                yield self._chunk(pending)
                pending = []
                rows = size = 0
        if pending:
            yield self._chunk(pending)

    def _row_batches(self, where: str, params: list[Any]) -> Iterator[pa.RecordBatch]:
        """The range's rows (``where`` narrowing them) as batches of JournalChunk's columns."""
        cursor = self._connection.execute(_ROWS.format(where), params)
        while fetched := cursor.fetchmany(_FETCH_ROWS):
            yield _unpacked(pa.array(fetched, _ROW_TYPE))

    def _kept(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of ``batch`` the filters want and the selection keeps, decided once per
        distinct topic and persistence."""
        topics = batch.column("topic")
        persistent = pc.not_equal(batch.column("persistent"), 0)
        distinct = pc.unique(topics).to_pylist()
        kept_persistent = [t for t in distinct if self._topic_kept((t, True))]
        kept_other = [t for t in distinct if self._topic_kept((t, False))]
        if len(kept_persistent) == len(kept_other) == len(distinct):
            return batch
        mask = pc.or_(
            pc.and_(persistent, pc.is_in(topics, pa.array(kept_persistent, pa.string()))),
            pc.and_(pc.invert(persistent), pc.is_in(topics, pa.array(kept_other, pa.string()))),
        )
        return batch.filter(mask)

    def _topic_kept(self, key: tuple[str, bool]) -> bool:
        """Is a row of this topic and persistence journal content the filters want?"""
        answer = self._kept_cache.get(key)
        if answer is None:
            if len(self._kept_cache) >= 4096:
                self._kept_cache.clear()
            topic, persistent = key
            answer = self._topics.matches(topic) and self._selection.keeps(topic, persistent)
            self._kept_cache[key] = answer
        return answer

    def _chunk(self, batches: list[pa.RecordBatch]) -> JournalChunk:
        if len(batches) == 1:
            columns = batches[0]
        else:  # one batch of contiguous columns (pa.concat_batches needs pyarrow 19)
            (columns,) = pa.Table.from_batches(batches).combine_chunks().to_batches()
        flagged = pc.indices_nonzero(columns.column("extras"))
        if not len(flagged):
            return JournalChunk(columns)
        offsets = columns.column("message_id")
        where = {offsets[i].as_py(): i for i in flagged.to_pylist()}
        extras: list[Message | None] = [None] * columns.num_rows
        ids = list(where)
        for first in range(0, len(ids), _WHOLE_ROWS_PER_QUERY):
            for row in self._whole_rows(ids[first : first + _WHOLE_ROWS_PER_QUERY]):
                extras[where[row[0]]] = message_from_row(row)
        return JournalChunk(columns, extras)

    def _whole_rows(self, ids: list[int]) -> Iterable[Sequence[Any]]:
        """The rows of these ids, every column of MESSAGE_COLUMNS, in the read's transaction."""
        query = _WHOLE_ROWS.format(", ".join("?" * len(ids)))
        rows: Iterable[Sequence[Any]] = self._connection.execute(query, ids)
        return rows

    def close(self) -> None:
        try:
            self._connection.execute("COMMIT")
        except sqlite3.Error:
            pass
        finally:
            self._connection.close()

    def __enter__(self) -> JournalRange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unpacked(rows: pa.StructArray) -> pa.RecordBatch:
    """The rows' columns, the packed flags split into theirs (in C)."""
    message_id, topic, payload, timestamp, flags = rows.flatten()
    names = ["message_id", "topic", "payload", "timestamp"]
    columns = [message_id, topic, payload, timestamp]
    for name, shift, bits, _sql in _FLAGS:
        field = pc.shift_right(flags, shift) if shift else flags
        names.append(name)
        columns.append(field if bits is None else pc.bit_wise_and(field, bits))
    return pa.RecordBatch.from_arrays(columns, names=names)


def _payload_bytes(batch: pa.RecordBatch) -> int:
    total = pc.sum(pc.binary_length(batch.column("payload"))).as_py()
    return int(total or 0)
