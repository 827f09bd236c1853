"""Flow control under a QoS 1 fan-in flood, in-process and deterministic: N publishers (an
in-flight window each) -> 1 subscriber (the broker's window to it), driven with bytes in rounds.
Each round every publisher sends what its window allows (one read), the subscriber acknowledges
everything it was sent (one read), then the loop runs.

The subscriber takes one window a round, so what differs between versions of the flow-control
rule is how deep the queue stands (what a message waits behind: the flood's latency, in
messages) and in how many rounds every publisher was blocked (on a socket, rounds in which only
the subscriber's round trip gives the loop work: it idles in between).

``--durable`` makes the subscriber's session persistent on the SQLite store (a temporary
directory) with an acceptance window far longer than the run, so no held batch is committed
before its copies are accepted: a publisher is acknowledged only as its copies' acceptances
allow (store-and-dispatch's early answer), whatever the machine's speed.

    python bench/flow_model.py                       # 10 -> 1, windows 100, default depth
    python bench/flow_model.py --depth 300 --publishers 4
    python bench/flow_model.py --durable             # persistent subscriber, SQLite store
    python bench/flow_model.py --durable --one-turn  # every publisher's read in one loop turn
    KITTIWAKE_SRC=/other/checkout/src python bench/flow_model.py   # another version's rule
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(
    0, os.environ.get("KITTIWAKE_SRC") or str(Path(__file__).resolve().parent.parent / "src")
)

from kittiwake.broker.broker import Broker
from kittiwake.broker.store import MemoryStore, Store
from kittiwake.config import config_from_dict
from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.connection import MQTTConnection
from kittiwake.mqtt.packets import (
    Connect,
    Packet,
    PubAck,
    Publish,
    Subscribe,
    SubscriptionRequest,
)

VERSION = 4
PAYLOAD = b"x" * 64


class KeepingTransport:
    """Keeps what the connection writes, for the client side to decode."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def write_backlog(self) -> int:
        return 0


class Client:
    """One connection: reads fed as the asyncio shell feeds them, writes decoded back."""

    def __init__(self, broker: Broker, client_id: str, clean_start: bool = True) -> None:
        self.transport = KeepingTransport()
        self.connection = MQTTConnection(
            broker, self.transport, client_id, call_soon=asyncio.get_running_loop().call_soon
        )
        self.broker = broker
        self.inbound = PacketDecoder(broker.config.limits.max_packet_size)
        self.outbound = PacketDecoder(broker.config.limits.max_packet_size)
        self.outbound.protocol_version = VERSION
        self.read([Connect(client_id, protocol_version=VERSION, clean_start=clean_start)])
        self.take()

    def read(self, packets: list[Packet]) -> None:
        data = b"".join(encode(p, VERSION) for p in packets)
        for packet in self.inbound.feed(data):
            self.connection.handle(packet)
        self.broker.pumps.run()

    def take(self) -> list[Packet]:
        data = bytes(self.transport.written)
        self.transport.written.clear()
        return self.outbound.feed(data)


def make_store(durable: bool, acceptance_window: float = 3600.0) -> Store:
    if not durable:
        return MemoryStore()
    from kittiwake.store.sqlite import SQLiteStore

    return SQLiteStore(tempfile.mkdtemp(prefix="kw-flow-"), acceptance_window=acceptance_window)


async def settled(broker: Broker) -> None:
    """Wait for the store to have written everything so far."""
    commit = broker.store.commit()
    while commit is not None and not commit.done():
        await asyncio.sleep(0.001)
        commit = broker.store.commit()


