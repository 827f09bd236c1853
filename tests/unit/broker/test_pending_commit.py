"""What waits for a pending commit: a stored copy's dispatch (persist -> acknowledge ->
dispatch); with producer flow control, a publisher's acknowledgement whose message is both
not yet durable and headed for a buried subscriber; and the completion every core operation
returns, which is pending exactly when what it announces is not yet durable.

The store is a MemoryStore whose commit() hands out a future the test resolves, so the order of
"commit done" and "subscriber drained" is chosen by the test.
"""

from __future__ import annotations

import asyncio

import pytest
from held_commits import HeldCommitStore, RecordingConsumer, run

from kittiwake.broker.broker import Broker, Subscribed, SubscriptionOptions
from kittiwake.broker.consumers import Consumer
from kittiwake.broker.message import Message
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.broker.sessions import Session
from kittiwake.clock import ManualClock
from kittiwake.config import config_from_dict

DEPTH = 4


def buried_subscriber() -> tuple[Broker, HeldCommitStore, Session, RecordingConsumer]:
    """A connected QoS 1 subscriber with a window of 1 and DEPTH messages already queued."""
    store = HeldCommitStore()
    config = config_from_dict({"limits": {"flow_control_depth": DEPTH}})
    broker = Broker(config, clock=ManualClock(), store=store)
    broker.schedule_ticks(asyncio.get_running_loop())
    consumer = RecordingConsumer()
    session, _, _ = broker.connect("sub", consumer, clean_start=True, expiry_interval=0, window=1)
    broker.start_delivery(session)
    broker.subscribe(session, "t", SubscriptionOptions(max_qos=1))
    for n in range(DEPTH + 1):  # one goes in flight, DEPTH wait in the queue
        broker.publish(Message("t", b"%d" % n, qos=1, persistent=False))
    assert session.queue.count == DEPTH
    return broker, store, session, consumer


def persistent(payload: bytes) -> Message:
    return Message("t", payload, qos=1, persistent=True)


async def drain(broker: Broker, session: Session, consumer: RecordingConsumer) -> None:
    """Acknowledge deliveries until the queue is empty, as a fast subscriber would."""
    while session.queue.count or session.inflight:
        sent, consumer.deliveries = consumer.deliveries, []
        for delivery in sent:
            broker.acknowledge(session, delivery)
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("qos", "store_and_dispatch"),
    [(2, True), (2, False), (1, False)],
    ids=["exactly-once", "exactly-once-strict", "at-least-once-strict"],
)
def test_a_stored_copy_is_not_dispatched_before_its_commit(
    qos: int, store_and_dispatch: bool
) -> None:
    """An acknowledgement from the subscriber pumps its queue; the next message in it must still
    wait for its own commit, even though the session has room in its window. Exactly-once
    publications always keep persist -> acknowledge -> dispatch; at-least-once ones do when
    store-and-dispatch is off."""

    async def body() -> None:
        store = HeldCommitStore()
        config = config_from_dict({"store": {"store_and_dispatch": store_and_dispatch}})
        broker = Broker(config, clock=ManualClock(), store=store)
        broker.schedule_ticks(asyncio.get_running_loop())
        consumer = RecordingConsumer()
        session, _, _ = broker.connect(
            "sub", consumer, clean_start=False, expiry_interval=3600, window=10
        )
        broker.start_delivery(session)
        broker.subscribe(session, "t", SubscriptionOptions(max_qos=1))
        broker.publish(Message("t", b"first", qos=qos, persistent=True))
        store.resolve()
        await asyncio.sleep(0.01)
        assert len(consumer.deliveries) == 1
        # Its commit stays pending.
        broker.publish(Message("t", b"second", qos=qos, persistent=True))
        broker.acknowledge(session, consumer.deliveries.pop())
        await asyncio.sleep(0.01)
        assert consumer.deliveries == [], "dispatched before it was durable"
        store.resolve()
        await asyncio.sleep(0.01)
        assert len(consumer.deliveries) == 1

    run(body)


