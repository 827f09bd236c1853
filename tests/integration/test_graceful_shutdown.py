"""SIGTERM with real clients of every protocol connected: an MQTT 5 client (paho) is told
0x8B (server shutting down), an AMQP client (proton) gets a close with amqp:connection:forced,
the broker exits 0, and a QoS 1 publication acknowledged just before the signal is there after
the restart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from paho.mqtt.client import MQTTv5
from proton.utils import BlockingConnection, ConnectionClosed

from .brokerproc import BrokerProcess
from .clients import unique


def test_sigterm_tells_every_client_and_keeps_what_was_acknowledged(
    broker: Callable[..., BrokerProcess], paho: Callable[..., Any]
) -> None:
    process = broker(amqp=True, http=True)
    topic = unique("shutdown")
    subscriber_id = unique("offline-sub")
    subscriber = paho(process.address, subscriber_id, clean=False)
    subscriber.subscribe(topic, qos=1)
    subscriber.disconnect()

    mqtt5 = paho(process.address, protocol=MQTTv5)
    amqp = BlockingConnection(process.amqp_url, timeout=10)
    try:
        amqp.create_receiver(unique("q"))
        publisher = paho(process.address)
        # publish() waits for the PUBACK: the broker has said the message is safe.
        publisher.publish(topic, b"acknowledged before SIGTERM", qos=1)

        process.stop()
        assert process.proc is not None and process.proc.returncode == 0, process.log_text()[-3000:]
        assert mqtt5.wait_disconnected().reason_code == 0x8B
        with pytest.raises(ConnectionClosed) as closed:
            amqp.wait(lambda: False, timeout=10, msg="the broker's close")
        assert closed.value.condition == "amqp:connection:forced"
    finally:
        amqp.close()

    process.restart()
    again = paho(process.address, subscriber_id, clean=False)
    assert again.session_present
    message = again.get(timeout=5)
    assert (message.topic, message.payload, message.qos) == (
        topic,
        b"acknowledged before SIGTERM",
        1,
    )
