"""Fenced writes (the Spark sink's units): a (writer, batch, partition) is published once, its
fence stored with its messages; a committed batch's fences give way to one mark; fences survive
a restart; a failed commit takes its fence back so the retry is applied.
"""

from __future__ import annotations

import asyncio

import pytest

from kittiwake.broker.broker import Broker, Subscribed, SubscriptionOptions
from kittiwake.broker.consumers import Delivery
from kittiwake.broker.fenced_writes import fenced_producer_name
from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage
from kittiwake.broker.store import MemoryStore
from kittiwake.clock import ManualClock
from kittiwake.config import config_from_dict


def rows(*payloads: str, topic: str = "out/t", qos: int = 1, retain: bool = False) -> list[Message]:
    return [
        Message(topic, p.encode(), qos=qos, retain=retain, persistent=qos > 0) for p in payloads
    ]


def test_a_unit_is_published_once_and_its_replay_publishes_nothing(harness) -> None:
    session, consumer, _ = harness.connect("sub")
    harness.subscribe(session, "out/#", qos=1)
    fenced = harness.broker.fenced_writes

    first = fenced.write("q1", 0, 0, rows("a", "b"))
    assert not first.already_committed
    assert consumer.payloads == [b"a", b"b"]
    again = fenced.write("q1", 0, 0, rows("a", "b"))
    assert again.already_committed
    assert consumer.payloads == [b"a", b"b"], "a replayed unit must publish nothing"

    # Another partition of the batch, the next batch, and another writer are other units.
    assert not fenced.write("q1", 0, 1, rows("c")).already_committed
    assert not fenced.write("q1", 1, 0, rows("d")).already_committed
    assert not fenced.write("q2", 0, 0, rows("e")).already_committed
    assert consumer.payloads == [b"a", b"b", b"c", b"d", b"e"]
    assert harness.store.duplicates[fenced_producer_name("q1")] == {"0/0", "0/1", "1/0"}


def test_the_messages_are_journalled_retained_and_fenced_together(harness) -> None:
    fenced = harness.broker.fenced_writes
    fenced.write("q1", 3, 1, rows("kept", topic="stats/d1", retain=True) + rows("x", qos=0))
    assert harness.store.retained["stats/d1"].payload == b"kept"
    assert harness.broker.retained.get("stats/d1") is not None
    assert "3/1" in harness.store.duplicates["spark:q1"]


def test_fences_survive_a_restart(harness) -> None:
    harness.broker.fenced_writes.write("q1", 0, 0, rows("a"))
    harness.broker.fenced_writes.commit_batch("q1", 0)
    harness.broker.fenced_writes.write("q1", 1, 0, rows("b"))
    again = harness.restart()
    session, consumer, _ = again.connect("sub")
    again.subscribe(session, "out/#", qos=1)
    fenced = again.broker.fenced_writes
    assert fenced.fences_of("q1") == (0, {"1/0"})
    assert fenced.write("q1", 0, 0, rows("a")).already_committed
    assert fenced.write("q1", 1, 0, rows("b")).already_committed
    assert consumer.payloads == []
    assert not fenced.write("q1", 1, 1, rows("c")).already_committed
    assert consumer.payloads == [b"c"]


def test_a_committed_batch_keeps_one_mark_instead_of_its_fences(harness) -> None:
    fenced = harness.broker.fenced_writes
    for batch in range(3):
        for partition in range(2):
            fenced.write("q1", batch, partition, rows(f"{batch}.{partition}"))
    fenced.commit_batch("q1", 1)
    assert harness.store.duplicates["spark:q1"] == {"committed/1", "2/0", "2/1"}
    fenced.commit_batch("q1", 2)
    assert harness.store.duplicates["spark:q1"] == {"committed/2"}
    # A unit of a committed batch (a zombie task, a replay) publishes nothing, even one that
    # never came before.
    assert fenced.write("q1", 2, 7, rows("late")).already_committed
    assert fenced.write("q1", 0, 0, rows("old")).already_committed
    # An older commit changes nothing.
    fenced.commit_batch("q1", 1)
    assert harness.store.duplicates["spark:q1"] == {"committed/2"}


def test_other_producers_are_not_taken_as_writers() -> None:
    store = MemoryStore()
    store.add_duplicate("$session/c1", 7)
    store.add_duplicate("spark:q9", "4/2")
    broker = Broker(clock=ManualClock(), store=store)
    broker.recover()
    assert broker.fenced_writes.fences_of("q9") == (-1, {"4/2"})
    assert broker.fenced_writes.fences_of("$session/c1") == (-1, set())


