"""The SQLite store against a real temporary directory: what is committed comes back on reopen.

Every "process lifetime" of a store is one ``asyncio.run`` (the store binds to the running loop
on first use); a reopen is a new :class:`SQLiteStore` on the same directory in a new loop.
No pytest-asyncio: :func:`run` is the whole event-loop harness.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kittiwake.broker.broker import Broker, Subscribed, SubscriptionOptions
from kittiwake.broker.consumers import Delivery, DeliveryState
from kittiwake.broker.durable_subscriptions import SubscriptionDefinition
from kittiwake.broker.message import Message, MessageProperties, MQTT5Fields, PropertyType
from kittiwake.broker.queues import DEFAULT_QUEUE_RULES, QueuedMessage, QueueRules
from kittiwake.broker.sessions import NEVER_EXPIRES, Session, session_queue_name
from kittiwake.broker.store import (
    QueuedRecord,
    RecoveredState,
    SessionRecord,
    SubscriptionRecord,
)
from kittiwake.clock import ManualClock
from kittiwake.config import Config
from kittiwake.store import sqlite as sqlite_module
from kittiwake.store.codec import message_columns, message_row
from kittiwake.store.schema import MIGRATIONS
from kittiwake.store.sqlite import (
    DATABASE_FILE,
    SCHEMA_VERSION,
    SQLiteStore,
    StoreError,
    StoreWriteError,
)

T = TypeVar("T")
SRC_DIR = Path(__file__).resolve().parents[3] / "src"
COMMIT_TIMEOUT = 10.0


def run(body: Callable[[], Awaitable[T]]) -> T:
    """One event loop for one store lifetime, bounded in time."""

    async def bounded() -> T:
        return await asyncio.wait_for(body(), timeout=30)

    return asyncio.run(bounded())


async def settle(store: SQLiteStore) -> None:
    """Wait until everything handed to the store so far is on disk."""
    future = store.commit()
    if future is not None:
        await asyncio.wait_for(future, COMMIT_TIMEOUT)


def reopen(directory: Path) -> RecoveredState:
    """A fresh store on the same directory: what a restarted broker would read back."""
    store = SQLiteStore(directory, clock=ManualClock())
    try:
        return store.recover()
    finally:
        store.close()


def db_rows(directory: Path, sql: str) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(directory / DATABASE_FILE)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def message(topic: str = "a/b", payload: bytes = b"m", qos: int = 1, **fields: Any) -> Message:
    return Message(topic=topic, payload=payload, qos=qos, persistent=True, **fields)


def entry(m: Message, qos: int | None = None, **fields: Any) -> QueuedMessage:
    return QueuedMessage(m, m.qos if qos is None else qos, True, **fields)


# -- records come back ------------------------------------------------------------------------


def test_journalled_and_queued_message_survives_reopen(tmp_path: Path) -> None:
    clock = ManualClock(5_000.0)

    async def write() -> int:
        store = SQLiteStore(tmp_path, clock=clock)
        m = message(
            "sensors/1/temp", b"\x00\x01binary\xff", qos=2, retain=True,
            created=clock.now(), expiry=clock.now() + 3600,
            mqtt5=MQTT5Fields(
                content_type="text/plain", response_topic="reply/here",
                correlation_data=b"\x01corr", payload_format_indicator=1,
                user_properties=[("k", "v"), ("k", "v2")],
            ),
            origin="pub-1",
        )
        store.journal(m)
        assert m.message_id > 0
        store.enqueue("sub-1", entry(m, 2, retain=True, subscription_ids=(3, 7)))
        await settle(store)
        store.close()
        return m.message_id

    message_id = run(write)
    state = reopen(tmp_path)
    got = state.messages[message_id]
    assert (got.topic, got.payload, got.qos, got.retain, got.persistent) == (
        "sensors/1/temp", b"\x00\x01binary\xff", 2, True, True,
    )
    assert got.mqtt5 is not None
    assert got.mqtt5.user_properties == [("k", "v"), ("k", "v2")]
    assert got.mqtt5.content_type == "text/plain"
    assert got.mqtt5.response_topic == "reply/here"
    assert got.mqtt5.correlation_data == b"\x01corr"
    assert got.mqtt5.payload_format_indicator == 1
    assert got.origin == "pub-1"
    # Times are stored as wall time: an hour of expiry is still an hour away on a clock
    # started later (the manual clocks share their wall time).
    assert got.expiry is not None
    assert got.expiry - ManualClock().now() == 3600
    assert state.queued == [QueuedRecord("sub-1", message_id, 2, True, (3, 7), 0, 0, "queued")]


def test_delivery_state_and_count_survive_reopen(tmp_path: Path) -> None:
    async def write() -> tuple[int, int]:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        first, second = message(payload=b"1", qos=1), message(payload=b"2", qos=2)
        for m in (first, second):
            store.journal(m)
            store.enqueue("c", entry(m, delivery_count=0))
        await settle(store)
        store.mark_delivery("c", first.message_id, 17, "sent")
        store.mark_delivery("c", second.message_id, 18, "sent")
        await settle(store)
        # A resend after reconnection bumps the count again; a PUBREC does not.
        store.mark_delivery("c", first.message_id, 17, "sent")
        store.mark_delivery("c", second.message_id, 18, "received")
        await settle(store)
        store.close()
        return first.message_id, second.message_id

    first_id, second_id = run(write)
    queued = {r.message_id: r for r in reopen(tmp_path).queued}
    assert queued[first_id] == QueuedRecord("c", first_id, 1, False, (), 2, 17, "sent")
    assert queued[second_id] == QueuedRecord("c", second_id, 2, False, (), 1, 18, "received")


def test_session_record_with_subscriptions_and_will_survives_reopen(tmp_path: Path) -> None:
    clock = ManualClock()
    will = message(
        "wills/c1", b"gone", qos=1, retain=True,
        mqtt5=MQTT5Fields(user_properties=[("why", "lost")]),
    )
    record = SessionRecord(
        client_id="c1",
        expiry_interval=3600,
        subscriptions=[
            SubscriptionRecord("a/+/c", 2),
            SubscriptionRecord("$share/g1/jobs/#", 1, False, False, 0, 42),
            SubscriptionRecord("x/y", 0, True, True, 2, None),
        ],
        will=will,
        will_delay=30,
        will_expiry=120,
    )

    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=clock)
        store.save_session(record)
        store.save_session(SessionRecord("c2", 0xFFFFFFFF))
        await settle(store)
        store.close()

    run(write)
    sessions = reopen(tmp_path).sessions
    assert set(sessions) == {"c1", "c2"}
    got = sessions["c1"]
    assert got.expiry_interval == 3600
    assert got.subscriptions == record.subscriptions
    assert (got.will_delay, got.will_expiry) == (30, 120)
    assert got.will is not None
    assert (got.will.topic, got.will.payload, got.will.qos, got.will.retain) == (
        "wills/c1", b"gone", 1, True,
    )
    assert got.will.mqtt5 == MQTT5Fields(user_properties=[("why", "lost")])
    assert sessions["c2"].expiry_interval == 0xFFFFFFFF
    assert sessions["c2"].will is None


def test_saving_a_session_again_replaces_it(tmp_path: Path) -> None:
    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("c", 60, [SubscriptionRecord("a", 1)]))
        await settle(store)
        store.save_session(SessionRecord("c", 120, [SubscriptionRecord("b", 2)]))
        await settle(store)
        store.close()

    run(write)
    got = reopen(tmp_path).sessions["c"]
    assert got.expiry_interval == 120
    assert got.subscriptions == [SubscriptionRecord("b", 2)]


def test_retained_set_replace_and_clear_survive_reopen(tmp_path: Path) -> None:
    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.set_retained("r/1", message("r/1", b"old", retain=True))
        store.set_retained("r/2", message("r/2", b"two", qos=2, retain=True))
        store.set_retained("r/3", message("r/3", b"three", retain=True))
        await settle(store)
        store.set_retained("r/1", message("r/1", b"new", retain=True))
        store.set_retained("r/3", None)
        await settle(store)
        store.close()

    run(write)
    retained = reopen(tmp_path).retained
    assert sorted(retained) == ["r/1", "r/2"]
    assert retained["r/1"].payload == b"new"
    assert (retained["r/2"].payload, retained["r/2"].qos, retained["r/2"].retain) == (
        b"two", 2, True,
    )
    assert retained["r/2"].persistent


def test_duplicate_keys_survive_reopen_per_producer(tmp_path: Path) -> None:
    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.add_duplicate("c1", 5)
        store.add_duplicate("c1", 6)
        store.add_duplicate("c1", 6)  # a resend: idempotent
        store.add_duplicate("c2", 9)
        store.add_duplicate("spark-query", "batch-3/partition-1")
        store.add_duplicate("spark-query", 3)  # an int and a text key are different keys
        await settle(store)
        store.remove_duplicate("c1", 6)
        store.add_duplicate("gone", 1)
        store.delete_duplicates("gone")
        await settle(store)
        store.close()

    run(write)
    assert reopen(tmp_path).duplicates == {
        "c1": {5},
        "c2": {9},
        "spark-query": {"batch-3/partition-1", 3},
    }


def typed_message(topic: str, payload: bytes) -> Message:
    properties = MessageProperties(
        [
            ("flag", True, PropertyType.BOOLEAN),
            ("b", -3, PropertyType.BYTE),
            ("s", 7, PropertyType.SHORT),
            ("i", 7, PropertyType.INT),
            ("l", 7, PropertyType.LONG),
            ("f", 0.25, PropertyType.FLOAT),
            ("d", 0.1, PropertyType.DOUBLE),
            ("str", "text", PropertyType.STRING),
        ]
    )
    mqtt5 = MQTT5Fields(user_properties=[("u", "2"), ("u", "1")], content_type="a/b")
    return message(topic, payload, properties=properties, mqtt5=mqtt5, retain=True)


def test_every_stored_copy_keeps_property_types_ids_and_timestamps(tmp_path: Path) -> None:
    """One encoding everywhere: a journal row, an inline queue entry, a retained message and a
    will all bring back typed properties, MQTT 5 fields, the message id and the timestamp."""
    clock = ManualClock()
    journalled = typed_message("j", b"journal")
    inline = typed_message("i", b"inline")
    retained = typed_message("r", b"retained")
    will = typed_message("w", b"will")

    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=clock)
        for m in (journalled, inline, retained):
            m.created = clock.now()
            store.journal(m)
            clock.advance(1)
        store.enqueue("a", entry(journalled))
        store.enqueue("b", entry(journalled))
        store.enqueue("a", entry(inline))
        store.set_retained("r", retained)
        store.save_session(SessionRecord("c", 60, [], will))
        await settle(store)
        store.close()

    run(write)
    assert db_rows(tmp_path, "SELECT topic FROM journal") == [("j",)]
    assert db_rows(tmp_path, "SELECT topic FROM queue_entries WHERE topic IS NOT NULL") == [("i",)]
    state = reopen(tmp_path)
    copies = {
        "journal": (journalled, state.messages[journalled.message_id]),
        "inline": (inline, state.messages[inline.message_id]),
        "retained": (retained, state.retained["r"]),
        "will": (will, state.sessions["c"].will),
    }
    for where, (sent, got) in copies.items():
        assert got is not None, where
        assert got.properties == sent.properties, where
        assert got.properties is not None and got.properties.type_of("s") is PropertyType.SHORT
        assert got.mqtt5 == sent.mqtt5, where
        assert got.message_id == sent.message_id, where
        assert got.timestamp == sent.timestamp, where
    assert retained.message_id > 0, "a retained message keeps its message id"
    assert journalled.timestamp == ManualClock().wall_ms()
    assert retained.timestamp == journalled.timestamp + 2000
    assert will.timestamp == 0  # not published yet


def test_every_shape_of_queue_entry_insert_stores_the_row_the_full_insert_stores(
    tmp_path: Path,
) -> None:
    """The writer inserts most queue entries with statements that bind no NULL (a reference to
    a journal row; a message without expiry, delivery time and properties): each row is the
    one the statement naming every column stores, whatever mix of shapes a turn holds."""
    clock = ManualClock()
    plain = message("p", b"plain")
    plain.origin = "c1"
    expiring = message("e", b"expiring", expiry=clock.now() + 60)
    expiring.origin = "c2"
    typed = typed_message("t", b"typed")
    typed.origin = "c3"
    anonymous = message("n", b"no origin")
    shared = message("s", b"shared")
    shared.origin = "c4"
    later = message("l", b"")
    later.origin = "c5"
    order = [
        ("a", plain, {}),
        ("a", expiring, {"subscription_ids": (2, 5)}),
        ("a", shared, {}),
        ("b", shared, {"retain": True}),
        ("a", typed, {"delivery_count": 2}),
        ("a", anonymous, {}),
        ("a", later, {}),
    ]

    async def write() -> None:
        store = SQLiteStore(tmp_path / "store", clock=clock)
        for _queue, m, _fields in order:
            m.created = clock.now()
            if not m.message_id:
                store.journal(m)
        for queue, m, fields in order:
            store.enqueue(queue, entry(m, **fields))
        await settle(store)
        store.close()

    run(write)
    columns = (
        "queue, message_id, delivery_qos, delivery_retain, subscription_ids, delivery_count, "
        "delivery_id, state, topic, payload, qos, retain, persistent, priority, timestamp, "
        "expiry, delivery_time, origin, properties"
    )
    query = f"SELECT {columns}, typeof(payload) FROM queue_entries ORDER BY queue, message_id"
    stored = db_rows(tmp_path / "store", query)
    # The same rows through the statement that binds every column (None as NULL).
    reference = SQLiteStore(tmp_path / "reference", clock=clock)
    reference.close()
    connection = sqlite3.connect(tmp_path / "reference" / DATABASE_FILE)
    try:
        for queue, m, fields in order:
            copy = entry(m, **fields)
            inline = m is not shared
            connection.execute(
                f"INSERT INTO queue_entries ({columns}) VALUES ({', '.join('?' * 19)})",
                (
                    queue,
                    m.message_id,
                    copy.qos,
                    1 if copy.retain else 0,
                    ",".join(str(i) for i in copy.subscription_ids),
                    copy.delivery_count,
                    0,
                    "queued",
                    *(
                        message_columns(m, clock.wall_ms() - clock.now() * 1000)
                        if inline
                        else (None,) * 11
                    ),
                ),
            )
        expected = connection.execute(query).fetchall()
    finally:
        connection.close()
    assert len(stored) == len(order)
    assert stored == expected
    assert {row[-1] for row in stored} == {"blob", "null"}


def test_every_shape_of_journal_retained_and_will_insert_stores_the_row_the_full_insert_stores(
    tmp_path: Path,
) -> None:
    """Journal, retained and will rows are inserted naming only the columns that hold a value
    (NULLs left out) with blobs bound as bytearray: each row, with the storage type of every
    column, is the one the statement binding every column stores (NULLs as None, blobs as
    bytes), and a retained topic set twice in a turn keeps the later message."""
    clock = ManualClock()
    now = clock.now()
    shapes = {
        "plain": message("s/plain", b"plain", origin="c1"),
        "expiring": message("s/expiring", b"expiring", expiry=now + 60, origin="c2"),
        "delayed": message("s/delayed", b"later", delivery_time=now + 5, origin="c3"),
        "typed": typed_message("s/typed", b"typed"),
        "anonymous": message("s/anonymous", b"no origin"),
        "everything": typed_message("s/everything", b"\x00\xff"),
        "empty": message("s/empty", b"", origin="c4"),
    }
    shapes["typed"].origin = "c5"
    shapes["everything"].expiry = now + 30
    shapes["everything"].delivery_time = now + 1
    replaced = message("s/plain", b"first", expiry=now + 9)  # the same topic, set first
    wills = {
        f"w-{name}": Message(
            topic=m.topic, payload=m.payload, qos=m.qos, retain=m.retain, persistent=True,
            expiry=m.expiry, delivery_time=m.delivery_time, origin=m.origin,
            properties=m.properties, mqtt5=m.mqtt5,
        )
        for name, m in shapes.items()
    }

    async def write() -> None:
        store = SQLiteStore(tmp_path / "store", clock=clock, journal_retention_seconds=3600)
        for m in [replaced, *shapes.values()]:
            m.created = now
            store.journal(m)
        store.set_retained(replaced.topic, replaced)
        for m in shapes.values():
            store.set_retained(m.topic, m)
        for client_id, will in wills.items():
            store.save_session(SessionRecord(client_id, 60, will=will))
        await settle(store)
        store.close()

    run(write)
    to_wall = clock.wall_ms() - clock.now() * 1000
    message_columns_sql = ", ".join(
        f"{column}, typeof({column})" for column in sqlite_module.MESSAGE_COLUMNS
    )
    queries = {
        "journal": f"SELECT {message_columns_sql} FROM journal ORDER BY message_id",
        "retained": f"SELECT {message_columns_sql} FROM retained ORDER BY topic",
        "wills": f"SELECT client_id, {message_columns_sql} FROM wills ORDER BY client_id",
    }
    stored = {table: db_rows(tmp_path / "store", sql) for table, sql in queries.items()}
    # The same rows through statements that bind every column (None as NULL, bytes blobs).
    reference = SQLiteStore(tmp_path / "reference", clock=clock)
    reference.close()
    connection = sqlite3.connect(tmp_path / "reference" / DATABASE_FILE)
    places = ", ".join("?" * len(sqlite_module.MESSAGE_COLUMNS))
    try:
        for m in [replaced, *shapes.values()]:
            connection.execute(
                f"INSERT INTO journal VALUES ({places}, 0)", message_row(m, to_wall)
            )
            connection.execute(
                f"INSERT OR REPLACE INTO retained VALUES ({places})", message_row(m, to_wall)
            )
        for client_id, will in wills.items():
            connection.execute(
                f"INSERT INTO wills VALUES (?, {places})",
                (client_id, *message_row(will, to_wall)),
            )
        expected = {table: connection.execute(sql).fetchall() for table, sql in queries.items()}
    finally:
        connection.close()
    assert [len(stored[t]) for t in queries] == [len(shapes) + 1, len(shapes), len(wills)]
    assert stored == expected
    # Every shape was taken: each optional column is NULL in some rows, a value in others.
    columns = sqlite_module.MESSAGE_COLUMNS
    for table, rows in stored.items():
        lead = 1 if table == "wills" else 0
        types = {
            column: {row[lead + 2 * columns.index(column) + 1] for row in rows}
            for column in ("payload", "expiry", "delivery_time", "origin", "properties")
        }
        assert types == {
            "payload": {"blob"},
            "expiry": {"integer", "null"},
            "delivery_time": {"integer", "null"},
            "origin": {"text", "null"},
            "properties": {"blob", "null"},
        }, table


# -- references and their release ------------------------------------------------------------


def test_release_removes_the_message_once_no_reference_remains(tmp_path: Path) -> None:
    async def write() -> int:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        m = message(payload=b"shared")
        store.journal(m)
        store.enqueue("a", entry(m))
        store.enqueue("b", entry(m))
        await settle(store)
        store.remove("a", m.message_id)
        await settle(store)
        assert db_rows(tmp_path, "SELECT message_id FROM journal") == [(m.message_id,)]
        store.remove("b", m.message_id)
        await settle(store)
        store.close()
        return m.message_id

    run(write)
    assert db_rows(tmp_path, "SELECT COUNT(*) FROM journal") == [(0,)]
    assert db_rows(tmp_path, "SELECT COUNT(*) FROM queue_entries") == [(0,)]
    state = reopen(tmp_path)
    assert state.messages == {}
    assert state.queued == []


def test_release_of_one_reference_keeps_the_message_for_the_others(tmp_path: Path) -> None:
    async def write() -> int:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        m = message(payload=b"shared")
        store.journal(m)
        store.enqueue("a", entry(m))
        store.enqueue("b", entry(m))
        await settle(store)
        store.remove("a", m.message_id)
        await settle(store)
        store.close()
        return m.message_id

    message_id = run(write)
    state = reopen(tmp_path)
    assert state.messages[message_id].payload == b"shared"
    assert [(r.queue, r.message_id) for r in state.queued] == [("b", message_id)]


def test_a_message_nobody_references_is_never_written(tmp_path: Path) -> None:
    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.journal(message(payload=b"orphan"))
        await settle(store)
        store.close()

    run(write)
    assert db_rows(tmp_path, "SELECT COUNT(*) FROM journal") == [(0,)]


def test_deleting_a_session_its_queue_and_its_keys_drops_exactly_those(tmp_path: Path) -> None:
    async def write() -> tuple[int, int]:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        only_a, shared = message(payload=b"only-a"), message(payload=b"shared")
        will = message("wills/a", b"bye", qos=0)
        will.persistent = False
        store.save_session(SessionRecord("a", 60, [SubscriptionRecord("#", 1)], will))
        store.save_session(SessionRecord("b", 60, [SubscriptionRecord("#", 1)]))
        store.journal(only_a)
        store.enqueue("a", entry(only_a))
        store.journal(shared)
        store.enqueue("a", entry(shared))
        store.enqueue("b", entry(shared))
        store.add_duplicate("a", 1)
        store.add_duplicate("b", 2)
        await settle(store)
        store.delete_session("a")
        store.delete_queue("a")
        store.delete_duplicates("a")
        await settle(store)
        store.close()
        return only_a.message_id, shared.message_id

    only_a_id, shared_id = run(write)
    assert db_rows(tmp_path, "SELECT client_id FROM subscriptions") == [("b",)]
    assert db_rows(tmp_path, "SELECT COUNT(*) FROM wills") == [(0,)]
    state = reopen(tmp_path)
    assert set(state.sessions) == {"b"}
    assert [(r.queue, r.message_id) for r in state.queued] == [("b", shared_id)]
    assert set(state.messages) == {shared_id}
    assert state.duplicates == {"b": {2}}
    assert db_rows(tmp_path, f"SELECT COUNT(*) FROM journal WHERE message_id={only_a_id}") == [(0,)]


def test_a_message_one_queue_references_is_stored_inline(tmp_path: Path) -> None:
    """One row written and one deleted per message: the common durable 1→1 case."""

    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        m = message(payload=b"alone")
        store.journal(m)
        store.enqueue("a", entry(m))
        await settle(store)
        assert db_rows(tmp_path, "SELECT COUNT(*) FROM journal") == [(0,)]
        assert db_rows(tmp_path, "SELECT payload FROM queue_entries") == [(b"alone",)]
        store.remove("a", m.message_id)
        await settle(store)
        store.close()

    run(write)
    assert db_rows(tmp_path, "SELECT COUNT(*) FROM queue_entries") == [(0,)]
    assert reopen(tmp_path).messages == {}


def test_a_second_reference_in_the_same_turn_moves_the_message_to_the_journal(
    tmp_path: Path,
) -> None:
    async def write() -> int:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        m = message(payload=b"shared")
        store.journal(m)
        store.enqueue("a", entry(m))
        store.enqueue("b", entry(m))
        await settle(store)
        store.close()
        return m.message_id

    message_id = run(write)
    assert db_rows(tmp_path, "SELECT message_id, payload FROM journal") == [(message_id, b"shared")]
    inline = "SELECT COUNT(*) FROM queue_entries WHERE payload IS NOT NULL"
    assert db_rows(tmp_path, inline) == [(0,)]
    state = reopen(tmp_path)
    assert state.messages[message_id].payload == b"shared"
    assert sorted(r.queue for r in state.queued) == ["a", "b"]


def test_an_inline_copy_and_a_later_reference_each_keep_the_message(tmp_path: Path) -> None:
    """A retained message queued for a new subscriber in a later turn: two inline rows."""

    async def write() -> int:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        m = message(payload=b"retained", retain=True)
        store.journal(m)
        store.enqueue("a", entry(m))
        await settle(store)
        store.enqueue("b", entry(m))
        await settle(store)
        store.remove("a", m.message_id)
        await settle(store)
        store.close()
        return m.message_id

    message_id = run(write)
    state = reopen(tmp_path)
    assert state.messages[message_id].payload == b"retained"
    assert [(r.queue, r.message_id) for r in state.queued] == [("b", message_id)]


def test_large_mixed_batches_keep_every_row_and_release_exactly_the_released(
    tmp_path: Path,
) -> None:
    """Multi-row statements: odd batch sizes, several clients, shared and inline messages."""

    async def write() -> set[tuple[str, int]]:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        expected: set[tuple[str, int]] = set()
        for n in range(203):
            m = message(payload=b"p%d" % n)
            store.journal(m)
            clients = ["a", "b"] if n % 5 == 0 else ["abc"[n % 3]]
            for client in clients:
                store.enqueue(client, entry(m))
                expected.add((client, m.message_id))
        await settle(store)
        released = sorted(expected)[::3]
        for client, message_id in released:
            store.remove(client, message_id)
        await settle(store)
        store.close()
        return expected - set(released)

    kept = run(write)
    state = reopen(tmp_path)
    assert {(r.queue, r.message_id) for r in state.queued} == kept
    for record in state.queued:
        assert state.messages[record.message_id].payload.startswith(b"p")


# -- lazy delivery marks ------------------------------------------------------------------------


def test_a_lazy_mark_removed_before_it_is_due_is_never_written(tmp_path: Path) -> None:
    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        kept, acked = message(payload=b"kept"), message(payload=b"acked")
        for m in (kept, acked):
            store.journal(m)
            store.enqueue("c", entry(m))
        await settle(store)
        store.mark_delivery("c", kept.message_id, 5, "sent", lazy=True)
        store.mark_delivery("c", acked.message_id, 6, "sent", lazy=True)
        await settle(store)
        # Not due on the store's clock: the rows still say queued, whatever time passes on
        # the wall, and commit() does not wait for the marks.
        assert db_rows(tmp_path, "SELECT DISTINCT state FROM queue_entries") == [("queued",)]
        store.remove("c", acked.message_id)
        await settle(store)
        store.close()

    run(write)
    # The graceful stop wrote the mark still pending; the removed one never was.
    assert db_rows(
        tmp_path, "SELECT payload, state, delivery_id, delivery_count FROM queue_entries"
    ) == [(b"kept", "sent", 5, 1)]


def test_a_lazy_mark_rides_on_the_first_batch_after_it_is_due(tmp_path: Path) -> None:
    async def write() -> None:
        clock = ManualClock()
        store = SQLiteStore(tmp_path, clock=clock)
        m = message(payload=b"in flight")
        store.journal(m)
        store.enqueue("c", entry(m))
        await settle(store)
        store.mark_delivery("c", m.message_id, 9, "sent", lazy=True)
        clock.advance(sqlite_module.LAZY_MARK_DELAY / 2)
        store.save_session(SessionRecord("other", 60))
        await settle(store)
        assert db_rows(tmp_path, "SELECT state FROM queue_entries") == [("queued",)]
        clock.advance(sqlite_module.LAZY_MARK_DELAY / 2)
        store.save_session(SessionRecord("other", 61))
        await settle(store)
        assert db_rows(tmp_path, "SELECT state, delivery_id FROM queue_entries") == [("sent", 9)]
        store.close()

    run(write)


def test_a_due_lazy_mark_is_written_without_other_traffic(tmp_path: Path) -> None:
    async def write() -> None:
        clock = ManualClock()
        store = SQLiteStore(tmp_path, clock=clock)
        m = message(payload=b"in flight")
        store.journal(m)
        store.enqueue("c", entry(m))
        await settle(store)
        store.mark_delivery("c", m.message_id, 9, "sent", lazy=True)
        clock.advance(sqlite_module.LAZY_MARK_DELAY)
        # The store's timer looks again within LAZY_MARK_DELAY of loop time.
        deadline = asyncio.get_running_loop().time() + COMMIT_TIMEOUT
        while db_rows(tmp_path, "SELECT state FROM queue_entries") != [("sent",)]:
            assert asyncio.get_running_loop().time() < deadline, "the due mark was not written"
            await asyncio.sleep(0.01)
        # Written while the store is still open: a kill -9 now would keep it.
        assert db_rows(tmp_path, "SELECT state, delivery_id FROM queue_entries") == [("sent", 9)]
        store.close()

    run(write)


def test_an_eager_mark_after_a_lazy_one_keeps_both_counts(tmp_path: Path) -> None:
    """A resend marked lazily, then a QoS 2-style eager mark: the count still counts both."""

    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        m = message(payload=b"x")
        store.journal(m)
        store.enqueue("c", entry(m))
        await settle(store)
        store.mark_delivery("c", m.message_id, 3, "sent", lazy=True)
        store.mark_delivery("c", m.message_id, 3, "sent")
        await settle(store)
        assert db_rows(tmp_path, "SELECT state, delivery_count FROM queue_entries") == [("sent", 2)]
        store.close()

    run(write)


def test_message_ids_keep_increasing_across_reopen(tmp_path: Path) -> None:
    """An id is never handed out twice, even when the store was reopened in between: a reused
    id would make ``INSERT OR IGNORE`` drop the new message and point its queue entry at the
    old one."""

    async def first_life() -> list[int]:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        ids = []
        for n in range(3):
            m = message(payload=f"first-{n}".encode())
            store.journal(m)
            store.enqueue("c", entry(m))
            ids.append(m.message_id)
        await settle(store)
        # Acknowledge the newest, keep the older two referenced.
        store.remove("c", ids[-1])
        await settle(store)
        store.close()
        return ids

    async def second_life() -> list[int]:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.recover()
        ids = []
        for n in range(3):
            m = message(payload=f"second-{n}".encode())
            store.journal(m)
            store.enqueue("c", entry(m))
            ids.append(m.message_id)
        await settle(store)
        store.close()
        return ids

    first = run(first_life)
    second = run(second_life)
    assert min(second) > max(first), f"ids reused: first life {first}, second life {second}"
    state = reopen(tmp_path)
    payloads = sorted(state.messages[r.message_id].payload for r in state.queued)
    assert payloads == [b"first-0", b"first-1", b"second-0", b"second-1", b"second-2"]


def test_message_ids_never_reused_even_when_the_store_emptied(tmp_path: Path) -> None:
    async def life(tag: str) -> int:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        m = message(payload=tag.encode())
        store.journal(m)
        store.enqueue("c", entry(m))
        await settle(store)
        store.remove("c", m.message_id)
        await settle(store)
        store.close()
        return m.message_id

    ids = [run(lambda tag=tag: life(tag)) for tag in ("a", "b", "c")]
    assert ids == sorted(set(ids)), ids


def test_enqueue_in_a_later_turn_after_release_keeps_the_message(tmp_path: Path) -> None:
    """A message object the broker keeps in memory (a retained message) can be queued again
    after every earlier reference was released; the queue entry must still find its message."""

    async def write() -> int:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        m = message("r/t", b"retained payload", retain=True)
        store.journal(m)
        store.enqueue("early", entry(m))
        await settle(store)
        store.remove("early", m.message_id)
        await settle(store)
        # A later subscriber gets the same (retained) message object queued.
        store.enqueue("late", entry(m, retain=True))
        await settle(store)
        store.close()
        return m.message_id

    message_id = run(write)
    state = reopen(tmp_path)
    assert [(r.queue, r.message_id) for r in state.queued] == [("late", message_id)]
    assert message_id in state.messages, "the queue entry survived but its message did not"
    assert state.messages[message_id].payload == b"retained payload"


def test_commit_is_none_when_nothing_is_pending(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        assert store.commit() is None
        store.save_session(SessionRecord("c", 60))
        future = store.commit()
        assert future is not None
        # Every commit() of one loop turn shares the batch.
        assert store.commit() is future
        await asyncio.wait_for(future, COMMIT_TIMEOUT)
        assert store.commit() is None
        store.close()

    run(body)


def test_many_batches_in_flight_all_land_in_order(tmp_path: Path) -> None:
    """Group commit: futures from many loop turns resolve, and the last write wins."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), max_batch=7)
        futures = []
        for n in range(200):
            store.save_session(SessionRecord("c", n + 1))
            store.add_duplicate("c", n + 1)
            future = store.commit()
            assert future is not None
            futures.append(future)
            await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*futures), COMMIT_TIMEOUT)
        store.close()

    run(body)
    state = reopen(tmp_path)
    assert state.sessions["c"].expiry_interval == 200
    assert state.duplicates == {"c": set(range(1, 201))}


