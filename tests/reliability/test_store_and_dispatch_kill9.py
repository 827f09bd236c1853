"""kill -9 with store-and-dispatch on (DESIGN.md section 3): a QoS 1 copy may reach a durable
subscriber before its commit, and a copy accepted before its batch is written is never
written; still, nothing a publisher got a PUBACK for is lost, and a copy lost because its
commit never happened is one whose publisher was not acknowledged, who resends it.

``[store] max_delay`` (a documented setting) holds every commit back for a few seconds, so
the kills land for certain between a delivery and the commit of its message.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from proton import Message, Timeout
from proton.utils import BlockingConnection
from reliability_harness import BrokerCtl

from kittiwake.mqtt.packets import PubAck, Publish
from tests.integration.amqp.blocking import accept_one_in_background, grant_credit
from tests.integration.rawclient import RawClient

# Commits wait this long to gather a group: far longer than a delivery over loopback.
SLOW_COMMIT = {"store": {"max_delay": 2.0}}


def durable_subscriber(address: tuple[str, int], client_id: str) -> RawClient:
    sub = RawClient(address, 4, timeout=5.0)
    sub.connect(client_id, clean_start=False)
    sub.subscribe("t", 1)
    return sub


def test_a_copy_accepted_before_its_commit_leaves_the_other_subscribers_copy_durable(
    tmp_path: Path,
) -> None:
    """Two durable subscribers; one accepts before the commit (its copy is never written),
    the other does not. The publisher's PUBACK comes after the commit, and after a kill -9
    the second subscriber still gets the message; the first does not get it again."""
    ctl = BrokerCtl(tmp_path, **SLOW_COMMIT)
    try:
        ctl.start()
        assert ctl.address is not None
        fast = durable_subscriber(ctl.address, "fast")
        slow = durable_subscriber(ctl.address, "slow")
        pub = RawClient(ctl.address, 4, timeout=10.0)
        pub.connect("pub", clean_start=True)
        pub.publish("t", b"m", 1, wait_ack=False)
        got = fast.expect(Publish, timeout=5.0)
        assert got.payload == b"m"
        pub.no_packet(0.01)  # delivered while its commit is pending: no PUBACK yet
        fast.send(PubAck(got.packet_id))  # type: ignore[arg-type]
        assert slow.expect(Publish, timeout=5.0).payload == b"m"  # and never acknowledged
        pub.expect(PubAck, timeout=10.0)
        ctl.kill9()
        ctl.start()
        slow = RawClient(ctl.address, 4, timeout=5.0)
        assert slow.connect("slow", clean_start=False).session_present
        again = slow.expect(Publish, timeout=5.0)
        assert (again.payload, again.dup) == (b"m", True)
        fast = RawClient(ctl.address, 4, timeout=5.0)
        assert fast.connect("fast", clean_start=False).session_present
        fast.no_packet(0.5)
    finally:
        ctl.shutdown()


def test_a_copy_delivered_before_a_commit_a_kill_prevented_comes_again_from_the_publisher(
    tmp_path: Path,
) -> None:
    """The subscriber got the copy, the commit never happened, the publisher never got its
    PUBACK: the store may lose the copy, and the publisher's resend after the restart
    delivers it (at least once, end to end)."""
    ctl = BrokerCtl(tmp_path, **SLOW_COMMIT)
    try:
        ctl.start()
        assert ctl.address is not None
        sub = durable_subscriber(ctl.address, "sub")
        pub = RawClient(ctl.address, 4, timeout=10.0)
        pub.connect("pub", clean_start=False)
        sent = pub.publish("t", b"m", 1, wait_ack=False)
        assert sub.expect(Publish, timeout=5.0).payload == b"m"
        pub.no_packet(0.01)
        ctl.kill9()  # before the commit: the publisher was never acknowledged
        ctl.start()
        pub = RawClient(ctl.address, 4, timeout=10.0)
        assert pub.connect("pub", clean_start=False).session_present
        pub.send(Publish("t", b"m", 1, False, True, sent.packet_id))
        assert pub.expect(PubAck, timeout=10.0).packet_id == sent.packet_id
        sub = RawClient(ctl.address, 4, timeout=5.0)
        assert sub.connect("sub", clean_start=False).session_present
        got = [sub.expect(Publish, timeout=5.0).payload]
        # The store may have lost the first copy (never committed) or kept it: at least once.
        while True:
            try:
                got.append(sub.recv(0.5).payload)  # type: ignore[union-attr]
            except TimeoutError:
                break
        assert set(got) == {b"m"} and 1 <= len(got) <= 2
    finally:
        ctl.shutdown()


def test_a_publisher_acknowledged_on_acceptance_loses_nothing_to_a_kill(tmp_path: Path) -> None:
    """The acknowledgement that comes before any commit (every stored copy accepted): the
    broker is killed before the commit; the publisher resends nothing, the subscriber had the
    message, and after the restart it is not owed it again (never written, or written and
    its removal pending: at most a duplicate)."""
    ctl = BrokerCtl(tmp_path, store={"acceptance_window": 60.0})
    try:
        ctl.start()
        assert ctl.address is not None
        sub = durable_subscriber(ctl.address, "sub")
        pub = RawClient(ctl.address, 4, timeout=10.0)
        pub.connect("pub", clean_start=True)
        blocker = sqlite3.connect(ctl.data_dir / "kittiwake.db", isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # no commit can happen from here on
            sent = pub.publish("t", b"m", 1, wait_ack=False)
            got = sub.expect(Publish, timeout=5.0)
            sub.send(PubAck(got.packet_id))  # type: ignore[arg-type]
            assert pub.expect(PubAck, timeout=5.0).packet_id == sent.packet_id
            ctl.kill9()
        finally:
            blocker.close()
        ctl.start()
        sub = RawClient(ctl.address, 4, timeout=5.0)
        assert sub.connect("sub", clean_start=False).session_present
        extra = []
        while True:
            try:
                extra.append(sub.recv(0.5))
            except TimeoutError:
                break
        # Accepted before the kill: nothing is owed; a copy written but not yet removed may
        # come once more (at least once), never anything else.
        assert all(isinstance(p, Publish) and p.payload == b"m" for p in extra)
        assert len(extra) <= 1
    finally:
        ctl.shutdown()


def test_a_queue_sender_answered_on_acceptance_loses_nothing_to_a_kill(tmp_path: Path) -> None:
    """The same for a JMS queue (AMQP): a PERSISTENT send answered because its consumer
    accepted the entry before any commit; the broker is killed before the commit. After the
    restart the queue owes nothing: an entry written but whose removal was not may come once
    more (at least once), never anything else."""
    ctl = BrokerCtl(tmp_path, amqp=True, store={"acceptance_window": 60.0})  # type: ignore[arg-type]
    try:
        proc = ctl.start()
        consumer_side = BlockingConnection(proc.amqp_url, timeout=10)
        receiver = consumer_side.create_receiver("q", credit=0)  # see test_amqp_persistence
        sender = BlockingConnection(proc.amqp_url, timeout=10).create_sender("q")
        sender.send(Message(body="first", durable=True))  # stores the queue's in-flight window
        assert receiver.receive(timeout=10).body == "first"
        receiver.accept()
        got: list[object] = []
        blocker = sqlite3.connect(ctl.data_dir / "kittiwake.db", isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # no commit can happen from here on
            grant_credit(receiver, 1)
            consumer = accept_one_in_background(receiver, got)
            sender.send(Message(body="m", durable=True), timeout=5)
            consumer.join(10)
            assert got == ["m"]
            ctl.kill9()
        finally:
            blocker.close()
        proc = ctl.start()
        again = BlockingConnection(proc.amqp_url, timeout=10).create_receiver("q", credit=10)
        extra = []
        while True:
            try:
                extra.append(again.receive(timeout=0.5).body)
            except Timeout:
                break
            again.accept()
        assert set(extra) <= {"first", "m"} and len(extra) == len(set(extra)), extra
    finally:
        ctl.shutdown()
