"""A publisher's read of plain QoS 1 PUBLISHes on one topic reaches the connection as one
PublishRun (the server's decoder): each publication is still published on its own and
answered in order, exactly as the PUBLISHes one by one would be; only the topic's checks are
made once, and the PUBACKs that need not wait leave in one write.

The store is a :class:`ControlledStore` where a commit must be pending; no timing is involved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from connection_harness import ControlledStore, Wire, turns

from kittiwake.broker.broker import Broker
from kittiwake.broker.message import Message
from kittiwake.broker.store import MemoryStore
from kittiwake.clock import ManualClock
from kittiwake.config import config_from_dict
from kittiwake.mqtt.codec import encode
from kittiwake.mqtt.packets import (
    Packet,
    PubAck,
    Publish,
    PublishRun,
    Subscribe,
    SubscriptionRequest,
)


def run(body: Callable[[ControlledStore, Broker], Awaitable[None]], **config: object) -> None:
    async def main() -> None:
        store = ControlledStore()
        broker = Broker(config_from_dict(config), clock=ManualClock(), store=store)
        cancel = broker.schedule_ticks(asyncio.get_running_loop())
        try:
            await body(store, broker)
        finally:
            cancel()

    asyncio.run(asyncio.wait_for(main(), 10))


def flood(topic: str, ids: range, version: int = 4) -> bytes:
    """One read of plain QoS 1 PUBLISHes (what the server's decoder makes one run of)."""
    return b"".join(
        encode(Publish(topic, b"m%d" % i, 1, False, False, i), version) for i in ids
    )


def acks(packets: list[Packet]) -> list[int]:
    return [p.packet_id for p in packets if isinstance(p, PubAck)]


def payloads(packets: list[Packet]) -> list[bytes]:
    return [p.payload for p in packets if isinstance(p, Publish)]


def test_a_run_is_delivered_and_acknowledged_in_order() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        sub = Wire(broker, 4)
        sub.connect("sub")
        sub.send(Subscribe(1, [SubscriptionRequest("t/#", 1)]))
        sub.received()
        pub = Wire(broker, 4)
        pub.connect("pub")
        before = pub.connection.traffic.messages_received
        pub.send_bytes(flood("t/a", range(1, 151)))
        await turns()
        assert acks(pub.received()) == list(range(1, 151))
        assert pub.connection.traffic.messages_received - before == 150
        # The window (100) first, the rest as it is acknowledged.
        first = sub.received()
        assert payloads(first) == [b"m%d" % i for i in range(1, 101)]
        sub.send_bytes(b"".join(encode(PubAck(p.packet_id), 4) for p in first))  # type: ignore[union-attr]
        await turns()
        assert payloads(sub.received()) == [b"m%d" % i for i in range(101, 151)]

    run(body)


def test_a_runs_answers_wait_behind_an_answer_queued_before_it() -> None:
    """The first publication waits for a pending commit; the run that follows (the store idle
    again, the commit's callbacks not run yet) needs no commit, yet is answered after it."""

    async def body(store: ControlledStore, broker: Broker) -> None:
        sub = Wire(broker, 4)
        sub.connect("sub")
        sub.send(Subscribe(1, [SubscriptionRequest("t", 1)]))
        sub.received()
        pub = Wire(broker, 4)
        pub.connect("pub")
        store.hold()
        pub.send(Publish("t", b"first", 1, False, False, 1))
        assert acks(pub.received()) == []
        store.resolve()  # durable; its callbacks have not run yet
        pub.send_bytes(flood("t", range(2, 6)))
        pub.send_bytes(flood("t", range(6, 9)))
        await turns()
        assert acks(pub.received()) == list(range(1, 9))

    run(body)


def test_a_run_while_the_store_is_busy_is_answered_at_its_commit() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        sub = Wire(broker, 4)
        sub.connect("sub")
        sub.send(Subscribe(1, [SubscriptionRequest("t", 1)]))
        pub = Wire(broker, 4)
        pub.connect("pub")
        store.hold()
        pub.send_bytes(flood("t", range(1, 6)))
        await turns()
        assert acks(pub.received()) == []
        store.resolve()
        await turns()
        assert acks(pub.received()) == [1, 2, 3, 4, 5]

    run(body)


def test_a_run_on_a_denied_topic_is_refused_publication_by_publication() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        sub = Wire(broker, 4)
        sub.connect("sub")
        sub.send(Subscribe(1, [SubscriptionRequest("#", 1)]))
        sub.received()
        pub = Wire(broker, 4)
        pub.connect("pub")
        pub.send_bytes(flood("deny/x", range(1, 4)) + flood("ok", range(4, 6)))
        await turns()
        assert acks(pub.received()) == [1, 2, 3, 4, 5]  # 3.1.1: refused is answered too
        assert payloads(sub.received()) == [b"m4", b"m5"]

    run(body, auth={"publish_deny": ["deny/#"]})


def test_a_run_handed_over_alone_is_published_whole() -> None:
    """As held input is: through ``handle``, not a read."""

    async def body(store: ControlledStore, broker: Broker) -> None:
        sub = Wire(broker, 4)
        sub.connect("sub")
        sub.send(Subscribe(1, [SubscriptionRequest("t", 1)]))
        sub.received()
        pub = Wire(broker, 4)
        pub.connect("pub")
        pub.connection.handle(PublishRun("t", [7, 8], [b"a", b"b"]))
        await turns()
        assert acks(pub.received()) == [7, 8]
        assert payloads(sub.received()) == [b"a", b"b"]

    run(body)


def test_a_publisher_subscribed_to_its_own_flood_gets_every_copy_and_every_answer() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        pub = Wire(broker, 4)
        pub.connect("pub")
        pub.send(Subscribe(1, [SubscriptionRequest("t", 1)]))
        pub.received()
        pub.send_bytes(flood("t", range(1, 11)))
        await turns()
        packets = pub.received()
        assert acks(packets) == list(range(1, 11))
        assert payloads(packets) == [b"m%d" % i for i in range(1, 11)]

    run(body)



def test_a_dispatch_run_reaches_the_subscriber_in_queue_order_whatever_its_shape() -> None:
    """What waited behind a full window goes out as one dispatch run (one write): plain first
    attempts spliced, and between them what deliver() sends its own way (another topic, a
    payload of another size, a retained copy, an MQTT 5 subscriber), in queue order, each
    under a packet id of its own, every one settled by its PUBACK."""

    async def body(store: ControlledStore, broker: Broker) -> None:
        subs = []
        for version in (4, 5):
            sub = Wire(broker, version)
            sub.connect(f"sub{version}")
            sub.send(Subscribe(1, [SubscriptionRequest("t/#", 1, retain_as_published=True)]))
            sub.received()
            subs.append(sub)
        pub = Wire(broker, 4)
        pub.connect("pub")
        pub.send_bytes(flood("t/a", range(1, 101)))  # fills both windows
        packets = []
        for i in range(101, 161):
            topic = "t/b" if i % 7 == 0 else "t/a"
            payload = b"x" * (i % 5) if i % 11 == 0 else b"m%d" % i
            packets.append(Publish(topic, payload, 1, i % 13 == 0, False, i))
        pub.send_bytes(b"".join(encode(p, 4) for p in packets))
        await turns()
        for sub in subs:
            # Live copies carry RETAIN only as published to MQTT 5 (Retain As Published).
            expected = [(p.topic, p.payload, p.retain and sub.version == 5) for p in packets]
            session = broker.sessions[sub.connection.client_id]
            assert session.queue.count == 60
            first = [p for p in sub.received() if isinstance(p, Publish)]
            assert [p.payload for p in first] == [b"m%d" % i for i in range(1, 101)]
            writes = len(sub.transport.written)
            sub.send_bytes(b"".join(encode(PubAck(p.packet_id), sub.version) for p in first))  # type: ignore[arg-type]
            await turns()
            assert len(sub.transport.written) > writes
            rest = [p for p in sub.received() if isinstance(p, Publish)]
            assert [(sub.topic_of(p), p.payload, p.retain) for p in rest] == expected
            ids = [p.packet_id for p in rest]
            assert len(set(ids)) == 60 and not set(ids) & {p.packet_id for p in first}
            assert not any(p.dup for p in rest)
            sub.send_bytes(b"".join(encode(PubAck(i), sub.version) for i in ids))  # type: ignore[arg-type]
            await turns()
            assert not session.inflight and not session.queue.count

    run(body)


@pytest.mark.parametrize("one_by_one", [False, True])
def test_a_publication_failing_mid_run_stops_the_count_where_one_by_one_stops(
    one_by_one: bool,
) -> None:
    """The received count is of publications taken, run or not: an internal error on the
    second leaves two counted (the first, and the one that failed), not the whole run. (The
    error is the store's, journalling the second: a step every publication takes, whether the
    broker takes it alone or with its run.)"""
    store = MemoryStore()
    broker = Broker(config_from_dict({}), clock=ManualClock(), store=store)
    publisher = Wire(broker, 4)
    publisher.connect("pub")
    real = store.journal
    calls = 0

    def failing(message: Message) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("boom")
        real(message)

    store.journal = failing  # type: ignore[method-assign]
    packets = [encode(Publish("t", b"x", 1, False, False, i), 4) for i in range(1, 6)]
    before = publisher.connection.traffic.messages_received
    with pytest.raises(RuntimeError):
        if one_by_one:  # a read each: no run
            for packet in packets:
                publisher.send_bytes(packet)
        else:
            publisher.send_bytes(b"".join(packets))
    assert publisher.connection.traffic.messages_received - before == 2