def test_close_writes_what_is_pending(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("c", 60))
        store.set_retained("r", message("r", b"x", retain=True))
        store.close()  # before the loop turn that would hand the batch over

    run(body)
    state = reopen(tmp_path)
    assert "c" in state.sessions
    assert "r" in state.retained


# -- schema and migrations --------------------------------------------------------------------


def schema_version(directory: Path) -> int:
    rows = db_rows(directory, "SELECT value FROM meta WHERE key='schema_version'")
    return int(rows[0][0])


def tables(directory: Path) -> set[str]:
    return {r[0] for r in db_rows(directory, "SELECT name FROM sqlite_master WHERE type='table'")}


EXPECTED_TABLES = {
    "meta",
    "journal",
    "queue_entries",
    "sessions",
    "subscriptions",
    "wills",
    "retained",
    "duplicates",
    "queue_windows",
    "durable_definitions",
}


def test_new_directory_gets_the_current_schema(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "data"
    SQLiteStore(directory).close()
    assert schema_version(directory) == SCHEMA_VERSION
    assert tables(directory) >= EXPECTED_TABLES


def test_migration_from_an_empty_file(tmp_path: Path) -> None:
    (tmp_path / DATABASE_FILE).write_bytes(b"")
    SQLiteStore(tmp_path).close()
    assert schema_version(tmp_path) == SCHEMA_VERSION
    assert tables(tmp_path) >= EXPECTED_TABLES


def test_migration_from_a_version_0_database(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / DATABASE_FILE)
    connection.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    connection.commit()
    connection.close()
    SQLiteStore(tmp_path).close()
    assert schema_version(tmp_path) == SCHEMA_VERSION
    assert tables(tmp_path) >= EXPECTED_TABLES
    # And the migrated store works.

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("c", 60))
        await settle(store)
        store.close()

    run(body)
    assert "c" in reopen(tmp_path).sessions


