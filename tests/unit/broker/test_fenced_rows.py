"""Fenced writes taken as columns (the Flight put's path): the SQLite store ends up with exactly
what the same unit given as messages stores (journal, retained, queue entries, fences, the id
counter), subscribers get the same copies, and a replayed unit publishes and journals nothing,
before and after a restart.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kittiwake.broker.broker import Broker, Subscribed, SubscriptionOptions
from kittiwake.broker.consumers import Delivery
from kittiwake.broker.message import Message, MQTT5Fields
from kittiwake.broker.publication_rows import PublicationRows
from kittiwake.broker.queues import QueuedMessage
from kittiwake.clock import ManualClock
from kittiwake.store.journal_selection import JournalSelection
from kittiwake.store.sqlite import DATABASE_FILE, SQLiteStore

Copy = tuple[str, bytes, int, bool, int, Any]


class Received:
    """A front end recording each copy: (topic, payload, QoS, retain flag, id, MQTT 5)."""

    def __init__(self) -> None:
        self.copies: list[Copy] = []

    def tag(self, delivery: Delivery) -> int:
        return delivery.id

    def deliver(self, delivery: Delivery) -> None:
        self.record(delivery.entry)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        self.record(entry)

    def record(self, entry: QueuedMessage) -> None:
        m = entry.message
        user = m.mqtt5.user_properties if m.mqtt5 is not None else None
        self.copies.append((m.topic, m.payload, entry.qos, entry.retain, m.message_id, user))

    def taken_over(self) -> None:
        pass


def subscribe(
    broker: Broker, client_id: str, topic_filter: str, qos: int, *, durable: bool = False
) -> Received:
    consumer = Received()
    session, _, _ = broker.connect(
        client_id,
        consumer,
        clean_start=not durable,
        expiry_interval=3600 if durable else 0,
        window=1000,
    )
    broker.start_delivery(session)
    result = broker.subscribe(
        session, topic_filter, SubscriptionOptions(max_qos=qos, retain_as_published=True)
    )
    assert isinstance(result, Subscribed)
    return consumer


def open_broker(directory: Path, journal: str) -> tuple[Broker, SQLiteStore]:
    clock = ManualClock()
    if journal == "none":
        store = SQLiteStore(directory, clock=clock)
    elif journal == "all":
        store = SQLiteStore(directory, clock=clock, journal_retention_seconds=3600)
    else:  # some persistent topics, QoS 0 on others
        selection = JournalSelection(
            enabled=True, persistent_topics=("out/a/#", "out/d/#"), qos0_topics=("out/c/#",)
        )
        store = SQLiteStore(
            directory, clock=clock, journal_retention_seconds=3600, journal_selection=selection
        )
    broker = Broker(clock=clock, store=store)
    broker.recover()
    return broker, store


def mixed_unit() -> list[Message]:
    """QoS 0, 1 and 2, retained rows (one clearing), user properties; topics with a QoS 1
    subscriber, a durable one, a QoS 0 one, and none."""
    out: list[Message] = []
    for n in range(40):
        topic = f"out/{'abcd'[n % 4]}/{n % 7}"
        qos = (0, 1, 2)[n % 3]
        pairs = [("k", str(n)), ("k", "again")] if n % 5 == 0 else None
        retain = n % 7 == 3
        payload = b"" if n == 10 else f"p{n}".encode()
        out.append(
            Message(
                topic,
                payload,
                qos,
                retain,
                qos > 0,
                mqtt5=MQTT5Fields(user_properties=pairs) if pairs else None,
            )
        )
    return out


def mixed_unit_without_properties() -> list[Message]:
    """The mixed unit with no user properties: a wide block whose rows all have no property
    blob."""
    return [
        Message(m.topic, m.payload, m.qos, m.retain, m.persistent) for m in mixed_unit()
    ]


def uniform_unit() -> list[Message]:
    """The Spark sink's usual unit: one QoS, nothing retained, no properties."""
    return [Message(f"out/{'abcd'[n % 4]}/{n % 9}", b"v%d" % n, 1, False, True) for n in range(60)]


def table(directory: Path, sql: str) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(directory / DATABASE_FILE)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


STORED = {
    "journal": "SELECT * FROM journal ORDER BY message_id",
    # Storage types too: a blob stays a BLOB, no properties stay NULL, on either path.
    "journal types": "SELECT message_id, typeof(payload), typeof(properties), typeof(expiry), "
    "typeof(origin) FROM journal ORDER BY message_id",
    "retained": "SELECT * FROM retained ORDER BY topic",
    "queue_entries": "SELECT * FROM queue_entries ORDER BY queue, message_id",
    "duplicates": "SELECT * FROM duplicates ORDER BY producer, key",
    "last id": "SELECT value FROM meta WHERE key = 'last_message_id'",
}


