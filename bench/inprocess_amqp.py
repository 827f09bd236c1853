"""In-process broker CPU per AMQP message: the broker's AMQP shell (amqp/server.py) fed by
python-qpid-proton client engines in the same process, no socket. Broker CPU = process time of
the whole exchange minus the time spent in the client engines (measured around each of their
calls), so the figure holds on a loaded machine and compares two versions of the code.

    python bench/inprocess_amqp.py                     # queue NON_PERSISTENT 1 -> 1, batch 1
    python bench/inprocess_amqp.py --batch 20 --runs 5
    python bench/inprocess_amqp.py --body jms          # a TextMessage as kittiwake.jms encodes it
    python bench/inprocess_amqp.py --body jms --persistent --transacted 100  # queue-persistent-tx
    python bench/inprocess_amqp.py --topic 10 --batch 10  # topic fan-out, CPU per delivery
    KITTIWAKE_SRC=/other/checkout/src python bench/inprocess_amqp.py   # another version's broker

``--batch``: messages the producer writes per read of the broker (the consumer's
acknowledgements and flow of one batch are one read too). In the socket benchmark the
broker usually outruns the Python clients and sees about one message per read.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(
    0, os.environ.get("KITTIWAKE_SRC") or str(Path(__file__).resolve().parent.parent / "src")
)

from proton import (
    Collector,
    Connection,
    Delivery,
    Described,
    Event,
    Message,
    Terminus,
    Transport,
    ulong,
)

from kittiwake.amqp.links import link_layer_factory
from kittiwake.amqp.server import AMQPServer, AMQPServerProtocol
from kittiwake.app import GC_YOUNG_THRESHOLD
from kittiwake.broker.broker import Broker
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.broker.store import MemoryStore
from kittiwake.broker.temporary_destinations import TemporaryDestinations
from kittiwake.config import Config

CLIENT = [0.0]  # process time spent in the client engines
# A transfer's or an outcome's transactional state (AMQP 1.0 section 4.5.5).
TRANSACTIONAL_STATE = 0x34


class Pipe:
    """The broker's side of a socket: keeps what the broker writes for the client."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 5672) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.out.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data


class Client:
    """A proton client engine on one broker connection."""

    def __init__(self, server: AMQPServer, name: str) -> None:
        self.pipe = Pipe()
        self.protocol = AMQPServerProtocol(server)
        self.protocol.connection_made(self.pipe)  # type: ignore[arg-type]
        started = time.process_time()
        self.connection = Connection()
        self.connection.container = name
        self.transport = Transport()
        self.transport.bind(self.connection)
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        CLIENT[0] += time.process_time() - started

    def to_broker(self) -> None:
        started = time.process_time()
        pending = self.transport.pending()
        # bytes, as a socket read hands them over (proton's peek gives a bytearray)
        data = bytes(self.transport.peek(pending)) if pending > 0 else b""
        if pending > 0:
            self.transport.pop(pending)
        CLIENT[0] += time.process_time() - started
        if data:
            self.protocol.data_received(data)

    def from_broker(self) -> None:
        data = self.pipe.take()
        started = time.process_time()
        while data:  # in pieces the engine can take (a commit releases many at once)
            piece = data[: max(1, self.transport.capacity())]
            self.transport.push(piece)
            data = data[len(piece):]
        CLIENT[0] += time.process_time() - started

    def events(self) -> list[Any]:
        started = time.process_time()
        out = []
        while True:
            event = self.collector.peek()
            if event is None:
                break
            out.append((event.type, event.delivery))
            self.collector.pop()
        CLIENT[0] += time.process_time() - started
        return out


