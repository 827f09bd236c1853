"""The embedded SQLite store (WAL mode): one writer thread owns the write connection and commits
in groups; the event loop only appends operations and awaits commit futures. Its time comes
from the broker's clock (never ``time``), so sweeps and lazy marks follow a test's manual clock.

A commit future resolves after the transaction holding every earlier operation is on disk, which
is when a publisher may be acknowledged. Must never be called from the writer thread's side of
the queue except through :meth:`SQLiteStore.commit` and friends.

Write cancellation (DESIGN.md section 3): a queue entry removed (accepted, mostly) before its
insert is taken by the writer is never written: the insert is dropped from its pending turn and
no delete is added. A turn left with nothing to write resolves without a transaction once every
earlier turn is done, so a commit future still means "everything before it is settled". Only
the insert of a message numbered in its own turn is cancellable (nothing older can be on disk
under its key); journal rows (retention, several references) and retained rows are always
written. While only callers of :meth:`SQLiteStore.commit_unhurried` wait (QoS 1 publishers who
also go once their copies are accepted), sealed turns holding cancellable inserts wait up to
``acceptance_window`` for an idle writer, so that what is accepted meanwhile is never written;
longer (a bounded number of windows) while held entries are being accepted.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from itertools import chain, islice
from pathlib import Path
from typing import Any

from kittiwake.broker.durable_subscriptions import SubscriptionDefinition
from kittiwake.broker.message import DEFAULT_PRIORITY, Message, MQTT5Fields
from kittiwake.broker.publication_rows import PublicationRows
from kittiwake.broker.queues import DEFAULT_QUEUE_RULES, QueuedMessage, QueueRules
from kittiwake.broker.store import (
    DuplicateKey,
    QueuedRecord,
    RecoveredState,
    SessionRecord,
)
from kittiwake.clock import Clock, MonotonicClock
from kittiwake.store.codec import (
    MESSAGE_COLUMNS,
    SUBSCRIPTION_COLUMNS,
    encode_properties,
    message_columns,
    message_from_row,
    subscription_from_row,
    subscription_ids_from_text,
    subscription_ids_text,
    subscription_row,
)
from kittiwake.store.commit_times import CommitTimes
from kittiwake.store.journal_selection import JournalSelection
from kittiwake.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from kittiwake.store.size_retention import SizeRetention

log = logging.getLogger(__name__)

__all__ = [
    "DATABASE_FILE",
    "DROPPED_THROUGH_KEY",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SQLiteStore",
    "StoreError",
]

DATABASE_FILE = "kittiwake.db"

# A run of one statement over many parameter rows: consecutive operations with the same SQL
# share a run, so the writer thread hands each run to executemany (one C loop, not one call
# per row).
# (A run of _INSERT_ENTRY holds _EntryInsert objects until it goes to the writer.)
Operation = tuple[str, list[Any]]
# Journal rows as columns: (wide, the values every row shares, the per-row columns).
_JournalBlock = tuple[bool, tuple[Any, ...], list[Any]]
# How often the journal is swept of messages no queue entry needs any more (clock seconds).
SWEEP_INTERVAL = 1.0
# A held turn this close to the end of its acceptance window (seconds) goes with those due.
_RELEASE_SLACK = 0.001
# Held turns are released at most this fraction of the acceptance window apart.
_RELEASE_GROUPING = 0.125
# While held entries are being accepted, a turn past its acceptance window stays held up to
# this many windows (see SQLiteStore._offer).
_ACCEPTING_HOLD = 4
# How long a lazy delivery mark waits for its acknowledgement before it is written (clock
# seconds): most QoS 1 deliveries are acknowledged sooner, and then it is never written at all.
LAZY_MARK_DELAY = 0.05

_MESSAGE_PLACES = ", ".join("?" * len(MESSAGE_COLUMNS))
_INSERT_JOURNAL = f"INSERT INTO journal VALUES ({_MESSAGE_PLACES}, ?)"
# Where a journal row (and a block of journal columns) has its payload.
_PAYLOAD = MESSAGE_COLUMNS.index("payload")
# Journal rows given as columns (Store.journal_rows): each row of this operation is one block,
# (wide, shared values, columns), written by _insert_columns. Its own string, compared by
# identity like every operation's SQL.
_INSERT_JOURNAL_COLUMNS = "INSERT INTO journal VALUES /* columns */ (?)"
# A turn's run of queue-entry inserts: _EntryInsert objects, each given its statement and row
# (_EntryInsert.row) only when handed to the writer. (The full insert's text, though a built
# row never uses it.)
_INSERT_ENTRY = (
    "INSERT OR REPLACE INTO queue_entries (queue, message_id, delivery_qos, delivery_retain, "
    "subscription_ids, delivery_count, delivery_id, state, "
    f"{', '.join(MESSAGE_COLUMNS[1:])}) "
    f"VALUES (?, ?, ?, ?, ?, ?, 0, 'queued', {', '.join('?' * (len(MESSAGE_COLUMNS) - 1))})"
)
# An entry that references a journal row carries no message columns; one that carries its
# message inline is inserted by the statement of its message's shape (_message_insert), which
# binds no NULL and no bytes (see _message_values).
_INSERT_ENTRY_REFERENCE = (
    "INSERT OR REPLACE INTO queue_entries (queue, message_id, delivery_qos, delivery_retain, "
    "subscription_ids, delivery_count, delivery_id, state) VALUES (?, ?, ?, ?, ?, ?, 0, 'queued')"
)
_MARK = (
    "UPDATE queue_entries SET delivery_id=?, state=?, delivery_count=delivery_count+? "
    "WHERE queue=? AND message_id=?"
)
_COUNT_POSSIBLE_DELIVERY = (
    "UPDATE queue_entries SET delivery_count=delivery_count+1 WHERE queue=? AND message_id=?"
)
_REMOVE = "DELETE FROM queue_entries WHERE queue=? AND message_id=?"
_SET_LAST_ID = "UPDATE meta SET value=? WHERE key='last_message_id'"
# Every journal row at or below this id may be gone (retention): readers start above it. Kept
# in meta and only ever raised, in the sweep's own transaction.
DROPPED_THROUGH_KEY = "journal_dropped_through"
_RAISE_DROPPED_THROUGH = (
    "UPDATE meta SET value = MAX(CAST(value AS INTEGER), COALESCE(({}), 0)) "
    f"WHERE key = '{DROPPED_THROUGH_KEY}'"
)
# The newest journal row past the time retention. Through the age index: left to itself SQLite
# takes MAX(message_id) by walking the table from its newest row, testing stored_at row by
# row, which reads the whole journal whenever nothing is past the retention (every second,
# ~120 ms of CPU for 2,000,000 rows); the index reads only the rows past it, which this very
# sweep deletes.
# The size retention's step of a sweep, run by the writer's SizeRetention (not SQL itself).
_SWEEP_BY_SIZE = "/* journal size retention */"
_PAST_TIME_RETENTION = (
    "SELECT MAX(message_id) FROM journal INDEXED BY journal_by_age WHERE stored_at <= ?"
)
_DELETE_DROPPED = (
    "DELETE FROM journal WHERE message_id <= (SELECT CAST(value AS INTEGER) FROM meta "
    f"WHERE key = '{DROPPED_THROUGH_KEY}') AND NOT EXISTS (SELECT 1 FROM queue_entries "
    "WHERE message_id = journal.message_id AND topic IS NULL)"
)
_INSERT_SUBSCRIPTION = "INSERT INTO subscriptions VALUES (?, ?, ?, ?, ?, ?, ?)"
_UPSERT_DURABLE_DEFINITION = "INSERT OR REPLACE INTO durable_definitions VALUES (?, ?, ?, ?)"
# The message columns a row may hold NULL in (every one before them is NOT NULL).
_OPTIONAL_COLUMNS = MESSAGE_COLUMNS[8:]
# Which of them a row holds a value in: the shape of most messages (an origin only).
_ORIGIN_ONLY = (False, False, True, False)
# A session record is these rows, keyed by client id.
_DELETE_SESSION = tuple(
    f"DELETE FROM {table} WHERE client_id=?"
    for table in ("sessions", "subscriptions", "wills", "durable_definitions")
)


class _EntryInsert:
    """A queue-entry insert not handed to the writer yet. Its row is built only when it is
    (:meth:`row`): most at-least-once entries are accepted before that and cancelled (write
    cancellation), and then nothing of the message is ever encoded for the disk. A lazy
    delivery mark made meanwhile waits here too (``mark``: delivery id, state, count bump)
    and becomes an ordinary lazy mark once the row is built; a cancelled entry's goes with it.
    """

    __slots__ = (
        "cancelled",
        "delivery_count",
        "entry",
        "inline",
        "mark",
        "message",
        "queue",
    )

    def __init__(
        self, queue: str, entry: QueuedMessage, message: Message, inline: bool
    ) -> None:
        self.queue = queue
        # Its level, RETAIN flag and subscription ids are read from the entry when the row
        # is built (they never change); its attempts so far are taken now.
        self.entry = entry
        self.message = message
        self.delivery_count = entry.delivery_count
        # Whether the entry carries the message's columns (else its journal row holds them).
        self.inline = inline
        self.cancelled = False
        self.mark: tuple[int, str, int] | None = None

    def row(self, clock_to_wall_ms: float) -> tuple[str, tuple[Any, ...]]:
        """The statement and the row that insert this entry: a reference to its journal row,
        or its queue, its message's values (:func:`_message_values`) and its delivery
        columns, by the statement of the message's shape."""
        message = self.message
        entry = self.entry
        ids = entry.subscription_ids
        ids_text = subscription_ids_text(ids) if ids else ""
        retain = 1 if entry.retain else 0
        if not self.inline:
            return _INSERT_ENTRY_REFERENCE, (
                self.queue,
                message.message_id,
                entry.qos,
                retain,
                ids_text,
                self.delivery_count,
            )
        present, values = _message_values(message, clock_to_wall_ms)
        statement = (
            _INSERT_ENTRY_ORIGIN_ONLY  # most messages' shape: no cache lookup
            if present is _ORIGIN_ONLY
            else _message_insert("INSERT OR REPLACE", "queue_entries", present, False)
        )
        return statement, (
            self.queue,
            *values,
            entry.qos,
            retain,
            ids_text,
            self.delivery_count,
        )


