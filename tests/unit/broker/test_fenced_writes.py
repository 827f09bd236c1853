"""Fenced writes (the Spark sink's units): a (writer, batch, partition) is published once, its
fence stored with its messages; a committed batch's fences give way to one mark; fences survive
a restart; a failed commit takes its fence back so the retry is applied.
"""

from __future__ import annotations

import asyncio

import pytest

from kittiwake.broker.broker import Broker
from kittiwake.broker.fenced_writes import fenced_producer_name
from kittiwake.broker.message import Message
from kittiwake.broker.store import MemoryStore
from kittiwake.clock import ManualClock


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
