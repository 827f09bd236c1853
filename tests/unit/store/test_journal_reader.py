"""The journal as the data pipeline reads it: offsets that only grow, committed rows only, the
operator's selection, and the part a retention dropped named as lost.

A reader has its own read-only connection; these tests read while the store's writer runs.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from kittiwake.broker.broker import Broker
from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage
from kittiwake.broker.topics import topic_matches
from kittiwake.clock import ManualClock
from kittiwake.config import Config
from kittiwake.store import sqlite as sqlite_module
from kittiwake.store.journal_reader import JournalRangeError, JournalReader
from kittiwake.store.journal_selection import JournalSelection
from kittiwake.store.sqlite import DATABASE_FILE, SQLiteStore

EVERYTHING = ("#",)


@pytest.fixture(autouse=True)
def sweep_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweep on every hand-off instead of once a second, so the test need not wait."""
    monkeypatch.setattr(sqlite_module, "SWEEP_INTERVAL", 0.0)


def open_store(directory: Path, **journal: object) -> SQLiteStore:
    selection = JournalSelection(
        enabled=True,
        persistent_topics=journal.pop("persistent_topics", EVERYTHING),  # type: ignore[arg-type]
        qos0_topics=journal.pop("qos0_topics", ()),  # type: ignore[arg-type]
    )
    return SQLiteStore(
        directory,
        clock=ManualClock(),
        journal_selection=selection,
        **journal,  # type: ignore[arg-type]
    )


def reader_for(store: SQLiteStore) -> JournalReader:
    return JournalReader(store.directory, store.journal_selection)


async def settle(store: SQLiteStore) -> None:
    for _ in range(3):  # the sweep rides on the next batch
        future = store.commit()
        if future is not None:
            await asyncio.wait_for(future, 10)
        await asyncio.sleep(0)


def publish(store: SQLiteStore, topic: str, payload: bytes, qos: int = 1) -> Message:
    message = Message(topic, payload, qos=qos, persistent=qos > 0)
    store.journal(message)
    return message


def read_all(reader: JournalReader, filters: tuple[str, ...] = EVERYTHING) -> list[tuple]:
    bounds = reader.bounds()
    with reader.read(0, bounds.high_water, filters) as journal_range:
        return [
            (offset, topic, bytes(payload))
            for chunk in journal_range.chunks()
            for offset, topic, payload in zip(
                chunk.offsets, chunk.topics, chunk.payloads, strict=True
            )
        ]


def table_ids(directory: Path) -> list[int]:
    connection = sqlite3.connect(directory / DATABASE_FILE)
    try:
        rows = connection.execute("SELECT message_id FROM journal ORDER BY message_id")
        return [row[0] for row in rows]
    finally:
        connection.close()


def test_offsets_only_grow_across_a_sweep_and_a_restart(tmp_path: Path) -> None:
    """Every offset handed out is above every earlier one, even after the retention swept
    the old rows and the broker restarted: a reader never finds a lower number later."""

    async def first_run() -> list[int]:
        store = open_store(tmp_path, journal_retention_bytes=300)
        ids = [publish(store, "t", bytes([65 + i]) * 100).message_id for i in range(6)]
        await settle(store)
        publish(store, "t", b"x")  # a later batch sweeps all but the newest
        await settle(store)
        ids.append(publish(store, "t", b"y").message_id)
        await settle(store)
        store.close()
        return ids

    first = asyncio.run(first_run())
    assert first == sorted(first) and len(set(first)) == len(first)
    reader = JournalReader(tmp_path, JournalSelection(enabled=True))
    before = reader.bounds()
    assert before.earliest > first[0], "the sweep must have dropped the oldest rows"

    async def second_run() -> list[int]:
        store = open_store(tmp_path, journal_retention_bytes=300)
        ids = [publish(store, "t", b"after restart").message_id for _ in range(3)]
        await settle(store)
        store.close()
        return ids

    second = asyncio.run(second_run())
    assert min(second) > max(first)
    after = reader.bounds()
    assert after.high_water == max(second) + 1
    assert after.earliest >= before.earliest
    assert [offset for offset, _t, _p in read_all(reader)] == sorted(
        offset for offset, _t, _p in read_all(reader)
    )
    assert {offset for offset, _t, _p in read_all(reader)} >= set(second)