class FailingCommitStore(MemoryStore):
    """commit() hands out one pending future per turn, which the test fails or resolves."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: asyncio.Future[None] | None = None

    def commit(self) -> asyncio.Future[None]:  # type: ignore[override]
        if self.pending is None:
            self.pending = asyncio.get_running_loop().create_future()
        return self.pending

    def take(self) -> asyncio.Future[None]:
        assert self.pending is not None
        future, self.pending = self.pending, None
        return future


def test_a_retry_waits_for_the_first_commit_and_a_failed_commit_is_applied_again() -> None:
    async def body() -> None:
        store = FailingCommitStore()
        broker = Broker(clock=ManualClock(), store=store)
        fenced = broker.fenced_writes
        first = fenced.write("q1", 0, 0, rows("a"))
        commit = store.take()
        # A retry while the first is pending waits for the first's commit.
        retry = fenced.write("q1", 0, 0, rows("a"))
        assert retry.already_committed and retry.completion is commit
        assert first.completion is not None
        commit.set_exception(OSError("disk full"))
        with pytest.raises(OSError):
            await first.completion
        await asyncio.sleep(0)  # one loop turn: the future's callbacks run
        # Nothing was stored: the fence is gone, and the next retry is applied.
        assert fenced.fences_of("q1") == (-1, set())
        again = fenced.write("q1", 0, 0, rows("a"))
        assert not again.already_committed
        store.take().set_result(None)
        assert again.completion is not None
        await again.completion
        await asyncio.sleep(0)
        assert fenced.fences_of("q1") == (-1, {"0/0"})
        after = fenced.write("q1", 0, 0, rows("a"))
        assert after.already_committed

    asyncio.run(asyncio.wait_for(body(), 10))


def held_broker(config: dict[str, object] | None = None) -> tuple[Broker, FailingCommitStore]:
    """A broker whose commits stay pending until the test resolves or fails them."""
    store = FailingCommitStore()
    broker = Broker(config_from_dict(config or {}), clock=ManualClock(), store=store)
    broker.schedule_ticks(asyncio.get_running_loop())
    return broker, store


class Received:
    """A front end that records what reaches it: (payload, delivered QoS), in order."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, int]] = []

    @property
    def payloads(self) -> list[bytes]:
        return [payload for payload, _ in self.deliveries]

    def tag(self, delivery: Delivery) -> int:
        return delivery.id

    def deliver(self, delivery: Delivery) -> None:
        self.deliveries.append((delivery.entry.message.payload, delivery.entry.qos))

    def deliver_settled(self, entry: QueuedMessage) -> None:
        self.deliveries.append((entry.message.payload, entry.qos))

    def taken_over(self) -> None:
        pass


def subscriber(broker: Broker, client_id: str, qos: int, *, persistent: bool = False) -> Received:
    consumer = Received()
    session, _, _ = broker.connect(
        client_id,
        consumer,
        clean_start=not persistent,
        expiry_interval=3600 if persistent else 0,
        window=100,
    )
    broker.start_delivery(session)
    result = broker.subscribe(session, "out/#", SubscriptionOptions(max_qos=qos))
    assert isinstance(result, Subscribed)
    return consumer


async def turns(count: int = 3) -> None:
    """Let the loop run the commit's callbacks and the pumps they schedule."""
    for _ in range(count):
        await asyncio.sleep(0)


def test_no_copy_of_a_unit_goes_out_before_its_commit_qos0_included() -> None:
    """Persist -> acknowledge -> dispatch for every copy of a fenced unit: a QoS 0 row, a QoS 1
    row to a subscriber without a stored session, and a stored copy all wait for the unit's
    commit, and arrive in the unit's order."""

    async def body() -> None:
        broker, store = held_broker()
        at_most_once = subscriber(broker, "q0", 0)
        clean = subscriber(broker, "clean", 1)
        durable = subscriber(broker, "durable", 1, persistent=True)
        unit = rows("a", qos=0) + rows("b", qos=1) + rows("c", qos=0)
        outcome = broker.fenced_writes.write("q1", 0, 0, unit)
        await turns()
        assert at_most_once.payloads == clean.payloads == durable.payloads == []
        store.take().set_result(None)
        assert outcome.completion is not None
        await outcome.completion
        await turns()
        assert at_most_once.payloads == [b"a", b"b", b"c"]
        assert clean.payloads == [b"a", b"b", b"c"]
        assert sorted(durable.payloads) == [b"a", b"b", b"c"]
        assert [qos for _, qos in clean.deliveries] == [0, 1, 0]

    asyncio.run(asyncio.wait_for(body(), 10))


