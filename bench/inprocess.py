"""In-process broker CPU per message: the broker and its MQTT connections driven with bytes,
no socket (but for `connections`, which measures memory), no load generator. Deterministic
enough to compare changes on a loaded machine (CPU time, or instruction counts under
`valgrind --tool=callgrind`).

    python bench/inprocess.py qos1            # QoS 1 1->1: publish, route, deliver, PUBACK, settle
    python bench/inprocess.py qos1 --publishers 10   # QoS 1 fan-in 10->1
    python bench/inprocess.py qos1 --subscribers 50  # QoS 1 fan-out 1->50 (CPU per delivery)
    python bench/inprocess.py qos1 --publishers 10 --qos 0   # the same shapes at QoS 0
    python bench/inprocess.py qos1 --durable  # the same to a persistent session, SQLite store
    python bench/inprocess.py connections --connections 2000   # bytes per idle connection
    python bench/inprocess.py topics --filters 10000
    python bench/inprocess.py topics --filters 10000 --churn 1000   # a device joins per 1,000
    python bench/inprocess.py amqp-in         # AMQP publish mapping: a JMS TextMessage to core
    python bench/inprocess.py amqp-out        # AMQP delivery mapping: that message to a consumer

Every frame a client would send is encoded before the clock starts; what the broker writes is
counted, not decoded. Reads are fed as the asyncio shell feeds them: one decoder.feed per read,
then every packet handled, then the loop runs what the read scheduled.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import socket
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from kittiwake.app import GC_YOUNG_THRESHOLD
from kittiwake.broker.broker import Broker
from kittiwake.broker.periodic import run_every
from kittiwake.broker.store import MemoryStore
from kittiwake.collector import CollectorPolicy
from kittiwake.config import ListenerConfig, StoreConfig
from kittiwake.mqtt.codec import AckRunDecoder, encode
from kittiwake.mqtt.connection import MQTTConnection
from kittiwake.mqtt.packets import (
    Connect,
    PubAck,
    Publish,
    Subscribe,
    SubscriptionRequest,
)
from kittiwake.mqtt.server import MQTTServer, MQTTServerProtocol

VERSION = 4


class CountingTransport:
    """Counts what the connection writes and keeps nothing."""

    __slots__ = ("closed", "written")

    def __init__(self) -> None:
        self.written = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def close(self) -> None:
        self.closed = True

    def write_backlog(self) -> int:
        return 0


class CountingSocketTransport(CountingTransport):
    """What the asyncio shell (mqtt/server.py) sees of a socket: counts what is sent."""

    __slots__ = ()

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1883) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


# --shell: feed reads through the asyncio shell (MQTTServerProtocol.data_received, its write
# coalescing and flushes) instead of straight to the connection; one server per broker.
SHELL = {"on": False}
SERVERS: dict[Broker, MQTTServer] = {}
# topics: run kittiwake.collector's policy as kittiwake.app does (off with --no-freeze).
FREEZE = {"on": True}


class Client:
    """One connection, fed reads as the asyncio shell feeds them."""

    def __init__(self, broker: Broker, client_id: str, clean_start: bool = True) -> None:
        self.protocol: MQTTServerProtocol | None = None
        if SHELL["on"]:
            server = SERVERS.get(broker)
            if server is None:
                server = SERVERS[broker] = MQTTServer(broker)
            self.transport = CountingSocketTransport()
            self.protocol = MQTTServerProtocol(
                server, server.listener_context(ListenerConfig(host="127.0.0.1", port=0))
            )
            self.protocol.connection_made(self.transport)  # type: ignore[arg-type]
            assert self.protocol.connection is not None
            self.connection = self.protocol.connection
        else:
            self.transport = CountingTransport()
            self.connection = MQTTConnection(broker, self.transport, client_id)
        self.decoder = AckRunDecoder(broker.config.limits.max_packet_size)
        self.read(
            encode(Connect(client_id, protocol_version=VERSION, clean_start=clean_start), VERSION)
        )

    def read(self, data: bytes) -> None:
        if self.protocol is not None:
            self.protocol.data_received(data)
            return
        connection = self.connection
        for packet in self.decoder.feed(data):
            connection.handle(packet)


async def turns(count: int = 3) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def frames(packets: list[object]) -> bytes:
    return b"".join(encode(p, VERSION) for p in packets)  # type: ignore[arg-type]


# qos1 --durable: the subscriber's session is persistent and the store is SQLite (fsync per
# group commit) in a temporary directory, with a serving broker's store settings (its
# acceptance window), as in run.py's qos1-persistent workloads; the writer thread's CPU
# counts (process time).
DURABLE = {"on": False}
# qos1 --durable: the store's acceptance window, when not a serving broker's default (None);
# --ack-after-commit: the subscriber acknowledges only what the store has committed.
STORE_OPTIONS: dict[str, float | None] = {"acceptance_window": None}
LATE_ACKS = {"on": False}
# qos1 --publishers N --one-turn: every publisher's read of a round in one loop turn (as a
# flooded event loop serves every ready socket before its next turn), so one store commit
# spans them all.
ONE_TURN = {"on": False}
# Per durable run: (queue entries written, inserts cancelled) by the store (write cancellation).
ENTRY_WRITES: list[tuple[int, int]] = []


def make_broker() -> Broker:
    if not DURABLE["on"]:
        return Broker(store=MemoryStore())
    from kittiwake.store.sqlite import SQLiteStore

    directory = tempfile.mkdtemp(prefix="kw-inprocess-")
    window = STORE_OPTIONS["acceptance_window"]
    if window is None:
        window = StoreConfig().acceptance_window
    return Broker(store=SQLiteStore(directory, acceptance_window=window))


async def committed(broker: Broker) -> None:
    """--ack-after-commit: wait for the store to commit what was published so far (at once,
    without an acceptance window), so the copies are written before they are accepted and
    then deleted: the durable 10->1 flood, where most copies wait behind a full window longer
    than the acceptance window."""
    if LATE_ACKS["on"]:
        commit = broker.store.commit()
        if commit is not None:
            await commit


async def settled(broker: Broker) -> None:
    """Wait for the store to have written everything (durable runs)."""
    commit = broker.store.commit()
    while commit is not None and not commit.done():
        await asyncio.sleep(0.001)
        commit = broker.store.commit()


def close_store(broker: Broker) -> None:
    """Close the store, noting a durable run's written and cancelled queue entries."""
    store = broker.store
    store.close()
    written = getattr(store, "written_entries", None)
    if written is not None:
        ENTRY_WRITES.append((written, getattr(store, "cancelled_writes", 0)))


