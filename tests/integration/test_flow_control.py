"""Producer flow control: a QoS 1 publisher feeding a subscriber that cannot keep up has its
acknowledgements held (so its own in-flight window stops it) instead of burying the
subscriber under an ever-growing queue; they are released as the subscriber catches up, and
at once when the subscriber goes away (an absent subscriber never blocks a publisher).
"""

from __future__ import annotations

import time

import pytest

from kittiwake.mqtt.packets import PubAck, Publish

from .clients import unique

DEPTH = 4


def _collect_acks(client, within: float) -> list[int]:
    acks: list[int] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            packet = client.recv(timeout=max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            break
        assert isinstance(packet, PubAck), packet
        acks.append(packet.packet_id)
    return acks


def _start(broker, raw, durable=False):
    """``durable``: the subscriber's session is persistent, so each publication also waits for
    its commit, and its acknowledgement for both the commit and the drain."""
    address = broker(limits={"flow_control_depth": DEPTH, "max_inflight": 1}).address
    topic = unique("fc/t")
    subscriber = raw(address, 4)
    subscriber.connect(unique("fc-sub"), clean_start=not durable)
    subscriber.subscribe(topic, 1)
    publisher = raw(address, 4)
    publisher.connect(unique("fc-pub"))
    for _ in range(12):
        publisher.publish(topic, b"m", 1, wait_ack=False)
    return subscriber, publisher


@pytest.mark.parametrize("durable", [False, True], ids=["clean-session", "persistent-session"])
def test_acks_are_held_while_the_subscriber_is_behind_and_released_as_it_catches_up(
    broker, raw, durable
):
    subscriber, publisher = _start(broker, raw, durable)
    early = _collect_acks(publisher, 0.7)
    assert 0 < len(early) <= DEPTH + 1, f"acknowledgements not held back: {early}"
    assert early == list(range(1, len(early) + 1))
    received = 0
    while received < 12:  # the subscriber catches up, one acknowledgement at a time
        delivery = subscriber.expect(Publish)
        subscriber.send(PubAck(delivery.packet_id))
        received += 1
    late = _collect_acks(publisher, 2.0)
    assert sorted(early + late) == list(range(1, 13))


def test_held_acks_are_released_when_the_subscriber_leaves(broker, raw):
    subscriber, publisher = _start(broker, raw)
    early = _collect_acks(publisher, 0.7)
    assert len(early) < 12
    subscriber.close()  # clean session: its queue is gone, nothing to wait for
    late = _collect_acks(publisher, 2.0)
    assert sorted(early + late) == list(range(1, 13))
