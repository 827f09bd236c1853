"""Store-and-dispatch over real sockets (DESIGN.md section 3): a durable QoS 1 subscriber gets
its messages while their commit is pending, every publisher still gets its PUBACK, nothing
accepted is left in the store, and exactly-once publications keep persist -> acknowledge ->
dispatch (so a QoS 1 message never overtakes a QoS 2 one still being committed).

``[store] max_delay`` (a documented setting) holds commits back where a test needs a window.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from kittiwake.mqtt.packets import PubAck, Publish, PubRec, PubRel
from kittiwake.store.sqlite import DATABASE_FILE

from .brokerproc import BrokerProcess, writes_blocked
from .clients import PahoClient
from .rawclient import RawClient

SLOW_COMMIT = {"store": {"max_delay": 2.0}}


def stored_entries(process: BrokerProcess) -> int:
    path = process.workdir / "data" / DATABASE_FILE
    connection = sqlite3.connect(path)
    try:
        return int(connection.execute("SELECT COUNT(*) FROM queue_entries").fetchone()[0])
    finally:
        connection.close()


def test_a_durable_subscriber_gets_every_message_and_the_publishers_every_puback(
    broker: Callable[..., BrokerProcess], paho: Callable[..., PahoClient]
) -> None:
    process = broker()
    sub = paho(process.address, "durable-sub", clean=False)
    sub.subscribe("sd/#", qos=1)
    publishers = [paho(process.address, f"pub{n}") for n in range(3)]
    sent: dict[str, list[bytes]] = {}
    infos: list[Any] = []
    for n, pub in enumerate(publishers):
        topic = f"sd/{n}"
        sent[topic] = [b"%d-%d" % (n, i) for i in range(200)]
        infos += [pub.publish(topic, p, qos=1, wait=False) for p in sent[topic]]
    for info in infos:
        info.wait_for_publish(10.0)
        assert info.is_published(), "a PUBACK never came"
    got = sub.get_many(600, timeout=20.0)
    by_topic: dict[str, list[bytes]] = {}
    for message in got:
        assert message.qos == 1
        by_topic.setdefault(message.topic, []).append(message.payload)
    assert by_topic == sent  # every message, each publisher's in order
    sub.stop()
    process.stop()
    # Every copy was accepted: none is left in the store (written and deleted, or never).
    assert stored_entries(process) == 0


def test_a_qos1_copy_reaches_a_durable_subscriber_before_its_publisher_is_acknowledged(
    broker: Callable[..., BrokerProcess], raw: Callable[..., RawClient]
) -> None:
    process = broker(**SLOW_COMMIT)
    sub = raw(process.address)
    sub.connect("sub", clean_start=False)
    sub.subscribe("t", 1)
    pub = raw(process.address, timeout=10.0)
    pub.connect("pub", clean_start=True)
    pub.publish("t", b"early", 1, wait_ack=False)
    got = sub.expect(Publish, timeout=5.0)
    assert got.payload == b"early"
    pub.no_packet(0.01)  # its commit is still being held back
    sub.send(PubAck(got.packet_id))  # type: ignore[arg-type]
    assert pub.expect(PubAck, timeout=10.0).reason_code == 0


def test_qos2_keeps_persist_acknowledge_dispatch_and_qos1_does_not_overtake_it(
    broker: Callable[..., BrokerProcess], raw: Callable[..., RawClient]
) -> None:
    process = broker(**SLOW_COMMIT)
    sub = raw(process.address)
    sub.connect("sub", clean_start=False)
    sub.subscribe("t", 2)
    pub = raw(process.address, timeout=10.0)
    pub.connect("pub", clean_start=True)
    pub.send(Publish("t", b"exactly-once", 2, False, False, 1))
    pub.send(Publish("t", b"at-least-once", 1, False, False, 2))
    # Nothing before the QoS 2 message's commit (held back 2 s): not it, and not the QoS 1
    # message queued behind it either.
    sub.no_packet(0.5)
    rec = pub.expect(PubRec, timeout=10.0)
    assert rec.packet_id == 1
    got = {}
    for _ in range(2):
        packet = sub.expect(Publish, timeout=10.0)
        got[packet.payload] = packet.qos
    assert got == {b"exactly-once": 2, b"at-least-once": 1}
    assert pub.expect(PubAck, timeout=10.0).packet_id == 2
    pub.send(PubRel(1))



def test_a_publisher_whose_every_stored_copy_was_accepted_does_not_wait_for_the_commit(
    broker: Callable[..., BrokerProcess], raw: Callable[..., RawClient]
) -> None:
    """The publisher's acknowledgement waits for the commit or for every acceptance, whichever
    comes first (DESIGN.md section 3): while the store cannot commit at all, a message every
    durable subscriber accepted is acknowledged, and one a subscriber has not accepted yet is
    not."""
    process = broker()
    first = raw(process.address)
    first.connect("first", clean_start=False)
    first.subscribe("one", 1)
    first.subscribe("both", 1)
    second = raw(process.address)
    second.connect("second", clean_start=False)
    second.subscribe("both", 1)
    pub = raw(process.address, timeout=10.0)
    pub.connect("pub", clean_start=True)
    with writes_blocked(process):
        sent = pub.publish("one", b"accepted", 1, wait_ack=False)
        got = first.expect(Publish, timeout=5.0)
        first.send(PubAck(got.packet_id))  # type: ignore[arg-type]
        assert pub.expect(PubAck, timeout=3.0).packet_id == sent.packet_id
        # Two durable subscribers: the PUBACK waits for both, or for the commit.
        sent = pub.publish("both", b"accepted by one", 1, wait_ack=False)
        got = first.expect(Publish, timeout=5.0)
        first.send(PubAck(got.packet_id))  # type: ignore[arg-type]
        assert second.expect(Publish, timeout=5.0).payload == b"accepted by one"
        pub.no_packet(0.5)
    assert pub.expect(PubAck, timeout=10.0).packet_id == sent.packet_id  # at its commit
