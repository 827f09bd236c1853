"""A publisher's run of plain QoS 1 PUBLISHes is taken by the broker at once
(Broker.publish_run): every client must see exactly what it would see were the same read's
PUBLISHes taken one by one. Each scenario runs twice on twin brokers, once through the
server's decoder (a PublishRun) and once through a decoder that makes no runs (a Publish
each, through the one-by-one path), and every packet each client receives, in order, after
every step, must be the same, as must the broker's counts. (Per direction of the protocol:
the PUBLISHes a client gets, and the answers it gets, each in order. How the two interleave
on one connection, a publisher subscribed to its own topic, is no rule of MQTT's, and the
run writes its PUBACKs together after its deliveries, as the run path always has.)

The scenarios reach the run's branches: copies that go at once and then queue, a queue that
reaches the flow-control depth within the run (publications held from the right one on, in
batches), several subscribers reaching it at different points, and the shapes that the run
leaves to the one-by-one path (an at-most-once subscriber, a noLocal one, a queue that would
not take the whole run, a shared group). No timing is involved.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from connection_harness import Wire, turns

from kittiwake.broker.broker import Broker
from kittiwake.broker.message import Message
from kittiwake.broker.store import MemoryStore
from kittiwake.clock import ManualClock
from kittiwake.config import config_from_dict
from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.packets import Packet, PubAck, Publish, Subscribe, SubscriptionRequest


@dataclass
class Scenario:
    # (client id, MQTT version, topic filter, max QoS, noLocal)
    subscribers: list[tuple[str, int, str, int, bool]]
    limits: dict[str, int] = field(default_factory=dict)
    # Publications per publisher read, read after read.
    reads: list[int] = field(default_factory=lambda: [30])
    # Subscribers acknowledge what they got after every read.
    acknowledge: bool = True
    # The publisher subscribes to its own topic too.
    publisher_subscribes: bool = False
    # The broker's tick runs after every read (the broker-wide bound is checked there).
    tick: bool = False


SCENARIOS = {
    "at once then queued": Scenario([("s", 4, "t", 1, False)], {"max_inflight": 5}),
    "depth reached mid-run": Scenario(
        [("s", 4, "t", 1, False)],
        {"max_inflight": 4, "flow_control_depth": 7},
        reads=[20, 15, 9],
    ),
    "depth reached, nobody acknowledges": Scenario(
        [("s", 4, "t", 1, False)],
        {"max_inflight": 3, "flow_control_depth": 10},
        reads=[12, 25, 4],
        acknowledge=False,
    ),
    "subscribers at the depth at different points": Scenario(
        [("a", 4, "t", 1, False), ("b", 5, "t", 2, False), ("c", 4, "#", 1, False)],
        {"max_inflight": 6, "flow_control_depth": 9},
        reads=[5, 14, 30],
    ),
    "byte depth": Scenario(
        [("s", 4, "t", 1, False)],
        {"max_inflight": 2, "flow_control_bytes": 60},
        reads=[10, 10],
    ),
    "broker-wide bound": Scenario(
        [("s", 4, "t", 1, False), ("c", 4, "t", 1, False)],
        {"max_inflight": 2, "max_total_queued_bytes": 150},
        reads=[12, 10, 10, 3],
        tick=True,
    ),
    "publisher among the subscribers": Scenario(
        [("s", 4, "t", 1, False)],
        {"max_inflight": 3, "flow_control_depth": 8},
        reads=[12, 12],
        publisher_subscribes=True,
    ),
    "at-most-once subscriber (one by one)": Scenario(
        [("s", 4, "t", 1, False), ("z", 4, "t", 0, False)], {"max_inflight": 4}
    ),
    "noLocal subscriber (one by one)": Scenario(
        [("s", 5, "t", 1, True)], {"max_inflight": 4}, publisher_subscribes=True
    ),
    "queue too short for the run (one by one)": Scenario(
        [("s", 4, "t", 1, False)],
        {"max_inflight": 2, "max_queued_messages": 9, "flow_control_depth": 4},
        reads=[6, 12],
        acknowledge=False,
    ),
    "shared group (one by one)": Scenario(
        [("s", 4, "t", 1, False), ("g", 4, "$share/g/t", 1, False)], {"max_inflight": 4}
    ),
}


def _directions(packets: list[Packet]) -> tuple[list[Packet], list[Packet]]:
    """A client's packets as (PUBLISHes, everything else), each in order."""
    publishes = [p for p in packets if isinstance(p, Publish)]
    return publishes, [p for p in packets if not isinstance(p, Publish)]