def test_migration_from_a_version_2_database_keeps_its_queue(tmp_path: Path) -> None:
    """Rows written before messages could ride inline still come back, and new ones do."""
    connection = sqlite3.connect(tmp_path / DATABASE_FILE, isolation_level=None)
    connection.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    for version in (1, 2):
        for statement in MIGRATIONS[version]:
            connection.execute(statement)
    connection.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    connection.execute(
        "INSERT INTO messages VALUES (7, 'old/topic', x'6f6c64', 1, 0, 4, NULL, NULL, 1.0, "
        "'pub', '', 1.0)"
    )
    connection.execute("INSERT INTO queued VALUES ('c', 7, 1, 0, '', 1, 12, 'sent')")
    connection.execute("UPDATE meta SET value='7' WHERE key='last_message_id'")
    connection.close()

    async def write() -> int:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        m = message(payload=b"new")
        store.journal(m)
        store.enqueue(session_queue_name("c"), entry(m))
        await settle(store)
        store.close()
        return m.message_id

    new_id = run(write)
    assert schema_version(tmp_path) == SCHEMA_VERSION
    assert new_id == 8
    state = reopen(tmp_path)
    assert state.messages[7].payload == b"old" and state.messages[7].topic == "old/topic"
    assert state.messages[8].payload == b"new"
    assert state.queued[0] == QueuedRecord(session_queue_name("c"), 7, 1, False, (), 1, 12, "sent")
    assert [r.message_id for r in state.queued] == [7, 8]