# Queue-entry inserts not taken by the writer yet, by message id: the insert of the message's
# only pending entry (nearly every message: one stored copy), else the message's pending
# inserts by queue (several queues' copies, or one entry inserted twice), where None says
# that another insert of the same entry is pending too, so neither may be cancelled
# (cancelling one would leave the other on disk with no delete). Keyed by id rather than by
# (queue, id): a removal, a delivery mark and an enqueue each look an entry up, and a
# (queue, id) tuple built and hashed for each was most of write cancellation's cost on the
# event loop.
_PendingInserts = dict[int, "_EntryInsert | dict[str, _EntryInsert | None]"]


def _share(inserts: _PendingInserts, message_id: int, queue: str, insert: _EntryInsert) -> None:
    """Another insert of a message with an insert pending: keep them by queue (a second one
    of the same entry pins it: see _PendingInserts)."""
    found = inserts[message_id]
    if isinstance(found, _EntryInsert):
        found = inserts[message_id] = {found.queue: found}
    found[queue] = None if queue in found else insert


def _pin(inserts: _PendingInserts, message_id: int, queue: str) -> None:
    """Another insert of this entry was added: its pending one may not be cancelled."""
    found = inserts.get(message_id)
    if found is None:
        return
    if isinstance(found, _EntryInsert):
        if found.queue == queue:
            inserts[message_id] = {queue: None}
    elif queue in found:
        found[queue] = None


def _taken(inserts: _PendingInserts, insert: _EntryInsert) -> None:
    """The writer takes ``insert``: it is no longer cancellable (a pin stays)."""
    message_id = insert.message.message_id
    found = inserts.get(message_id)
    if found is insert:
        del inserts[message_id]
    elif isinstance(found, dict) and found.get(insert.queue) is insert:
        del found[insert.queue]
        if not found:
            del inserts[message_id]


class StoreError(RuntimeError):
    """The store cannot be used; the message names the file and what to do."""