def apply(
    directory: Path, journal: str, unit: list[Message], as_rows: bool
) -> tuple[dict[str, list[Copy]], int]:
    """One broker lifetime: subscribers, something published before, the unit, committed."""

    async def body() -> tuple[dict[str, list[Copy]], int]:
        broker, store = open_broker(directory, journal)
        receivers = {
            "clean": subscribe(broker, "clean", "out/a/#", 1),
            "durable": subscribe(broker, "durable", "out/b/#", 2, durable=True),
            "at most once": subscribe(broker, "q0", "out/c/#", 0),
        }
        # Ids already handed out: the unit's continue from them.
        await asyncio.wait_for(broker.publish(Message("other/x", b"before", 1, False, True)), 10)
        messages = [
            Message(m.topic, m.payload, m.qos, m.retain, m.persistent, mqtt5=m.mqtt5) for m in unit
        ]
        given = PublicationRows.of_messages(messages) if as_rows else messages
        outcome = broker.fenced_writes.write("w1", 0, 0, given)
        assert not outcome.already_committed
        if outcome.completion is not None:
            await asyncio.wait_for(outcome.completion, 10)
        for _ in range(5):
            await asyncio.sleep(0)
        received = broker.stats.messages_received
        store.close()
        return {name: r.copies for name, r in receivers.items()}, received

    return asyncio.run(body())


@pytest.mark.parametrize("journal", ["all", "some", "none"])
@pytest.mark.parametrize("unit", [mixed_unit, mixed_unit_without_properties, uniform_unit])
def test_rows_store_and_deliver_exactly_what_messages_do(
    tmp_path: Path, journal: str, unit: Callable[[], list[Message]]
) -> None:
    old_copies, old_count = apply(tmp_path / "messages", journal, unit(), as_rows=False)
    new_copies, new_count = apply(tmp_path / "rows", journal, unit(), as_rows=True)
    assert new_copies == old_copies
    assert any(old_copies.values()), "the unit must reach some subscriber"
    assert new_count == old_count
    for what, sql in STORED.items():
        assert table(tmp_path / "rows", sql) == table(tmp_path / "messages", sql), what
    if journal != "none":
        assert table(tmp_path / "rows", STORED["journal"]), "the unit must be journalled"


def test_a_replayed_unit_of_rows_publishes_and_journals_nothing_even_after_a_restart(
    tmp_path: Path,
) -> None:
    def rows() -> PublicationRows:
        return PublicationRows.of_messages(uniform_unit())

    async def first() -> list[Copy]:
        broker, store = open_broker(tmp_path, "all")
        receiver = subscribe(broker, "clean", "out/a/#", 1)
        fenced = broker.fenced_writes
        outcome = fenced.write("w1", 0, 0, rows())
        assert outcome.completion is not None
        await asyncio.wait_for(outcome.completion, 10)
        replay = fenced.write("w1", 0, 0, rows())
        assert replay.already_committed
        if replay.completion is not None:
            await asyncio.wait_for(replay.completion, 10)
        for _ in range(5):
            await asyncio.sleep(0)
        store.close()
        return receiver.copies

    async def after_restart() -> list[Copy]:
        broker, store = open_broker(tmp_path, "all")
        receiver = subscribe(broker, "clean", "out/a/#", 1)
        replay = broker.fenced_writes.write("w1", 0, 0, rows())
        assert replay.already_committed
        if replay.completion is not None:
            await asyncio.wait_for(replay.completion, 10)
        for _ in range(5):
            await asyncio.sleep(0)
        store.close()
        return receiver.copies

    copies = asyncio.run(first())
    expected = [m for m in uniform_unit() if m.topic.startswith("out/a/")]
    assert [(c[0], c[1]) for c in copies] == [(m.topic, m.payload) for m in expected]
    journal = table(tmp_path, "SELECT message_id, payload FROM journal ORDER BY message_id")
    assert [payload for _, payload in journal] == [m.payload for m in uniform_unit()]
    assert asyncio.run(after_restart()) == []
    assert table(tmp_path, "SELECT message_id, payload FROM journal ORDER BY message_id") == (
        journal
    )


def test_journal_ids_only_grow_across_units_of_rows_and_messages(tmp_path: Path) -> None:
    async def body() -> None:
        broker, store = open_broker(tmp_path, "all")
        fenced = broker.fenced_writes
        for batch in range(4):
            unit: list[Message] | PublicationRows = uniform_unit()
            if batch % 2:
                unit = PublicationRows.of_messages(unit)  # type: ignore[arg-type]
            outcome = fenced.write("w1", batch, 0, unit)
            assert outcome.completion is not None
            await asyncio.wait_for(outcome.completion, 10)
        store.close()

    asyncio.run(body())
    ids = [row[0] for row in table(tmp_path, "SELECT message_id FROM journal ORDER BY rowid")]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) == 4 * len(uniform_unit())