def test_a_version_3_row_that_cannot_be_upgraded_stops_the_start_and_changes_nothing(
    tmp_path: Path,
) -> None:
    connection = sqlite3.connect(tmp_path / DATABASE_FILE, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    for version in (1, 2, 3):
        for statement in MIGRATIONS[version]:
            connection.execute(statement)
    connection.execute("INSERT INTO meta VALUES ('schema_version', '3')")
    connection.execute("INSERT INTO sessions VALUES ('c', '{not json')")
    connection.close()
    error = assert_refused(tmp_path)
    assert "cannot be upgraded from schema version 3" in str(error)
    assert schema_version(tmp_path) == 3
    assert "queued" in tables(tmp_path) and "queue_entries" not in tables(tmp_path)


def test_a_session_keeps_its_in_flight_window_and_a_version_4_session_comes_back(
    tmp_path: Path,
) -> None:
    """Version 5 stores the in-flight window of the connection a session had when it was
    saved (recovery after a crash counts that many queued entries as possibly delivered); a
    session stored by version 4 comes back with none."""
    connection = sqlite3.connect(tmp_path / DATABASE_FILE, isolation_level=None)
    connection.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    for version in (1, 2, 3):
        for statement in MIGRATIONS[version]:
            connection.execute(statement)
    step = MIGRATIONS[4]
    assert callable(step)
    step(connection)
    connection.execute("INSERT INTO meta VALUES ('schema_version', '4')")
    connection.execute("INSERT INTO sessions VALUES ('old', 60, 0, NULL)")
    connection.close()

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("new", 60, window=7))
        await settle(store)
        store.close()

    run(body)
    assert schema_version(tmp_path) == SCHEMA_VERSION
    state = reopen(tmp_path)
    assert (state.sessions["old"].expiry_interval, state.sessions["old"].window) == (60, 0)
    assert state.sessions["new"].window == 7