class SQLiteStore:
    """Durable broker state in ``<data_dir>/kittiwake.db``."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        clock: Clock | None = None,
        max_batch: int = 5000,
        max_delay: float = 0.0,
        acceptance_window: float = 0.0,
        journal_retention_seconds: float = 0.0,
        journal_retention_bytes: int = 0,
        journal_selection: JournalSelection | None = None,
        synchronous: str = "FULL",
        wal_autocheckpoint: int = 1000,
    ) -> None:
        self.directory = Path(data_dir)
        self.path = self.directory / DATABASE_FILE
        self._clock = clock or MonotonicClock()
        # Wall ms minus clock ms: converts the core's clock readings for disk.
        self._clock_to_wall_ms = self._clock.wall_ms() - self._clock.now() * 1000
        self._max_batch = max_batch
        self._max_delay = max_delay
        # How long sealed turns holding cancellable inserts may wait for an idle writer
        # (see commit_unhurried).
        self._acceptance_window = acceptance_window
        self._retention = journal_retention_seconds
        self._retention_bytes = journal_retention_bytes
        # Writer-thread state of the size retention (see size_retention.py).
        self._size_retention = (
            SizeRetention(journal_retention_bytes, DROPPED_THROUGH_KEY)
            if journal_retention_bytes
            else None
        )
        # With a retention, the publications the selection names are journalled (for the Spark
        # source), not only those several durable queues reference.
        self._keeps_journal = journal_retention_seconds > 0 or journal_retention_bytes > 0
        # Without a retention the journal keeps nothing, whatever a selection says.
        if journal_selection is None or not self._keeps_journal:
            journal_selection = JournalSelection(enabled=self._keeps_journal)
        self.journal_selection = journal_selection
        self._selection_keeps = journal_selection.keeps
        # The broker hands this store its QoS 0 publications only when this is true.
        self.keeps_qos0 = journal_selection.keeps_qos0
        self._wal_autocheckpoint = wal_autocheckpoint
        self._synchronous = synchronous
        self._ops: list[Operation] = []
        # Messages to write to the journal with this turn, first in its batch (only the sweep
        # deletes from that table, and it always comes last).
        self._journal_messages: list[Message] = []
        # Journal rows of this turn given as columns (journal_rows), each block (wide, the
        # values every row shares but stored_at, the per-row columns); written after the
        # messages' rows, in the same transaction.
        self._journal_blocks: list[_JournalBlock] = []
        # Ids already in _journal_messages (without a retention; with one, all of this turn's).
        self._journalled: set[int] = set()
        # Removed entries since the last journal sweep; the sweep deletes messages that no queue
        # references any more (after the retention), once a second rather than per ack.
        self._removed = 0
        self._last_sweep = self._clock.now()
        # Queue rows not yet handed off that carry their message inline, by message id: a
        # second reference in the same hand-off turns the first into a plain reference and
        # writes a journal row instead.
        self._inline: dict[int, _EntryInsert] = {}
        # Queue-entry inserts not taken by the writer yet, so a removal can cancel the insert
        # instead of adding a delete (see _PendingInserts). Those of this turn, then those of
        # sealed turns: every id of this turn's is newer than any sealed one.
        self._open_inserts: _PendingInserts = {}
        self._sealed_inserts: _PendingInserts = {}
        # An insert was cancelled since the last hand-over to the writer: sealed turns may
        # hold empty runs (or nothing) to drop.
        self._trimmed = False
        # Queue-entry inserts cancelled so far, and those handed to the writer (for tests,
        # benchmarks and /metrics: how well write cancellation works).
        self.cancelled_writes = 0
        self.written_entries = 0
        # Lazy delivery marks by (queue, message id): (delivery id, state, count bump, due
        # clock time). Written once due; dropped when the entry is removed first.
        self._marks: dict[tuple[str, int], tuple[int, str, int, float]] = {}
        self._mark_timer: asyncio.TimerHandle | None = None
        # An id was handed out since last_message_id was last written.
        self._ids_dirty = False
        self._pending_future: asyncio.Future[None] | None = None
        self._last_future: asyncio.Future[None] | None = None
        # The pending hand-off (next loop turn, or max_delay later to gather a bigger group).
        self._scheduled: asyncio.Handle | None = None
        # The writer holds a batch: operations gather on the loop until it is done (group
        # commit), which also gives lazy marks the time to be cancelled by their acknowledgement.
        self._writing = False
        # Turns handed off while the writer was busy, each (operations, future); sent together.
        self._sealed: list[tuple[list[Operation], asyncio.Future[None]]] = []
        # A commit() (not commit_unhurried) waits on the open turn: it goes to an idle writer
        # at once. While none does, sealed turns with cancellable inserts wait up to the
        # acceptance window for the writer (the timer), so that entries accepted meanwhile
        # are never written.
        self._urgent = False
        self._held: asyncio.TimerHandle | None = None
        # Loop time each sealed turn was sealed (in _sealed's order), and whether a sealed
        # turn has a commit() waiting on it (both for _offer).
        self._sealed_times: list[float] = []
        self._sealed_urgent = False
        # cancelled_writes when _offer last looked, and the loop time it last saw it grow:
        # held entries being accepted (see _offer).
        self._cancels_seen = 0
        self._accepting_at = 0.0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[list[tuple[list[Operation], asyncio.Future[None]]] | None]
        self._queue = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self.failed_batches = 0
        # How long each group commit took (written by the writer thread, read by /metrics).
        self.commit_times = CommitTimes()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create data directory {self.directory}: {exc}") from exc
        self._open_and_migrate()
        self._last_id = self._highest_id()
        # The highest id handed out before the last hand-off. Only a message numbered since
        # (above it) may get a journal row: its row then reaches the journal in the same
        # transaction as every id handed out with it, after every lower one, so a reader that
        # saw a number never later finds a lower one, and a row the sweep deleted never
        # comes back under its old number.
        self._sealed_id = self._last_id

    # -- opening --------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(f"PRAGMA synchronous={self._synchronous}")
        # Bounds the WAL file: SQLite copies it back into the database every N pages.
        connection.execute(f"PRAGMA wal_autocheckpoint={int(self._wal_autocheckpoint)}")
        return connection

    def _open_and_migrate(self) -> None:
        existed = self.path.exists() and self.path.stat().st_size > 0
        try:
            connection = self._connect()
            if existed:
                verdict = connection.execute("PRAGMA quick_check").fetchone()[0]
                if verdict != "ok":
                    raise StoreError(
                        f"{self.path} is corrupt ({verdict}); refusing to start. Restore it from "
                        "a backup or move it away to start with an empty store."
                    )
            connection.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            row = connection.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}, newer than this kittiwake "
                    f"understands ({SCHEMA_VERSION}); upgrade kittiwake."
                )
            connection.execute(
                f"INSERT OR IGNORE INTO meta (key, value) VALUES ('{DROPPED_THROUGH_KEY}', '0')"
            )
            try:
                migrate(
                    connection,
                    version,
                    lambda to: log.info("store %s: migrating schema to version %d", self.path, to),
                )
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                # A row an older version wrote that cannot be converted; the step rolled back.
                raise StoreError(
                    f"{self.path}: a stored record cannot be upgraded from schema version "
                    f"{version} ({type(exc).__name__}: {exc}); refusing to start. The file is "
                    "unchanged: run the previous kittiwake on it, or move it away to start with "
                    "an empty store."
                ) from exc
            connection.close()
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.path} is not a readable kittiwake database ({exc}); refusing to start. "
                "Restore it from a backup or move it away to start with an empty store."
            ) from exc

    def _highest_id(self) -> int:
        """The last message id ever handed out: the stored counter, or any higher id a row
        still holds (a database written before the counter was kept up to date)."""
        connection = self._connect()
        try:
            row = connection.execute(
                "SELECT value FROM meta WHERE key='last_message_id'"
            ).fetchone()
            stored = int(row[0]) if row is not None and row[0] is not None else 0
            in_rows = connection.execute(
                "SELECT MAX(m) FROM (SELECT MAX(message_id) AS m FROM journal "
                "UNION ALL SELECT MAX(message_id) FROM queue_entries "
                "UNION ALL SELECT MAX(message_id) FROM retained "
                "UNION ALL SELECT MAX(message_id) FROM wills)"
            ).fetchone()[0]
        except (sqlite3.DatabaseError, ValueError) as exc:
            raise StoreError(
                f"{self.path} is not a readable kittiwake database ({exc}); refusing to start. "
                "Restore it from a backup or move it away to start with an empty store."
            ) from exc
        finally:
            connection.close()
        return max(stored, int(in_rows or 0))

    # -- the Store protocol ---------------------------------------------------------------

    def journal(self, message: Message) -> None:
        if message.message_id == 0:
            # Journal content (the selection's choice) is written referenced or not, and a
            # persistent publication's acknowledgement waits for it. Other persistent
            # publications are written by enqueue(), once several queues reference them;
            # non-persistent ones (QoS 0, JMS NON_PERSISTENT) never.
            keeps = self._keeps_journal and self._selection_keeps(message.topic, message.persistent)
            if not keeps and not message.persistent:
                return
            self._last_id += 1
            message.message_id = self._last_id
            self._ids_dirty = True
            if keeps:
                self._journal_messages.append(message)
                self._schedule()

    def journal_rows(self, rows: PublicationRows, created: float) -> Sequence[int]:
        """What :meth:`journal` does for each row's message, as columns: the same ids in row
        order, the same journal rows (their values shared by every row, such as the
        timestamp, bound once per statement rather than once per row)."""
        count = len(rows)
        keeping = self._keeps_journal
        keeps = self._selection_keeps
        topics = rows.topics
        ids: Sequence[int]
        kept: list[bool] | None = None  # None: every row with an id is kept
        uniform = rows.uniform_qos
        if uniform is not None and uniform > 0:
            first = self._last_id + 1
            self._last_id += count
            self._ids_dirty = True
            ids = range(first, first + count)
            if not keeping:
                return ids
            dropped = {topic for topic in rows.distinct_topics if not keeps(topic, True)}
            if dropped:
                kept = [topic not in dropped for topic in topics]
        else:
            ids = []
            kept = []
            last = self._last_id
            for topic, level in zip(topics, rows.qos, strict=True):
                if level > 0:
                    last += 1
                    ids.append(last)
                    kept.append(keeping and keeps(topic, True))
                elif keeping and keeps(topic, False):
                    last += 1
                    ids.append(last)
                    kept.append(True)
                else:
                    ids.append(0)
                    kept.append(False)
            if last != self._last_id:
                self._last_id = last
                self._ids_dirty = True
            if not keeping:
                return ids
        timestamp = round(created * 1000 + self._clock_to_wall_ms)
        wide = uniform is None or rows.any_retained or rows.user_properties is not None
        columns: list[Sequence[Any]] = [ids, topics, rows.payloads]
        if wide:
            # Bound as bytearray, no property blob as an empty one (stored as NULL: see
            # _columns_insert), since sqlite3 binds None and bytes through its slow adapter
            # lookup (see _message_values).
            blobs: list[bytearray] = (
                [_NO_BLOB] * count
                if rows.user_properties is None
                else [
                    bytearray(
                        encode_properties(None, MQTT5Fields(user_properties=list(pairs))) or b""
                    )
                    if pairs
                    else _NO_BLOB
                    for pairs in rows.user_properties
                ]
            )
            columns += [
                rows.qos,
                [1 if retain else 0 for retain in rows.retain],
                [1 if level else 0 for level in rows.qos],
                blobs,
            ]
            shared: tuple[Any, ...] = (DEFAULT_PRIORITY, timestamp, None, None, None)
        else:
            assert uniform is not None
            shared = (uniform, 0, 1 if uniform else 0, DEFAULT_PRIORITY, timestamp) + (None,) * 4
        if kept is not None:
            columns = [[v for v, k in zip(c, kept, strict=True) if k] for c in columns]
            if not columns[0]:
                return ids
        self._journal_blocks.append((wide, shared, columns))
        self._schedule()
        return ids

    def journals_qos0(self, topic: str) -> bool:
        """Whether a non-persistent publication (QoS 0, JMS NON_PERSISTENT) on ``topic``
        must go through :meth:`journal`."""
        return self._selection_keeps(topic, False)

    def keeps_in_journal(self, message: Message) -> bool:
        return self._keeps_journal and self._selection_keeps(message.topic, message.persistent)

    def enqueue(self, queue: str, entry: QueuedMessage) -> None:
        message = entry.message
        message_id = message.message_id
        if self._marks:
            self._marks.pop((queue, message_id), None)
        if message_id <= self._sealed_id:
            # Numbered in an earlier turn (a retained message for a new subscriber): its
            # journal row, if it ever had one, may be swept by now and never comes back. The
            # entry carries its own copy.
            inline = True
        elif message_id in self._journalled or (
            self._keeps_journal and self._selection_keeps(message.topic, message.persistent)
        ):
            inline = False  # its journal row is written with this turn
        else:
            first = self._inline.pop(message_id, None)
            if first is None:
                inline = True
            else:
                # A second reference: the message moves into a journal row both point to.
                first.inline = False
                self._journal_messages.append(message)
                self._journalled.add(message_id)
                inline = False
        insert = _EntryInsert(queue, entry, message, inline)
        ops = self._ops  # _add, inlined: once per stored copy
        if ops and ops[-1][0] is _INSERT_ENTRY:
            ops[-1][1].append(insert)
        else:
            ops.append((_INSERT_ENTRY, [insert]))
        if self._scheduled is None:
            self._schedule()
        if message_id > self._sealed_id:
            if inline:
                self._inline[message_id] = insert
            inserts = self._open_inserts
            if inserts.setdefault(message_id, insert) is not insert:
                _share(inserts, message_id, queue, insert)
        elif self._sealed_inserts:
            # (Only a sealed turn can hold it: the open one's ids are all newer.)
            _pin(self._sealed_inserts, message_id, queue)

    def mark_delivery(
        self, queue: str, message_id: int, delivery_id: int, state: str, lazy: bool = False
    ) -> None:
        bump = 1 if state == "sent" else 0
        if self._marks:
            earlier = self._marks.pop((queue, message_id), None)
            if earlier is not None:
                bump += earlier[2]
        # The entry's insert if it is the only one pending and not built yet (None in a
        # message's inserts by queue: two are): the mark of nearly every stored at-least-once
        # delivery joins it.
        found = self._open_inserts.get(message_id) if self._open_inserts else None
        if found is None and self._sealed_inserts:
            found = self._sealed_inserts.get(message_id)
        pending: _EntryInsert | None
        if found is None or isinstance(found, _EntryInsert):
            pending = found if found is None or found.queue == queue else None
        else:
            pending = found.get(queue)
        if pending is not None and pending.mark is not None:
            bump += pending.mark[2]
            pending.mark = None
        if lazy:
            if pending is not None:
                # The entry's insert is not built yet: the mark waits with it, and is
                # dropped with it if the entry is accepted first (see _build_rows).
                pending.mark = (delivery_id, state, bump)
                return
            due = self._clock.now() + LAZY_MARK_DELAY
            self._marks[(queue, message_id)] = (delivery_id, state, bump, due)
            if self._mark_timer is None:
                loop = self._loop or self._get_loop()
                self._mark_timer = loop.call_later(LAZY_MARK_DELAY, self._on_mark_timer)
        else:
            self._add(_MARK, (delivery_id, state, bump, queue, message_id))

    def count_possible_delivery(self, queue: str, message_id: int) -> None:
        self._add(_COUNT_POSSIBLE_DELIVERY, (queue, message_id))

    def remove(self, queue: str, message_id: int) -> None:
        if self._marks:
            self._marks.pop((queue, message_id), None)
        # Write cancellation: drop the entry's insert if the writer has not taken it yet;
        # then its delete is not needed either. (None: it has, or may have, been taken; a
        # None left in a message's inserts by queue goes too, as the entry does.)
        inserts = self._open_inserts
        found = inserts.get(message_id) if inserts else None
        if found is None and self._sealed_inserts:
            inserts = self._sealed_inserts
            found = inserts.get(message_id)
        pending: _EntryInsert | None = None
        if found is not None:
            if isinstance(found, _EntryInsert):
                if found.queue == queue:
                    del inserts[message_id]
                    pending = found
            else:
                pending = found.pop(queue, None)
                if not found:
                    del inserts[message_id]
        if pending is None:
            self._add(_REMOVE, (queue, message_id))
            self._removed += 1
            return
        pending.cancelled = True
        self._trimmed = True
        if self._inline:
            # A second reference in this turn must not rewrite the cancelled row.
            self._inline.pop(message_id, None)
        self.cancelled_writes += 1
        if self._held is not None and not self._sealed_inserts:
            self._send()  # every held entry was accepted: nothing to wait for any more

    def delete_queue(self, queue: str) -> None:
        for key in [key for key in self._marks if key[0] == queue]:
            del self._marks[key]
        self._add("DELETE FROM queue_entries WHERE queue=?", (queue,))
        self._removed += 1

    def save_queue_window(self, queue: str, window: int) -> None:
        if window:
            self._add(
                "INSERT OR REPLACE INTO queue_windows (queue, in_flight_window) VALUES (?, ?)",
                (queue, window),
            )
        else:
            self._add("DELETE FROM queue_windows WHERE queue=?", (queue,))

    def save_session(self, record: SessionRecord) -> None:
        client_id = record.client_id
        self._add(
            "INSERT OR REPLACE INTO sessions (client_id, expiry_interval, will_delay, will_expiry,"
            " in_flight_window, principal, queue_ordering, dead_letters)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                client_id,
                record.expiry_interval,
                record.will_delay,
                record.will_expiry,
                record.window,
                record.principal,
                record.queue_rules.ordering,
                record.queue_rules.dead_letters,
            ),
        )
        self._add("DELETE FROM subscriptions WHERE client_id=?", (client_id,))
        for subscription in record.subscriptions:
            self._add(_INSERT_SUBSCRIPTION, subscription_row(client_id, subscription))
        if record.will is None:
            self._add("DELETE FROM wills WHERE client_id=?", (client_id,))
        else:
            present, values = _message_values(record.will, self._clock_to_wall_ms)
            self._add(
                _message_insert("INSERT OR REPLACE", "wills", present, False), (client_id, *values)
            )

    def save_durable_definition(self, client_id: str, definition: SubscriptionDefinition) -> None:
        self._add(
            _UPSERT_DURABLE_DEFINITION,
            (client_id, definition.topic, definition.selector, int(definition.no_local)),
        )

    def delete_session(self, client_id: str) -> None:
        for sql in _DELETE_SESSION:
            self._add(sql, (client_id,))

    def set_retained(self, topic: str, message: Message | None) -> None:
        if message is None:
            self._add("DELETE FROM retained WHERE topic=?", (topic,))
        else:
            present, values = _message_values(message, self._clock_to_wall_ms)
            self._add(_message_insert("INSERT OR REPLACE", "retained", present, False), values)

    def add_duplicate(self, producer: str, key: DuplicateKey) -> None:
        self._add("INSERT OR IGNORE INTO duplicates VALUES (?, ?)", (producer, key))

    def remove_duplicate(self, producer: str, key: DuplicateKey) -> None:
        self._add("DELETE FROM duplicates WHERE producer=? AND key=?", (producer, key))

    def delete_duplicates(self, producer: str) -> None:
        self._add("DELETE FROM duplicates WHERE producer=?", (producer,))

    def commit(self) -> asyncio.Future[None] | None:
        """The future of the batch that will hold every operation so far, or None.

        Lazy marks are not waited for: they are allowed to be late.
        """
        future = self.commit_unhurried()
        if future is not None:
            if future is self._pending_future:
                self._urgent = True
            elif self._held is not None and not self._writing:
                self._send()  # a turn held back for acceptances holds this caller: no more
            elif self._sealed:
                self._sealed_urgent = True  # offered whole once the busy writer is done
        return future

    def commit_unhurried(self) -> asyncio.Future[None] | None:
        """:meth:`commit` for a caller that does not mind waiting up to the acceptance window
        longer (a QoS 1 publisher acknowledged once its copies are accepted, a subscriber's
        acceptance nobody waits for): while only such callers wait, a batch with entries that
        may still be accepted is held back from an idle writer that long, and an entry
        accepted meanwhile is never written (write cancellation, DESIGN.md section 3)."""
        if self._ops or self._journal_messages or self._journal_blocks:
            if self._scheduled is None:  # once per turn; this runs once per publication
                self._schedule()
            if self._pending_future is None:
                self._pending_future = self._get_loop().create_future()
            return self._pending_future
        if self._last_future is not None and not self._last_future.done():
            return self._last_future
        return None

    def recover(self) -> RecoveredState:
        """Read everything back (before the writer starts; on the caller's thread)."""
        started = self._clock.now()
        offset = self._clock_to_wall_ms
        state = RecoveredState()
        columns = ", ".join(MESSAGE_COLUMNS)
        connection = self._connect()
        try:
            for row in connection.execute(
                f"SELECT {columns} FROM journal WHERE message_id IN "
                "(SELECT message_id FROM queue_entries WHERE topic IS NULL) ORDER BY message_id"
            ):
                state.messages[row[0]] = message_from_row(row, offset)
            for (
                client_id,
                expiry_interval,
                will_delay,
                will_expiry,
                window,
                principal,
                ordering,
                dead_letters,
            ) in connection.execute(
                "SELECT client_id, expiry_interval, will_delay, will_expiry, in_flight_window, "
                "principal, queue_ordering, dead_letters FROM sessions"
            ):
                state.sessions[client_id] = SessionRecord(
                    client_id,
                    expiry_interval,
                    [],
                    None,
                    will_delay,
                    will_expiry,
                    window,
                    principal,
                    _queue_rules(ordering, dead_letters),
                )
            for row in connection.execute(
                f"SELECT client_id, {', '.join(SUBSCRIPTION_COLUMNS)} FROM subscriptions "
                "ORDER BY rowid"
            ):
                owner = state.sessions.get(row[0])
                if owner is not None:
                    owner.subscriptions.append(subscription_from_row(row[1:]))
            for row in connection.execute(f"SELECT client_id, {columns} FROM wills"):
                owner = state.sessions.get(row[0])
                if owner is not None:
                    owner.will = message_from_row(row[1:], offset)
            for row in connection.execute(
                "SELECT queue, delivery_qos, delivery_retain, subscription_ids, delivery_count, "
                f"delivery_id, state, {columns} FROM queue_entries ORDER BY message_id"
            ):
                message_id = row[7]
                if row[8] is not None and message_id not in state.messages:
                    state.messages[message_id] = message_from_row(row[7:], offset)
                state.queued.append(
                    QueuedRecord(
                        row[0],
                        message_id,
                        row[1],
                        bool(row[2]),
                        subscription_ids_from_text(row[3]),
                        row[4],
                        row[5],
                        row[6],
                    )
                )
            for row in connection.execute(f"SELECT {columns} FROM retained"):
                state.retained[row[1]] = message_from_row(row, offset)
            for producer, key in connection.execute("SELECT producer, key FROM duplicates"):
                state.duplicates.setdefault(producer, set()).add(key)
            for queue, window in connection.execute(
                "SELECT queue, in_flight_window FROM queue_windows"
            ):
                state.queue_windows[queue] = window
            for client_id, topic, selector, no_local in connection.execute(
                "SELECT client_id, topic, selector, no_local FROM durable_definitions"
            ):
                state.durable_definitions[client_id] = SubscriptionDefinition(
                    topic, selector, bool(no_local)
                )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: cannot read stored state ({exc})") from exc
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            # Damage inside a row passes SQLite's page checks; never start on half a state.
            raise StoreError(
                f"{self.path}: a stored record cannot be decoded ({type(exc).__name__}: {exc}); "
                "refusing to start. Restore it from a backup or move it away to start with an "
                "empty store."
            ) from exc
        finally:
            connection.close()
        log.info(
            "store %s: recovered %d sessions, %d queued messages, %d retained in %.3fs",
            self.path,
            len(state.sessions),
            len(state.queued),
            len(state.retained),
            self._clock.now() - started,
        )
        return state

    def close(self) -> None:
        """Write what is pending, lazy marks included, and stop the writer (graceful stop)."""
        self._closed = True
        if self._mark_timer is not None:
            self._mark_timer.cancel()
            self._mark_timer = None
        if self._removed:
            self._sweep_journal()
        if (
            self._ops
            or self._journal_messages
            or self._journal_blocks
            or self._ids_dirty
            or self._marks
        ):
            self._hand_off(final=True)
        if self._sealed:
            # Turns held back for acceptances (or waiting for a busy writer) are written too:
            # their callers wait for them and their rows are what a restart recovers.
            self._send()
        if self._marks:
            # The lazy marks of held entries become marks only as their rows are built (by
            # either send above, after the first hand-off took the marks it saw): written too.
            self._hand_off(final=True)
        if self._mark_timer is not None:  # set again by building those rows
            self._mark_timer.cancel()
            self._mark_timer = None
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=30)
            self._writer = None
        if self.cancelled_writes:
            log.info(
                "store %s: %d queue entries accepted before their commit were never written, "
                "%d written",
                self.path,
                self.cancelled_writes,
                self.written_entries,
            )

    # -- batching -------------------------------------------------------------------------

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _add(self, sql: str, params: tuple[Any, ...] | _EntryInsert) -> None:
        ops = self._ops
        if ops and ops[-1][0] is sql:
            ops[-1][1].append(params)
        else:
            ops.append((sql, [params]))
        if self._scheduled is None:
            self._schedule()

    def _schedule(self) -> None:
        """Hand this loop turn's operations to the writer once the turn ends."""
        if self._scheduled is not None:
            return
        loop = self._get_loop()
        if self._max_delay:
            self._scheduled = loop.call_later(self._max_delay, self._hand_off)
        else:
            self._scheduled = loop.call_soon(self._hand_off)

    def _on_mark_timer(self) -> None:
        self._mark_timer = None
        self._schedule()

    def _due_marks(self, final: bool) -> list[tuple[Any, ...]]:
        """Take the lazy marks that waited long enough (all of them when ``final``) as rows,
        and set the timer for the rest."""
        marks = self._marks
        if not marks:
            return []
        now = self._clock.now()
        rows: list[tuple[Any, ...]] = []
        for key, (delivery_id, state, bump, due) in marks.items():
            if due > now and not final:
                break
            rows.append((delivery_id, state, bump, key[0], key[1]))
        for row in rows:
            del marks[(row[3], row[4])]
        if marks and self._mark_timer is None:
            # Dict order is due order: a mark is re-inserted whenever it changes. The timer
            # runs on the loop's time, the due times on the store's clock: on the production
            # clock they agree; on a test's manual clock the timer only looks again.
            wait = max(next(iter(marks.values()))[3] - now, 0.0) or LAZY_MARK_DELAY
            self._mark_timer = self._get_loop().call_later(wait, self._on_mark_timer)
        return rows

    def _hand_off(self, final: bool = False) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if self._closed and not final:
            return
        now = self._clock.now()
        if (self._removed or self._keeps_journal) and now - self._last_sweep >= SWEEP_INTERVAL:
            self._sweep_journal()
            self._last_sweep = now
        ops = self._ops
        self._ops = []
        journal_ops = 0
        if self._journal_messages:
            stored_at = self._clock.wall_ms()
            to_wall = self._clock_to_wall_ms
            # One run per statement shape (journal rows have distinct ids: their order in
            # the transaction does not matter).
            by_shape: dict[tuple[bool, ...], list[Any]] = {}
            for m in self._journal_messages:
                present, values = _message_values(m, to_wall)
                rows = by_shape.get(present)
                if rows is None:
                    rows = by_shape[present] = []
                rows.append((*values, stored_at))
            ops[:0] = [
                (_message_insert("INSERT", "journal", present, True), rows)
                for present, rows in by_shape.items()
            ]
            journal_ops = len(by_shape)
            self._journal_messages = []
        if self._journal_blocks:
            stored_at = self._clock.wall_ms()
            ops.insert(
                journal_ops,
                (
                    _INSERT_JOURNAL_COLUMNS,
                    [(wide, (*shared, stored_at), c) for wide, shared, c in self._journal_blocks],
                ),
            )
            self._journal_blocks = []
        self._journalled.clear()
        self._inline.clear()
        if self._open_inserts:
            if self._sealed_inserts:
                self._sealed_inserts.update(self._open_inserts)
                self._open_inserts = {}
            else:
                self._sealed_inserts, self._open_inserts = self._open_inserts, {}
        self._sealed_id = self._last_id
        marks = self._due_marks(final)
        if marks:
            ops.append((_MARK, marks))
        if self._ids_dirty and ops:
            # In the same transaction as the rows using the new ids, so an id never comes back;
            # ids no stored row uses need not be remembered.
            ops.append((_SET_LAST_ID, [(str(self._last_id),)]))
            self._ids_dirty = False
        future = self._pending_future
        self._pending_future = None
        if not ops:
            if future is not None:
                future.set_result(None)
            return
        if future is None:
            # Even an unawaited batch gets a future, so a later commit() can wait for it.
            future = self._get_loop().create_future()
        self._last_future = future
        # A turn's operations stay together: the writer commits whole turns, never a part of
        # one (a duplicate key and the message it admits are stored together or not at all).
        self._sealed_times.append(self._get_loop().time())
        self._sealed.append((ops, future))
        if self._urgent:
            self._urgent = False
            self._sealed_urgent = True
        if final:
            self._send()
        elif not self._writing:
            self._offer()
        # else: offered once the writer is done with its batch (_batch_written)

    def _offer(self) -> None:
        """The writer is idle: give it the sealed turns now, unless only entries that may yet
        be accepted (and callers that can wait) are in them; then each turn goes once it has
        waited the acceptance window, without the entries accepted meanwhile.

        Only the turns that waited that long go (in order: a commit future still means every
        earlier turn is settled); younger ones keep waiting, else each release would write
        every entry sealed just before it, accepted a moment later.

        While held entries are being accepted (an acceptance within the last window), a turn
        past its window stays held, up to ``_ACCEPTING_HOLD`` windows, and only the turns left
        with nothing to write go (done, without a write): a subscriber taking a flood in order
        accepts a copy once the copies queued ahead of it are accepted, which under a deep
        queue (and a slow loop) can take longer than the window although it makes steady
        progress; writing then would write and delete nearly every copy. The copies' own
        publishers wait for their acceptance meanwhile, as they would for the commit; an
        entry not accepted while nothing is (a stalled subscriber's) is written a window after
        the last acceptance.
        """
        if (
            self._sealed_urgent
            or not self._acceptance_window
            or not self._sealed_inserts
            # (Messages, not entries: a fanned-out message's count once.)
            or len(self._sealed_inserts) >= self._max_batch
        ):
            self._send()
            return
        if self._held is not None:
            return
        loop = self._get_loop()
        window = self._acceptance_window
        times = self._sealed_times
        # A timer may fire a little early (the loop's clock resolution): a turn that close
        # to its time goes now rather than on a timer of its own.
        now = loop.time()
        due = now - window + _RELEASE_SLACK
        aged = bisect.bisect_right(times, due)
        if aged:
            cancelled = self.cancelled_writes
            if cancelled != self._cancels_seen:
                self._cancels_seen = cancelled
                self._accepting_at = now
            if now - self._accepting_at < window:
                aged = bisect.bisect_right(times, now - window * _ACCEPTING_HOLD + _RELEASE_SLACK)
        # Turns whose every entry is accepted go too, done without a write, rather than at
        # the end of their window: held on, each would keep its messages alive that long.
        aged = max(aged, self._nothing_to_write(len(times)))
        if aged:
            self._send(aged)
            if self._sealed and not self._writing:
                self._offer()  # everything sent was cancelled: the rest waits its turn
            return
        # A look every fraction of the window: released in groups at most that far apart, so
        # a steady flow of turns is written in a few commits per window rather than one per
        # turn, and turns whose entries were all accepted meanwhile are let go.
        self._held = loop.call_later(window * _RELEASE_GROUPING, self._release)

    def _nothing_to_write(self, count: int) -> int:
        """How many of the oldest ``count`` sealed turns have nothing left to write but the
        id counter (every entry insert in them cancelled, no other operation)."""
        done = 0
        for ops, _future in islice(self._sealed, count):
            for sql, rows in ops:
                if sql is _INSERT_ENTRY:
                    for insert in rows:
                        if not insert.cancelled:
                            return done
                elif sql is not _SET_LAST_ID:
                    return done
            done += 1
        return done

    def _release(self) -> None:
        """A look at the held turns (see _offer)."""
        self._held = None
        if self._sealed and not self._writing and not self._closed:
            self._offer()

    def _send(self, count: int | None = None) -> None:
        """Give the writer the sealed turns (the oldest ``count`` of them, else all); it
        commits them in groups of whole turns.

        The rows of their queue-entry inserts are built now, but for cancelled ones; turns
        left with nothing to write, ahead of any that has something, are done at once (every
        earlier turn is).
        """
        if self._held is not None:
            self._held.cancel()
            self._held = None
        sealed = self._sealed
        if count is None or count >= len(sealed):
            taken = sealed
            self._sealed = []
            self._sealed_times = []
            self._sealed_urgent = False
            self._sealed_inserts = {}
            trimmed, self._trimmed = self._trimmed, False
        else:
            taken = sealed[:count]
            self._sealed = sealed[count:]
            del self._sealed_times[:count]
            # The turns left may hold cancelled inserts too: still trimmed.
            trimmed = self._trimmed
        self._build_rows(taken, whole=not self._sealed)
        if trimmed:
            taken = self._compact(taken)
            if not taken:
                return
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_loop, name="kittiwake-store", daemon=True
            )
            self._writer.start()
        self._writing = True
        self._queue.put(taken)

    def _build_rows(
        self, turns: list[tuple[list[Operation], asyncio.Future[None]]], whole: bool
    ) -> None:
        """The rows of ``turns``' queue-entry inserts that were not cancelled (a run left
        empty stays, for :meth:`_compact`). Unless they are every sealed turn (``whole``),
        their inserts leave the cancellable ones (those of the turns left stay)."""
        to_wall = self._clock_to_wall_ms
        pending = None if whole else self._sealed_inserts
        marks = self._marks
        due = 0.0
        for ops, _future in turns:
            if not any(sql is _INSERT_ENTRY for sql, _rows in ops):
                continue
            built: list[Operation] = []
            for sql, inserts in ops:
                if sql is not _INSERT_ENTRY:
                    built.append((sql, inserts))
                    continue
                # Consecutive rows of one statement shape share a run (in order: a second
                # insert of an entry must still come after the first).
                shape = _INSERT_ENTRY
                rows: list[Any] = []
                written = 0
                for insert in inserts:
                    if insert.cancelled:
                        continue
                    if pending is not None:
                        _taken(pending, insert)
                    statement, row = insert.row(to_wall)
                    if statement is not shape:
                        if rows:
                            built.append((shape, rows))
                            rows = []
                        shape = statement
                    rows.append(row)
                    written += 1
                    if insert.mark is not None:
                        # An ordinary lazy mark from now on, due a whole delay later
                        # (lazier than it was: a lazy mark may be late). The latest due
                        # time yet, so dict order stays due order.
                        if not due:
                            due = self._clock.now() + LAZY_MARK_DELAY
                        key = (insert.queue, insert.message.message_id)
                        marks.pop(key, None)
                        marks[key] = (*insert.mark, due)
                self.written_entries += written
                built.append((shape, rows))  # (left empty only when every one was cancelled)
            ops[:] = built
        if due and self._mark_timer is None:
            self._mark_timer = self._get_loop().call_later(LAZY_MARK_DELAY, self._on_mark_timer)

    def _compact(
        self, turns: list[tuple[list[Operation], asyncio.Future[None]]]
    ) -> list[tuple[list[Operation], asyncio.Future[None]]]:
        """``turns`` without their empty runs, and without the leading turns left with
        nothing to write (done now, when the writer is idle: every earlier turn is)."""
        for ops, _future in turns:
            if not all(rows for _sql, rows in ops):
                ops[:] = [(sql, rows) for sql, rows in ops if rows]
        # Leading turns with nothing left but the id counter are done now (ids no stored row
        # uses need not be kept); the first with something to write ends the run, and empty
        # turns after it go to the writer, to be resolved in order.
        if not self._writing:
            done = 0
            for ops, future in turns:
                if any(sql is not _SET_LAST_ID for sql, _rows in ops):
                    break
                _resolve(future, None)
                done += 1
            if done:
                return turns[done:]
        return turns

    def _batch_written(
        self, results: list[tuple[asyncio.Future[None], BaseException | None]]
    ) -> None:
        """On the loop: the writer committed (or failed) what it was given and is free again."""
        self._writing = False
        for future, error in results:
            _resolve(future, error)
        if self._sealed and not self._closed:
            self._offer()
        elif not self._closed and self._marks and self._mark_timer is None:
            self._hand_off()  # lazy marks fell due while the writer was busy

    def _sweep_journal(self) -> None:
        """Delete journalled messages no queue references, once past the retention.

        The time retention keeps messages for so many seconds after the batch that stored
        them (their ``stored_at``), acknowledged or not; the size retention keeps the newest
        ones whose payloads fit in so many bytes (whichever is stricter wins). Referenced
        messages are never deleted, but once past a retention they are no longer journal
        content (readers start above them).
        """
        self._removed = 0
        # First the journal's new start (every row at or below it is past a retention), then
        # the rows below it that no queue references. A referenced row stays for its queue but
        # is no longer journal content: readers never see below the start.
        # Appended, not _add()ed: the sweep rides on a batch and must not schedule another.
        if self._retention or not self._retention_bytes:
            self._ops.append(
                (
                    _RAISE_DROPPED_THROUGH.format(_PAST_TIME_RETENTION),
                    [(self._clock.wall_ms() - round(self._retention * 1000),)],
                )
            )
        if self._retention_bytes:
            self._ops.append((_SWEEP_BY_SIZE, [()]))
        self._ops.append((_DELETE_DROPPED, [()]))

    # -- the writer thread ----------------------------------------------------------------

    def _write_loop(self) -> None:
        connection = self._connect()
        try:
            while True:
                turns = self._queue.get()
                if turns is None:
                    return
                results: list[tuple[asyncio.Future[None], BaseException | None]] = []
                while turns:
                    # Group commit: whole turns, up to max_batch operations (at least one turn).
                    count, taken = 0, 0
                    while taken < len(turns) and (not taken or count < self._max_batch):
                        count += sum(_weight(sql, rows) for sql, rows in turns[taken][0])
                        taken += 1
                    group, turns = turns[:taken], turns[taken:]
                    error = self._write_batch(connection, _merged([ops for ops, _ in group]))
                    results.extend((future, error) for _ops, future in group)
                loop = self._loop
                if loop is not None and not loop.is_closed():
                    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                        loop.call_soon_threadsafe(self._batch_written, results)
        finally:
            connection.close()

    def _write_batch(
        self, connection: sqlite3.Connection, ops: list[Operation]
    ) -> BaseException | None:
        """Write ``ops`` in order in one transaction; the error, if it failed."""
        sizes = self._size_retention
        # Whether the size retention counted this batch (so a failure takes it back).
        counting = False
        try:
            # A measurement of the disk, not a broker time: the real clock even under a test's.
            started = time.perf_counter()
            connection.execute("BEGIN")
            if sizes is None:
                for sql, rows in ops:
                    _execute(connection, sql, rows)
            else:
                sizes.begin(connection)
                counting = True
                for sql, rows in ops:
                    if sql is _SWEEP_BY_SIZE:
                        sizes.sweep(connection)
                        continue
                    sizes.added(_journal_payload_bytes(sql, rows))
                    _execute(connection, sql, rows)
            connection.execute("COMMIT")
            self.commit_times.record(time.perf_counter() - started)
        except Exception as exc:  # not only sqlite3.Error: the writer thread must never die
            self.failed_batches += 1
            log.error(
                "store %s: write failed (%s); %d operations not stored",
                self.path,
                exc,
                sum(len(rows) for _sql, rows in ops),
            )
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            if counting:
                assert sizes is not None
                sizes.rollback()
            return exc
        return None