async def flood(
    publishers: int,
    window: int,
    depth: int,
    messages: int,
    durable: bool = False,
    one_turn: bool = False,
    acceptance_window: float = 3600.0,
) -> str:
    limits = {"flow_control_depth": depth, "max_inflight": 100, "max_queued_messages": 1_000_000}
    store = make_store(durable, acceptance_window)
    broker = Broker(config_from_dict({"limits": limits}), store=store)
    cancel = broker.schedule_ticks(asyncio.get_running_loop())
    sub = Client(broker, "sub", clean_start=not durable)
    sub.read([Subscribe(1, [SubscriptionRequest("bench/flow", 1)])])
    await settled(broker)  # the persistent session's CONNACK and SUBACK wait for its commit
    sub.take()
    queue = sub.connection.session.queue  # type: ignore[union-attr]
    pubs = [Client(broker, f"pub{i}") for i in range(publishers)]
    unacknowledged = [0] * publishers
    last_id = [0] * publishers
    sent = received = rounds = blocked = 0
    started = time.process_time()
    depths: list[int] = []
    # Rounds from each copy's publication to its acceptance (the subscriber acknowledges in
    # the round it receives): how long a durable copy must stay cancellable, in rounds.
    waits: list[int] = []
    while received < messages and rounds < 100 * messages:
        rounds += 1
        sending = False
        for i, pub in enumerate(pubs):
            unacknowledged[i] -= sum(isinstance(p, PubAck) for p in pub.take())
            room = min(window - unacknowledged[i], messages - sent)
            if room <= 0:
                continue
            batch = []
            # The payload carries its round, for the copy's wait at its acceptance.
            payload = rounds.to_bytes(4, "big") + PAYLOAD
            for _ in range(room):
                last_id[i] = last_id[i] % 0xFFFF + 1
                batch.append(Publish("bench/flow", payload, 1, False, False, last_id[i]))
            pub.read(batch)
            unacknowledged[i] += room
            sent += room
            sending = True
            if not one_turn:
                await asyncio.sleep(0)
        if not sending and sent < messages:
            blocked += 1
        deliveries = [p for p in sub.take() if isinstance(p, Publish)]
        received += len(deliveries)
        waits.extend(rounds - int.from_bytes(p.payload[:4], "big") for p in deliveries)
        depths.append(queue.count)
        if deliveries:
            sub.read([PubAck(p.packet_id or 0) for p in deliveries])
        for _ in range(2):
            await asyncio.sleep(0)
    cpu = time.process_time() - started
    cancel()
    store = broker.store
    store.close()
    # With a real acceptance window (--acceptance-window) how many copies outlived it depends
    # on the machine's speed: not part of the deterministic figures above it.
    written = getattr(store, "written_entries", None)
    timed = (
        f"; acceptance window {acceptance_window:g} s: queue entries written / cancelled "
        f"{written:,} / {getattr(store, 'cancelled_writes', 0):,}, "
        f"{cpu / received * 1e6:.1f} us CPU per message"
        if written is not None and acceptance_window < 3600
        else ""
    )
    depths.sort()
    waits.sort()
    return (
        f"{publishers}->1{' durable' if durable else ''}{' one turn' if one_turn else ''}, "
        f"windows {window}/100, depth {depth}: "
        f"{rounds} rounds, "
        f"{received / rounds:.0f} delivered a round, every publisher blocked in {blocked}; "
        f"queue p50 {depths[len(depths) // 2]}, p99 {depths[int(len(depths) * 0.99)]}, "
        f"max {depths[-1]}; a copy's rounds from publication to acceptance p50 "
        f"{waits[len(waits) // 2]}, p99 {waits[int(len(waits) * 0.99)]}, max {waits[-1]}"
        f"{timed}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishers", type=int, default=10)
    parser.add_argument("--window", type=int, default=100, help="each publisher's in-flight window")
    parser.add_argument("--depth", type=int, default=1000, help="limits.flow_control_depth")
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument(
        "--durable",
        action="store_true",
        help="the subscriber's session persistent on the SQLite store (see above)",
    )
    parser.add_argument(
        "--one-turn",
        action="store_true",
        help="every publisher's read in one loop turn (as an event loop with every "
        "publisher's socket ready serves them), not a turn each",
    )
    parser.add_argument(
        "--acceptance-window",
        type=float,
        default=3600.0,
        help="--durable: the store's acceptance window (default an hour: no copy outlives "
        "it); a serving broker's (0.05) adds the queue entries written and cancelled and the "
        "CPU per message, which depend on the machine's speed",
    )
    args = parser.parse_args()
    print(
        asyncio.run(
            flood(
                args.publishers,
                args.window,
                args.depth,
                args.messages,
                args.durable,
                args.one_turn,
                args.acceptance_window,
            )
        )
    )


if __name__ == "__main__":
    main()
