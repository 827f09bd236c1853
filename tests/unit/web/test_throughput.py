"""The console's throughput ring: per-second growth of the broker's counters."""

from __future__ import annotations

from kittiwake.broker.broker import BrokerStats
from kittiwake.web.throughput import Throughput


def test_each_sample_is_the_growth_since_the_last_and_the_ring_is_bounded() -> None:
    stats = BrokerStats()
    mqtt = stats.protocol("mqtt")
    connections = [3]
    times = iter(range(100, 200))
    ring = Throughput(stats, lambda: connections[0], lambda: float(next(times)), kept=2)
    stats.messages_received += 10
    stats.messages_sent += 20
    mqtt.bytes_received += 1000
    mqtt.bytes_sent += 2000
    first = ring.sample()
    assert (first.time, first.messages_in, first.messages_out) == (100.0, 10, 20)
    assert (first.bytes_in, first.bytes_out, first.connections) == (1000, 2000, 3)
    stats.messages_received += 1
    connections[0] = 4
    second = ring.sample()
    assert (second.messages_in, second.messages_out, second.bytes_in) == (1, 0, 0)
    assert second.connections == 4
    third = ring.sample()
    assert list(ring.samples) == [second, third]