async def qos1(
    messages: int, batch: int, publishers: int = 1, subscribers: int = 1, qos: int = 1
) -> float:
    """QoS 1 1->1: batches of `batch` PUBLISHes in one read, their PUBACKs in one read.

    With `publishers` > 1 (fan-in), each publisher reads a batch in turn, then the subscriber
    acknowledges what it was sent, a window at a time, until every message is settled.
    With `subscribers` > 1 (fan-out), every subscriber acknowledges each batch in a read of
    its own, one batch late (the next batch is queued behind a full window and dispatched
    from the queue as the acknowledgement frees it); `messages` then counts deliveries, and
    the cost is per delivery.
    With `qos` 0 the same shapes publish at QoS 0: nothing to acknowledge.
    """
    if publishers > 1:
        return await qos1_fan_in(messages, batch, publishers, qos)
    broker = make_broker()
    cancel = broker.schedule_ticks(asyncio.get_running_loop())
    subs = [
        Client(broker, f"sub{i}" if subscribers > 1 else "sub", clean_start=not DURABLE["on"])
        for i in range(subscribers)
    ]
    pub = Client(broker, "pub")
    for sub in subs:
        sub.read(frames([Subscribe(1, [SubscriptionRequest("bench/q1", 1)])]))
    messages //= subscribers
    await settled(broker)
    payload = b"x" * 64
    rounds = messages // batch
    # Packet ids 1..65535 wrap; the subscriber's ids follow the same sequence (window >= batch).
    publish_reads = []
    ack_reads = []
    pid = 0
    for _ in range(rounds):
        ids = []
        for _ in range(batch):
            pid = pid + 1 if pid < 0xFFFF else 1
            ids.append(pid)
        publish_reads.append(
            frames([Publish("bench/q1", payload, qos, False, False, i if qos else None)
                    for i in ids])
        )
        ack_reads.append(frames([PubAck(i) for i in ids]) if qos else b"")
    # Fan-out: each subscriber acknowledges a batch one read later (after the next batch is
    # published), as subscribers that lag behind a flood do: with the default batch (the
    # window's size) the next batch finds the window full, so it is queued and then
    # dispatched from the queue (Queue.dispatch) when the acknowledgements free the window,
    # not sent at once (deliver_now) as in 1->1.
    lag = 1 if subscribers > 1 and qos else 0
    ack_reads = [b""] * lag + ack_reads
    publish_reads = publish_reads + [b""] * lag
    await turns()
    gc.collect()
    start = time.process_time()
    for publishes, acks in zip(publish_reads, ack_reads, strict=True):
        if publishes:
            pub.read(publishes)
            await asyncio.sleep(0)
            await committed(broker)
        if acks:
            for sub in subs:
                sub.read(acks)
            await asyncio.sleep(0)
    await settled(broker)
    elapsed = time.process_time() - start
    cancel()
    close_store(broker)
    for sub in subs:
        assert not sub.connection.session.consumer.unsettled, "deliveries left unsettled"  # type: ignore[union-attr]
        assert sub.connection.session.queue.count == 0, "messages left queued"  # type: ignore[union-attr]
    return elapsed / (rounds * batch * subscribers)


