"""The answers to one connection leave in the order of the packets they answer, whatever each
waits for: PUBACK and PUBREC in the order of the PUBLISHes (MQTT-4.6.0-2, -3), PUBREL in the
order of the PUBRECs (MQTT-4.6.0-4), PUBCOMP, SUBACK and UNSUBACK in line with them.

The store is a :class:`ControlledStore`, so which commit is pending and when it completes is
chosen by the test; no timing is involved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from connection_harness import ControlledStore, Wire, turns

from kittiwake.broker.broker import Broker
from kittiwake.clock import ManualClock
from kittiwake.config import config_from_dict
from kittiwake.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
)
from kittiwake.mqtt.properties import Properties


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


def answers(packets: list[Packet]) -> list[tuple[str, int]]:
    """(kind, packet id) of every acknowledgement among ``packets``."""
    kinds = (PubAck, PubRec, PubRel, PubComp, SubAck, UnsubAck)
    return [(type(p).__name__, p.packet_id) for p in packets if isinstance(p, kinds)]


def subscribe(wire: Wire, topic_filter: str, qos: int, packet_id: int = 1) -> None:
    wire.send(Subscribe(packet_id, [SubscriptionRequest(topic_filter, qos)]))


def test_pubrels_follow_the_order_of_their_pubrecs_while_the_store_is_busy() -> None:
    """The reported case: a clean-session subscriber sends PUBREC 1, then, as the store's busy
    batch completes, PUBREC 2; it got PUBREL 2 before PUBREL 1."""

    async def body(store: ControlledStore, broker: Broker) -> None:
        sub = Wire(broker, 4)
        sub.connect("sub")
        subscribe(sub, "t", 2)
        pub = Wire(broker, 4)
        pub.connect("pub")
        pub.send(Publish("t", b"1", 2, packet_id=1))
        pub.send(Publish("t", b"2", 2, packet_id=2))
        await turns()
        delivered = [p for p in sub.received() if isinstance(p, Publish)]
        assert [p.payload for p in delivered] == [b"1", b"2"]
        store.hold()  # another client's writes keep the store busy
        sub.send(PubRec(delivered[0].packet_id))
        store.resolve()  # that batch is durable; its callbacks have not run yet
        sub.send(PubRec(delivered[1].packet_id))
        await turns()
        assert answers(sub.received()) == [
            ("PubRel", delivered[0].packet_id),
            ("PubRel", delivered[1].packet_id),
        ]

    run(body)


def test_pubrels_of_a_persistent_session_wait_for_their_commit_in_order() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        sub = Wire(broker, 5)
        sub.connect("sub", clean_start=False, properties=Properties(session_expiry_interval=60))
        subscribe(sub, "t", 2)
        pub = Wire(broker, 5)
        pub.connect("pub")
        for n in (1, 2, 3):
            pub.send(Publish("t", b"%d" % n, 2, packet_id=n))
        await turns()
        ids = [p.packet_id for p in sub.received() if isinstance(p, Publish)]
        assert len(ids) == 3
        store.hold()
        for packet_id in ids:
            sub.send(PubRec(packet_id))
        await turns()
        assert answers(sub.received()) == [], "PUBREL before the PUBREC state was durable"
        store.resolve()
        await turns()
        assert answers(sub.received()) == [("PubRel", i) for i in ids]

    run(body)


def test_a_suback_that_needs_no_commit_waits_for_an_earlier_puback() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        client = Wire(broker, 4)
        client.connect("client")
        store.hold()
        client.send(Publish("t", b"stored", 1, packet_id=7))
        subscribe(client, "u", 0, packet_id=8)  # a clean session: nothing to store
        await turns()
        assert answers(client.received()) == []
        store.resolve()
        await turns()
        assert answers(client.received()) == [("PubAck", 7), ("SubAck", 8)]

    run(body)


def test_pubacks_keep_publish_order_when_one_waits_for_a_congested_subscriber() -> None:
    """Flow control holds the PUBACK of a message headed for a buried subscriber; the PUBACK
    of a later message that goes nowhere must not overtake it (MQTT-4.6.0-2)."""

    async def body(store: ControlledStore, broker: Broker) -> None:
        sub = Wire(broker, 4)
        sub.connect("slow")
        subscribe(sub, "slow", 1)
        pub = Wire(broker, 4)
        pub.connect("pub")
        for n in (1, 2, 3):  # one in flight, then the queue reaches the depth
            pub.send(Publish("slow", b"%d" % n, 1, packet_id=n))
        pub.send(Publish("elsewhere", b"4", 1, packet_id=4))
        await turns()
        assert answers(pub.received()) == [("PubAck", 1), ("PubAck", 2)]
        for packet in sub.received():
            if isinstance(packet, Publish):
                sub.send(PubAck(packet.packet_id))
        await turns()
        assert answers(pub.received()) == [("PubAck", 3), ("PubAck", 4)]

    run(body, limits={"flow_control_depth": 2, "max_inflight": 1})


def test_qos2_answers_keep_packet_order() -> None:
    """PUBREC, a resent PUBLISH's PUBREC, PUBCOMP and UNSUBACK of a persistent session, each
    waiting on a different batch or none, leave in the order of their packets."""

    async def body(store: ControlledStore, broker: Broker) -> None:
        client = Wire(broker, 5)
        client.connect(
            "client", clean_start=False, properties=Properties(session_expiry_interval=60)
        )
        subscribe(client, "s", 0)
        await turns()
        client.received()
        store.hold()
        client.send(Publish("t", b"x", 2, packet_id=1))
        client.send(Publish("t", b"x", 2, dup=True, packet_id=1))  # a resend: no new routing
        store.resolve()
        store.hold()
        client.send(PubRel(1))
        client.send(Unsubscribe(2, ["s"]))
        client.send(Publish("t", b"y", 2, packet_id=3))
        await turns()
        assert answers(client.received()) == [("PubRec", 1), ("PubRec", 1)]
        store.resolve()
        await turns()
        assert answers(client.received()) == [("PubComp", 1), ("UnsubAck", 2), ("PubRec", 3)]

    run(body)


def test_a_failed_commit_answers_negatively_in_place() -> None:
    """v5: the store could not take the message; its negative PUBACK still leaves before the
    answers to later packets."""

    async def body(store: ControlledStore, broker: Broker) -> None:
        client = Wire(broker, 5)
        client.connect("client")
        store.hold()
        client.send(Publish("t", b"lost", 1, packet_id=1))
        subscribe(client, "u", 0, packet_id=2)
        store.fail()
        await turns()
        got = client.received()
        assert answers(got) == [("PubAck", 1), ("SubAck", 2)]
        assert got[0].reason_code >= 0x80  # type: ignore[attr-defined]
        assert not client.connection.closed

    run(body)


# -- CONNACK and UNSUBACK wait for the state they announce -----------------------------------


def stored_session(broker: Broker, client_id: str, topic: str) -> None:
    """A persistent 3.1.1 session subscribed to ``topic`` at QoS 1, then offline."""
    wire = Wire(broker, 4)
    wire.connect(client_id, clean_start=False)
    subscribe(wire, topic, 1)
    wire.send(Disconnect())
    assert wire.connection.closed


def test_connack_with_clean_start_over_a_stored_session_waits_for_its_deletion() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        stored_session(broker, "c", "t")
        store.hold()
        client = Wire(broker, 4)
        client.send(Connect("c", protocol_version=4, clean_start=True))
        subscribe(client, "u", 0, packet_id=2)  # sent before the CONNACK, as clients may
        publisher = Wire(broker, 4)
        publisher.connect("p")
        publisher.send(Publish("u", b"live", 0))
        await turns()
        assert client.received() == [], "CONNACK before the stored session's deletion"
        store.resolve()
        await turns()
        got = client.received()
        assert isinstance(got[0], ConnAck) and not got[0].session_present
        assert sorted(type(p).__name__ for p in got[1:]) == ["Publish", "SubAck"]

    run(body)


def test_a_resumed_session_gets_its_connack_before_its_queued_messages() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        stored_session(broker, "c", "t")
        publisher = Wire(broker, 4)
        publisher.connect("p")
        for n in (1, 2):
            publisher.send(Publish("t", b"%d" % n, 1, packet_id=n))
        store.hold()
        client = Wire(broker, 4)
        client.send(Connect("c", protocol_version=4, clean_start=False))
        await turns()
        assert client.received() == []
        store.resolve()
        await turns()
        got = client.received()
        assert isinstance(got[0], ConnAck) and got[0].session_present
        assert [p.payload for p in got[1:] if isinstance(p, Publish)] == [b"1", b"2"]

    run(body)


def test_unsuback_of_a_persistent_session_waits_for_its_commit() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        client = Wire(broker, 5)
        client.connect("c", clean_start=False, properties=Properties(session_expiry_interval=60))
        subscribe(client, "t", 1)
        client.received()
        store.hold()
        client.send(Unsubscribe(2, ["t", "never-subscribed"]))
        await turns()
        assert client.received() == []
        store.resolve()
        await turns()
        (unsuback,) = client.received()
        assert isinstance(unsuback, UnsubAck) and unsuback.reason_codes == [0x00, 0x11]

    run(body)


def test_a_clean_session_needs_no_commit_for_connack_or_unsuback() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        store.hold()  # the store is busy with others' writes
        client = Wire(broker, 4)
        client.connect("c")  # asserts the CONNACK came at once
        subscribe(client, "t", 1)
        client.send(Unsubscribe(2, ["t"]))
        assert answers(client.received()) == [("SubAck", 1), ("UnsubAck", 2)]
        store.resolve()

    run(body)


def test_a_failed_session_commit_refuses_the_connection() -> None:
    async def body(store: ControlledStore, broker: Broker) -> None:
        stored_session(broker, "c", "t")
        store.hold()
        client = Wire(broker, 5)
        expiry = Properties(session_expiry_interval=60)
        client.send(Connect("c", protocol_version=5, clean_start=False, properties=expiry))
        store.fail()
        await turns()
        got = client.received()
        assert [(type(p).__name__, p.reason_code) for p in got] == [("ConnAck", 0x88)]  # type: ignore[attr-defined]
        assert client.transport.closed

    run(body)