def test_store_and_dispatch_sends_a_stored_copy_before_its_commit() -> None:
    """At-least-once (DESIGN.md section 3): a stored copy goes to its consumer while its commit
    is pending; the publisher's completion still waits for the commit."""

    async def body() -> None:
        store = HeldCommitStore()
        broker = Broker(config_from_dict({}), clock=ManualClock(), store=store)
        broker.schedule_ticks(asyncio.get_running_loop())
        consumer = RecordingConsumer()
        session, _, _ = broker.connect(
            "sub", consumer, clean_start=False, expiry_interval=3600, window=10
        )
        broker.start_delivery(session)
        broker.subscribe(session, "t", SubscriptionOptions(max_qos=1))
        completion = broker.publish(persistent(b"first"))
        assert completion is not None
        await asyncio.sleep(0)
        assert [d.entry.message.payload for d in consumer.deliveries] == [b"first"]
        assert not completion.done(), "acknowledged before its commit"
        store.resolve()
        await asyncio.sleep(0)
        assert completion.done() and completion.exception() is None

    run(body)


def test_the_acknowledgement_waits_for_the_commit_and_the_drain() -> None:
    async def body() -> None:
        broker, store, session, consumer = buried_subscriber()
        waiting = broker.publish(persistent(b"held"))
        assert waiting is not None
        assert store.pending is not None
        store.pending.set_result(None)
        await asyncio.sleep(0.01)
        assert not waiting.done(), "acknowledged while the subscriber is still buried"
        await drain(broker, session, consumer)
        await asyncio.wait_for(waiting, 5)

    run(body)


def test_the_drain_alone_does_not_acknowledge_an_uncommitted_message() -> None:
    async def body() -> None:
        broker, store, session, consumer = buried_subscriber()
        waiting = broker.publish(persistent(b"held"))
        assert waiting is not None and store.pending is not None
        await drain(broker, session, consumer)
        await asyncio.sleep(0.01)
        assert not waiting.done(), "acknowledged before the message was durable"
        store.pending.set_result(None)
        await asyncio.wait_for(waiting, 5)

    run(body)


def test_a_failed_commit_reaches_the_publisher_after_the_drain() -> None:
    async def body() -> None:
        broker, store, session, consumer = buried_subscriber()
        waiting = broker.publish(persistent(b"lost"))
        assert waiting is not None and store.pending is not None
        store.pending.set_exception(OSError("disk full"))
        await drain(broker, session, consumer)
        try:
            await asyncio.wait_for(waiting, 5)
        except OSError as exc:
            assert "disk full" in str(exc)
        else:
            raise AssertionError("a failed commit was acknowledged")

    run(body)


def test_publications_waiting_on_the_same_commit_and_drain_share_one_waiter() -> None:
    """Not a task per message: the whole held window resolves through one future."""

    async def body() -> None:
        broker, store, session, consumer = buried_subscriber()
        waiters = [broker.publish(persistent(b"%d" % n)) for n in range(50)]
        assert all(w is not None for w in waiters)
        assert len({id(w) for w in waiters}) == 1
        assert store.pending is not None
        store.pending.set_result(None)
        await drain(broker, session, consumer)
        await asyncio.wait_for(asyncio.gather(*[w for w in waiters if w is not None]), 5)

    run(body)


# -- completions: what each core operation makes its caller wait for -----------------------