async def qos1_fan_in(messages: int, batch: int, publishers: int, qos: int = 1) -> float:
    """QoS 1 N->1: per round every publisher reads `batch` PUBLISHes (one loop turn after
    each read; with --one-turn, one after them all), then the subscriber acknowledges its
    window's deliveries, one read and one loop turn per window, until the round is settled."""
    broker = make_broker()
    cancel = broker.schedule_ticks(asyncio.get_running_loop())
    sub = Client(broker, "sub", clean_start=not DURABLE["on"])
    pubs = [Client(broker, f"pub{i}") for i in range(publishers)]
    sub.read(frames([Subscribe(1, [SubscriptionRequest("bench/q1", 1)])]))
    await settled(broker)
    window = broker.config.limits.max_inflight
    payload = b"x" * 64
    per_round = batch * publishers
    rounds = messages // per_round
    pid = 0
    publish_reads = []
    for _ in range(rounds):
        reads = []
        for _ in range(publishers):
            ids = []
            for _ in range(batch):
                pid = pid + 1 if pid < 0xFFFF else 1
                ids.append(pid)
            reads.append(
                frames([Publish("bench/q1", payload, qos, False, False, i if qos else None)
                        for i in ids])
            )
        publish_reads.append(reads)
    # The subscriber's packet ids run 1, 2, ... as the broker hands them out (every earlier
    # one is acknowledged before the window moves on). Each round starts with nothing in
    # flight, so its acknowledgements are whole windows and then what is left of the round
    # (batch x publishers need not be a multiple of the window).
    ack_reads = []
    sid = 0
    for _ in range(rounds):
        for first in range(0, per_round, window):
            ids = []
            for _ in range(min(window, per_round - first)):
                sid = sid + 1 if sid < 0xFFFF else 1
                ids.append(sid)
            ack_reads.append(frames([PubAck(i) for i in ids]))
    acks = iter(ack_reads)
    consumer = sub.connection.session.consumer  # type: ignore[union-attr]
    await turns()
    gc.collect()
    start = time.process_time()
    for reads in publish_reads:
        for pub, data in zip(pubs, reads, strict=True):
            pub.read(data)
            if not ONE_TURN["on"]:
                await asyncio.sleep(0)
        if ONE_TURN["on"]:
            await asyncio.sleep(0)
        await committed(broker)
        while consumer.unsettled:
            sub.read(next(acks))
            await asyncio.sleep(0)
    await settled(broker)
    elapsed = time.process_time() - start
    cancel()
    close_store(broker)
    assert not consumer.unsettled, "deliveries left unsettled"
    assert sub.connection.session.queue.count == 0, "messages left queued"  # type: ignore[union-attr]
    return elapsed / (rounds * per_round)