def test_a_swept_journal_row_is_never_written_again_under_its_offset(tmp_path: Path) -> None:
    """A retained message queued for a new subscriber after the sweep dropped its journal row
    travels in its queue row: the journal never gains a row below offsets already handed out
    (a replayed range must return the same rows)."""

    async def body() -> None:
        store = open_store(tmp_path, journal_retention_bytes=150)
        retained = publish(store, "status", b"R" * 100)
        store.enqueue("early", QueuedMessage(retained, 1, True))
        await settle(store)
        store.remove("early", retained.message_id)
        newer = [publish(store, "t", b"N" * 100) for _ in range(3)]
        await settle(store)
        publish(store, "t", b"x")
        await settle(store)
        assert retained.message_id not in table_ids(tmp_path)
        # A new subscriber gets the retained message, two of them in one turn.
        store.enqueue("late1", QueuedMessage(retained, 1, True))
        store.enqueue("late2", QueuedMessage(retained, 1, True))
        await settle(store)
        assert retained.message_id not in table_ids(tmp_path)
        store.close()
        # Both references survive a restart, each with its own copy.
        recovered = SQLiteStore(tmp_path, clock=ManualClock()).recover()
        assert recovered.messages[retained.message_id].payload == b"R" * 100
        assert {(q.queue, q.message_id) for q in recovered.queued} >= {
            ("late1", retained.message_id),
            ("late2", retained.message_id),
        }
        assert newer  # published to push the retained one out of the byte retention

    asyncio.run(body())


def test_only_committed_rows_are_readable(tmp_path: Path) -> None:
    """The committed high-water mark ends what may be read: a journalled message whose batch
    has not been committed is invisible, and a range past the mark is refused."""

    async def body() -> None:
        store = open_store(tmp_path, journal_retention_seconds=3600)
        reader = reader_for(store)
        first = publish(store, "t", b"one")
        await settle(store)
        assert reader.bounds().high_water == first.message_id + 1
        second = publish(store, "t", b"two")  # handed to the writer only at the turn's end
        assert reader.bounds().high_water == first.message_id + 1
        with pytest.raises(JournalRangeError, match="high-water mark"):
            reader.read(first.message_id, second.message_id + 1, EVERYTHING)
        await settle(store)
        assert read_all(reader) == [
            (first.message_id, "t", b"one"),
            (second.message_id, "t", b"two"),
        ]
        store.close()

    asyncio.run(body())


def test_the_journal_keeps_the_selection_and_reads_filter_by_topic(tmp_path: Path) -> None:
    """Persistent publications on the listed filters, QoS 0 ones only where opted in; a row
    written for another reason (a message two durable queues share) is not journal content."""

    async def body() -> None:
        store = open_store(
            tmp_path,
            journal_retention_seconds=3600,
            persistent_topics=("sensors/#",),
            qos0_topics=("metrics/#",),
        )
        sensor = publish(store, "sensors/a/temp", b"21.5")
        shared = publish(store, "chat/room", b"hello")
        store.enqueue("alice", QueuedMessage(shared, 1, True))
        store.enqueue("bob", QueuedMessage(shared, 1, True))
        assert store.journals_qos0("metrics/cpu") and not store.journals_qos0("chat/x")
        metric = publish(store, "metrics/cpu", b"0.7", qos=0)
        publish(store, "chat/noise", b"never stored", qos=0)
        await settle(store)
        assert shared.message_id in table_ids(tmp_path)
        reader = reader_for(store)
        assert read_all(reader) == [
            (sensor.message_id, "sensors/a/temp", b"21.5"),
            (metric.message_id, "metrics/cpu", b"0.7"),
        ]
        assert read_all(reader, ("metrics/+",)) == [(metric.message_id, "metrics/cpu", b"0.7")]
        assert read_all(reader, ("nothing/here",)) == []
        store.close()

    asyncio.run(body())