def test_a_unit_retried_after_a_failed_commit_reaches_every_subscriber_once() -> None:
    """The commit holding a unit and its fence fails (disk full): nothing of it was sent, QoS
    0 rows included, so the sink's retry publishes each row exactly once."""

    async def body() -> None:
        broker, store = held_broker()
        at_most_once = subscriber(broker, "q0", 0)
        clean = subscriber(broker, "clean", 1)
        durable = subscriber(broker, "durable", 1, persistent=True)
        unit = rows("a", qos=0) + rows("b", qos=1) + rows("c", qos=0)
        first = broker.fenced_writes.write("q1", 0, 0, unit)
        store.take().set_exception(OSError("disk full"))
        assert first.completion is not None
        with pytest.raises(OSError):
            await first.completion
        await turns()
        assert at_most_once.payloads == clean.payloads == durable.payloads == []

        retry = broker.fenced_writes.write("q1", 0, 0, unit)
        assert not retry.already_committed
        store.take().set_result(None)
        assert retry.completion is not None
        await retry.completion
        await turns()
        assert at_most_once.payloads == [b"a", b"b", b"c"]
        assert clean.payloads == [b"a", b"b", b"c"]
        assert sorted(durable.payloads) == [b"a", b"b", b"c"]

    asyncio.run(asyncio.wait_for(body(), 10))


def test_a_finished_batch_write_keeps_one_mark_until_the_retention_then_nothing(
    harness,
) -> None:
    """A batch write's commit says it is finished: its fences give way to one mark, which
    answers a late task or a rerun as "already committed" for journal.finished_write_retention
    and is then dropped with the writer (nothing left in the duplicate table)."""
    fenced = harness.broker.fenced_writes
    retention = harness.broker.config.journal.finished_write_retention
    for partition in range(3):
        fenced.write("write-1", 0, partition, rows(f"p{partition}"))
    fenced.commit_batch("write-1", 0, finished=True)
    (mark,) = harness.store.duplicates[fenced_producer_name("write-1")]
    assert str(mark).startswith("finished/")
    assert fenced.finished("write-1")
    # A straggler of the write, or a rerun with its writeId, publishes nothing.
    assert fenced.write("write-1", 0, 1, rows("again")).already_committed
    assert fenced.write("write-1", 0, 9, rows("late")).already_committed

    harness.advance(retention - 1)
    assert harness.store.duplicates[fenced_producer_name("write-1")] == {mark}
    harness.advance(2)
    assert not harness.store.duplicates.get(fenced_producer_name("write-1"))
    assert not fenced.finished("write-1")
    assert fenced.fences_of("write-1") == (-1, set())


def test_a_finished_mark_survives_a_restart_and_is_dropped_on_time_after_it(harness) -> None:
    fenced = harness.broker.fenced_writes
    retention = harness.broker.config.journal.finished_write_retention
    fenced.write("write-2", 0, 0, rows("a"))
    fenced.commit_batch("write-2", 0, finished=True)
    harness.advance(retention / 2)
    again = harness.restart()
    assert again.broker.fenced_writes.finished("write-2")
    assert again.broker.fenced_writes.write("write-2", 0, 0, rows("a")).already_committed
    again.advance(retention / 2 - 1)
    assert again.store.duplicates.get(fenced_producer_name("write-2"))
    again.advance(2)
    assert not again.store.duplicates.get(fenced_producer_name("write-2"))


def test_a_stream_writer_keeps_its_committed_mark(make_harness) -> None:
    """A stream never finishes (its query restarts from its checkpoint whenever its owner
    says): its committed mark is not dropped with time."""
    harness = make_harness(journal={"finished_write_retention": 10})
    fenced = harness.broker.fenced_writes
    fenced.write("query-1", 0, 0, rows("a"))
    fenced.commit_batch("query-1", 0)
    harness.advance(3600)
    assert harness.store.duplicates[fenced_producer_name("query-1")] == {"committed/0"}
    assert fenced.write("query-1", 0, 0, rows("a")).already_committed
