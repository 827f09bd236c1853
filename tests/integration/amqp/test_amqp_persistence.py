"""PERSISTENT and NON_PERSISTENT from an AMQP producer, across a broker crash: a durable
message the broker accepted is stored (its acceptance waited for the commit); a non-durable one
never touches the store. Observed by an offline MQTT persistent session."""

from __future__ import annotations

from collections.abc import Callable

from proton import Message
from proton.reactor import DurableSubscription
from proton.utils import BlockingConnection, BlockingReceiver

from ..brokerproc import BrokerProcess
from ..clients import PahoClient, unique


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