TOPICS = [
    "sensors",
    "sensors/",
    "sensors/a",
    "sensors/a/temp",
    "sensorsX/a",
    "other/sensors/a",
    "$SYS/sensors",
    "é/ü/x",
    "é/üx",
    "a%b/_c",
    "a*b/[c]",
]
FILTERS = [
    ("#",),
    ("sensors/#",),
    ("sensors/a/#",),
    ("sensors/a",),
    ("sensors/+",),
    ("+/sensors/#",),
    ("é/ü/#",),
    ("a%b/#", "a*b/[c]"),
    ("sensors/a/temp", "other/#", "nothing"),
    ("$SYS/#",),
]


@pytest.mark.parametrize("filters", FILTERS)
def test_a_read_serves_exactly_the_rows_its_filters_match(
    tmp_path: Path, filters: tuple[str, ...]
) -> None:
    """Whether matched in SQL (exact topics, "prefix/#") or row by row (filters with '+'),
    a read serves the journal rows the MQTT rules match: the parent level of "a/#", never a
    sibling that only shares the prefix's characters, never a '$' topic for a wildcard."""

    async def body() -> None:
        store = open_store(tmp_path, journal_retention_seconds=3600)
        published = [publish(store, topic, topic.encode()) for topic in TOPICS]
        publish(store, "sensors/a", b"qos 0: not journalled", qos=0)
        await settle(store)
        expected = [
            (m.message_id, m.topic, m.payload)
            for m in published
            if not m.topic.startswith("$") and any(topic_matches(f, m.topic) for f in filters)
        ]
        assert read_all(reader_for(store), filters) == expected
        store.close()

    asyncio.run(body())


def test_qos0_is_never_written_unless_opted_in(tmp_path: Path) -> None:
    async def body() -> None:
        store = open_store(tmp_path, journal_retention_seconds=3600)
        message = publish(store, "sensors/a", b"fire and forget", qos=0)
        assert message.message_id == 0
        assert not store.keeps_qos0
        await settle(store)
        assert table_ids(tmp_path) == []
        store.close()

    asyncio.run(body())


def test_a_range_the_retention_dropped_is_reported_lost(tmp_path: Path) -> None:
    """The reader names the part of a range below the retention's start, serves the rest,
    and offsets below the start are never served even where a queue still keeps the row."""

    async def body() -> None:
        store = open_store(tmp_path, journal_retention_bytes=250)
        messages = [publish(store, "t", bytes([65 + i]) * 100) for i in range(5)]
        store.enqueue("durable", QueuedMessage(messages[0], 1, True))
        await settle(store)
        publish(store, "t", b"z")
        await settle(store)
        reader = reader_for(store)
        bounds = reader.bounds()
        assert messages[0].message_id in table_ids(tmp_path)  # its queue still needs it
        assert bounds.earliest > messages[2].message_id
        start = messages[0].message_id
        with reader.read(start, bounds.high_water, EVERYTHING) as journal_range:
            assert journal_range.lost == (start, bounds.earliest)
            served = [o for chunk in journal_range.chunks() for o in chunk.offsets]
        assert served and min(served) >= bounds.earliest
        store.close()

    asyncio.run(body())


def test_offset_for_time(tmp_path: Path) -> None:
    async def body() -> None:
        store = open_store(tmp_path, journal_retention_seconds=3600)
        first = publish(store, "t", b"a")
        await settle(store)
        reader = reader_for(store)
        assert reader.offset_for_time(0.0) == first.message_id
        assert reader.offset_for_time(4e9) == reader.bounds().high_water
        store.close()

    asyncio.run(body())


def test_the_broker_hands_opted_in_qos0_publications_to_the_journal(tmp_path: Path) -> None:
    """QoS 0 on an opted-in topic leaves the forwarding fast path and reaches the journal;
    other QoS 0 topics keep the fast path."""

    async def body() -> None:
        store = open_store(tmp_path, journal_retention_seconds=3600, qos0_topics=("metrics/#",))
        broker = Broker(Config(), clock=ManualClock(), store=store)
        assert broker.route_plan("metrics/cpu").direct is None
        assert broker.route_plan("chat/x").direct == ()
        broker.publish(Message("metrics/cpu", b"0.7", qos=0))
        broker.publish(Message("chat/x", b"not kept", qos=0))
        await settle(store)
        assert [(t, p) for _o, t, p in read_all(reader_for(store))] == [("metrics/cpu", b"0.7")]
        store.close()

    asyncio.run(body())


