"""/metrics rendered from a snapshot: Prometheus's text format, parsed back by
prometheus-client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kittiwake.broker.broker import ProtocolStats
from kittiwake.broker.inspection import QueueView
from kittiwake.store.commit_times import CommitTimes
from kittiwake.web.metrics import CommitHistogram, MetricsSnapshot, render


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_figure_with_its_labels() -> None:
    times = CommitTimes()
    for seconds in (0.0002, 0.003, 0.003, 7.0):
        times.record(seconds)
    figures = MetricsSnapshot(
        uptime_seconds=12.5,
        connections={"mqtt": 3, "amqp": 1},
        traffic={
            "mqtt": ProtocolStats(10, 20, 1000, 2000),
            "amqp": ProtocolStats(1, 2, 300, 400),
        },
        messages_received=11,
        messages_sent=22,
        messages_dropped=4,
        subscriber_stalls=2,
        stalled_subscribers=1,
        total_bound_engaged=5,
        sessions=5,
        subscriptions=6,
        retained_messages=7,
        queues=[QueueView("orders", "queue", 8, 80, 2, 1, True, 3, 1, 0, 0)],
        session_queued_messages=9,
        session_queued_bytes=90,
        expired=3,
        dead_lettered=1,
        commits=CommitHistogram(times.cumulative(), times.total, times.count),
    )
    values = samples(render(figures).decode())
    mqtt, amqp = (("protocol", "mqtt"),), (("protocol", "amqp"),)
    assert values[("kittiwake_connections", mqtt)] == 3
    assert values[("kittiwake_connections", amqp)] == 1
    assert values[("kittiwake_messages_received_total", mqtt)] == 10
    assert values[("kittiwake_messages_sent_total", amqp)] == 2
    assert values[("kittiwake_bytes_received_total", mqtt)] == 1000
    assert values[("kittiwake_bytes_sent_total", amqp)] == 400
    assert values[("kittiwake_messages_dropped_total", ())] == 4
    assert values[("kittiwake_subscriber_stalls_total", ())] == 2
    assert values[("kittiwake_stalled_subscribers", ())] == 1
    assert values[("kittiwake_total_bound_engaged_total", ())] == 5
    assert values[("kittiwake_messages_expired_total", ())] == 3
    assert values[("kittiwake_messages_dead_lettered_total", ())] == 1
    orders = (("kind", "queue"), ("queue", "orders"))
    assert values[("kittiwake_queue_depth", orders)] == 8
    assert values[("kittiwake_queue_consumers", orders)] == 1
    assert values[("kittiwake_session_queued_messages", ())] == 9
    assert values[("kittiwake_store_commit_seconds_count", ())] == 4
    assert values[("kittiwake_store_commit_seconds_bucket", (("le", "0.0005"),))] == 1
    assert values[("kittiwake_store_commit_seconds_bucket", (("le", "0.005"),))] == 3
    assert values[("kittiwake_store_commit_seconds_bucket", (("le", "2.5"),))] == 3
    assert values[("kittiwake_store_commit_seconds_bucket", (("le", "+Inf"),))] == 4
    assert abs(values[("kittiwake_store_commit_seconds_sum", ())] - 7.0062) < 1e-9


def test_a_store_without_commit_times_has_no_histogram() -> None:
    text = render(MetricsSnapshot()).decode()
    assert "kittiwake_store_commit_seconds" not in text
    assert "kittiwake_uptime_seconds 0.0" in text