def test_reopening_a_current_database_does_not_migrate_again(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("c", 60))
        await settle(store)
        store.close()

    run(body)
    for _ in range(3):
        SQLiteStore(tmp_path).close()
    assert schema_version(tmp_path) == SCHEMA_VERSION
    assert "c" in reopen(tmp_path).sessions


def test_a_newer_schema_version_is_refused_naming_the_file(tmp_path: Path) -> None:
    SQLiteStore(tmp_path).close()
    connection = sqlite3.connect(tmp_path / DATABASE_FILE)
    connection.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    connection.commit()
    connection.close()
    with pytest.raises(StoreError) as caught:
        SQLiteStore(tmp_path)
    text = str(caught.value)
    assert str(tmp_path / DATABASE_FILE) in text
    assert "99" in text
    # Refused, not touched: still version 99.
    assert schema_version(tmp_path) == 99


# -- corrupt and unreadable databases ---------------------------------------------------------


def assert_refused(directory: Path) -> StoreError:
    path = directory / DATABASE_FILE
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(StoreError) as caught:
        store = SQLiteStore(directory, clock=ManualClock())
        # Opening may succeed if the damage is only in the rows; reading them back must not.
        try:
            store.recover()
        finally:
            store.close()
    assert str(directory / DATABASE_FILE) in str(caught.value), caught.value
    if before is not None:
        # Never "repaired" into an empty store behind the operator's back.
        assert (directory / DATABASE_FILE).read_bytes() == before
    return caught.value


def test_random_bytes_are_refused(tmp_path: Path) -> None:
    (tmp_path / DATABASE_FILE).write_bytes(os.urandom(64 * 1024))
    assert_refused(tmp_path)


def test_a_text_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / DATABASE_FILE).write_text("this is not a database\n" * 100)
    assert_refused(tmp_path)


def populated_database(directory: Path, count: int = 400) -> None:
    async def body() -> None:
        store = SQLiteStore(directory, clock=ManualClock())
        for n in range(count):
            m = message(f"t/{n}", os.urandom(1024))
            store.journal(m)
            store.enqueue("c", entry(m))
            store.save_session(SessionRecord(f"s{n}", 60, [SubscriptionRecord(f"t/{n}", 1)]))
        await settle(store)
        store.close()

    run(body)
    # Closing the last connection checkpoints the WAL into the main file.
    assert not (directory / (DATABASE_FILE + "-wal")).exists() or (
        (directory / (DATABASE_FILE + "-wal")).stat().st_size == 0
    )
    assert (directory / DATABASE_FILE).stat().st_size > count * 1024