def transcript(scenario: Scenario, runs: bool) -> list[object]:
    """Every packet each client received after every step, and the broker's counts."""
    seen: list[object] = []

    async def main() -> None:
        broker = Broker(
            config_from_dict({"limits": scenario.limits}), clock=ManualClock(), store=MemoryStore()
        )
        cancel = broker.schedule_ticks(asyncio.get_running_loop())
        try:
            subs = []
            for client_id, version, topic_filter, qos, no_local in scenario.subscribers:
                sub = Wire(broker, version, call_soon=asyncio.get_running_loop().call_soon)
                sub.connect(client_id)
                sub.send(Subscribe(1, [SubscriptionRequest(topic_filter, qos, no_local=no_local)]))
                sub.received()
                subs.append(sub)
            pub = Wire(broker, 4, call_soon=asyncio.get_running_loop().call_soon)
            pub.connect("pub")
            if not runs:
                pub._inbound = PacketDecoder(broker.config.limits.max_packet_size)
            clients = [pub, *subs]
            if scenario.publisher_subscribes:
                pub.send(Subscribe(1, [SubscriptionRequest("t", 1)]))
                pub.received()
            packet_id = 0
            for count in scenario.reads:
                frames = []
                for _ in range(count):
                    packet_id += 1
                    payload = b"m%d" % packet_id + b"." * (packet_id % 4)
                    frames.append(encode(Publish("t", payload, 1, False, False, packet_id), 4))
                pub.send_bytes(b"".join(frames))
                if scenario.tick:
                    broker.tick()
                for _ in range(3):
                    await turns()
                    got = [client.received() for client in clients]
                    seen.append([_directions(packets) for packets in got])
                    if not scenario.acknowledge:
                        continue
                    for client, packets in zip(clients, got, strict=True):
                        acks = [
                            encode(PubAck(p.packet_id), client.version)
                            for p in packets
                            if isinstance(p, Publish) and p.qos == 1 and p.packet_id
                        ]
                        if acks and client is not pub:
                            client.send_bytes(b"".join(acks))
            stats = broker.stats
            seen.append((stats.messages_received, stats.messages_sent, stats.messages_dropped))
            seen.append([broker.sessions[c[0]].queue.count for c in scenario.subscribers])
        finally:
            cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
    return seen


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_run_is_seen_by_every_client_as_one_by_one(name: str) -> None:
    scenario = SCENARIOS[name]
    as_run = transcript(scenario, runs=True)
    one_by_one = transcript(scenario, runs=False)
    assert as_run == one_by_one
    # The scenario did something: publications went out and were answered.
    steps: list[list[tuple[list[Packet], list[Packet]]]] = one_by_one[:-2]  # type: ignore[assignment]
    assert any(publishes for step in steps for publishes, _ in step)
    assert any(
        isinstance(p, PubAck) for step in steps for _, answers in step for p in answers
    )


def _failing_mid_run(runs: bool) -> tuple[list[bytes], int, int]:
    """A store error on a run's third publication: what the subscriber got, and the counts."""
    seen: tuple[list[bytes], int, int] = ([], 0, 0)

    async def main() -> None:
        nonlocal seen
        store = MemoryStore()
        broker = Broker(config_from_dict({}), clock=ManualClock(), store=store)
        loop = asyncio.get_running_loop()
        cancel = broker.schedule_ticks(loop)
        try:
            sub = Wire(broker, 4, call_soon=loop.call_soon)
            sub.connect("sub")
            sub.send(Subscribe(1, [SubscriptionRequest("t", 1)]))
            sub.received()
            pub = Wire(broker, 4, call_soon=loop.call_soon)
            pub.connect("pub")
            if not runs:
                pub._inbound = PacketDecoder(broker.config.limits.max_packet_size)
            journal = store.journal
            calls = 0

            def failing(message: Message) -> None:
                nonlocal calls
                calls += 1
                if calls == 3:
                    raise RuntimeError("the store failed")
                journal(message)

            store.journal = failing  # type: ignore[method-assign]
            frames = [encode(Publish("t", b"m%d" % i, 1, False, False, i), 4) for i in range(1, 6)]
            with pytest.raises(RuntimeError):
                pub.send_bytes(b"".join(frames))
            await turns()
            got = [p.payload for p in sub.received() if isinstance(p, Publish)]
            seen = (got, broker.stats.messages_received, broker.stats.messages_sent)
        finally:
            cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
    return seen


def test_an_error_mid_run_still_delivers_what_was_taken_before_it() -> None:
    """One by one, the publications before the failing one are routed before the error; a
    run must not keep them (counted and journalled) from their subscribers."""
    as_run = _failing_mid_run(runs=True)
    assert as_run == _failing_mid_run(runs=False)
    assert as_run[0] == [b"m1", b"m2"]
