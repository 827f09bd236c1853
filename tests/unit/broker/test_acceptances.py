"""The publisher's side of store-and-dispatch (DESIGN.md section 3): a QoS 1 publication whose
stored copies went out before their commit is acknowledged at the commit or once every stored
copy is accepted, whichever comes first; a failed commit still refuses a publisher whose copies
were not all accepted, and a message that must be kept (retained) waits for its commit.

The store hands out a commit future the test resolves (or fails), so the order of "commit done"
and "every copy accepted" is chosen by the test.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from held_commits import HeldCommitStore, RecordingConsumer, run

from kittiwake.broker.broker import Broker, SubscriptionOptions
from kittiwake.broker.message import Message
from kittiwake.broker.sessions import Session
from kittiwake.broker.subscription_filters import FilteringReceiver
from kittiwake.clock import ManualClock
from kittiwake.config import config_from_dict
from kittiwake.store.sqlite import SQLiteStore


def durable_broker(
    subscribers: int, store_and_dispatch: bool = True
) -> tuple[Broker, HeldCommitStore, list[tuple[Session, RecordingConsumer]]]:
    store = HeldCommitStore()
    config = config_from_dict({"store": {"store_and_dispatch": store_and_dispatch}})
    broker = Broker(config, clock=ManualClock(), store=store)
    broker.schedule_ticks(asyncio.get_running_loop())
    subs = []
    for n in range(subscribers):
        consumer = RecordingConsumer()
        session, _, _ = broker.connect(
            f"sub{n}", consumer, clean_start=False, expiry_interval=3600, window=10
        )
        broker.start_delivery(session)
        broker.subscribe(session, "t", SubscriptionOptions(max_qos=1))
        subs.append((session, consumer))
    return broker, store, subs


def accept_all(broker: Broker, session: Session, consumer: RecordingConsumer) -> None:
    sent, consumer.deliveries = consumer.deliveries, []
    for delivery in sent:
        broker.acknowledge(session, delivery)


def publish(broker: Broker, payload: bytes, retain: bool = False) -> asyncio.Future[None]:
    completion = broker.publish(Message("t", payload, qos=1, retain=retain, persistent=True))
    assert completion is not None
    return completion


def test_the_publisher_goes_once_every_stored_copy_is_accepted_before_the_commit() -> None:
    async def body() -> None:
        broker, store, subs = durable_broker(2)
        completion = publish(broker, b"m")
        await asyncio.sleep(0)
        accept_all(broker, *subs[0])
        await asyncio.sleep(0)
        assert not completion.done(), "acknowledged while a stored copy was not accepted"
        accept_all(broker, *subs[1])
        await asyncio.sleep(0)
        assert completion.done() and completion.exception() is None
        assert store.pending is not None and not store.pending.done()  # the commit still waits
        store.resolve()

    run(body)


def test_the_commit_acknowledges_a_publisher_whose_copies_were_not_accepted() -> None:
    async def body() -> None:
        broker, store, _subs = durable_broker(1)
        completion = publish(broker, b"m")
        await asyncio.sleep(0)
        assert not completion.done()
        store.resolve()
        await asyncio.sleep(0)
        assert completion.done() and completion.exception() is None

    run(body)


def test_a_failed_commit_refuses_a_publisher_whose_copies_were_not_all_accepted() -> None:
    async def body() -> None:
        broker, store, subs = durable_broker(1)
        accepted = publish(broker, b"accepted")
        await asyncio.sleep(0)
        accept_all(broker, *subs[0])
        await asyncio.sleep(0)
        assert accepted.done(), "every copy was accepted"
        # A second message in a new batch, never accepted: its commit fails.
        refused = publish(broker, b"not accepted")
        await asyncio.sleep(0)
        store.fail()
        await asyncio.sleep(0)
        assert accepted.exception() is None
        assert refused.done() and isinstance(refused.exception(), OSError)

    run(body)


def test_publications_of_one_batch_share_a_future_until_it_is_done() -> None:
    async def body() -> None:
        broker, store, subs = durable_broker(1)
        first = publish(broker, b"1")
        second = publish(broker, b"2")
        assert first is second, "one future per batch, not one per message"
        await asyncio.sleep(0)
        session, consumer = subs[0]
        broker.acknowledge(session, consumer.deliveries[0])
        assert not first.done(), "one of the batch's copies is not accepted yet"
        broker.acknowledge(session, consumer.deliveries[1])
        assert first.done()
        # A later publication joining the same pending commit gets a future of its own.
        third = publish(broker, b"3")
        assert third is not first and not third.done()
        store.resolve()
        await asyncio.sleep(0)
        assert third.done()

    run(body)


def test_a_retained_message_waits_for_its_commit() -> None:
    async def body() -> None:
        broker, store, subs = durable_broker(1)
        completion = publish(broker, b"kept", retain=True)
        await asyncio.sleep(0)
        accept_all(broker, *subs[0])
        await asyncio.sleep(0)
        assert not completion.done(), "a retained message is acknowledged only once stored"
        store.resolve()
        await asyncio.sleep(0)
        assert completion.done()

    run(body)


def test_without_store_and_dispatch_the_publisher_waits_for_the_commit() -> None:
    async def body() -> None:
        broker, store, subs = durable_broker(1, store_and_dispatch=False)
        completion = publish(broker, b"m")
        await asyncio.sleep(0)
        assert subs[0][1].deliveries == [], "persist -> acknowledge -> dispatch"
        assert completion is store.pending
        store.resolve()

    run(body)


def test_with_the_sqlite_store_only_copies_for_connected_subscribers_wait_for_acceptance(
    tmp_path: Path,
) -> None:
    """An hour's acceptance window: a copy on its way to a connected subscriber is held from
    the writer until accepted (then never written, its publisher acknowledged), while a copy
    for an absent session is written at once (its publisher waits for that commit only)."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock(), acceptance_window=3600)
        broker = Broker(config_from_dict({}), clock=ManualClock(), store=store)
        broker.schedule_ticks(asyncio.get_running_loop())
        present = RecordingConsumer()
        session, _, _ = broker.connect(
            "present", present, clean_start=False, expiry_interval=3600, window=10
        )
        broker.start_delivery(session)
        broker.subscribe(session, "t", SubscriptionOptions(max_qos=1))
        absent, _, _ = broker.connect(
            "absent", RecordingConsumer(), clean_start=False, expiry_interval=3600, window=10
        )
        broker.subscribe(absent, "u", SubscriptionOptions(max_qos=1))
        broker.disconnect(absent, publish_will=False)
        settled = store.commit()
        if settled is not None:
            await asyncio.wait_for(settled, 10)
        accepted = broker.publish(Message("t", b"a", qos=1, persistent=True))
        assert accepted is not None
        for _ in range(3):
            await asyncio.sleep(0)
        assert not accepted.done(), "neither accepted nor written yet"
        accept_all(broker, session, present)
        await asyncio.sleep(0)
        assert accepted.done() and accepted.exception() is None
        stored = broker.publish(Message("u", b"b", qos=1, persistent=True))
        assert stored is not None
        await asyncio.wait_for(stored, 10)  # written at once: no hour's wait
        assert store.cancelled_writes == 1
        store.close()

    run(body)