class Transactions:
    """A coordinator link on a client's session, declaring and discharging as proton's
    Container does (its transacted transfers and acceptances carry [txn-id(, outcome)])."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.link = client.session.sender("txn-ctrl")
        self.link.target.type = Terminus.COORDINATOR
        self.link.open()
        self.tags = 0
        self.id: Any = None

    async def control(self, body: Described) -> Delivery:
        self.tags += 1
        delivery = self.link.delivery(b"c%d" % self.tags)
        self.link.send(Message(body=body).encode())
        self.link.advance()
        for _ in range(20):
            self.client.to_broker()
            await turns()
            self.client.from_broker()
            if delivery.remote_state:
                break
        assert delivery.remote_state, "the coordinator did not answer"
        delivery.settle()
        return delivery

    async def declare(self) -> None:
        declared = await self.control(Described(ulong(0x31), []))
        self.id = bytes(declared.remote.data[0])

    async def commit(self) -> None:
        discharged = await self.control(Described(ulong(0x32), [self.id, False]))
        assert discharged.remote_state == Delivery.ACCEPTED, discharged.remote_state
        await self.declare()


async def turns(count: int = 2) -> None:
    """Let the loop run what a read scheduled (a pump, then the flush it wakes)."""
    for _ in range(count):
        await asyncio.sleep(0)


async def idle_turns(rounds: int, consumers: int = 1) -> float:
    """Process time of the loop turns one round takes with nothing to do (subtracted: a
    socket's loop turns are not these)."""
    started = time.process_time()
    for _ in range(rounds):
        await turns()
        for _ in range(consumers):
            await turns()
    return (time.process_time() - started) / rounds


def encoded_body(kind: str, persistent: bool = False) -> bytes:
    text = "x" * 100
    if kind == "jms":
        from kittiwake.jms import DeliveryMode, Queue, TextMessage
        from kittiwake.jms import messages as jms_codec

        message = TextMessage(text)
        # Set either way: a JMS message is PERSISTENT unless its producer says otherwise.
        message.jms_delivery_mode = (
            DeliveryMode.PERSISTENT if persistent else DeliveryMode.NON_PERSISTENT
        )
        message.jms_message_id = jms_codec.new_message_id()
        message.jms_timestamp = jms_codec.now_ms()
        return bytes(jms_codec.encode(message, address="q", destination=Queue("q"),
                                      delivery_delay_ms=0, allow_pickle=False))
    return bytes(Message(body=text, durable=persistent).encode())


async def queue_run(
    messages: int,
    batch: int,
    body: bytes,
    credit: int,
    subscribers: int = 0,
    transacted: int = 0,
    ack_every: int = 1,
) -> float:
    """Broker CPU per delivery: a queue 1 -> 1 (``subscribers`` 0), else a topic
    1 -> ``subscribers`` (each message delivered to every one of them); ``transacted``:
    producer and consumer each commit a transaction every that many messages; ``ack_every``:
    each consumer settles its deliveries in runs of that many (one read of the broker's)
    instead of each in the read after it arrived."""
    config = Config()
    broker = Broker(config, store=MemoryStore())
    queues = QueueDestinations(broker)
    server = AMQPServer(broker, link_layer_factory(broker, queues, TemporaryDestinations(queues)))
    address = "topic://t" if subscribers else "q"
    producer = Client(server, "producer")
    consumers = [Client(server, f"consumer{i}") for i in range(max(1, subscribers))]
    sender = producer.session.sender("p")
    sender.target.address = address
    sender.open()
    receivers = []
    for index, consumer in enumerate(consumers):
        receiver = consumer.session.receiver(f"c{index}")
        receiver.source.address = address
        receiver.open()
        receiver.flow(credit)
        receivers.append(receiver)
    for client in (producer, *consumers):
        client.to_broker()
        await turns()
        client.from_broker()
        client.to_broker()
        await turns()
        client.from_broker()
        client.events()
    assert sender.credit > 0, "the broker gave the producer no credit"
    producing = consuming = None
    if transacted:
        producing, consuming = Transactions(producer), Transactions(consumers[0])
        await producing.declare()
        await consuming.declare()
        producer.events()
        consumers[0].events()
    deliveries = messages * len(consumers)
    sent = received = settled = committed = committed_sent = 0
    CLIENT[0] = 0.0
    tag = 0
    unacked: list[list[Any]] = [[] for _ in consumers]
    gc.collect()
    started = time.process_time()
    rounds = 0
    while received < deliveries:
        rounds += 1
        assert rounds < 10 * messages, "no progress"
        t0 = time.process_time()
        for _ in range(min(batch, messages - sent, sender.credit)):
            tag += 1
            delivery = sender.delivery(str(tag).encode())
            if producing is not None:
                delivery.local.data = [producing.id]
                delivery.update(TRANSACTIONAL_STATE)
            sender.send(body)
            sender.advance()
            sent += 1
        CLIENT[0] += time.process_time() - t0
        producer.to_broker()
        if producing is not None and sent % transacted == 0 and sent > committed_sent:
            committed_sent = sent
            await measured_client(producing.commit())
        await turns()
        producer.from_broker()
        for consumer, receiver, held in zip(consumers, receivers, unacked, strict=True):
            consumer.from_broker()
            for kind, delivery in consumer.events():
                if kind is Event.DELIVERY and delivery is not None and delivery.readable:
                    t0 = time.process_time()
                    receiver.recv(delivery.pending)
                    receiver.advance()
                    if consuming is not None:
                        delivery.local.data = [consuming.id, Described(ulong(0x24), [])]
                        delivery.update(TRANSACTIONAL_STATE)
                    else:
                        delivery.update(Delivery.ACCEPTED)
                    held.append(delivery)
                    if len(held) >= ack_every or received + 1 >= deliveries:
                        for done in held:
                            done.settle()
                        held.clear()
                    received += 1
                    if receiver.credit < credit // 2:
                        receiver.flow(credit - receiver.credit)
                    CLIENT[0] += time.process_time() - t0
            consumer.to_broker()
            await turns()
            consumer.from_broker()
            if consuming is not None and received % transacted == 0 and received > committed:
                committed = received
                await measured_client(consuming.commit())
        producer.from_broker()
        for kind, delivery in producer.events():
            if (
                kind is Event.DELIVERY
                and delivery is not None
                and delivery.settled
                and delivery.link.name == "p"
            ):
                t0 = time.process_time()
                delivery.settle()
                settled += 1
                CLIENT[0] += time.process_time() - t0
        producer.to_broker()
    await turns()
    total = time.process_time() - started - rounds * await idle_turns(rounds, len(consumers))
    assert settled >= messages - batch, (settled, messages)
    await server.close()
    return (total - CLIENT[0]) / deliveries


async def measured_client(work: Any) -> None:
    """A commit's exchange: the broker's work counts, the client's own calls in it do not
    (they are timed in ``Client``), so this only awaits it."""
    await work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--credit", type=int, default=1000)
    parser.add_argument("--body", choices=("proton", "jms"), default="proton")
    parser.add_argument("--topic", type=int, default=0, metavar="N",
                        help="a topic with N subscribers instead of a queue (per delivery)")
    parser.add_argument("--transacted", type=int, default=0, metavar="N",
                        help="a queue with a transacted producer and consumer, each "
                        "committing every N messages")
    parser.add_argument("--ack-every", type=int, default=1, metavar="N",
                        help="each consumer settles its deliveries N at a time, in one read "
                        "(as proton's client and kittiwake.jms's DUPS_OK batch them; default "
                        "1: each in its own read, as AUTO_ACKNOWLEDGE)")
    parser.add_argument("--persistent", action="store_true",
                        help="PERSISTENT (durable) messages, as run_jms.py's queue-persistent "
                        "rows send (default NON_PERSISTENT)")
    args = parser.parse_args()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])  # as kittiwake.app.serve
    try:
        import uvloop

        run: Any = uvloop.run
    except ImportError:
        run = asyncio.run
    body = encoded_body(args.body, args.persistent)
    costs = [run(queue_run(args.messages, args.batch, body, args.credit, args.topic,
                           args.transacted, args.ack_every))
             for _ in range(args.runs)]
    costs_us = sorted(c * 1e6 for c in costs)
    scenario = f"topic 1->{args.topic}" if args.topic else "queue 1->1"
    if args.transacted:
        scenario += f" transacted (commit every {args.transacted})"
    if args.ack_every > 1:
        scenario += f" acknowledged {args.ack_every} at a time"
    unit = "delivery" if args.topic else "message"
    mode = "PERSISTENT" if args.persistent else "NON_PERSISTENT"
    print(f"amqp {scenario} batch {args.batch} ({args.body} body, {mode}): broker "
          f"{statistics.median(costs_us):.1f} us CPU per {unit} (median of {args.runs}; "
          f"min {costs_us[0]:.1f}, max {costs_us[-1]:.1f})")


if __name__ == "__main__":
    main()
