"""Transactions: one session's staged sends and settlements across destinations, applied all
at once on commit (one loop turn, so one store commit) or not at all; a rollback gives the
settled messages back with their delivery count incremented."""

from __future__ import annotations

import pytest

from kittiwake.broker.consumers import Consumer, Delivery, Settlement
from kittiwake.broker.destinations import Destination
from kittiwake.broker.message import Message
from kittiwake.broker.queues import Queue, QueuedMessage
from kittiwake.broker.routing import Binding, Router
from kittiwake.broker.transactions import Transaction, TransactionRolledBack
from kittiwake.clock import ManualClock


class Receiver:
    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []

    def deliver(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        raise AssertionError("nothing here is at most once")


def payloads(queue: Queue) -> list[bytes]:
    return sorted(e.message.payload for e in queue.entries())


@pytest.fixture
def router() -> Router:
    return Router(lambda name: Queue(name, max_messages=3, max_bytes=10_000))


def test_sends_to_two_queues_appear_together_on_commit(router: Router) -> None:
    enqueued: list[tuple[str, bytes]] = []
    tx = Transaction(router, on_enqueued=lambda q, e: enqueued.append((q.name, e.message.payload)))
    tx.send(Destination.queue("a"), Message("a", b"1", qos=2, persistent=True))
    tx.send(Destination.queue("b"), Message("b", b"2", qos=2, persistent=True))
    assert "a" not in router.queues or router.queue("a").count == 0
    assert "b" not in router.queues or router.queue("b").count == 0
    touched = tx.commit()
    assert {q.name for q in touched} == {"a", "b"}
    assert payloads(router.queue("a")) == [b"1"]
    assert payloads(router.queue("b")) == [b"2"]
    assert enqueued == [("a", b"1"), ("b", b"2")]


def test_a_commit_settles_and_sends_across_destinations_at_once(router: Router) -> None:
    """Consume from one queue and produce to a topic and a queue in one unit."""
    clock = ManualClock()
    source = router.queue("in")
    source.push(QueuedMessage.of(Message("in", b"work", qos=2, persistent=True), 2))
    receiver = Receiver()
    source.attach(Consumer(receiver, window=5))
    source.dispatch(clock.now())
    (delivery,) = receiver.deliveries
    router.bind(Binding("results", router.queue("subscriber")))
    tx = Transaction(router)
    tx.settle(delivery, Settlement.ACCEPTED)
    tx.send(Destination.topic("results"), Message("results", b"done", qos=1))
    tx.send(Destination.queue("out"), Message("out", b"next", qos=1))
    assert source.in_flight == 1, "a staged settlement is not applied before the commit"
    tx.commit()
    assert (source.in_flight, source.count) == (0, 0)
    assert payloads(router.queue("subscriber")) == [b"done"]
    assert payloads(router.queue("out")) == [b"next"]


def test_rollback_returns_settled_messages_with_their_count_incremented(router: Router) -> None:
    clock = ManualClock()
    receivers = {}
    deliveries = []
    for name in ("a", "b"):
        queue = router.queue(name)
        queue.push(QueuedMessage.of(Message(name, name.encode(), qos=1), 1))
        receivers[name] = Receiver()
        queue.attach(Consumer(receivers[name], window=1))
        queue.dispatch(clock.now())
        deliveries.append(receivers[name].deliveries.pop())
    tx = Transaction(router)
    for delivery in deliveries:
        tx.settle(delivery, Settlement.ACCEPTED)
    tx.send(Destination.queue("c"), Message("c", b"never"))
    touched = tx.rollback()
    assert {q.name for q in touched} == {"a", "b"}
    assert "c" not in router.queues or router.queue("c").count == 0
    for name in ("a", "b"):
        queue = router.queue(name)
        queue.dispatch(clock.now())
        (again,) = receivers[name].deliveries
        assert again.entry.message.payload == name.encode()
        assert (again.delivery_count, again.redelivered) == (1, True)
    assert tx.commit() == [], "a rolled back transaction starts empty"


def test_a_commit_that_cannot_apply_everything_applies_nothing(router: Router) -> None:
    """Queue b has room for one more message only: the commit fails and rolls back, leaving a
    untouched and the staged settlement's message back in its queue, counted."""
    clock = ManualClock()
    full = router.queue("b")
    for i in range(2):
        full.push(QueuedMessage.of(Message("b", b"%d" % i), 0))
    source = router.queue("in")
    source.push(QueuedMessage.of(Message("in", b"work", qos=1), 1))
    receiver = Receiver()
    source.attach(Consumer(receiver, window=1))
    source.dispatch(clock.now())
    tx = Transaction(router)
    tx.settle(receiver.deliveries[0], Settlement.ACCEPTED)
    tx.send(Destination.queue("a"), Message("a", b"x"))
    tx.send(Destination.queue("b"), Message("b", b"y"))
    tx.send(Destination.queue("b"), Message("b", b"z"))
    with pytest.raises(TransactionRolledBack, match="queue b"):
        tx.commit()
    assert router.queue("a").count == 0
    assert payloads(full) == [b"0", b"1"]
    (back,) = source.entries()
    assert back.delivery_count == 1 and source.in_flight == 0


def test_a_staged_delivery_taken_back_meanwhile_fails_the_commit(router: Router) -> None:
    clock = ManualClock()
    source = router.queue("in")
    source.push(QueuedMessage.of(Message("in", b"work", qos=1), 1))
    receiver = Receiver()
    consumer = Consumer(receiver, window=1)
    source.attach(consumer)
    source.dispatch(clock.now())
    tx = Transaction(router)
    tx.settle(receiver.deliveries[0], Settlement.ACCEPTED)
    tx.send(Destination.queue("out"), Message("out", b"x"))
    source.detach(consumer)  # the consumer went away: its delivery came back to the queue
    with pytest.raises(TransactionRolledBack):
        tx.commit()
    assert router.queue("out").count == 0
    assert [e.delivery_count for e in source.entries()] == [1]
