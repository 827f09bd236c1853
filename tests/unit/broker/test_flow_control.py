"""Producer flow control's rules, with a manual clock: a congested subscriber holds publishers
back while it makes progress; one that makes none for stalled_subscriber_timeout stops holding
anyone, its queue fills to its limit (counted), and it holds them again once it moves; bytes
count as well as messages; the broker-wide bound holds every publisher.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from held_commits import RecordingConsumer, run

from kittiwake.broker.broker import Broker, SubscriptionOptions
from kittiwake.broker.flow_control import RELEASE_BATCH
from kittiwake.broker.message import Message
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.broker.sessions import Session
from kittiwake.clock import ManualClock
from kittiwake.config import config_from_dict

DEPTH = 4
TIMEOUT = 5.0


def subscriber(**limits: Any) -> tuple[Broker, ManualClock, Session, RecordingConsumer]:
    """A connected QoS 1 subscriber on "t" with a window of 1 (nothing queued yet)."""
    clock = ManualClock()
    settings = {
        "flow_control_depth": DEPTH,
        "stalled_subscriber_timeout": TIMEOUT,
        "max_queued_messages": 20,
    }
    settings.update(limits)
    broker = Broker(config_from_dict({"limits": settings}), clock=clock)
    broker.pumps.loop = broker.flow.loop = asyncio.get_running_loop()
    consumer = RecordingConsumer()
    session, _, _ = broker.connect("sub", consumer, clean_start=True, expiry_interval=0, window=1)
    broker.start_delivery(session)
    broker.subscribe(session, "t", SubscriptionOptions(max_qos=1))
    return broker, clock, session, consumer


def publish(broker: Broker, payload: bytes = b"m") -> asyncio.Future[None] | None:
    return broker.publish(Message("t", payload, qos=1, persistent=False))


def bury(broker: Broker, session: Session) -> asyncio.Future[None]:
    """Publish until the subscriber is congested; returns what the last publisher waits on."""
    for _ in range(100):
        waiting = publish(broker)
        if waiting is not None:
            return waiting
    raise AssertionError(f"never congested: {session.queue}")


async def settle(broker: Broker, session: Session, consumer: RecordingConsumer, count: int) -> None:
    """The subscriber acknowledges ``count`` deliveries, one at a time, as they come."""
    for _ in range(count):
        for _ in range(100):
            if consumer.deliveries:
                break
            await asyncio.sleep(0)
        broker.acknowledge(session, consumer.deliveries.pop(0))
        await asyncio.sleep(0)


def test_a_progressing_subscriber_holds_publishers_past_the_timeout() -> None:
    async def body() -> None:
        broker, clock, session, consumer = subscriber()
        waiting = bury(broker, session)
        for _ in range(4):  # four timeouts, each with some progress (not enough to drain)
            broker.tick()
            clock.advance(TIMEOUT - 1)
            await settle(broker, session, consumer, 1)
            publish(broker)
            broker.tick()
        assert not waiting.done(), "a slow but progressing subscriber stopped holding back"
        assert broker.stats.subscriber_stalls == 0

    run(body)


def test_a_subscriber_without_progress_stops_holding_publishers_and_its_queue_policy_applies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        broker, clock, session, consumer = subscriber()
        waiting = bury(broker, session)
        broker.tick()  # the watch starts
        clock.advance(TIMEOUT - 0.1)
        broker.tick()
        assert not waiting.done()
        clock.advance(0.2)
        with caplog.at_level(logging.WARNING, "kittiwake.broker.flow_control"):
            broker.tick()
        await asyncio.sleep(0)
        assert waiting.done(), "a stuck subscriber still holds its publishers"
        assert broker.stats.subscriber_stalls == 1
        assert broker.stats.stalled_subscribers == 1
        assert "made no progress" in caplog.text
        # Publishers go on at once; the queue fills to its limit and rejects the rest.
        for _ in range(30):
            assert publish(broker) is None
        assert session.queue.count == 20
        rejected = session.queue.counters.rejected
        assert rejected > 0
        caplog.clear()
        with caplog.at_level(logging.WARNING, "kittiwake.broker.flow_control"):
            broker.tick()
        assert f"{rejected} messages dropped since it stalled" in caplog.text
        # It reads again: it is making progress, and holds publishers back again.
        await settle(broker, session, consumer, 1)
        broker.tick()
        assert broker.stats.stalled_subscribers == 0
        assert publish(broker) is not None

    run(body)


def test_the_stall_timeout_counts_from_the_last_progress() -> None:
    async def body() -> None:
        broker, clock, session, consumer = subscriber()
        waiting = bury(broker, session)
        broker.tick()
        clock.advance(TIMEOUT - 1)
        await settle(broker, session, consumer, 1)
        publish(broker)
        broker.tick()
        clock.advance(TIMEOUT - 1)  # 2 * TIMEOUT - 2 since congested, TIMEOUT - 1 since progress
        broker.tick()
        assert not waiting.done()
        clock.advance(1.5)
        broker.tick()
        await asyncio.sleep(0)
        assert waiting.done()

    run(body)


def test_bytes_congest_a_subscriber_before_its_message_count_does() -> None:
    async def body() -> None:
        broker, _clock, session, _consumer = subscriber(
            flow_control_depth=1000, flow_control_bytes=10_000, max_queued_bytes=100_000
        )
        held = None
        for _ in range(20):
            held = publish(broker, b"x" * 1000)
            if held is not None:
                break
        assert held is not None, "bytes never engaged flow control"
        assert session.queue.count < 1000
        assert 10_000 <= session.queue.bytes < 100_000

    run(body)


def test_the_broker_wide_bound_holds_every_publisher() -> None:
    async def body() -> None:
        broker, _clock, session, consumer = subscriber(
            flow_control_depth=0, flow_control_bytes=0, max_total_queued_bytes=5_000
        )
        for _ in range(6):
            assert publish(broker, b"x" * 1000) is None
        broker.tick()
        waiting = publish(broker, b"x" * 1000)
        assert waiting is not None, "over the broker-wide bound, yet not held back"
        assert broker.stats.total_bound_engaged == 1
        await settle(broker, session, consumer, 6)
        broker.tick()
        await asyncio.sleep(0)
        assert waiting.done()
        assert publish(broker, b"x") is None

    run(body)


def test_a_subscriber_that_leaves_while_stalled_is_forgotten() -> None:
    async def body() -> None:
        broker, clock, session, _consumer = subscriber()
        bury(broker, session)
        broker.tick()
        clock.advance(TIMEOUT + 1)
        broker.tick()
        assert broker.stats.stalled_subscribers == 1
        broker.disconnect(session, publish_will=False)
        broker.tick()
        assert broker.stats.stalled_subscribers == 0
        assert not broker.flow._watched

    run(body)


def test_jms_queue_bytes_count_toward_the_broker_wide_bound() -> None:
    """A JMS queue nobody consumes holds memory like a session's queue does: past the bound
    every QoS 1/2 publisher waits, and goes again once the queue is purged."""

    async def body() -> None:
        broker, _clock, _session, _consumer = subscriber(
            flow_control_depth=0, flow_control_bytes=0, max_total_queued_bytes=5_000
        )
        destinations = QueueDestinations(broker)
        assert publish(broker, b"x") is None  # in flight: the subscriber's window is full
        for _ in range(6):
            assert destinations.send("orders", Message("orders", b"x" * 1000))[0]
        broker.tick()
        waiting = publish(broker, b"x")
        assert waiting is not None, "JMS queue bytes were not counted"
        assert destinations.purge("orders") == 6
        broker.tick()
        await asyncio.sleep(0)
        assert waiting.done()

    run(body)


def test_the_running_total_is_the_sum_of_every_queues_bytes() -> None:
    """The bound reads a total the queues keep as they change, not a walk over them: after
    every kind of change it equals what a walk would find."""

    async def body() -> None:
        broker, _clock, session, consumer = subscriber(
            flow_control_depth=0, flow_control_bytes=0, max_queued_messages=5,
            queue_full_policy="discard_oldest",
        )
        destinations = QueueDestinations(broker)

        def walked() -> int:
            queues = [s.queue for s in broker.sessions.values()]
            queues += [g.queue for g in broker.shared_groups.values()]
            queues += list(destinations.router.queues.values())
            return sum(q.bytes for q in queues)

        def check() -> None:
            assert broker.queued_bytes() == walked()

        other, _, _ = broker.connect("other", RecordingConsumer(), clean_start=True,
                                     expiry_interval=0, window=1)
        broker.start_delivery(other)
        broker.subscribe(other, "$share/g/t", SubscriptionOptions(max_qos=1))
        for size in range(1, 12):  # past max_queued_messages: the oldest are discarded
            publish(broker, b"x" * size)
            destinations.send("orders", Message("orders", b"y" * size))
        check()
        assert broker.queued_bytes() > 0
        await settle(broker, session, consumer, 2)
        check()
        broker.unsubscribe(other, "$share/g/t")  # the group's last member: its queue goes
        check()
        destinations.delete("orders")
        check()
        broker.disconnect(session, publish_will=False)  # expiry 0: the session ends
        check()
        assert broker.queued_bytes() == 0

    run(body)


def test_held_acknowledgements_go_back_a_batch_at_a_time_oldest_first() -> None:
    """Past the depth, publications are held on one future per RELEASE_BATCH; the oldest
    batch goes once the queue has room for a batch below the depth, the rest later, not all
    at half (which would stop every publisher until then)."""

    async def body() -> None:
        depth = 4 * RELEASE_BATCH
        broker, _, session, consumer = subscriber(
            flow_control_depth=depth, max_queued_messages=10 * depth
        )
        held = [publish(broker) for _ in range(depth + 1)]  # one in flight, depth queued
        waiting = held[-1]
        assert waiting is not None and held[-2] is None, "not congested at the depth"
        first = [waiting] + [publish(broker) for _ in range(RELEASE_BATCH - 1)]
        second = [publish(broker) for _ in range(RELEASE_BATCH)]
        assert {id(w) for w in first} == {id(waiting)}, "a batch shares one future"
        assert len({id(w) for w in second}) == 1 and second[0] is not waiting
        queued = session.queue.count
        # Just short of a batch's room below the depth: nobody goes yet.
        await settle(broker, session, consumer, queued - (depth - RELEASE_BATCH) - 1)
        assert not waiting.done()
        await settle(broker, session, consumer, 1)
        assert session.queue.count == depth - RELEASE_BATCH
        assert waiting.done(), "the oldest batch was not released with room for it"
        assert second[0] is not None and not second[0].done(), "a younger batch went early"
        await settle(broker, session, consumer, session.queue.count - depth // 2)
        assert second[0].done(), "everyone goes at half the depth"
        assert session.drain_waiter is None

    run(body)
