"""The embedded SQLite store (WAL mode): one writer thread owns the write connection and commits
in groups; the event loop only appends operations and awaits commit futures.

A commit future resolves after the transaction holding every earlier operation is on disk, which
is when a publisher may be acknowledged. Must never be called from the writer thread's side of
the queue except through :meth:`SQLiteStore.commit` and friends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage
from kittiwake.broker.store import QueuedRecord, RecoveredState, SessionRecord
from kittiwake.clock import Clock, MonotonicClock
from kittiwake.store.codec import (
    apply_message_properties,
    from_wall,
    message_from_json,
    message_properties_json,
    message_to_json,
    session_from_json,
    session_to_json,
)
from kittiwake.store.journal_selection import JournalSelection

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
DATABASE_FILE = "kittiwake.db"

# A run of one statement over many parameter rows: consecutive operations with the same SQL
# share a run, so the writer thread hands each run to executemany (one C loop, not one call
# per row).
Operation = tuple[str, list[tuple[Any, ...]]]
# How often released messages are swept out of the journal (seconds).
SWEEP_INTERVAL = 1.0
# How long a lazy delivery mark waits for its acknowledgement before it is written (seconds):
# most QoS 1 deliveries are acknowledged sooner, and then the mark is never written at all.
LAZY_MARK_DELAY = 0.05

_MIGRATIONS: dict[int, list[str]] = {
    # 0 → 1: the first schema.
    1: [
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            topic TEXT NOT NULL,
            payload BLOB NOT NULL,
            qos INTEGER NOT NULL,
            retain INTEGER NOT NULL,
            priority INTEGER NOT NULL,
            expiry REAL,
            delivery_time REAL,
            created REAL NOT NULL,
            origin TEXT,
            extra TEXT NOT NULL,
            stored_at REAL NOT NULL
        )""",
        """CREATE TABLE sessions (
            client_id TEXT PRIMARY KEY,
            record TEXT NOT NULL
        )""",
        """CREATE TABLE queued (
            client_id TEXT NOT NULL,
            message_id INTEGER NOT NULL,
            qos INTEGER NOT NULL,
            retain INTEGER NOT NULL,
            subscription_ids TEXT NOT NULL,
            delivery_count INTEGER NOT NULL,
            delivery_id INTEGER NOT NULL,
            state TEXT NOT NULL,
            PRIMARY KEY (client_id, message_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX queued_by_message ON queued (message_id)",
        """CREATE TABLE retained (
            topic TEXT PRIMARY KEY,
            message TEXT NOT NULL
        )""",
        """CREATE TABLE incoming_qos2 (
            client_id TEXT NOT NULL,
            packet_id INTEGER NOT NULL,
            PRIMARY KEY (client_id, packet_id)
        ) WITHOUT ROWID""",
        "INSERT INTO meta (key, value) VALUES ('last_message_id', '0')",
    ],
    # 1 → 2: the journal sweep finds messages past their retention by age.
    2: ["CREATE INDEX messages_by_age ON messages (stored_at)"],
    # 2 → 3: a queue row may carry its message inline (a message one queue references and no
    # journal retention keeps): one row written and deleted per message instead of two. Only
    # rows without a message (topic IS NULL) keep a journal row alive.
    3: [
        *(
            f"ALTER TABLE queued ADD COLUMN {column}"
            for column in (
                "topic TEXT",
                "payload BLOB",
                "message_qos INTEGER",
                "message_retain INTEGER",
                "priority INTEGER",
                "expiry REAL",
                "delivery_time REAL",
                "created REAL",
                "origin TEXT",
                "extra TEXT",
            )
        ),
        "DROP INDEX queued_by_message",
        "CREATE INDEX queued_by_message ON queued (message_id) WHERE topic IS NULL",
    ],
}


_INSERT_MESSAGE = "INSERT OR IGNORE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_QUEUED = (
    "INSERT OR REPLACE INTO queued (client_id, message_id, qos, retain, subscription_ids, "
    "delivery_count, delivery_id, state, topic, payload, message_qos, message_retain, priority, "
    "expiry, delivery_time, created, origin, extra) "
    "VALUES (?, ?, ?, ?, ?, ?, 0, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_MARK = (
    "UPDATE queued SET delivery_id=?, state=?, delivery_count=delivery_count+? "
    "WHERE client_id=? AND message_id=?"
)
_RELEASE = "DELETE FROM queued WHERE client_id=? AND message_id=?"
_SET_LAST_ID = "UPDATE meta SET value=? WHERE key='last_message_id'"
# Every journal row at or below this id may be gone (retention): readers start above it. Kept
# in meta (not a schema change) and only ever raised, in the sweep's own transaction.
DROPPED_THROUGH_KEY = "journal_dropped_through"
_RAISE_DROPPED_THROUGH = (
    "UPDATE meta SET value = MAX(CAST(value AS INTEGER), COALESCE(({}), 0)) "
    f"WHERE key = '{DROPPED_THROUGH_KEY}'"
)
# The message columns of a queue row that references a journal row instead.
_NO_MESSAGE: tuple[None, ...] = (None,) * 10
# The columns of a message, in journal-row and inline-queue-row order.
_MESSAGE_COLUMNS = (
    "topic, payload, {qos}, {retain}, priority, expiry, delivery_time, created, origin, extra"
)


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
        journal_retention_seconds: float = 0.0,
        journal_retention_bytes: int = 0,
        journal_selection: JournalSelection | None = None,
        synchronous: str = "FULL",
        wal_autocheckpoint: int = 1000,
    ) -> None:
        self.directory = Path(data_dir)
        self.path = self.directory / DATABASE_FILE
        self._clock = clock or MonotonicClock()
        # Wall time minus clock time: converts the core's clock readings for disk.
        self._offset = time.time() - self._clock.now()
        self._max_batch = max_batch
        self._max_delay = max_delay
        self._retention = journal_retention_seconds
        self._retention_bytes = journal_retention_bytes
        # With a retention, the publications the selection names are journalled (for the Spark
        # source), not only those a durable subscriber references.
        self._keeps_journal = journal_retention_seconds > 0 or journal_retention_bytes > 0
        # Without a retention the journal keeps nothing, whatever a selection says.
        if journal_selection is None or not self._keeps_journal:
            journal_selection = JournalSelection(enabled=self._keeps_journal)
        self.journal_selection = journal_selection
        self._selection_keeps = self.journal_selection.keeps
        # The broker hands this store its QoS 0 publications only when this is true.
        self.keeps_qos0 = self.journal_selection.keeps_qos0
        self._wal_autocheckpoint = wal_autocheckpoint
        self._synchronous = synchronous
        self._ops: list[Operation] = []
        # Journal rows of this turn, written first in their batch as one executemany run:
        # only the sweep deletes from that table, and it always comes last.
        self._message_rows: list[tuple[Any, ...]] = []
        # Released references since the last journal sweep; the sweep deletes messages that no
        # queue references any more (after the retention), once a second rather than per ack.
        self._released = 0
        self._last_sweep = time.monotonic()
        self._unwritten: dict[int, Message] = {}
        # Ids whose journal row is written by the operations not yet handed off.
        self._inserted: set[int] = set()
        # Queue rows not yet handed off that carry their message inline, by message id, as
        # (run, index) into self._ops: a second reference in the same hand-off turns the first
        # into a plain reference and writes a journal row instead.
        self._inline: dict[int, tuple[list[tuple[Any, ...]], int]] = {}
        # Lazy delivery marks by (client id, message id): (delivery id, state, count bump,
        # due time). Written once due; dropped when the entry is released first.
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
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[list[tuple[list[Operation], asyncio.Future[None]]] | None]
        self._queue = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self.failed_batches = 0
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create data directory {self.directory}: {exc}") from exc
        self._open_and_migrate()
        self._last_id = self._highest_id()

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
            while version < SCHEMA_VERSION:
                version += 1
                log.info("store %s: migrating schema to version %d", self.path, version)
                connection.execute("BEGIN IMMEDIATE")
                for statement in _MIGRATIONS[version]:
                    connection.execute(statement)
                connection.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(version),),
                )
                connection.execute("COMMIT")
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
                "SELECT MAX(m) FROM (SELECT MAX(id) AS m FROM messages "
                "UNION ALL SELECT MAX(message_id) FROM queued)"
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
        # Journal content (the selection's choice): a row whether referenced or not, which a
        # persistent publication's acknowledgement waits for. Other persistent publications
        # are written by enqueue() only, once a durable queue references them; other QoS 0
        # ones never.
        keeps = self._keeps_journal and self._selection_keeps(message.topic, message.persistent)
        if not keeps and not message.persistent:
            return
        if message.message_id == 0:
            self._last_id += 1
            message.message_id = self._last_id
            self._ids_dirty = True
        if keeps:
            self._unwritten[message.message_id] = message
            self._schedule()

    def journals_qos0(self, topic: str) -> bool:
        """Whether a QoS 0 publication on ``topic`` must go through :meth:`journal`."""
        return self._selection_keeps(topic, False)

    def enqueue(self, client_id: str, entry: QueuedMessage) -> None:
        message = entry.message
        message_id = message.message_id
        if self._marks:
            self._marks.pop((client_id, message_id), None)
        unwritten = self._unwritten.pop(message_id, None)
        if unwritten is not None:
            self._message_rows.append(self._message_row(unwritten))
            self._inserted.add(message_id)
        if message_id in self._inserted:
            columns = _NO_MESSAGE
        else:
            inline = self._inline.pop(message_id, None)
            if inline is None:
                columns = self._message_columns(message)
            elif self._keeps_journal and self._selection_keeps(message.topic, message.persistent):
                # Journal content queued again in a later turn (a retained message for a new
                # subscriber): its row may be swept already, and an offset is never written
                # twice, so every such reference carries its own copy.
                columns = self._message_columns(message)
            else:
                # A second reference: the message moves into a journal row both point to.
                run, index = inline
                run[index] = run[index][:6] + _NO_MESSAGE
                self._message_rows.append(self._message_row(message))
                self._inserted.add(message_id)
                columns = _NO_MESSAGE
        self._add(
            _INSERT_QUEUED,
            (
                client_id,
                message_id,
                entry.qos,
                int(entry.retain),
                ",".join(map(str, entry.subscription_ids)) if entry.subscription_ids else "",
                entry.delivery_count,
                *columns,
            ),
        )
        if columns is not _NO_MESSAGE:
            run = self._ops[-1][1]
            self._inline[message_id] = (run, len(run) - 1)

    def mark_delivery(
        self, client_id: str, message_id: int, delivery_id: int, state: str, lazy: bool = False
    ) -> None:
        bump = 1 if state == "sent" else 0
        earlier = self._marks.pop((client_id, message_id), None)
        if earlier is not None:
            bump += earlier[2]
        if lazy:
            loop = self._loop or self._get_loop()
            due = loop.time() + LAZY_MARK_DELAY
            self._marks[(client_id, message_id)] = (delivery_id, state, bump, due)
            if self._mark_timer is None:
                self._mark_timer = loop.call_at(due, self._on_mark_timer)
        else:
            self._add(_MARK, (delivery_id, state, bump, client_id, message_id))

    def release(self, client_id: str, message_id: int) -> None:
        if self._marks:
            self._marks.pop((client_id, message_id), None)
        self._add(_RELEASE, (client_id, message_id))
        self._released += 1

    def save_session(self, record: SessionRecord) -> None:
        self._add(
            "INSERT OR REPLACE INTO sessions VALUES (?, ?)",
            (record.client_id, session_to_json(record, self._offset)),
        )

    def delete_session(self, client_id: str) -> None:
        for key in [key for key in self._marks if key[0] == client_id]:
            del self._marks[key]
        self._add("DELETE FROM sessions WHERE client_id=?", (client_id,))
        self._add("DELETE FROM incoming_qos2 WHERE client_id=?", (client_id,))
        self._add("DELETE FROM queued WHERE client_id=?", (client_id,))
        self._released += 1

    def set_retained(self, topic: str, message: Message | None) -> None:
        if message is None:
            self._add("DELETE FROM retained WHERE topic=?", (topic,))
        else:
            self._add(
                "INSERT OR REPLACE INTO retained VALUES (?, ?)",
                (topic, message_to_json(message, self._offset)),
            )

    def add_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        self._add("INSERT OR IGNORE INTO incoming_qos2 VALUES (?, ?)", (client_id, packet_id))

    def remove_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        self._add(
            "DELETE FROM incoming_qos2 WHERE client_id=? AND packet_id=?", (client_id, packet_id)
        )

    def commit(self) -> asyncio.Future[None] | None:
        """The future of the batch that will hold every operation so far, or None.

        Lazy marks are not waited for: they are allowed to be late.
        """
        if self._ops or self._message_rows or (self._unwritten and self._keeps_journal):
            self._schedule()
            if self._pending_future is None:
                self._pending_future = self._get_loop().create_future()
            return self._pending_future
        if self._last_future is not None and not self._last_future.done():
            return self._last_future
        return None

    def recover(self) -> RecoveredState:
        """Read everything back (before the writer starts; on the caller's thread)."""
        started = time.monotonic()
        offset = self._offset
        state = RecoveredState()
        connection = self._connect()
        try:
            for row in connection.execute(
                f"SELECT id, {_MESSAGE_COLUMNS.format(qos='qos', retain='retain')} FROM messages "
                "WHERE id IN (SELECT message_id FROM queued WHERE topic IS NULL) ORDER BY id"
            ):
                state.messages[row[0]] = _message_from_columns(row[0], row[1:], offset)
            for client_id, text in connection.execute("SELECT client_id, record FROM sessions"):
                state.sessions[client_id] = session_from_json(client_id, text, offset)
            inline_columns = _MESSAGE_COLUMNS.format(qos="message_qos", retain="message_retain")
            for row in connection.execute(
                "SELECT client_id, message_id, qos, retain, subscription_ids, delivery_count, "
                f"delivery_id, state, {inline_columns} FROM queued ORDER BY message_id"
            ):
                message_id = row[1]
                if row[8] is not None and message_id not in state.messages:
                    state.messages[message_id] = _message_from_columns(message_id, row[8:], offset)
                ids = tuple(int(x) for x in row[4].split(",") if x)
                state.queued.append(
                    QueuedRecord(
                        row[0], message_id, row[2], bool(row[3]), ids, row[5], row[6], row[7]
                    )
                )
            for topic, text in connection.execute("SELECT topic, message FROM retained"):
                state.retained[topic] = message_from_json(text, offset)
            for client_id, packet_id in connection.execute(
                "SELECT client_id, packet_id FROM incoming_qos2"
            ):
                state.incoming_qos2.setdefault(client_id, set()).add(packet_id)
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
            time.monotonic() - started,
        )
        return state

    def close(self) -> None:
        """Write what is pending, lazy marks included, and stop the writer (graceful stop)."""
        self._closed = True
        if self._mark_timer is not None:
            self._mark_timer.cancel()
            self._mark_timer = None
        if self._released:
            self._sweep_journal()
        if self._ops or self._message_rows or self._unwritten or self._ids_dirty or self._marks:
            self._hand_off(final=True)
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=30)
            self._writer = None

    # -- batching -------------------------------------------------------------------------

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _add(self, sql: str, params: tuple[Any, ...]) -> None:
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
        now = self._get_loop().time()
        rows: list[tuple[Any, ...]] = []
        for key, (delivery_id, state, bump, due) in marks.items():
            if due > now and not final:
                break
            rows.append((delivery_id, state, bump, key[0], key[1]))
        for row in rows:
            del marks[(row[3], row[4])]
        if marks and self._mark_timer is None:
            # Dict order is due order: a mark is re-inserted whenever it changes.
            first_due = next(iter(marks.values()))[3]
            self._mark_timer = self._get_loop().call_at(first_due, self._on_mark_timer)
        return rows

    def _hand_off(self, final: bool = False) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if self._closed and not final:
            return
        if self._keeps_journal and self._unwritten:
            for message in self._unwritten.values():
                self._message_rows.append(self._message_row(message))
        self._unwritten.clear()
        now = time.monotonic()
        if (self._released or self._keeps_journal) and now - self._last_sweep >= SWEEP_INTERVAL:
            self._sweep_journal()
            self._last_sweep = now
        ops = self._ops
        self._ops = []
        if self._message_rows:
            ops.insert(0, (_INSERT_MESSAGE, self._message_rows))
            self._message_rows = []
        self._inserted.clear()
        self._inline.clear()
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
        # one (a QoS 2 id and the message it admits are stored together or not at all).
        self._sealed.append((ops, future))
        if not self._writing or final:
            self._send()

    def _send(self) -> None:
        """Give the writer every sealed turn; it commits them in groups of whole turns."""
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_loop, name="kittiwake-store", daemon=True
            )
            self._writer.start()
        self._writing = True
        self._queue.put(self._sealed)
        self._sealed = []

    def _batch_written(
        self, results: list[tuple[asyncio.Future[None], BaseException | None]]
    ) -> None:
        """On the loop: the writer committed (or failed) what it was given and is free again."""
        self._writing = False
        for future, error in results:
            _resolve(future, error)
        if self._sealed and not self._closed:
            self._send()
        elif not self._closed and self._marks and self._mark_timer is None:
            self._hand_off()  # lazy marks fell due while the writer was busy

    def _message_row(self, message: Message) -> tuple[Any, ...]:
        return (message.message_id, *self._message_columns(message), time.time())

    def _message_columns(self, message: Message) -> tuple[Any, ...]:
        # to_wall() written out: this runs once per durable message on the event loop.
        offset = self._offset
        expiry = message.expiry
        delivery_time = message.delivery_time
        return (
            message.topic,
            message.payload,
            message.qos,
            int(message.retain),
            message.priority,
            None if expiry is None else expiry + offset,
            None if delivery_time is None else delivery_time + offset,
            message.created + offset,
            message.origin,
            message_properties_json(message),
        )

    def _sweep_journal(self) -> None:
        """Delete journalled messages no queue references, once past the retention.

        The time retention keeps acknowledged messages for so many seconds; the size retention
        keeps the newest ones whose payloads fit in so many bytes (whichever is stricter wins).
        Referenced messages are never deleted.
        """
        self._released = 0
        # Appended, not _add()ed: the sweep rides on a batch and must not schedule another.
        # First the journal's new start (every row at or below it is past a retention), then
        # the rows below it that no queue references. A referenced row stays for its queue but
        # is no longer journal content: readers never see below the start.
        if self._retention or not self._retention_bytes:
            self._ops.append(
                (
                    _RAISE_DROPPED_THROUGH.format(
                        "SELECT MAX(id) FROM messages WHERE stored_at < ?"
                    ),
                    [(time.time() - self._retention,)],
                )
            )
        if self._retention_bytes:
            self._ops.append(
                (
                    _RAISE_DROPPED_THROUGH.format(
                        "SELECT MAX(id) FROM (SELECT id, SUM(length(payload)) OVER "
                        "(ORDER BY id DESC) AS newer FROM messages) WHERE newer > ?"
                    ),
                    [(self._retention_bytes,)],
                )
            )
        self._ops.append(
            (
                "DELETE FROM messages WHERE id <= (SELECT CAST(value AS INTEGER) FROM meta "
                f"WHERE key = '{DROPPED_THROUGH_KEY}') AND NOT EXISTS "
                "(SELECT 1 FROM queued WHERE message_id = messages.id AND topic IS NULL)",
                [()],
            )
        )

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
                        count += sum(len(rows) for _sql, rows in turns[taken][0])
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
        try:
            connection.execute("BEGIN")
            for sql, rows in ops:
                _execute(connection, sql, rows)
            connection.execute("COMMIT")
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
    if len(rows) == 1:
        connection.execute(sql, rows[0])
    elif sql in _BULK_INSERTS:
        for chunk in _chunks(rows):
            connection.execute(_bulk_insert(sql, len(chunk)), list(chain.from_iterable(chunk)))
    elif sql is _RELEASE:
        by_client: dict[str, list[int]] = {}
        for client_id, message_id in rows:
            by_client.setdefault(client_id, []).append(message_id)
        for client_id, ids in by_client.items():
            for chunk in _chunks(ids):
                connection.execute(_bulk_release(len(chunk)), [client_id, *chunk])
    else:
        connection.executemany(sql, rows)


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
def _bulk_release(rows: int) -> str:
    marks = ", ".join("?" * rows)
    return f"DELETE FROM queued WHERE client_id=? AND message_id IN ({marks})"


# INSERT statements that can take many rows: (everything up to the values, one row's values).
_BULK_INSERTS = {
    sql: (sql[: sql.index("VALUES") + 7], sql[sql.index("VALUES") + 7 :])
    for sql in (_INSERT_MESSAGE, _INSERT_QUEUED)
}


def _message_from_columns(message_id: int, row: Any, offset: float) -> Message:
    """A message from its columns (journal-row or inline-queue-row order)."""
    message = Message(
        topic=row[0],
        payload=bytes(row[1]),
        qos=row[2],
        retain=bool(row[3]),
        persistent=True,
        priority=row[4],
        expiry=from_wall(row[5], offset),
        delivery_time=from_wall(row[6], offset),
        created=from_wall(row[7], offset) or 0.0,
        origin=row[8],
        message_id=message_id,
    )
    apply_message_properties(message, row[9])
    return message


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(StoreWriteError(str(error)))


class StoreWriteError(StoreError):
    """A batch could not be written (disk full, I/O error); its acknowledgements must fail."""