def test_completions_wait_only_for_what_is_stored() -> None:
    """A clean session's operations store nothing and need no wait, even while the store is
    busy; a persistent session's wait for the pending commit."""

    async def body() -> None:
        store = HeldCommitStore()
        broker = Broker(config_from_dict({}), clock=ManualClock(), store=store)
        clean, present, completion = broker.connect(
            "clean", RecordingConsumer(), clean_start=True, expiry_interval=0, window=10
        )
        assert (present, completion) == (False, None)
        subscribed = broker.subscribe(clean, "t", SubscriptionOptions(max_qos=2))
        assert isinstance(subscribed, Subscribed) and subscribed.completion is None
        assert broker.unsubscribe(clean, "t") == (True, None)
        assert broker.unsubscribe(clean, "t") == (False, None)
        assert broker.begin_exactly_once(clean, 5)
        assert broker.end_exactly_once(clean, 5) == (True, None)
        assert broker.end_exactly_once(clean, 5) == (False, None)
        assert broker.set_session_expiry(clean, 0) is None

        kept, present, completion = broker.connect(
            "kept", RecordingConsumer(), clean_start=False, expiry_interval=60, window=10
        )
        assert not present and completion is store.pending is not None
        subscribed = broker.subscribe(kept, "t", SubscriptionOptions(max_qos=2))
        assert isinstance(subscribed, Subscribed) and subscribed.completion is store.pending
        assert broker.unsubscribe(kept, "t") == (True, store.pending)
        assert broker.begin_exactly_once(kept, 5)
        assert broker.end_exactly_once(kept, 5) == (True, store.pending)
        assert broker.set_session_expiry(kept, 30) is store.pending
        store.resolve()

    run(body)


def test_a_clean_start_over_a_stored_session_waits_for_the_deletion() -> None:
    async def body() -> None:
        store = HeldCommitStore()
        broker = Broker(config_from_dict({}), clock=ManualClock(), store=store)
        session, _, _ = broker.connect(
            "c", RecordingConsumer(), clean_start=False, expiry_interval=60, window=10
        )
        broker.disconnect(session, publish_will=False)
        store.resolve()
        _, present, completion = broker.connect(
            "c", RecordingConsumer(), clean_start=True, expiry_interval=0, window=10
        )
        assert not present
        assert completion is not None and completion is store.pending
        assert not completion.done()
        store.resolve()
        await completion

    run(body)


def test_settling_a_stored_delivery_waits_for_its_commit() -> None:
    async def body() -> None:
        store = HeldCommitStore()
        broker = Broker(config_from_dict({}), clock=ManualClock(), store=store)
        broker.schedule_ticks(asyncio.get_running_loop())
        consumer = RecordingConsumer()
        session, _, _ = broker.connect(
            "sub", consumer, clean_start=False, expiry_interval=60, window=10
        )
        broker.start_delivery(session)
        broker.subscribe(session, "t", SubscriptionOptions(max_qos=1))
        broker.publish(persistent(b"stored"))
        store.resolve()
        for _ in range(5):  # the commit's callback, then the pump it schedules
            await asyncio.sleep(0)
        (delivery,) = consumer.deliveries
        found, completion = broker.acknowledge(session, delivery)
        assert found and completion is store.pending is not None
        assert broker.acknowledge(session, delivery) == (False, None)
        store.pending.set_exception(OSError("disk full"))
        with pytest.raises(OSError):
            await completion

    run(body)


def test_a_transactions_topic_sends_wait_for_its_commit() -> None:
    """A JMS transaction is atomic across a crash: a NON_PERSISTENT send to a topic in it must
    not reach a subscriber before the commit that makes its persistent neighbours durable
    (else a crash shows part of it), and it honours noLocal like any publication."""
    from kittiwake.broker.destinations import Destination
    from kittiwake.broker.queue_destinations import QueueDestinations

    async def body() -> None:
        store = HeldCommitStore()
        broker = Broker(config_from_dict({}), clock=ManualClock(), store=store)
        broker.schedule_ticks(asyncio.get_running_loop())
        queues = QueueDestinations(broker)
        consumer = RecordingConsumer()
        session, _, _ = broker.connect(
            "sub", consumer, clean_start=True, expiry_interval=0, window=10
        )
        broker.start_delivery(session)
        broker.subscribe(session, "t", SubscriptionOptions(max_qos=1))
        own = RecordingConsumer()
        publisher, _, _ = broker.connect(
            "pub", own, clean_start=True, expiry_interval=0, window=10
        )
        broker.start_delivery(publisher)
        broker.subscribe(publisher, "t", SubscriptionOptions(max_qos=1, no_local=True))
        transaction = queues.begin()
        for payload, durable in ((b"np", False), (b"p", True)):
            message = Message("t", payload, qos=1, persistent=durable)
            message.origin = "pub"
            transaction.send(Destination.topic("t"), message)
        completion = queues.commit(transaction)
        assert completion is not None
        await asyncio.sleep(0.01)
        assert consumer.deliveries == [], "a transaction's send went out before its commit"
        store.resolve()
        await asyncio.wait_for(asyncio.ensure_future(completion), 5)
        await asyncio.sleep(0.01)
        assert [d.view.message.payload for d in consumer.deliveries] == [b"np", b"p"]
        assert own.deliveries == [], "noLocal: the publisher's own subscription got it"


