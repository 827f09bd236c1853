"""PERSISTENT and NON_PERSISTENT from an AMQP producer, across a broker crash: a durable
message the broker accepted is stored (its acceptance waited for the commit); a non-durable one
never touches the store. Observed by an offline MQTT persistent session."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Message, Timeout
from proton.reactor import DurableSubscription
from proton.utils import BlockingConnection, BlockingReceiver

from ..brokerproc import BrokerProcess, writes_blocked
from ..clients import PahoClient, unique
from .blocking import accept_one_in_background, grant_credit


def test_accepted_persistent_survives_a_crash_non_persistent_does_not(
    broker: Callable[..., BrokerProcess], paho: Callable[..., PahoClient]
) -> None:
    process = broker(amqp=True)
    topic = unique("persist") + "/t"
    client_id = unique("offline")
    subscriber = paho(process.address, client_id, clean=False)
    assert subscriber.subscribe(topic, 2) == [2]
    subscriber.disconnect()

    connection = BlockingConnection(process.amqp_url, timeout=10)
    sender = connection.create_sender(f"topic://{topic}")
    # send() returns once the broker accepted: for a durable message, after its commit.
    sender.send(Message(body=b"kept", durable=True, inferred=True))
    sender.send(Message(body=b"lost", durable=False, inferred=True))
    connection.close()

    assert process.proc is not None
    process.proc.kill()  # no graceful stop: only what was committed remains
    process.proc.wait(10)
    process.start()

    resumed = paho(process.address, client_id, clean=False)
    assert resumed.session_present
    received = resumed.get(timeout=5)
    assert (received.payload, received.qos) == (b"kept", 2)
    resumed.no_message(within=0.5)


def test_a_drain_on_a_new_link_to_a_stored_queue_gets_the_waiting_messages(
    broker: Callable[..., BrokerProcess],
) -> None:
    """A new consumer's first credit grows the queue's in-flight window, which is stored
    before anything goes out (the crash rule). A drain arriving then must wait for that
    commit and send what waits, not answer at once with its credit used up (Qpid JMS's and
    kittiwake.jms's receiveNoWait would return nothing from a full queue)."""
    process = broker(amqp=True)  # the SQLite store
    queue = unique("stored")
    connection = BlockingConnection(process.amqp_url, timeout=10)
    try:
        sender = connection.create_sender(queue)
        for body in ("1", "2"):
            sender.send(Message(body=body, durable=True))
        receiver = connection.create_receiver(queue, credit=0, name="puller")
        receiver.link.drain(2)
        got = [receiver.receive(timeout=5).body, receiver.receive(timeout=5).body]
        receiver.accept()
        assert got == ["1", "2"]
    finally:
        connection.close()


def test_a_drain_on_a_durable_subscription_gets_what_it_collected(
    broker: Callable[..., BrokerProcess],
) -> None:
    """A durable subscription's persistent copies go out exactly once: each waits for the
    commit of its in-flight mark. A drain must wait for those sends, not use the credit up
    first (then the copies would sit unsent until the client gave credit again)."""
    process = broker(amqp=True)  # the SQLite store
    topic = f"topic://{unique('collected')}/t"
    client_id = unique("durable-drain")

    def subscribe(connection: BlockingConnection) -> BlockingReceiver:
        return connection.create_receiver(
            topic, name="sub", credit=0, options=DurableSubscription()
        )

    connection = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
    subscribe(connection).detach()  # the subscription stays, collecting
    connection.close()
    connection = BlockingConnection(process.amqp_url, timeout=10)
    sender = connection.create_sender(topic)
    for body in ("1", "2"):
        sender.send(Message(body=body, durable=True))
    connection.close()
    connection = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
    try:
        receiver = subscribe(connection)
        receiver.link.drain(2)
        got = [receiver.receive(timeout=5).body, receiver.receive(timeout=5).body]
        receiver.accept()
        assert got == ["1", "2"]
    finally:
        connection.close()


def test_a_persistent_queue_send_is_answered_once_its_consumer_accepted_it(
    broker: Callable[..., BrokerProcess],
) -> None:
    """Store-and-dispatch for a queue (DESIGN.md section 3): a PERSISTENT send outside a
    transaction is answered at its commit or once a consumer accepted the entry, whichever
    comes first. While the store cannot commit at all, a send to a queue with a consumer is
    accepted after that consumer accepted it; a send to a queue nobody consumes waits for the
    commit."""
    process = broker(amqp=True)
    consumed, idle = unique("consumed"), unique("idle")
    consumer_side = BlockingConnection(process.amqp_url, timeout=10)
    # Credit 0: one message at a time, each asked for after the acceptance of the one before
    # (frames keep their order on a connection), so the queue's in-flight window stays 1.
    receiver = consumer_side.create_receiver(consumed, credit=0)
    producer_side = BlockingConnection(process.amqp_url, timeout=10)
    to_consumed = producer_side.create_sender(consumed)
    to_idle = producer_side.create_sender(idle)
    # A first message while the store works: the queue's in-flight window is stored before
    # anything goes out, and that commit must not be the blocked one.
    to_consumed.send(Message(body="first", durable=True))
    assert receiver.receive(timeout=10).body == "first"
    receiver.accept()
    got: list[object] = []
    with writes_blocked(process):
        grant_credit(receiver, 1)  # the consumer can take it the moment it comes
        consumer = accept_one_in_background(receiver, got)
        to_consumed.send(Message(body="taken", durable=True), timeout=4)
        consumer.join(10)
        assert got == ["taken"]
        with pytest.raises(Timeout):  # nobody accepts it: the commit it waits for cannot come
            to_idle.send(Message(body="kept", durable=True), timeout=0.5)
    # The lock is gone: the idle queue's message is committed, and it waits there.
    idle_receiver = consumer_side.create_receiver(idle, credit=10)
    assert idle_receiver.receive(timeout=10).body == "kept"
    idle_receiver.accept()
    consumer_side.close()
    producer_side.close()


def test_a_send_to_a_queue_whose_consumer_is_behind_is_answered_at_its_commit(
    broker: Callable[..., BrokerProcess],
) -> None:
    """A consumer holding a delivery it has not settled would not accept a new entry soon: a
    PERSISTENT send to its queue is answered at its commit, not held for an acceptance (a
    synchronous producer would otherwise wait out the acceptance window on every send)."""
    process = broker(amqp=True, store={"acceptance_window": 60.0})
    name = unique("behind")
    producer_side = BlockingConnection(process.amqp_url, timeout=10)
    sender = producer_side.create_sender(name)
    sender.send(Message(body="held", durable=True))  # nobody consumes yet: at its commit
    consumer_side = BlockingConnection(process.amqp_url, timeout=10)
    receiver = consumer_side.create_receiver(name, credit=10)
    assert receiver.receive(timeout=10).body == "held"  # and left unsettled
    for n in range(3):
        # Held for an acceptance, each would wait the whole 60 s window.
        sender.send(Message(body=f"next {n}", durable=True), timeout=10)
    assert [receiver.receive(timeout=10).body for _ in range(3)] == ["next 0", "next 1", "next 2"]
    receiver.accept()
    consumer_side.close()
    producer_side.close()