def _merged(turns: list[list[Operation]]) -> list[Operation]:
    """The operations of several turns for one transaction, in order: a run continues across
    turns when the next turn starts with the same statement, and the message-id counter is
    written once, last (its values only grow)."""
    merged: list[Operation] = []
    last_id: Operation | None = None
    for ops in turns:
        for sql, rows in ops:
            if sql is _SET_LAST_ID:
                last_id = (sql, rows)
            elif merged and merged[-1][0] is sql:
                merged[-1] = (sql, merged[-1][1] + rows)
            else:
                merged.append((sql, rows))
    if last_id is not None:
        merged.append(last_id)
    return merged


# Rows per multi-row statement: powers of two, so a handful of statement texts cover every
# batch size and stay in the connection's statement cache.
_BULK_SIZES = (64, 16, 4, 1)


def _execute(connection: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """Run ``sql`` for every row, as few statements as possible.

    One multi-row INSERT or one ``IN (...)`` DELETE per chunk instead of one step per row:
    SQLite does less per row, and the writer gives up the GIL once per chunk rather than once
    per row (each hand-over is a context switch away from the event loop on a busy core).
    """
    if sql is _INSERT_JOURNAL_COLUMNS:
        for wide, shared, columns in rows:
            _insert_columns(connection, wide, shared, columns)
    elif len(rows) == 1:
        connection.execute(sql, rows[0])
    elif sql in _BULK_INSERTS:
        for chunk in _chunks(rows):
            connection.execute(_bulk_insert(sql, len(chunk)), list(chain.from_iterable(chunk)))
    elif sql is _REMOVE:
        by_queue: dict[str, list[int]] = {}
        for queue_name, message_id in rows:
            by_queue.setdefault(queue_name, []).append(message_id)
        for queue_name, ids in by_queue.items():
            for chunk in _chunks(ids):
                connection.execute(_bulk_remove(len(chunk)), [queue_name, *chunk])
    else:
        connection.executemany(sql, rows)


def _journal_payload_bytes(sql: str, rows: list[Any]) -> int:
    """Payload bytes of the journal rows an operation inserts (0 for any other)."""
    if sql in _JOURNAL_INSERTS:
        return sum(len(row[_PAYLOAD]) for row in rows if row[_PAYLOAD] is not None)
    if sql is _INSERT_JOURNAL_COLUMNS:
        return sum(
            len(payload)
            for _wide, _shared, columns in rows
            for payload in columns[_PAYLOAD]
            if payload is not None
        )
    return 0


def _weight(sql: str, rows: list[tuple[Any, ...]]) -> int:
    """The rows an operation writes (a block of columns is many)."""
    if sql is _INSERT_JOURNAL_COLUMNS:
        return sum(len(columns[0]) for _wide, _shared, columns in rows)
    return len(rows)


def _insert_columns(
    connection: sqlite3.Connection, wide: bool, shared: tuple[Any, ...], columns: list[Any]
) -> None:
    """Journal rows from columns: per statement, the shared values once and each row's own
    values (a narrow block: id, topic, payload; a wide one: those, qos, retain, persistent
    and properties), zipped in C."""
    start, left = 0, len(columns[0])
    for size in _BULK_SIZES:
        if left < size:
            continue
        sql = _columns_insert(wide, size)
        while left >= size:
            end = start + size
            chunk = [c[start:end] for c in columns]
            # Payloads bound as bytearray (the same BLOB): sqlite3 binds bytes through its
            # slow adapter lookup (see _message_values).
            chunk[_PAYLOAD] = map(bytearray, chunk[_PAYLOAD])
            connection.execute(sql, [*shared, *chain.from_iterable(zip(*chunk, strict=True))])
            start = end
            left -= size


@functools.cache
def _columns_insert(wide: bool, rows: int) -> str:
    """A multi-row journal insert whose shared values are numbered parameters ?1..?k, bound
    once, then each row's own values. Journal columns: message_id, topic, payload, qos,
    retain, persistent, priority, timestamp, expiry, delivery_time, origin, properties,
    stored_at."""
    values = []
    if wide:
        # shared: priority, timestamp, expiry, delivery_time, origin, stored_at; a row's
        # properties are an empty blob when it has none (never a property blob: that is
        # NULL), stored as NULL.
        for row in range(rows):
            b = 7 + 7 * row
            values.append(
                f"(?{b}, ?{b + 1}, ?{b + 2}, ?{b + 3}, ?{b + 4}, ?{b + 5}, "
                f"?1, ?2, ?3, ?4, ?5, NULLIF(?{b + 6}, x''), ?6)"
            )
    else:
        # shared: qos, retain, persistent, priority, timestamp, expiry, delivery_time,
        # origin, properties, stored_at
        for row in range(rows):
            b = 11 + 3 * row
            values.append(f"(?{b}, ?{b + 1}, ?{b + 2}, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)")
    return "INSERT INTO journal VALUES " + ", ".join(values)


def _chunks(rows: list[Any]) -> Iterator[list[Any]]:
    start, left = 0, len(rows)
    for size in _BULK_SIZES:
        while left >= size:
            yield rows[start : start + size]
            start += size
            left -= size


@functools.cache
def _bulk_insert(sql: str, rows: int) -> str:
    head, values = _BULK_INSERTS[sql]
    return head + ", ".join([values] * rows)


@functools.cache
def _bulk_remove(rows: int) -> str:
    marks = ", ".join("?" * rows)
    return f"DELETE FROM queue_entries WHERE queue=? AND message_id IN ({marks})"


# INSERT statements that can take many rows: (everything up to the values, one row's values).
_BULK_INSERTS = {
    sql: (sql[: sql.index("VALUES") + 7], sql[sql.index("VALUES") + 7 :])
    for sql in (
        _INSERT_JOURNAL,
        _INSERT_ENTRY,
        _INSERT_ENTRY_REFERENCE,
        _INSERT_SUBSCRIPTION,
    )
}


# A journal row's property blob when it has none, in a block of columns (see _columns_insert).
_NO_BLOB = bytearray()
# Every statement that inserts journal rows one message a row (payload at _PAYLOAD).
_JOURNAL_INSERTS = {_INSERT_JOURNAL}


def _message_values(
    message: Message, clock_to_wall_ms: float
) -> tuple[tuple[bool, ...], tuple[Any, ...]]:
    """A message's row (:func:`message_row`) in the form sqlite3 binds cheaply: which of the
    optional columns it holds a value in, and its values without the NULLs, blobs as
    bytearray.

    sqlite3 (3.11) binds a None, as a bytes value, through its adapter lookup: two attribute
    lookups that fail, each formatting an AttributeError, several times a plain value's cost
    on the writer thread. A NULL column is left out of the statement instead (it defaults to
    NULL: :func:`_message_insert`); a bytearray is bound directly, as the same BLOB.
    """
    (
        topic,
        payload,
        qos,
        retain,
        persistent,
        priority,
        timestamp,
        expiry,
        delivery_time,
        origin,
        properties,
    ) = message_columns(message, clock_to_wall_ms)
    head = (
        message.message_id,
        topic,
        bytearray(payload),
        qos,
        retain,
        persistent,
        priority,
        timestamp,
    )
    if expiry is None and delivery_time is None and properties is None and origin is not None:
        return _ORIGIN_ONLY, (*head, origin)
    present = (
        expiry is not None,
        delivery_time is not None,
        origin is not None,
        properties is not None,
    )
    blob = None if properties is None else bytearray(properties)
    return present, (*head, *[v for v in (expiry, delivery_time, origin, blob) if v is not None])


# A queue entry's own columns around its message's (see _message_insert): its queue first,
# then, after the message's, its delivery's, and (fixed for a new entry) not in flight.
_ENTRY_DELIVERY_COLUMNS = ("delivery_qos", "delivery_retain", "subscription_ids", "delivery_count")
_ENTRY_QUEUED = (("delivery_id", "0"), ("state", "'queued'"))


@functools.cache
def _message_insert(verb: str, table: str, present: tuple[bool, ...], stored_at: bool) -> str:
    """The statement inserting a message row of ``table`` whose optional columns hold a value
    where ``present`` says (the others are left out: NULL); a will row leads with its client
    id, a journal row ends with its ``stored_at``, a queue entry carrying its message leads
    with its queue and ends with its delivery columns. One string per shape, so runs of one
    shape share a statement (and the writer's statement cache)."""
    entry = table == "queue_entries"
    names = [
        *(("client_id",) if table == "wills" else ()),
        *(("queue",) if entry else ()),
        *MESSAGE_COLUMNS[:8],
        *(name for name, there in zip(_OPTIONAL_COLUMNS, present, strict=True) if there),
        *(("stored_at",) if stored_at else ()),
        *(_ENTRY_DELIVERY_COLUMNS if entry else ()),
    ]
    places = ["?"] * len(names)
    if entry:
        names += [name for name, _value in _ENTRY_QUEUED]
        places += [value for _name, value in _ENTRY_QUEUED]
    sql = f"{verb} INTO {table} ({', '.join(names)}) VALUES ({', '.join(places)})"
    if table == "journal":
        _JOURNAL_INSERTS.add(sql)
    if table == "journal" or entry:
        # A turn's journal rows and queue entries go as multi-row statements (see _execute).
        _BULK_INSERTS[sql] = (sql[: sql.index("VALUES") + 7], sql[sql.index("VALUES") + 7 :])
    return sql


# The insert of a queue entry carrying a message of the commonest shape (an origin only).
_INSERT_ENTRY_ORIGIN_ONLY = _message_insert(
    "INSERT OR REPLACE", "queue_entries", _ORIGIN_ONLY, False
)


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(StoreWriteError(str(error)))


class StoreWriteError(StoreError):
    """A batch could not be written (disk full, I/O error); its acknowledgements must fail."""


def _queue_rules(ordering: str, dead_letters: int) -> QueueRules:
    """A stored session's queue rules (the shared default for an MQTT session's)."""
    if ordering != "priority" and not dead_letters:
        return DEFAULT_QUEUE_RULES
    return QueueRules("priority" if ordering == "priority" else "fifo", bool(dead_letters))