def test_a_stored_copy_goes_in_flight_during_its_publish_with_its_mark_stored(
    tmp_path: Path,
) -> None:
    """A stored QoS 1 copy for a connected subscriber with nothing queued ahead and room in
    its window is sent while its publication is routed (no pump round), its entry stored
    with the delivery's in-flight mark; one that finds the window full waits in the queue
    and goes once the window opens. A restart finds both entries, the one sent as sent."""

    async def body() -> None:
        store = SQLiteStore(tmp_path, clock=ManualClock())
        broker = Broker(config_from_dict({}), clock=ManualClock(), store=store)
        broker.schedule_ticks(asyncio.get_running_loop())
        consumer = RecordingConsumer()
        session, _, _ = broker.connect(
            "sub", consumer, clean_start=False, expiry_interval=3600, window=1
        )
        broker.start_delivery(session)
        broker.subscribe(session, "t", SubscriptionOptions(max_qos=1))
        first = broker.publish(Message("t", b"1", qos=1, persistent=True))
        assert [d.entry.message.payload for d in consumer.deliveries] == [b"1"]
        assert session.queue.count == 0
        second = broker.publish(Message("t", b"2", qos=1, persistent=True))
        assert session.queue.count == 1, "the window is full: the second copy waits"
        assert first is not None and second is not None
        await asyncio.wait_for(second, 10)
        store.close()
        recovered = SQLiteStore(tmp_path, clock=ManualClock()).recover()
        states = {
            recovered.messages[r.message_id].payload: (r.state, r.delivery_id)
            for r in recovered.queued
        }
        assert states == {b"1": ("sent", consumer.deliveries[0].id), b"2": ("queued", 0)}

    run(body)


def test_a_copy_queued_behind_a_full_window_goes_when_the_window_opens() -> None:
    async def body() -> None:
        broker, store, subs = durable_broker(1)
        session, consumer = subs[0]
        session.set_window(1)
        publish(broker, b"1")
        publish(broker, b"2")
        assert [d.entry.message.payload for d in consumer.deliveries] == [b"1"]
        accept_all(broker, session, consumer)
        await asyncio.sleep(0)
        assert [d.entry.message.payload for d in consumer.deliveries] == [b"2"]
        store.resolve()

    run(body)


def test_a_copy_accepted_as_it_is_handed_over_still_counts_for_the_early_answer() -> None:
    """A receiver that settles a copy the moment it is handed one (a noLocal or selector filter
    refusing it) accepts it while its publication is still being routed, before any watch
    exists: the publisher still goes before the commit once every copy is accepted."""

    async def body() -> None:
        broker, store, subs = durable_broker(2)
        (refusing, _), (taking, consumer) = subs
        refusing.consumer.receiver = FilteringReceiver(
            refusing.consumer.receiver, no_local_origin="me"
        )
        message = Message("t", b"x", qos=1, persistent=True)
        message.origin = "me"
        done = broker.publish(message)
        assert done is not None and not done.done()
        assert refusing.queue.count == 0 and not refusing.consumer.unsettled
        accept_all(broker, taking, consumer)
        await asyncio.sleep(0)
        assert done.done(), "every stored copy is accepted: the publisher goes before the commit"
        store.resolve()

    run(body)


def test_a_publication_whose_only_copy_is_accepted_as_it_is_handed_over_goes_at_once() -> None:
    async def body() -> None:
        broker, store, subs = durable_broker(1)
        ((refusing, _),) = subs
        refusing.consumer.receiver = FilteringReceiver(
            refusing.consumer.receiver, no_local_origin="me"
        )
        message = Message("t", b"x", qos=1, persistent=True)
        message.origin = "me"
        done = broker.publish(message)
        await asyncio.sleep(0)
        assert done is not None and done.done()
        store.resolve()

    run(body)
