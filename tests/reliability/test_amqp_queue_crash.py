"""The crash rule for JMS queues (DESIGN.md section 2): an entry that could have been in flight
when the broker was killed (within its consumers' credit) comes back as a redelivery, its
delivery count + 1, whether or not its lazily written in-flight mark reached the disk; entries
beyond that window come back as first deliveries. Over AMQP with python-qpid-proton."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection
from reliability_harness import BrokerCtl

from tests.integration.clients import unique


def receive_all(url: str, queue: str, count: int) -> list[tuple[str, int]]:
    connection = BlockingConnection(url, timeout=10)
    try:
        receiver = connection.create_receiver(queue, credit=count + 1)
        got = []
        for _ in range(count):
            message = receiver.receive(timeout=5)
            receiver.accept()
            got.append((message.body, message.delivery_count))
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.3)
        return got
    finally:
        connection.close()


# Kill at once (before the lazy in-flight marks are written) or after them: the pause only aims
# the kill at either side; the outcome must not depend on it.
KILL_AFTER = pytest.mark.parametrize("kill_after", [0.0, 0.3])


@KILL_AFTER
def test_entries_within_the_credit_at_a_kill_come_back_counted(
    tmp_path: Path, kill_after: float
) -> None:
    ctl = BrokerCtl(tmp_path / "b", amqp=True)
    try:
        process = ctl.start()
        queue = unique("crash-q")
        connection = BlockingConnection(process.amqp_url, timeout=10)
        sender = connection.create_sender(queue)
        for n in range(4):
            sender.send(Message(body=f"m{n}", durable=True))  # accepted = committed
        # Exactly two credits (no prefetch, which would top the credit up as messages come).
        receiver = connection.create_receiver(queue, credit=0)
        receiver.link.flow(2)
        assert receiver.receive(timeout=5).body == "m0"  # never settled
        time.sleep(kill_after)
        ctl.kill9()
        process = ctl.start()
        assert receive_all(process.amqp_url, queue, 4) == [
            ("m0", 1),
            ("m1", 1),
            ("m2", 0),
            ("m3", 0),
        ]
    finally:
        ctl.shutdown()


@KILL_AFTER
def test_a_second_kill_still_counts_both_attempts(tmp_path: Path, kill_after: float) -> None:
    """The count recovery adds for a possibly lost mark is written back: a redelivery killed
    again before its own mark is written still comes back with both attempts counted
    (never under-counted). Before the write-back the first kill's attempt was forgotten."""
    ctl = BrokerCtl(tmp_path / "b", amqp=True)
    try:
        process = ctl.start()
        queue = unique("twice-q")
        connection = BlockingConnection(process.amqp_url, timeout=10)
        connection.create_sender(queue).send(Message(body="m0", durable=True))
        receiver = connection.create_receiver(queue, credit=0)
        receiver.link.flow(1)
        assert receiver.receive(timeout=5).delivery_count == 0  # never settled
        time.sleep(kill_after)
        ctl.kill9()
        for attempts in (1, 2):
            process = ctl.start()
            connection = BlockingConnection(process.amqp_url, timeout=10)
            receiver = connection.create_receiver(queue, credit=0)
            receiver.link.flow(1)
            message = receiver.receive(timeout=5)  # never settled either
            assert (message.body, message.delivery_count) == ("m0", attempts)
            time.sleep(kill_after)
            ctl.kill9()
        process = ctl.start()
        assert receive_all(process.amqp_url, queue, 1) == [("m0", 3)]
    finally:
        ctl.shutdown()


def test_a_graceful_stop_counts_only_what_went_out(tmp_path: Path) -> None:
    """Consumers detach on a graceful stop: no window is left, only marked entries count."""
    ctl = BrokerCtl(tmp_path / "b", amqp=True)
    try:
        process = ctl.start()
        queue = unique("stop-q")
        connection = BlockingConnection(process.amqp_url, timeout=10)
        sender = connection.create_sender(queue)
        for n in range(3):
            sender.send(Message(body=f"m{n}", durable=True))
        receiver = connection.create_receiver(queue, credit=5)
        assert receiver.receive(timeout=5).body == "m0"
        receiver.accept()
        connection.close()
        assert ctl.terminate() == 0
        process = ctl.start()
        assert receive_all(process.amqp_url, queue, 2) == [("m1", 1), ("m2", 1)]
    finally:
        ctl.shutdown()


@KILL_AFTER
def test_a_shared_durable_subscription_counts_what_its_consumers_could_hold(
    tmp_path: Path, kill_after: float
) -> None:
    """The same rule for a JMS shared durable subscription: its consumers' credit is the
    window stored before it grows."""
    from tests.integration.amqp.test_amqp_shared import shared

    ctl = BrokerCtl(tmp_path / "b", amqp=True)
    try:
        process = ctl.start()
        topic = unique("crash-shared") + "/t"
        connection = BlockingConnection(process.amqp_url, timeout=10)
        receiver = shared(connection, topic, "sub|global", global_=True, durable=True, credit=0)
        receiver.link.flow(2)
        sender = connection.create_sender(f"topic://{topic}")
        for n in range(4):
            sender.send(Message(body=f"m{n}", durable=True))
        assert receiver.receive(timeout=5).body == "m0"  # never settled
        time.sleep(kill_after)
        ctl.kill9()
        process = ctl.start()
        again = BlockingConnection(process.amqp_url, timeout=10)
        try:
            receiver = shared(again, topic, "sub|global", global_=True, durable=True)
            got = []
            for _ in range(4):
                message = receiver.receive(timeout=5)
                receiver.accept()
                got.append((message.body, message.delivery_count))
            assert got == [("m0", 1), ("m1", 1), ("m2", 0), ("m3", 0)]
        finally:
            again.close()
    finally:
        ctl.shutdown()