def test_a_truncated_database_is_refused(tmp_path: Path) -> None:
    populated_database(tmp_path)
    path = tmp_path / DATABASE_FILE
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate((size // 2) // 4096 * 4096)
    assert_refused(tmp_path)


def test_overwritten_pages_are_refused(tmp_path: Path) -> None:
    populated_database(tmp_path)
    path = tmp_path / DATABASE_FILE
    with open(path, "r+b") as f:
        # Keep the header page; smash a run of b-tree pages in the middle.
        f.seek(8 * 4096)
        f.write(os.urandom(16 * 4096))
    assert_refused(tmp_path)


def test_a_damaged_header_is_refused(tmp_path: Path) -> None:
    populated_database(tmp_path, count=20)
    path = tmp_path / DATABASE_FILE
    with open(path, "r+b") as f:
        f.write(b"SQLite format 2\x00")  # the 16-byte magic string
    assert_refused(tmp_path)


def test_a_directory_in_place_of_the_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / DATABASE_FILE).mkdir()
    (tmp_path / DATABASE_FILE / "x").write_text("not a db")
    error = assert_refused(tmp_path)
    assert "refusing to start" in str(error) or "cannot" in str(error)


def test_an_undecodable_will_is_refused_naming_the_file(tmp_path: Path) -> None:
    """Damage inside a row passes SQLite's page checks; reading it back must still stop the
    start-up with a StoreError naming the file, not a bare traceback or a silently empty store."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        will = message("w", b"bye", mqtt5=MQTT5Fields(content_type="text/plain"))
        store.save_session(SessionRecord("c", 60, [SubscriptionRecord("a", 1)], will))
        await settle(store)
        store.close()

    run(body)
    connection = sqlite3.connect(tmp_path / DATABASE_FILE)
    # A content type whose length runs past the end of the blob.
    connection.execute("UPDATE wills SET properties=x'2105616263' WHERE client_id='c'")
    connection.commit()
    connection.close()
    assert "cannot be decoded" in str(assert_refused(tmp_path))


def test_an_undecodable_retained_row_is_refused_naming_the_file(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.set_retained("r", message("r", b"x", retain=True))
        await settle(store)
        store.close()

    run(body)
    connection = sqlite3.connect(tmp_path / DATABASE_FILE)
    connection.execute("UPDATE retained SET properties=x'ff00' WHERE topic='r'")
    connection.commit()
    connection.close()
    assert "cannot be decoded" in str(assert_refused(tmp_path))


# -- write errors -----------------------------------------------------------------------------


def test_a_failed_batch_fails_its_commit_future_and_later_batches_succeed(tmp_path: Path) -> None:
    """A write the database refuses (here: a trigger aborting inserts of queue entries under the
    store, the way a full disk aborts them) fails the whole batch atomically; the store keeps
    working once the cause is gone."""

    async def body() -> tuple[int, int]:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("before", 60))
        await settle(store)

        side = sqlite3.connect(tmp_path / DATABASE_FILE)
        side.execute(
            "CREATE TRIGGER simulated_io_error BEFORE INSERT ON queue_entries "
            "BEGIN SELECT RAISE(ABORT, 'simulated I/O error'); END"
        )
        side.commit()
        lost = message(payload=b"lost")
        store.journal(lost)
        store.enqueue("c", entry(lost))
        store.save_session(SessionRecord("same-batch", 60))
        future = store.commit()
        assert future is not None
        with pytest.raises(StoreWriteError, match="simulated I/O error"):
            await asyncio.wait_for(future, COMMIT_TIMEOUT)
        assert store.failed_batches == 1

        side.execute("DROP TRIGGER simulated_io_error")
        side.commit()
        side.close()
        kept = message(payload=b"kept")
        store.journal(kept)
        store.enqueue("c", entry(kept))
        store.save_session(SessionRecord("after", 60))
        await settle(store)
        assert store.failed_batches == 1
        store.close()
        return lost.message_id, kept.message_id

    lost_id, kept_id = run(body)
    state = reopen(tmp_path)
    assert set(state.sessions) == {"before", "after"}  # the failed batch is all or nothing
    assert [r.message_id for r in state.queued] == [kept_id]
    assert state.messages[kept_id].payload == b"kept"
    assert lost_id not in state.messages
    assert kept_id > lost_id


def test_a_dropped_table_fails_the_batch_and_recreating_it_recovers(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.set_retained("r/0", message("r/0", b"0", retain=True))
        await settle(store)
        side = sqlite3.connect(tmp_path / DATABASE_FILE)
        (create,) = side.execute("SELECT sql FROM sqlite_master WHERE name='retained'").fetchone()
        side.execute("DROP TABLE retained")
        side.commit()
        store.set_retained("r/1", message("r/1", b"1", retain=True))
        future = store.commit()
        assert future is not None
        with pytest.raises(StoreWriteError):
            await asyncio.wait_for(future, COMMIT_TIMEOUT)
        side.execute(create)
        side.commit()
        side.close()
        store.set_retained("r/2", message("r/2", b"2", retain=True))
        await settle(store)
        store.close()

    run(body)
    assert sorted(reopen(tmp_path).retained) == ["r/2"]


def test_one_turn_is_stored_whole_even_past_max_batch(tmp_path: Path) -> None:
    """A QoS 2 id and the queue row of the message it admitted, written in one turn, are stored
    together or not at all, however small max_batch is: a crash or a failure between them
    would make the publisher's resend look like a duplicate of a message that was never kept."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), max_batch=1)
        store.save_session(SessionRecord("c", 60))
        await settle(store)
        side = sqlite3.connect(tmp_path / DATABASE_FILE)
        side.execute("ALTER TABLE queue_entries RENAME TO queue_entries_away")
        side.commit()
        store.add_duplicate("c", 7)
        m = message(payload=b"admitted", qos=2)
        store.journal(m)
        store.enqueue("c", entry(m))
        future = store.commit()
        assert future is not None
        with pytest.raises(StoreWriteError):
            await asyncio.wait_for(future, COMMIT_TIMEOUT)
        side.execute("ALTER TABLE queue_entries_away RENAME TO queue_entries")
        side.commit()
        side.close()
        store.close()

    run(body)
    state = reopen(tmp_path)
    assert state.duplicates == {}, "the id was kept without the message it admitted"
    assert state.queued == []


IO_ERROR_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, resource, sys
    from kittiwake.broker.message import Message, MessageProperties, MQTT5Fields, PropertyType
    from kittiwake.broker.queues import QueuedMessage
    from kittiwake.store.sqlite import SQLiteStore, StoreWriteError

    async def main():
        store = SQLiteStore(sys.argv[1])
        acked, failed = [], 0
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        # Python ignores SIGXFSZ, so writes past the limit fail with EFBIG: a "disk full".
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, hard))
        for n in range(200):
            m = Message(topic="t", payload=bytes([n % 256]) * 16384, qos=1, persistent=True)
            store.journal(m)
            store.enqueue("c", QueuedMessage(m, 1, True))
            try:
                await asyncio.wait_for(store.commit(), 10)
                acked.append(m.message_id)
            except StoreWriteError as exc:
                failed += 1
                error = str(exc)
                if failed >= 3:
                    break
        # Space comes back: later batches succeed again.
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        m = Message(topic="t", payload=b"after", qos=1, persistent=True)
        store.journal(m)
        store.enqueue("c", QueuedMessage(m, 1, True))
        await asyncio.wait_for(store.commit(), 10)
        acked.append(m.message_id)
        store.close()
        print(json.dumps({"acked": acked, "failed": failed, "error": error}))

    asyncio.run(main())
    """
)


def test_a_real_io_error_fails_the_commit_and_keeps_what_was_acknowledged(tmp_path: Path) -> None:
    """A genuine write failure (file size limit → EFBIG), in a child process so the limit does
    not touch pytest's own files."""
    env = dict(os.environ, PYTHONPATH=str(SRC_DIR))
    done = subprocess.run(
        [sys.executable, "-c", IO_ERROR_SCRIPT, str(tmp_path)],
        capture_output=True, env=env, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert result["failed"] >= 1, result
    assert len(result["acked"]) >= 2, result
    state = reopen(tmp_path)
    stored = {r.message_id for r in state.queued}
    missing = set(result["acked"]) - stored
    assert not missing, f"acknowledged messages lost after I/O errors: {sorted(missing)}"
    for message_id in result["acked"][:-1]:
        assert len(state.messages[message_id].payload) == 16384
    assert state.messages[result["acked"][-1]].payload == b"after"


# -- the broker on the SQLite store -----------------------------------------------------------


class RecordingConsumer:
    """A SessionLink that remembers what the broker asked of it, by wire id (the id an MQTT
    front end would put on the PUBLISH)."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[int, QueuedMessage, bool]] = []
        self.releases: list[int] = []
        self.by_id: dict[int, Delivery] = {}
        self._last_id = 0

    def tag(self, delivery: Delivery) -> int:
        if not delivery.tag:
            self._last_id += 1
            delivery.tag = self._last_id
        self.by_id[delivery.tag] = delivery
        return delivery.tag

    def deliver(self, delivery: Delivery) -> None:
        wire_id = self.tag(delivery)
        if delivery.state is DeliveryState.RECEIVED:
            self.releases.append(wire_id)
        else:
            self.deliveries.append((wire_id, delivery.entry, delivery.redelivered))

    def deliver_settled(self, entry: QueuedMessage) -> None:
        self.deliveries.append((0, entry, False))

    def taken_over(self) -> None:
        pass

    @property
    def payloads(self) -> list[bytes]:
        return [e.message.payload for _, e, _ in self.deliveries]


class Life:
    """One broker process lifetime on a SQLite store: build, recover, use, then stop.

    ``crash()`` stops the way kill -9 would as far as the store goes: nothing more is written
    (everything awaited is already on disk, lazy marks not yet due are lost), no session is
    disconnected. ``stop()`` is a graceful stop of the store: what is pending is written.
    """

    def __init__(self, directory: Path) -> None:
        self.clock = ManualClock()
        self.store = SQLiteStore(directory, clock=self.clock)
        self.broker = Broker(Config(), clock=self.clock, store=self.store)
        self.broker.recover()

    def connect(
        self, client_id: str, *, clean: bool = False, expiry: int = 3600, start: bool = True,
        will: Message | None = None, will_delay: int = 0,
    ) -> tuple[Session, RecordingConsumer, bool]:
        consumer = RecordingConsumer()
        session, present, _ = self.broker.connect(
            client_id, consumer, clean_start=clean, expiry_interval=expiry, window=10,
            will=will, will_delay=will_delay,
        )
        if start:
            self.broker.start_delivery(session)
        return session, consumer, present

    def subscribe(self, session: Session, topic_filter: str, qos: int) -> None:
        result = self.broker.subscribe(session, topic_filter, SubscriptionOptions(max_qos=qos))
        assert isinstance(result, Subscribed)
        self.broker.send_retained(result)

    async def publish(self, topic: str, payload: bytes, qos: int, retain: bool = False) -> None:
        m = Message(topic=topic, payload=payload, qos=qos, retain=retain, persistent=qos > 0)
        commit = self.broker.publish(m)
        if commit is not None:
            await asyncio.wait_for(commit, COMMIT_TIMEOUT)
        await self.settle()  # let the post-commit pump (and its deliveries) run

    async def settle(self) -> None:
        """Everything so far is on disk and whatever waited for that has run."""
        for _ in range(3):
            await settle(self.store)
            await asyncio.sleep(0)

    async def crash(self) -> None:
        await self.settle()
        # Abandoned, not closed: close() would write what kill -9 never lets it write. Its
        # writer thread idles on an empty queue until the test process ends.

    async def stop(self) -> None:
        await self.settle()
        self.store.close()


def test_broker_delivery_count_survives_a_second_crash(tmp_path: Path) -> None:
    """Recovery counts an entry whose in-flight mark a crash may have lost as possibly
    delivered; that extra count is written back, so a second crash that loses the mark of the
    redelivery too still counts both attempts (DESIGN.md section 2: never under-counted).
    Before the write-back the third life saw one earlier attempt, not two."""

    async def first() -> None:
        life = Life(tmp_path)
        session, consumer, _ = life.connect("sub")
        await life.settle()
        life.subscribe(session, "t", 1)
        await life.settle()
        await life.publish("t", b"twice lost", 1)
        assert [entry.delivery_count for _, entry, _ in consumer.deliveries] == [0]
        await life.crash()

    async def second() -> None:
        life = Life(tmp_path)
        _, consumer, _ = life.connect("sub")
        await life.settle()
        assert [entry.delivery_count for _, entry, _ in consumer.deliveries] == [1]
        await life.crash()  # the redelivery's lazy mark is not due yet: lost again

    async def third() -> None:
        life = Life(tmp_path)
        _, consumer, _ = life.connect("sub")
        await life.settle()
        assert consumer.payloads == [b"twice lost"]
        _, entry, redelivered = consumer.deliveries[0]
        assert redelivered
        assert entry.delivery_count == 2  # both attempts whose marks the crashes lost

    run(first)
    run(second)
    run(third)


def test_broker_queued_message_for_offline_session_survives_restart(tmp_path: Path) -> None:
    async def first() -> None:
        life = Life(tmp_path)
        session, _, present = life.connect("sub", clean=True)
        await life.settle()
        assert not present
        life.subscribe(session, "t/#", 2)
        await life.settle()
        life.broker.disconnect(session, publish_will=False)
        await life.publish("t/1", b"q1 while offline", 1)
        await life.publish("t/2", b"q2 while offline", 2)
        await life.publish("t/0", b"q0 while offline", 0)  # never stored, never queued
        await life.crash()

    async def second() -> None:
        life = Life(tmp_path)
        _session, consumer, present = life.connect("sub")
        await life.settle()
        assert present
        got = [(e.message.payload, e.qos, resend) for _, e, resend in consumer.deliveries]
        assert got == [(b"q1 while offline", 1, False), (b"q2 while offline", 2, False)]
        await life.crash()

    run(first)
    run(second)


def test_broker_subscriptions_survive_restart(tmp_path: Path) -> None:
    async def first() -> None:
        life = Life(tmp_path)
        session, _, _ = life.connect("sub")
        await life.settle()
        life.subscribe(session, "a/+", 1)
        await life.settle()
        life.subscribe(session, "$share/g/b/#", 2)
        await life.settle()
        await life.crash()

    async def second() -> None:
        life = Life(tmp_path)
        session = life.broker.sessions["sub"]
        assert sorted(session.subscriptions) == ["$share/g/b/#", "a/+"]
        # Routed without any new SUBSCRIBE, while offline.
        await life.publish("a/x", b"one", 1)
        await life.publish("b/y/z", b"two", 2)
        await life.crash()

    async def third() -> None:
        life = Life(tmp_path)
        _, consumer, present = life.connect("sub")
        await life.settle()
        assert present
        assert consumer.payloads == [b"one", b"two"]

    run(first)
    run(second)
    run(third)


def test_broker_inflight_delivery_comes_back_as_a_resend_after_a_graceful_stop(
    tmp_path: Path,
) -> None:
    async def first() -> int:
        life = Life(tmp_path)
        session, consumer, _ = life.connect("sub")
        await life.settle()
        life.subscribe(session, "t", 1)
        await life.settle()
        await life.publish("t", b"in flight", 1)
        assert len(consumer.deliveries) == 1
        delivery_id, _, resend = consumer.deliveries[0]
        assert not resend
        await life.stop()  # no PUBACK came; the stop writes the delivery's mark
        return delivery_id

    async def second(delivery_id: int) -> None:
        life = Life(tmp_path)
        session, consumer, present = life.connect("sub")
        await life.settle()
        assert present
        assert len(consumer.deliveries) == 1
        got_id, got_entry, resend = consumer.deliveries[0]
        assert (got_id, got_entry.message.payload, resend) == (delivery_id, b"in flight", True)
        # The count recorded when it was first sent came back with it.
        assert got_entry.delivery_count == 1
        # Acknowledged now: gone for good.
        assert life.broker.acknowledge(session, consumer.by_id[got_id])[0]
        await life.crash()

    async def third() -> None:
        life = Life(tmp_path)
        _, consumer, _ = life.connect("sub")
        await life.settle()
        assert consumer.deliveries == []

    delivery_id = run(first)
    run(lambda: second(delivery_id))
    run(third)


def test_broker_qos1_delivery_in_flight_at_a_crash_comes_back(tmp_path: Path) -> None:
    """Its lazy mark was not due on the store's clock: it comes again, never lost, and marked
    as a redelivery with the lost attempt counted (DESIGN.md section 2: recovery treats what
    could have been in flight, within the window of a session connected at the crash, as
    possibly delivered). Before the core redesign it came back as a first delivery (DUP=0)."""

    async def first() -> None:
        life = Life(tmp_path)
        session, consumer, _ = life.connect("sub")
        await life.settle()
        life.subscribe(session, "t", 1)
        await life.settle()
        await life.publish("t", b"in flight", 1)
        assert [resend for _, _, resend in consumer.deliveries] == [False]
        await life.crash()

    async def second() -> None:
        life = Life(tmp_path)
        session, consumer, present = life.connect("sub")
        await life.settle()
        assert present
        assert consumer.payloads == [b"in flight"]
        got_id, got_entry, redelivered = consumer.deliveries[0]
        assert redelivered, "possibly seen before the crash: it must carry the redelivery mark"
        assert got_entry.delivery_count == 1  # the attempt whose mark the crash lost
        assert life.broker.acknowledge(session, consumer.by_id[got_id])[0]
        await life.crash()

    async def third() -> None:
        life = Life(tmp_path)
        _, consumer, _ = life.connect("sub")
        await life.settle()
        assert consumer.deliveries == []

    run(first)
    run(second)
    run(third)


def test_broker_pubrecd_qos2_delivery_comes_back_as_a_release(tmp_path: Path) -> None:
    async def first() -> int:
        life = Life(tmp_path)
        session, consumer, _ = life.connect("sub")
        await life.settle()
        life.subscribe(session, "t", 2)
        await life.settle()
        await life.publish("t", b"exactly once", 2)
        delivery_id = consumer.deliveries[0][0]
        assert life.broker.received(session, consumer.by_id[delivery_id])[0]  # PUBREC
        await life.crash()
        return delivery_id

    async def second(delivery_id: int) -> None:
        life = Life(tmp_path)
        session, consumer, _ = life.connect("sub")
        await life.settle()
        assert consumer.deliveries == [], "a PUBREC'd QoS 2 message must not be published again"
        assert consumer.releases == [delivery_id]
        assert life.broker.acknowledge(session, consumer.by_id[delivery_id])[0]  # PUBCOMP
        await life.crash()

    async def third() -> None:
        life = Life(tmp_path)
        _, consumer, _ = life.connect("sub")
        await life.settle()
        assert consumer.deliveries == [] and consumer.releases == []

    delivery_id = run(first)
    run(lambda: second(delivery_id))
    run(third)


def test_broker_incoming_qos2_state_survives_restart(tmp_path: Path) -> None:
    async def first() -> None:
        life = Life(tmp_path)
        sub, _, _ = life.connect("sub")
        await life.settle()
        life.subscribe(sub, "t", 2)
        await life.settle()
        life.broker.disconnect(sub, publish_will=False)
        pub, _, _ = life.connect("pub")
        await life.settle()
        assert life.broker.begin_exactly_once(pub, 7)
        await life.publish("t", b"once", 2)
        await life.crash()  # PUBREC went out; no PUBREL yet

    async def second() -> None:
        life = Life(tmp_path)
        pub, _, present = life.connect("pub")
        await life.settle()
        assert present
        assert pub.exactly_once_keys == {7}
        # The publisher resends PUBLISH (DUP) with id 7: it must not be routed again.
        assert not life.broker.begin_exactly_once(pub, 7)
        assert life.broker.end_exactly_once(pub, 7)[0]  # PUBREL
        await life.crash()

    async def third() -> None:
        life = Life(tmp_path)
        pub, _, _ = life.connect("pub")
        await life.settle()
        assert pub.exactly_once_keys == set()
        _, consumer, _ = life.connect("sub")
        await life.settle()
        assert consumer.payloads == [b"once"]

    run(first)
    run(second)
    run(third)


def test_broker_retained_persistent_survive_restart_and_nonpersistent_do_not(
    tmp_path: Path,
) -> None:
    async def first() -> None:
        life = Life(tmp_path)
        await life.publish("r/q1", b"kept-1", 1, retain=True)
        await life.publish("r/q2", b"kept-2", 2, retain=True)
        await life.publish("r/q0", b"gone", 0, retain=True)
        await life.publish("r/replaced", b"old persistent", 1, retain=True)
        await life.publish("r/replaced", b"new nonpersistent", 0, retain=True)
        await life.publish("r/cleared", b"x", 1, retain=True)
        await life.publish("r/cleared", b"", 1, retain=True)
        await life.crash()

    async def second() -> None:
        life = Life(tmp_path)
        session, consumer, _ = life.connect("fresh", clean=True, expiry=0)
        await life.settle()
        life.subscribe(session, "r/#", 2)
        await life.settle()
        got = {
            e.message.topic: (e.message.payload, e.qos, e.retain) for _, e, _ in consumer.deliveries
        }
        assert got == {"r/q1": (b"kept-1", 1, True), "r/q2": (b"kept-2", 2, True)}

    run(first)
    run(second)


def test_broker_retained_copy_sent_to_a_later_subscriber_survives_restart(tmp_path: Path) -> None:
    """A retained message is queued for a new persistent subscriber after its first subscribers
    acknowledged it (its journal row was released); that in-flight copy must come back."""

    async def first() -> None:
        life = Life(tmp_path)
        early, early_consumer, _ = life.connect("early")
        await life.settle()
        life.subscribe(early, "r", 1)
        await life.settle()
        await life.publish("r", b"retained", 1, retain=True)
        life.broker.acknowledge(early, early_consumer.by_id[early_consumer.deliveries[0][0]])
        await life.settle()
        late, late_consumer, _ = life.connect("late")
        await life.settle()
        life.subscribe(late, "r", 1)
        await life.settle()
        assert late_consumer.payloads == [b"retained"]
        await life.crash()  # no PUBACK from "late"

    async def second() -> None:
        life = Life(tmp_path)
        _, consumer, _ = life.connect("late")
        await life.settle()
        assert consumer.payloads == [b"retained"], "the unacknowledged retained copy was lost"
        # The crash came before its lazy in-flight mark was due, and "late" was connected:
        # possibly seen, so it comes back marked as a redelivery (DESIGN.md section 2).
        assert consumer.deliveries[0][2]

    run(first)
    run(second)


def test_broker_will_of_persistent_session_survives_restart(tmp_path: Path) -> None:
    async def first() -> None:
        life = Life(tmp_path)
        watcher, _, _ = life.connect("watcher")
        await life.settle()
        life.subscribe(watcher, "wills/#", 1)
        await life.settle()
        will = Message(topic="wills/w", payload=b"w is gone", qos=1, persistent=True)
        life.connect("w", will=will, will_delay=5)
        await life.settle()
        await life.crash()  # "w" never disconnected: its will is due after the restart

    async def second() -> None:
        life = Life(tmp_path)
        session = life.broker.sessions["w"]
        assert session.will is not None and session.will.payload == b"w is gone"
        life.clock.advance(6)
        life.broker.tick()
        await life.settle()
        await asyncio.sleep(0)
        await life.crash()

    async def third() -> None:
        life = Life(tmp_path)
        _, consumer, _ = life.connect("watcher")
        await life.settle()
        assert consumer.payloads == [b"w is gone"]
        assert life.broker.sessions["w"].will is None  # published once, not again

    run(first)
    run(second)
    run(third)


def test_broker_message_ids_after_restart_do_not_clobber_queued_messages(tmp_path: Path) -> None:
    async def life_with(payload: bytes) -> None:
        life = Life(tmp_path)
        if "sub" not in life.broker.sessions:
            session, _, _ = life.connect("sub")
            await life.settle()
            life.subscribe(session, "t", 1)
            await life.settle()
            life.broker.disconnect(session, publish_will=False)
        await life.publish("t", payload, 1)
        await life.crash()

    async def last() -> None:
        life = Life(tmp_path)
        _, consumer, _ = life.connect("sub")
        await life.settle()
        assert consumer.payloads == [b"first", b"second", b"third"]

    for payload in (b"first", b"second", b"third"):
        run(lambda payload=payload: life_with(payload))
    run(last)


def test_broker_clean_session_drops_stored_state(tmp_path: Path) -> None:
    async def first() -> None:
        life = Life(tmp_path)
        session, _, _ = life.connect("c")
        await life.settle()
        life.subscribe(session, "t", 1)
        await life.settle()
        life.broker.disconnect(session, publish_will=False)
        await life.publish("t", b"queued", 1)
        life.connect("c", clean=True, expiry=0)
        await life.settle()
        await life.crash()

    run(first)
    state = reopen(tmp_path)
    assert "c" not in state.sessions
    assert state.queued == []
    assert state.messages == {}


def test_broker_nonpersistent_messages_never_touch_disk(tmp_path: Path) -> None:
    async def first() -> None:
        life = Life(tmp_path)
        session, _, _ = life.connect("sub")
        await life.settle()
        life.subscribe(session, "t", 2)
        await life.settle()
        life.broker.disconnect(session, publish_will=False)
        for n in range(20):
            await life.publish("t", f"qos0-{n}".encode(), 0, retain=n % 2 == 0)
        await life.crash()

    run(first)
    assert db_rows(tmp_path, "SELECT COUNT(*) FROM journal") == [(0,)]
    assert db_rows(tmp_path, "SELECT COUNT(*) FROM queue_entries") == [(0,)]
    assert db_rows(tmp_path, "SELECT COUNT(*) FROM retained") == [(0,)]


def test_queue_windows_are_kept_until_set_to_zero(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_queue_window("orders", 5)
        store.save_queue_window("gone", 3)
        store.save_queue_window("gone", 0)
        await settle(store)
        store.close()

    run(body)
    assert reopen(tmp_path).queue_windows == {"orders": 5}


def drop_version_8_columns(connection: sqlite3.Connection) -> None:
    """Make today's sessions table version 7's again."""
    connection.execute("ALTER TABLE sessions DROP COLUMN queue_ordering")
    connection.execute("ALTER TABLE sessions DROP COLUMN dead_letters")


def test_migration_from_a_version_5_database_adds_queue_windows(tmp_path: Path) -> None:
    """A version 5 database is today's without the queue_windows table: it gains the table and
    keeps what it holds."""

    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("c", 60, window=4))
        await settle(store)
        store.close()

    run(write)
    connection = sqlite3.connect(tmp_path / DATABASE_FILE, isolation_level=None)
    connection.execute("DROP TABLE queue_windows")
    connection.execute("ALTER TABLE sessions DROP COLUMN principal")  # added by version 7
    drop_version_8_columns(connection)
    connection.execute("DROP TABLE durable_definitions")  # added by version 9
    connection.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    connection.close()
    state = reopen(tmp_path)
    assert schema_version(tmp_path) == SCHEMA_VERSION == 9
    assert "queue_windows" in tables(tmp_path)
    assert state.sessions["c"].window == 4 and state.queue_windows == {}


def test_migration_from_a_version_6_database_adds_the_session_principal(tmp_path: Path) -> None:
    """A version 6 database is today's without sessions.principal: its sessions come back as
    anonymous ones (filtered by the anonymous rules until their clients reconnect: sent less,
    never more); a session saved since keeps its user."""

    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("old", 60, window=2, principal="alice"))
        await settle(store)
        store.close()

    run(write)
    connection = sqlite3.connect(tmp_path / DATABASE_FILE, isolation_level=None)
    connection.execute("ALTER TABLE sessions DROP COLUMN principal")
    drop_version_8_columns(connection)
    connection.execute("DROP TABLE durable_definitions")  # added by version 9
    connection.execute("UPDATE meta SET value='6' WHERE key='schema_version'")
    connection.close()
    state = reopen(tmp_path)
    assert schema_version(tmp_path) == SCHEMA_VERSION == 9
    assert state.sessions["old"].principal is None and state.sessions["old"].window == 2

    async def write_again() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.recover()
        store.save_session(SessionRecord("new", 60, principal="alice"))
        await settle(store)
        store.close()

    run(write_again)
    assert reopen(tmp_path).sessions["new"].principal == "alice"


def test_a_session_keeps_its_queue_rules(tmp_path: Path) -> None:
    """A JMS subscription's queue rules come back; an MQTT session's are the shared default."""
    rules = QueueRules(ordering="priority", dead_letters=True)

    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("jms", 60, queue_rules=rules))
        store.save_session(SessionRecord("mqtt", 60))
        await settle(store)
        store.close()

    run(write)
    state = reopen(tmp_path)
    assert state.sessions["jms"].queue_rules == rules
    assert state.sessions["mqtt"].queue_rules is DEFAULT_QUEUE_RULES


def test_migration_from_a_version_7_database_gives_durable_subscriptions_jms_rules(
    tmp_path: Path,
) -> None:
    """A version 7 database is today's without the sessions' queue rules: the sessions only
    the JMS front end named ($durable/..., durable subscriptions) come back in priority order
    and dead-lettering, every other session with MQTT's rules."""

    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("$durable/app/orders", NEVER_EXPIRES))
        store.save_session(SessionRecord("$durable/$global/audit", NEVER_EXPIRES))
        store.save_session(SessionRecord("sensor-1", 60, principal="alice"))
        await settle(store)
        store.close()

    run(write)
    connection = sqlite3.connect(tmp_path / DATABASE_FILE, isolation_level=None)
    drop_version_8_columns(connection)
    connection.execute("DROP TABLE durable_definitions")  # added by version 9
    connection.execute("UPDATE meta SET value='7' WHERE key='schema_version'")
    connection.close()
    state = reopen(tmp_path)
    assert schema_version(tmp_path) == SCHEMA_VERSION == 9
    jms = QueueRules(ordering="priority", dead_letters=True)
    assert state.sessions["$durable/app/orders"].queue_rules == jms
    assert state.sessions["$durable/$global/audit"].queue_rules == jms
    assert state.sessions["sensor-1"].queue_rules == DEFAULT_QUEUE_RULES
    assert state.sessions["sensor-1"].principal == "alice"