class CollectorPauses:
    """The garbage collector's passes while installed: how many of each generation, and the
    longest (a full pass over millions of subscriptions stops the loop for its duration)."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.longest = [0.0, 0.0, 0.0]
        self._started = 0.0
        self._ignoring = False
        gc.callbacks.append(self._observe)

    def collect(self) -> None:
        """The harness's own full collection (before a clock starts): not counted."""
        self._ignoring = True
        try:
            gc.collect()
        finally:
            self._ignoring = False

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if self._ignoring:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self.passes[generation] += 1
        pause = time.perf_counter() - self._started
        self.longest[generation] = max(self.longest[generation], pause)

    def __str__(self) -> str:
        return ", ".join(
            f"gen {g}: {n} passes, longest {self.longest[g] * 1e3:.1f} ms"
            for g, n in enumerate(self.passes)
        )


# Every collector pass while the harness runs (see CollectorPauses).
PAUSES = CollectorPauses()


def fleet_filters(count: int) -> list[str]:
    """Half exact `s/<i>/v`, half `s/<i>/+` (issue 17's fleet shape)."""
    half = count // 2
    return [f"s/{i}/v" for i in range(half)] + [f"s/{half + i}/+" for i in range(count - half)]


def fleet_topics(count: int) -> list[str]:
    """One topic per filter, each matching exactly that filter."""
    half = count // 2
    return [f"s/{i}/v" for i in range(half)] + [f"s/{half + i}/w" for i in range(count - half)]


# topics: filters per SUBSCRIBE packet (--per-subscribe; run.py's fleet sends 100).
PER_SUBSCRIBE = {"filters": 1}


