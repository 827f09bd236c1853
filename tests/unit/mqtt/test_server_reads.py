"""The asyncio shell's output per read (mqtt/server.py): what one read's packets produce for
their own connection (answers, and the deliveries its acknowledgements freed) is written by the
end of that read, in one write, in order; nothing waits for a later loop turn."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kittiwake.broker.broker import Broker
from kittiwake.config import Config, LimitsConfig, ListenerConfig
from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.packets import (
    ConnAck,
    Connect,
    Packet,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionRequest,
)
from kittiwake.mqtt.server import MQTTServer, MQTTServerProtocol

VERSION = 4
WINDOW = 3


class SocketTransport:
    """What the shell sees of a socket; records each write (one write = one send)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Client:
    def __init__(self, server: MQTTServer, client_id: str) -> None:
        self.transport = SocketTransport()
        self.protocol = MQTTServerProtocol(
            server, server.listener_context(ListenerConfig(host="127.0.0.1", port=0))
        )
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]
        self.decoder = PacketDecoder()
        self.decoder.protocol_version = VERSION
        self.read(Connect(client_id, protocol_version=VERSION, clean_start=True))

    def read(self, *packets: Packet) -> None:
        """One socket read carrying ``packets``."""
        self.protocol.data_received(b"".join(encode(p, VERSION) for p in packets))

    def take(self) -> tuple[int, list[Packet]]:
        """(writes made, the packets they carried) since the last call."""
        writes = self.transport.writes
        count = len(writes)
        packets = self.decoder.feed(b"".join(writes))
        writes.clear()
        return count, packets


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def run(body: Callable[[MQTTServer], Awaitable[None]]) -> None:
    async def main() -> None:
        broker = Broker(Config(limits=LimitsConfig(max_inflight=WINDOW)))
        cancel = broker.schedule_ticks(asyncio.get_running_loop())
        try:
            await body(MQTTServer(broker))
        finally:
            cancel()

    asyncio.run(asyncio.wait_for(main(), 10))


async def subscriber(server: MQTTServer) -> Client:
    sub = Client(server, "sub")
    sub.read(Subscribe(1, [SubscriptionRequest("t", 1)]))
    await settle()
    _, packets = sub.take()
    assert [type(p) for p in packets] == [ConnAck, SubAck]
    return sub


def test_a_reads_pubacks_leave_in_one_write_by_its_end_in_order() -> None:
    run(a_reads_pubacks_leave_in_one_write_by_its_end_in_order)


async def a_reads_pubacks_leave_in_one_write_by_its_end_in_order(server: MQTTServer) -> None:
    await subscriber(server)
    pub = Client(server, "pub")
    await settle()
    pub.take()
    pub.read(*(Publish("t", b"m%d" % i, 1, False, False, 10 + i) for i in range(5)))
    # No loop turn yet: the read's answers are out already, together, in packet order.
    writes, packets = pub.take()
    assert writes == 1
    assert [(type(p), p.packet_id) for p in packets] == [(PubAck, 10 + i) for i in range(5)]  # type: ignore[attr-defined]


def test_deliveries_an_ack_frees_leave_by_the_end_of_its_read() -> None:
    run(deliveries_an_ack_frees_leave_by_the_end_of_its_read)


async def deliveries_an_ack_frees_leave_by_the_end_of_its_read(server: MQTTServer) -> None:
    sub = await subscriber(server)
    pub = Client(server, "pub")
    pub.read(*(Publish("t", b"m%d" % i, 1, False, False, 1 + i) for i in range(7)))
    await settle()
    _, first = sub.take()
    assert [p.payload for p in first] == [b"m0", b"m1", b"m2"]  # type: ignore[attr-defined]
    sub.read(*(PubAck(p.packet_id) for p in first))  # type: ignore[attr-defined]
    # The window the acknowledgements freed is refilled before the loop turns again.
    writes, refill = sub.take()
    assert writes == 1
    assert [p.payload for p in refill] == [b"m3", b"m4", b"m5"]  # type: ignore[attr-defined]
    sub.read(PubAck(refill[0].packet_id))  # type: ignore[attr-defined]
    writes, last = sub.take()
    assert (writes, [p.payload for p in last]) == (1, [b"m6"])  # type: ignore[attr-defined]
    await settle()
    assert sub.take() == (0, [])


def test_a_run_of_pubacks_around_a_publish_settles_each_once_in_order() -> None:
    run(a_run_of_pubacks_around_a_publish_settles_each_once_in_order)


async def a_run_of_pubacks_around_a_publish_settles_each_once_in_order(
    server: MQTTServer,
) -> None:
    sub = await subscriber(server)
    pub = Client(server, "pub")
    pub.read(*(Publish("t", b"m%d" % i, 1, False, False, 1 + i) for i in range(7)))
    await settle()
    _, first = sub.take()
    ids = [p.packet_id for p in first]  # type: ignore[attr-defined]
    assert len(ids) == WINDOW
    # One read: a PUBACK, the same one again, one for an id never sent, the subscriber's own
    # publication (nobody subscribes to its topic), then the rest of the window's PUBACKs.
    unknown = max(ids) + 100
    sub.read(
        PubAck(ids[0]),
        PubAck(ids[0]),
        PubAck(unknown),
        Publish("elsewhere", b"own", 1, False, False, 50),
        *(PubAck(i) for i in ids[1:]),
    )
    # Its publication is answered in place, and the window the acknowledgements freed is
    # refilled once, by the end of the read: the same write, after the answer.
    writes, out = sub.take()
    assert writes == 1
    assert [(type(p), getattr(p, "payload", None)) for p in out] == [
        (PubAck, None),
        (Publish, b"m3"),
        (Publish, b"m4"),
        (Publish, b"m5"),
    ]
    assert out[0].packet_id == 50  # type: ignore[attr-defined]
    session = server.broker.sessions["sub"]
    assert len(session.inflight) == WINDOW
    assert session.queued == 1
