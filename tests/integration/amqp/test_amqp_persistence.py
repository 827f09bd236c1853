"""PERSISTENT and NON_PERSISTENT from an AMQP producer, across a broker crash: a durable
message the broker accepted is stored (its acceptance waited for the commit); a non-durable one
never touches the store. Observed by an offline MQTT persistent session."""

from __future__ import annotations

from collections.abc import Callable

from proton import Message
from proton.utils import BlockingConnection

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