@pytest.mark.parametrize("store_and_dispatch", [True, False], ids=["concurrent", "strict"])
def test_a_persistent_queue_send_reaches_its_consumer_before_its_commit_only_if_allowed(
    store_and_dispatch: bool,
) -> None:
    """A JMS PERSISTENT send to a queue, outside a transaction: with store-and-dispatch its
    consumer may have it while the commit is pending; strict, it waits for the commit. The
    sender's completion is the commit either way."""

    async def body() -> None:
        store = HeldCommitStore()
        config = config_from_dict({"store": {"store_and_dispatch": store_and_dispatch}})
        broker = Broker(config, clock=ManualClock(), store=store)
        broker.schedule_ticks(asyncio.get_running_loop())
        destinations = QueueDestinations(broker)
        receiver = RecordingConsumer()
        destinations.attach("orders", Consumer(receiver, window=10))
        # The first send also stores the queue's in-flight window; both wait for a commit.
        destinations.send("orders", Message("", b"first", qos=2, persistent=True))
        for _ in range(3):  # the send's commit, then (strict) the window's
            await asyncio.sleep(0.01)
            if store.pending is not None:
                store.resolve()
        await asyncio.sleep(0.01)
        assert len(receiver.deliveries) == 1
        accepted, completion = destinations.send(
            "orders", Message("", b"second", qos=2, persistent=True)
        )
        assert accepted and completion is not None
        await asyncio.sleep(0.01)
        assert len(receiver.deliveries) == (2 if store_and_dispatch else 1)
        assert not completion.done()
        store.resolve()
        await asyncio.sleep(0.01)
        assert completion.done() and completion.exception() is None
        assert len(receiver.deliveries) == 2

    run(body)


def test_nothing_goes_out_before_a_queues_larger_window_is_stored() -> None:
    """Recovery after a crash counts as many waiting entries as the stored in-flight window
    allows as possibly delivered, so a delivery beyond the stored window must wait for the
    commit that stores the larger one: every pump while that commit is pending sends
    nothing, not only the one that asked for it. A drain waits for it too, then answers."""

    async def body() -> None:
        store = HeldCommitStore()
        broker = Broker(config_from_dict({}), clock=ManualClock(), store=store)
        broker.schedule_ticks(asyncio.get_running_loop())
        destinations = QueueDestinations(broker)
        receiver = RecordingConsumer()
        destinations.send("orders", Message("", b"1", qos=2, persistent=False))
        queue = destinations.attach("orders", Consumer(receiver, window=2))
        assert destinations.pump(queue) == 0  # the window of 2 is being stored
        assert store.pending is not None
        assert destinations.pump(queue) == 0, "sent before the window was stored"
        answered: list[int] = []
        destinations.pump_then(queue, lambda: answered.append(len(receiver.deliveries)))
        assert receiver.deliveries == [] and answered == []
        store.resolve()
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(receiver.deliveries) == 1
        assert answered == [1], "the drain answered before what waited went out"

    run(body)