def publish_message(store: SQLiteStore, topic: str, qos: int, persistent: bool) -> Message:
    message = Message(topic, f"{topic} {qos} {persistent}".encode(), qos=qos, persistent=persistent)
    store.journal(message)
    return message


# Filters a read may give: matched in SQL as a whole ("#"), in SQL by prefix, row by row ('+').
READ_FILTERS = [("#",), ("a/#", "b/#"), ("+/x",)]


@pytest.mark.parametrize("filters", READ_FILTERS)
def test_a_non_persistent_message_is_served_by_the_rule_that_journalled_it(
    tmp_path: Path, filters: tuple[str, ...]
) -> None:
    """A JMS NON_PERSISTENT message arrives at QoS 1 but is not persistent: the journal keeps
    it only where its topic is opted in like a QoS 0 one, and the reader, asking the same
    rule, serves exactly that (not by its QoS, which would call it persistent)."""

    async def body() -> None:
        store = open_store(
            tmp_path,
            journal_retention_seconds=3600,
            persistent_topics=("a/#",),
            qos0_topics=("b/#",),
        )
        durable_a = publish_message(store, "a/x", 2, True)
        publish_message(store, "a/x", 1, False)  # not opted in: never written
        publish_message(store, "b/x", 2, True)  # persistent, but b/# keeps only QoS 0 ones
        non_persistent_b = publish_message(store, "b/x", 1, False)
        qos0_b = publish_message(store, "b/x", 0, False)
        await settle(store)
        assert table_ids(tmp_path) == [
            durable_a.message_id,
            non_persistent_b.message_id,
            qos0_b.message_id,
        ]
        assert [offset for offset, _t, _p in read_all(reader_for(store), filters)] == [
            durable_a.message_id,
            non_persistent_b.message_id,
            qos0_b.message_id,
        ]
        store.close()

    asyncio.run(body())


@pytest.mark.parametrize("filters", READ_FILTERS)
def test_a_non_persistent_row_is_not_served_where_only_persistent_ones_are_selected(
    tmp_path: Path, filters: tuple[str, ...]
) -> None:
    """Rows journalled while the operator had opted topics in stay in the journal when the
    selection goes back to the default (persistent publications only): a reader then serves
    the persistent rows and no non-persistent one, whatever its QoS, in SQL or in Python."""

    async def body() -> list[Message]:
        store = open_store(tmp_path, journal_retention_seconds=3600, qos0_topics=("a/#", "b/#"))
        messages = [
            publish_message(store, "a/x", 2, True),
            publish_message(store, "b/x", 1, False),
            publish_message(store, "a/x", 0, False),
            publish_message(store, "b/x", 1, True),
        ]
        await settle(store)
        store.close()
        return messages

    messages = asyncio.run(body())
    assert table_ids(tmp_path) == [m.message_id for m in messages]
    reader = JournalReader(tmp_path, JournalSelection(enabled=True))
    assert [offset for offset, _t, _p in read_all(reader, filters)] == [
        m.message_id for m in messages if m.persistent
    ]


def test_the_broker_journals_a_non_persistent_message_only_where_opted_in(
    tmp_path: Path,
) -> None:
    """Through the broker's publish path: NON_PERSISTENT at QoS 1 is journalled (and then
    served) on a topic opted in for QoS 0, never on one selected for persistent messages."""

    async def body() -> None:
        store = open_store(
            tmp_path,
            journal_retention_seconds=3600,
            persistent_topics=("a/#",),
            qos0_topics=("b/#",),
        )
        broker = Broker(Config(), clock=ManualClock(), store=store)
        broker.publish(Message("a/x", b"persistent", qos=2, persistent=True))
        broker.publish(Message("a/x", b"non-persistent on a", qos=1, persistent=False))
        broker.publish(Message("b/x", b"non-persistent on b", qos=1, persistent=False))
        await settle(store)
        assert [(t, p) for _o, t, p in read_all(reader_for(store))] == [
            ("a/x", b"persistent"),
            ("b/x", b"non-persistent on b"),
        ]
        store.close()

    asyncio.run(body())
