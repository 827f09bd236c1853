"""One range read of the journal through ADBC's SQLite driver: SQLite's rows become Arrow
columns in C with the GIL released, about a third of the cost of Python's sqlite3 per row.

ONLY for a process that never opens the journal with another SQLite (the Flight service's
range-reader worker, kittiwake.flight.range_worker): ADBC's driver links its own copy of
SQLite, and two copies in one process do not see each other's POSIX locks on the same file;
the last close of one truncates the WAL index the other has mapped (the broker's writer would
die of SIGBUS). Between processes the locks work, so the worker reads safely beside the
broker's writer. Read-only (``mode=ro``), one transaction for the bounds and the rows, as
:class:`~kittiwake.store.journal_range.JournalRange`, whose filtering it shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import adbc_driver_sqlite.dbapi as adbc_sqlite
import pyarrow as pa

from kittiwake.store.journal_range import _FETCH_ROWS, _WHOLE_ROWS, JournalRange
from kittiwake.store.journal_reader import (
    BOUNDS_QUERY,
    JournalError,
    TopicFilterSet,
    bounds_from_meta,
)
from kittiwake.store.journal_selection import JournalSelection

# Every column is NOT NULL (or an expression), so the driver, which infers a column's type
# from its values, sees one SQLite type per column; the batches are cast to JournalChunk's
# types all the same (an all-NULL column would come as null).
_ROWS = (
    "SELECT message_id, topic, payload, timestamp, qos, retain <> 0 AS retain, "
    "properties IS NOT NULL AS extras, persistent <> 0 AS persistent, priority FROM journal "
    "WHERE message_id >= ? AND message_id < ?{} ORDER BY message_id"
)
_SCHEMA = pa.schema(
    [
        ("message_id", pa.int64()),
        ("topic", pa.string()),
        ("payload", pa.binary()),
        ("timestamp", pa.int64()),
        ("qos", pa.int64()),
        ("retain", pa.int64()),
        ("extras", pa.int64()),
        ("persistent", pa.int64()),
        ("priority", pa.int64()),
    ]
)


class AdbcJournalRange(JournalRange):
    """A :class:`JournalRange` read with ADBC's SQLite (see the module's warning)."""

    def __init__(
        self,
        path: str,
        start: int,
        end: int,
        topics: TopicFilterSet,
        selection: JournalSelection,
        busy_timeout_ms: int,
    ) -> None:
        # Not JournalRange.__init__: that opens Python's sqlite3, which must not touch the file
        # in this process (see the module's warning); the rest is shared.
        self._choose(topics, selection)
        try:
            # Not autocommit: the driver opens a deferred transaction, so the snapshot is
            # taken by the bounds query and holds for every row read after it.
            self._adbc = adbc_sqlite.connect(f"file:{path}?mode=ro")
        except Exception as exc:
            raise JournalError(f"cannot open the journal {path}: {exc}") from exc
        try:
            self._query(f"PRAGMA busy_timeout={int(busy_timeout_ms)}", [])
            meta = self._query(*BOUNDS_QUERY)
            names = meta.column(0).to_pylist()
            values = meta.column(1).to_pylist()
            bounds = bounds_from_meta(dict(zip(names, values, strict=True)))
        except Exception as exc:
            self._adbc.close()
            raise JournalError(f"cannot read the journal {path}: {exc}") from exc
        try:
            self._take_bounds(bounds, start, end)
        except JournalError:
            self._adbc.close()
            raise

    def _query(self, sql: str, params: Sequence[Any]) -> pa.Table:
        with self._adbc.cursor() as cursor:
            cursor.execute(sql, list(params))
            table: pa.Table = cursor.fetch_arrow_table()
        return table

    def _row_batches(self, where: str, params: list[Any]) -> Iterator[pa.RecordBatch]:
        with self._adbc.cursor() as cursor:
            options = {"adbc.sqlite.query.batch_rows": str(_FETCH_ROWS)}
            cursor.adbc_statement.set_options(**options)
            cursor.execute(_ROWS.format(where), params)
            for batch in cursor.fetch_record_batch():
                if batch.num_rows:
                    yield batch if batch.schema.equals(_SCHEMA) else batch.cast(_SCHEMA)

    def _whole_rows(self, ids: list[int]) -> Iterable[Sequence[Any]]:
        table = self._query(_WHOLE_ROWS.format(", ".join("?" * len(ids))), ids)
        return list(zip(*(column.to_pylist() for column in table.columns), strict=True))

    def close(self) -> None:
        try:
            self._adbc.rollback()  # a read-only transaction: nothing to keep
        except Exception:
            pass
        finally:
            self._adbc.close()
