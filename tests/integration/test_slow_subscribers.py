"""Slow and stuck subscribers, as users meet them: one subscriber that stops reading must not
stall its publishers (and loses nothing within its queue limit); a subscriber that reads as
fast as it can gets every large message (backpressure counts bytes); and broker memory stays
within a bound derived from the configured limits while a subscriber stops reading.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kittiwake.mqtt.packets import PubAck, Publish
from kittiwake.mqtt.properties import Properties

from .clients import unique, wait_until
from .rawclient import RawClient

KIB = 1024
MIB = 1024 * KIB


def publish_all(
    publisher: RawClient, topic: str, count: int, size: int, *, in_flight: int, within: float
) -> int:
    """Publish ``count`` QoS 1 messages of ``size`` bytes (their index first) keeping at most
    ``in_flight`` unacknowledged; returns how many were acknowledged within ``within``."""
    acked = 0
    outstanding: set[int] = set()
    sent = 0
    deadline = time.monotonic() + within
    filler = b"x" * max(0, size - 8)
    while (sent < count or outstanding) and time.monotonic() < deadline:
        while sent < count and len(outstanding) < in_flight:
            packet = publisher.publish(topic, sent.to_bytes(8, "big") + filler, 1, wait_ack=False)
            assert packet.packet_id is not None
            outstanding.add(packet.packet_id)
            sent += 1
        try:
            ack = publisher.recv(timeout=max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            break
        assert isinstance(ack, PubAck) and ack.reason_code == 0, ack
        outstanding.discard(ack.packet_id)
        acked += 1
    return acked


def receive_all(subscriber: RawClient, count: int, within: float) -> set[int]:
    """Read and acknowledge publications until ``count`` distinct indexes arrived or time is up."""
    seen: set[int] = set()
    deadline = time.monotonic() + within
    while len(seen) < count and time.monotonic() < deadline:
        try:
            packet = subscriber.recv(timeout=max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            break
        assert isinstance(packet, Publish), packet
        seen.add(int.from_bytes(packet.payload[:8], "big"))
        if packet.qos == 1:
            subscriber.send(PubAck(packet.packet_id))
    return seen


def test_a_subscriber_that_stops_reading_does_not_stall_its_publishers(broker) -> None:
    """The issue's flood/# scenario: 3,000 x 1 KB at QoS 1 with a subscriber that never reads:
    every PUBACK arrives (once the subscriber is found stuck), and when it reads again it gets
    all 3,000 (they fit its queue limit)."""
    address = broker(limits={"stalled_subscriber_timeout": 1.0}).address
    subscriber = RawClient(address, 4)
    subscriber.connect(unique("flood-sub"))
    subscriber.subscribe("flood/#", 1)
    publisher = RawClient(address, 5)
    publisher.connect(unique("flood-pub"))
    acks = publish_all(publisher, "flood/a", 3000, KIB, in_flight=100, within=60)
    assert acks == 3000, f"only {acks} of 3000 PUBACKs while a subscriber is stuck"
    seen = receive_all(subscriber, 3000, within=60)
    assert seen == set(range(3000)), f"the subscriber got {len(seen)} of 3000"
    publisher.close()
    subscriber.close()


@pytest.mark.timeout(600)
def test_a_subscriber_that_keeps_reading_gets_every_large_message(broker) -> None:
    """The issue's 1,000 x 1 MiB scenario with the default configuration: a QoS 1 publisher
    with 100 in flight and a subscriber reading as fast as it can: nothing is dropped."""
    process = broker()
    subscriber = RawClient(process.address, 4, timeout=30)
    subscriber.connect(unique("big-sub"))
    subscriber.subscribe("big/t", 1)
    publisher = RawClient(process.address, 5, timeout=30)
    publisher.connect(unique("big-pub"))
    seen: set[int] = set()
    reader = threading.Thread(target=lambda: seen.update(receive_all(subscriber, 1000, 400)))
    reader.start()
    acks = publish_all(publisher, "big/t", 1000, MIB, in_flight=100, within=400)
    reader.join(timeout=420)
    assert acks == 1000
    assert seen == set(range(1000)), (
        f"the subscriber got {len(seen)} of 1000; broker log:\n{process.log_text()[-3000:]}"
    )
    assert "full" not in process.log_text()
    publisher.close()
    subscriber.close()


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.timeout(600)
def test_broker_memory_stays_bounded_while_a_subscriber_stops_reading(broker) -> None:
    """A subscriber stops reading under a QoS 1 flood six times its queue limit: the broker's
    peak RSS (VmHWM, so no sampling) grows by no more than what the configured limits allow
    it to hold (twice over, for the allocator and Python's object overhead)."""
    size = 64 * KIB
    limits = {
        "max_queued_bytes": 16 * MIB,
        "flow_control_bytes": 4 * MIB,
        "publisher_pause_bytes": 2 * MIB,
        "max_inflight": 10,
        "stalled_subscriber_timeout": 1.0,
    }
    process = broker(limits=limits)
    assert process.proc is not None
    pid = process.proc.pid
    subscriber = RawClient(process.address, 4)
    subscriber.connect(unique("rss-sub"))
    subscriber.subscribe("rss/t", 1)
    publisher = RawClient(process.address, 5)
    publisher.connect(unique("rss-pub"), properties=Properties())
    # Warm up the paths (codec, store writer) so the baseline includes what they keep.
    publish_all(publisher, "rss/warm", 50, size, in_flight=10, within=60)
    baseline = _status_kib(pid, "VmHWM") * KIB
    count = 6 * limits["max_queued_bytes"] // size
    acks = publish_all(publisher, "rss/t", count, size, in_flight=100, within=300)
    assert acks == count
    peak = _status_kib(pid, "VmHWM") * KIB
    held = (
        limits["max_queued_bytes"]  # the stuck subscriber's queue, at its limit
        + limits["max_inflight"] * size  # its window, in its socket's send buffer
        + limits["publisher_pause_bytes"]  # what the held-back publisher may still push in
        + 100 * size  # ... and its unanswered window, read before the pause
        + limits["flow_control_bytes"]
    )
    bound = baseline + 2 * held
    assert peak <= bound, (
        f"peak RSS grew by {(peak - baseline) / MIB:.1f} MiB under the flood; the limits allow "
        f"{held / MIB:.1f} MiB (bound {2 * held / MIB:.1f})"
    )
    # The drops are counted and logged with their true count (at the next periodic check).
    assert wait_until(lambda: "dropped since it stalled" in process.log_text(), 10)
    publisher.close()
    subscriber.close()