async def subscribe_fleet(broker: Broker, filters: list[str], per_connection: int) -> float:
    """Subscribe `filters` over connections of `per_connection` each, PER_SUBSCRIBE filters a
    SUBSCRIBE, each connection's packets in one read; CPU seconds spent."""
    per_packet = PER_SUBSCRIBE["filters"]
    reads = []
    for first in range(0, len(filters), per_connection):
        chunk = filters[first : first + per_connection]
        requests = [
            frames(
                [
                    Subscribe(
                        1 + (k // per_packet) % 0xFFFE,
                        [SubscriptionRequest(f, 0) for f in chunk[k : k + per_packet]],
                    )
                ]
            )
            for k in range(0, len(chunk), per_packet)
        ]
        reads.append(b"".join(requests))
    clients = [Client(broker, f"sub{i}") for i in range(len(reads))]
    PAUSES.collect()
    start = time.process_time()
    for client, data in zip(clients, reads, strict=True):
        client.read(data)
        await asyncio.sleep(0)
    return time.process_time() - start


async def topics(
    filters: int, messages: int, batch: int, churn: int = 0
) -> tuple[float, float]:
    """QoS 0 over `filters` distinct topics: (subscribe s per filter, publish s per message).

    With `churn`, a new device connects and subscribes to a topic of its own (no wildcard)
    after every `churn` messages, as in a fleet that never stands still; its cost counts.
    The collector policy runs as in a serving broker (kittiwake.app), unless --no-freeze."""
    broker = Broker(store=MemoryStore())
    loop = asyncio.get_running_loop()
    cancel = broker.schedule_ticks(loop)
    if FREEZE["on"]:
        policy = CollectorPolicy(lambda: len(broker.routes.tree) + len(broker.sessions))
        cancel_policy = run_every(loop, 1.0, policy.check, "collector policy")
    subscribe_cost = await subscribe_fleet(broker, fleet_filters(filters), 5000)
    pub = Client(broker, "pub")
    names = fleet_topics(filters)
    payload = b"x" * 64
    reads = []
    for first in range(0, messages, batch):
        reads.append(
            frames(
                [
                    Publish(names[(first + k) % filters], payload, 0, False, False, None)
                    for k in range(batch)
                ]
            )
        )
    every = max(1, churn // batch) if churn else 0
    devices = [
        frames([Subscribe(1, [SubscriptionRequest(f"dev/{k}/in", 0)])])
        for k in range(len(reads) // every if every else 0)
    ]
    PAUSES.collect()
    start = time.process_time()
    for k, data in enumerate(reads):
        pub.read(data)
        if every and k % every == every - 1:
            device = k // every
            Client(broker, f"dev{device}").read(devices[device])
        await asyncio.sleep(0)
    elapsed = time.process_time() - start
    cancel()
    if FREEZE["on"]:
        cancel_policy()
        gc.unfreeze()  # the next run starts from the same heap as this one did
    return subscribe_cost / filters, elapsed / (len(reads) * batch)


async def idle_connections(count: int) -> float:
    """Bytes the broker's process allocates per idle MQTT connection (tracemalloc: every
    Python-visible allocation, the event loop's transport included), over real sockets."""
    broker = Broker(store=MemoryStore())
    server = MQTTServer(broker)
    host, port = await server.listen("127.0.0.1", 0)
    connect = encode(Connect("", protocol_version=VERSION, clean_start=True, keepalive=60), VERSION)
    loop = asyncio.get_running_loop()

    def connected() -> int:
        return sum(1 for p in server.connections if p.connection and p.connection.session)

    async def open_all(sockets: list[socket.socket], n: int) -> None:
        for _ in range(n):
            client = socket.socket()
            client.setblocking(False)
            sockets.append(client)
            await loop.sock_connect(client, (host, port))
            await loop.sock_sendall(client, connect)
        deadline = loop.time() + 60
        while connected() < len(sockets):
            if loop.time() > deadline:
                raise RuntimeError(f"only {connected()} of {len(sockets)} connected")
            await asyncio.sleep(0.01)

    warm: list[socket.socket] = []
    await open_all(warm, 50)  # first-use allocations (codec tables, loop internals)
    clients: list[socket.socket] = []
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    await open_all(clients, count)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    # What the client side of the same process holds: its socket objects and the list.
    client_side = sys.getsizeof(clients) + sum(sys.getsizeof(c) for c in clients)
    tracemalloc.stop()
    for client in warm + clients:
        client.close()
    await server.close()
    return (after - before - client_side) / count


def best(runs: int, measure: Callable[[], float]) -> float:
    return min(measure() for _ in range(runs))


def spread(runs: int, measure: Callable[[], float]) -> tuple[float, float, float]:
    """Median, min and max of ``runs`` measurements."""
    values = sorted(measure() for _ in range(runs))
    return statistics.median(values), values[0], values[-1]


def amqp_out(messages: int) -> float:
    """CPU per delivery of mapping that core message back to AMQP for a consumer
    (``amqp.message_mapping.to_amqp``: its sections were kept, the header is per delivery)."""
    from kittiwake.amqp.message_mapping import Clocks, DestinationType, from_amqp, to_amqp
    from kittiwake.jms import Queue, TextMessage
    from kittiwake.jms import messages as jms_codec

    text = TextMessage("x" * 100)
    text.jms_message_id = jms_codec.new_message_id()
    encoded = bytes(jms_codec.encode(text, address="q", destination=Queue("q"),
                                     delivery_delay_ms=0, allow_pickle=False))
    clocks = Clocks(now=time.monotonic(), wall_ms=jms_codec.now_ms())
    message = from_amqp(encoded, topic="q", clocks=clocks, origin="c").message
    started = time.process_time()
    for _ in range(messages):
        to_amqp(message, durable=False, delivery_count=0, clocks=clocks,
                destination_type=DestinationType.QUEUE)
    return (time.process_time() - started) / messages


def amqp_in(messages: int) -> float:
    """CPU per message of mapping an incoming AMQP transfer to the core's message
    (``amqp.message_mapping.from_amqp``): a PERSISTENT 100-character TextMessage encoded as
    kittiwake.jms sends it."""
    from kittiwake.amqp.message_mapping import Clocks, from_amqp
    from kittiwake.jms import Queue, TextMessage
    from kittiwake.jms import messages as jms_codec

    message = TextMessage("x" * 100)
    message.jms_message_id = jms_codec.new_message_id()
    message.jms_timestamp = jms_codec.now_ms()
    encoded = bytes(jms_codec.encode(message, address="q", destination=Queue("q"),
                                     delivery_delay_ms=0, allow_pickle=False))
    clocks = Clocks(now=time.monotonic(), wall_ms=jms_codec.now_ms())
    started = time.process_time()
    for _ in range(messages):
        from_amqp(encoded, topic="q", clocks=clocks, origin="c")
    return (time.process_time() - started) / messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "workload", choices=("qos1", "topics", "connections", "amqp-in", "amqp-out")
    )
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--filters", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument(
        "--churn",
        type=int,
        default=0,
        help="topics: a new device connects and subscribes (one filter) every N messages",
    )
    parser.add_argument(
        "--per-subscribe",
        type=int,
        default=1,
        help="topics: filters per SUBSCRIBE packet (run.py's fleet sends 100)",
    )
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="topics: without kittiwake.collector's policy (freezing long-lived objects)",
    )
    parser.add_argument(
        "--shell",
        action="store_true",
        help="qos1/topics: feed reads through the asyncio shell (mqtt/server.py), as a socket does",
    )
    parser.add_argument(
        "--publishers", type=int, default=1, help="qos1: publishers fanning in to one subscriber"
    )
    parser.add_argument(
        "--subscribers",
        type=int,
        default=1,
        help="qos1: subscribers one publisher fans out to (--messages counts deliveries)",
    )
    parser.add_argument(
        "--qos",
        type=int,
        choices=(0, 1),
        default=1,
        help="qos1: publish at this QoS (0: the same shapes, nothing acknowledged)",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="qos1: a persistent subscriber session on the SQLite store (writer thread included)",
    )
    parser.add_argument(
        "--acceptance-window",
        type=float,
        help="qos1 --durable: the store's acceptance window in seconds (default: a serving "
        "broker's); a long one keeps every copy cancellable however slowly the run goes "
        "(under valgrind)",
    )
    parser.add_argument(
        "--ack-after-commit",
        action="store_true",
        help="qos1 --durable: the subscriber acknowledges only what the store has committed "
        "(every copy written, then deleted)",
    )
    parser.add_argument(
        "--one-turn",
        action="store_true",
        help="qos1 --publishers N: every publisher's read of a round in one loop turn (one "
        "store commit for them all, as in a flooded event loop), not a turn each",
    )
    args = parser.parse_args()
    ONE_TURN["on"] = args.one_turn
    STORE_OPTIONS["acceptance_window"] = args.acceptance_window
    LATE_ACKS["on"] = args.ack_after_commit
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])  # as kittiwake.app.serve
    SHELL["on"] = args.shell
    DURABLE["on"] = args.durable
    FREEZE["on"] = not args.no_freeze
    PER_SUBSCRIBE["filters"] = max(1, args.per_subscribe)
    if args.workload == "connections":
        size = asyncio.run(idle_connections(args.connections))
        print(f"idle connections: {size:,.0f} bytes allocated per connection")
    elif args.workload == "qos1":
        if args.publishers > 1 and args.subscribers > 1:
            parser.error("qos1: --publishers and --subscribers do not combine")
        median, low, high = spread(
            args.runs,
            lambda: asyncio.run(
                qos1(args.messages, args.batch, args.publishers, args.subscribers, args.qos)
            ),
        )
        unit = "delivery" if args.subscribers > 1 else "message"
        print(
            f"qos{args.qos} {args.publishers}->{args.subscribers}: "
            f"{low * 1e6:.2f} us CPU per {unit} "
            f"(best of {args.runs}; median {median * 1e6:.2f}, max {high * 1e6:.2f})"
        )
        if ENTRY_WRITES:
            print(
                "queue entries written / cancelled per run: "
                + ", ".join(f"{w:,} / {c:,}" for w, c in ENTRY_WRITES)
            )
    elif args.workload == "amqp-in":
        cost = best(args.runs, lambda: amqp_in(args.messages))
        print(f"amqp-in: {cost * 1e6:.2f} us CPU per message")
    elif args.workload == "amqp-out":
        cost = best(args.runs, lambda: amqp_out(args.messages))
        print(f"amqp-out: {cost * 1e6:.2f} us CPU per delivery")
    else:
        results = [
            asyncio.run(topics(args.filters, args.messages, args.batch, args.churn))
            for _ in range(args.runs)
        ]
        sub = min(r[0] for r in results)
        pub = min(r[1] for r in results)
        print(
            f"topics {args.filters}: subscribe {1 / sub:,.0f} filters/s, "
            f"QoS 0 publish {pub * 1e6:.2f} us CPU per message; collector: {PAUSES}"
        )


if __name__ == "__main__":
    main()
