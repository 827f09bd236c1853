"""Queue.dispatch to a receiver that takes runs (``deliver_all``) starts the plain entries at the
front of its FIFO in one step: it must hand out exactly what it hands a receiver taking one
delivery at a time, in the same order under the same delivery ids, and leave the queue, the
credit and the in-flight count alike, whatever is mixed in (expired entries, entries waiting
for their commit, entries the consumer is excluded from, entries given back).
"""

from __future__ import annotations

import random

import pytest

from kittiwake.broker.consumers import Consumer, Delivery, Settlement
from kittiwake.broker.message import Message
from kittiwake.broker.queues import Queue, QueuedMessage

NOW = 1_000.0


class OneByOne:
    """A receiver without deliver_all: the queue hands it each delivery as it starts it."""

    def __init__(self) -> None:
        self.got: list[Delivery] = []

    def deliver(self, delivery: Delivery) -> None:
        self.got.append(delivery)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        raise AssertionError("no at-most-once entry here")


class Runs(OneByOne):
    """A receiver that takes a dispatch's deliveries at once."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[int] = []

    def deliver_all(self, deliveries: list[Delivery]) -> None:
        self.runs.append(len(deliveries))
        self.got.extend(deliveries)


def scenario(seed: int, receiver: OneByOne) -> list[object]:
    """One random history of pushes, dispatches and settlements; what was seen after each."""
    rng = random.Random(seed)
    queue = Queue("q", max_messages=10_000, max_bytes=10_000_000, durable=bool(seed % 2))
    consumer = Consumer(receiver, window=rng.choice([1, 3, 8, 50]))
    queue.attach(consumer)
    seen: list[object] = []
    for _ in range(40):
        for _ in range(rng.randrange(0, 12)):
            message = Message(f"t/{rng.randrange(3)}", b"p" * rng.randrange(5), qos=1)
            kind = rng.random()
            if kind < 0.1:
                message.expiry = NOW - 1  # expired by the time it is dispatched
            elif kind < 0.2:
                message.expiry = NOW + 100
            elif kind < 0.3:
                message.awaiting_commit = True
            entry = QueuedMessage(message, 1, rng.random() < 0.5)
            if seed % 3 == 0 and rng.random() < 0.05:
                # (Excluded from the only consumer, it stays ahead of later entries, which
                # then go one by one: only some histories have one.)
                entry.excluded = {consumer}
            queue.push(entry)
        if rng.random() < 0.3:
            # Some commits are done: their copies may go.
            for waiting in queue.entries():
                if rng.random() < 0.5:
                    waiting.message.awaiting_commit = False
        before = len(receiver.got)
        sent = queue.dispatch(NOW)
        got = receiver.got[before:]
        seen.append(
            (
                sent,
                [(d.id, d.entry.message.payload, d.entry.message.topic) for d in got],
                queue.count,
                queue.bytes,
                queue.in_flight,
                consumer.credit.available,
                queue.counters.expired,
            )
        )
        # Settle some of what is in flight, some given back.
        for delivery in list(consumer.unsettled.values()):
            roll = rng.random()
            if roll < 0.5:
                queue.settle(delivery, Settlement.ACCEPTED)
            elif roll < 0.6:
                queue.settle(delivery, Settlement.RELEASED)
            elif roll < 0.65:
                queue.settle(delivery, Settlement.MODIFIED)
    return seen


SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_run_receiver_is_dispatched_what_a_one_by_one_receiver_is(seed: int) -> None:
    assert scenario(seed, Runs()) == scenario(seed, OneByOne())


def test_the_histories_hand_out_runs() -> None:
    """(The comparison above is of something: most histories hand runs of several.)"""
    handed = []
    for seed in SEEDS:
        runs = Runs()
        scenario(seed, runs)
        handed.append(max(runs.runs, default=0))
    assert sum(1 for longest in handed if longest > 1) >= len(SEEDS) // 2


def test_a_run_put_in_flight_at_once_is_what_one_by_one_puts_in_flight() -> None:
    """Queue.deliver_now_all against deliver_now for each: the same deliveries under the same
    ids, the same counts, and, taken back, the entries come back in their arrival order
    among the ones that waited."""

    def history(at_once: bool) -> list[object]:
        receiver = Runs()
        queue = Queue("q", max_messages=100, max_bytes=100_000)
        consumer = Consumer(receiver, window=10)
        queue.attach(consumer)
        queue.push(QueuedMessage(Message("t", b"early", qos=1), 1, False))
        queue.dispatch(NOW)
        entries = [QueuedMessage(Message("t", b"m%d" % i, qos=1), 1, False) for i in range(5)]
        if at_once:
            queue.deliver_now_all(consumer, entries, receiver.deliver_all)
        else:
            for entry in entries:
                queue.deliver_now(consumer, entry)
        queue.push(QueuedMessage(Message("t", b"late", qos=1), 1, False))
        seen: list[object] = [
            [(d.id, d.entry.message.payload) for d in receiver.got],
            consumer.credit.available,
            queue.in_flight,
        ]
        queue.detach(consumer)  # everything in flight comes back, possibly delivered
        seen.append([e.message.payload for e in iter(lambda: queue.pop(NOW), None)])
        return seen

    assert history(at_once=True) == history(at_once=False)
    assert history(at_once=True)[-1] == [b"early", b"m0", b"m1", b"m2", b"m3", b"m4", b"late"]