def test_a_durable_subscription_keeps_its_definition_until_its_session_goes(tmp_path: Path) -> None:
    """Topic, selector and noLocal come back; a replaced definition is the one kept; deleting
    the session deletes its definition."""
    kept = SubscriptionDefinition.of("orders", "n > 1", no_local=True)

    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("$durable/app/orders", NEVER_EXPIRES))
        store.save_durable_definition("$durable/app/orders", SubscriptionDefinition("orders"))
        store.save_durable_definition("$durable/app/orders", kept)
        store.save_session(SessionRecord("$durable/app/gone", NEVER_EXPIRES))
        store.save_durable_definition("$durable/app/gone", SubscriptionDefinition("x"))
        store.delete_session("$durable/app/gone")
        await settle(store)
        store.close()

    run(write)
    assert reopen(tmp_path).durable_definitions == {"$durable/app/orders": kept}


def test_migration_from_a_version_8_database_keeps_durable_subscriptions_undefined(
    tmp_path: Path,
) -> None:
    """A version 8 database is today's without durable_definitions: it gains the table, and
    its durable subscriptions come back with no definition (their first consumer defines
    them, as after any restart before); one defined since is kept."""

    async def write() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.save_session(SessionRecord("$durable/app/orders", NEVER_EXPIRES))
        await settle(store)
        store.close()

    run(write)
    connection = sqlite3.connect(tmp_path / DATABASE_FILE, isolation_level=None)
    connection.execute("DROP TABLE durable_definitions")
    connection.execute("UPDATE meta SET value='8' WHERE key='schema_version'")
    connection.close()
    state = reopen(tmp_path)
    assert schema_version(tmp_path) == SCHEMA_VERSION == 9
    assert "$durable/app/orders" in state.sessions and state.durable_definitions == {}
    definition = SubscriptionDefinition.of("orders", "n > 1")

    async def write_again() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        store.recover()
        store.save_durable_definition("$durable/app/orders", definition)
        await settle(store)
        store.close()

    run(write_again)
    assert reopen(tmp_path).durable_definitions == {"$durable/app/orders": definition}
