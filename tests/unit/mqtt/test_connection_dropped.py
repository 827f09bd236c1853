"""A message the connection drops instead of sending leaves no trace but the drop itself.

Outgoing topic aliases (MQTT 5 §3.3.2.3.4) exist for the client only once a PUBLISH that sets
one was sent: a message dropped for the client's Maximum Packet Size sets none. The statistics
count it dropped, not sent.
"""

from __future__ import annotations

import pytest
from connection_harness import Wire

from kittiwake.broker.broker import Broker
from kittiwake.clock import ManualClock
from kittiwake.mqtt.packets import Publish, Subscribe, SubscriptionRequest
from kittiwake.mqtt.properties import Properties

MAX_PACKET = 2048


def subscriber(broker: Broker, qos: int) -> Wire:
    """A v5 subscriber to T announcing Topic Alias Maximum 10 and Maximum Packet Size 2048."""
    wire = Wire(broker, 5)
    wire.connect(
        "sub", properties=Properties(topic_alias_maximum=10, maximum_packet_size=MAX_PACKET)
    )
    wire.send(Subscribe(1, [SubscriptionRequest("T", qos)]))
    wire.received()  # SUBACK
    return wire


def publish(broker: Broker, topic: str, payload: bytes, qos: int) -> None:
    publisher = Wire(broker, 5)
    publisher.connect(f"pub-{len(payload)}-{topic}")
    publisher.send(Publish(topic, payload, qos, packet_id=1 if qos else None))


@pytest.mark.parametrize("qos", [0, 1])
def test_a_dropped_oversized_message_sets_no_alias(qos: int) -> None:
    broker = Broker(clock=ManualClock())
    sub = subscriber(broker, qos)
    publish(broker, "T", b"x" * 4096, qos)
    assert sub.received() == [], "a message above the client's Maximum Packet Size was sent"
    publish(broker, "T", b"after", qos)
    publish(broker, "T", b"again", qos)
    got = [p for p in sub.received() if isinstance(p, Publish)]
    assert [(sub.topic_of(p), p.payload) for p in got] == [("T", b"after"), ("T", b"again")]
    assert not sub.connection.closed



@pytest.mark.parametrize("qos", [0, 1])
def test_a_message_dropped_for_its_size_is_counted_dropped_not_sent(qos: int) -> None:
    broker = Broker(clock=ManualClock())
    subscriber(broker, qos)
    before = (broker.stats.messages_sent, broker.stats.messages_dropped)
    publish(broker, "T", b"x" * 4096, qos)
    assert (broker.stats.messages_sent, broker.stats.messages_dropped) == (
        before[0],
        before[1] + 1,
    )


@pytest.mark.parametrize("version", [4, 5])
def test_qos0_dropped_for_a_slow_reader_is_counted_dropped_not_sent(version: int) -> None:
    """Both QoS 0 paths: the 3.x forwarding shortcut and the full publish path."""
    broker = Broker(clock=ManualClock())
    sub = Wire(broker, version)
    sub.connect("slow")
    sub.send(Subscribe(1, [SubscriptionRequest("T", 0)]))
    sub.received()
    sub.transport.backlog = broker.config.limits.max_queued_bytes + 1
    before = (broker.stats.messages_sent, broker.stats.messages_dropped)
    publish(broker, "T", b"x", 0)
    assert sub.received() == []
    assert (broker.stats.messages_sent, broker.stats.messages_dropped) == (
        before[0],
        before[1] + 1,
    )
