"""/metrics in Prometheus's text format: a collector that reads, at scrape time, the counters
the broker already keeps (nothing is counted through prometheus-client on the message path).

:func:`snapshot` gathers the figures (on the loop, once per scrape); :func:`render` turns a
snapshot into the exposition text and is pure, so it is tested with objects alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from kittiwake.broker import inspection
from kittiwake.broker.broker import Broker, ProtocolStats
from kittiwake.broker.inspection import QueueView
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.store.commit_times import CommitTimes

__all__ = ["CONTENT_TYPE_LATEST", "MetricsSnapshot", "render", "snapshot"]


@dataclass(frozen=True, slots=True)
class CommitHistogram:
    buckets: list[tuple[float, int]]  # cumulative, +Inf last
    total_seconds: float
    count: int


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Every figure /metrics shows, taken at one moment."""

    uptime_seconds: float = 0.0
    # Open connections by protocol.
    connections: Mapping[str, int] = field(default_factory=dict)
    # Messages and bytes in and out by protocol.
    traffic: Mapping[str, ProtocolStats] = field(default_factory=dict)
    messages_received: int = 0
    messages_sent: int = 0
    messages_dropped: int = 0
    # Flow control: subscribers that stopped holding publishers back (no progress), how many
    # are stalled now, and how often the broker-wide queued-bytes bound held publishers.
    subscriber_stalls: int = 0
    stalled_subscribers: int = 0
    total_bound_engaged: int = 0
    # Retained publications not retained (payload over limits.max_retained_payload).
    retained_refused: int = 0
    sessions: int = 0
    subscriptions: int = 0
    retained_messages: int = 0
    # Queue destinations and shared groups, one series each; sessions' queues (one per
    # client: too many for labels) only summed.
    queues: list[QueueView] = field(default_factory=list)
    session_queued_messages: int = 0
    session_queued_bytes: int = 0
    # Over every queue, sessions' included.
    expired: int = 0
    dead_lettered: int = 0
    commits: CommitHistogram | None = None


def snapshot(
    broker: Broker,
    destinations: QueueDestinations | None,
    connections: Mapping[str, int],
    commit_times: CommitTimes | None = None,
) -> MetricsSnapshot:
    """The figures now (on the loop: one pass over sessions and queues, no I/O)."""
    stats = broker.stats
    labelled = [
        view for view in inspection.queues(broker, destinations, session_queues=False)
    ]
    expired = sum(view.expired for view in labelled)
    dead_lettered = sum(view.dead_lettered for view in labelled)
    session_messages = session_bytes = 0
    for session in broker.sessions.values():
        queue = session.made_queue
        if queue is None:
            continue  # not made yet: nothing queued, nothing counted
        session_messages += queue.count
        session_bytes += queue.bytes
        expired += queue.counters.expired
        dead_lettered += queue.counters.dead_lettered
    commits = None
    if commit_times is not None:
        commits = CommitHistogram(
            commit_times.cumulative(), commit_times.total, commit_times.count
        )
    return MetricsSnapshot(
        uptime_seconds=broker.clock.now() - broker.started_at,
        connections=dict(connections),
        traffic={name: replace(counts) for name, counts in stats.protocols.items()},
        messages_received=stats.messages_received,
        messages_sent=stats.messages_sent,
        messages_dropped=stats.messages_dropped,
        subscriber_stalls=stats.subscriber_stalls,
        stalled_subscribers=stats.stalled_subscribers,
        total_bound_engaged=stats.total_bound_engaged,
        retained_refused=stats.retained_refused,
        sessions=len(broker.sessions),
        subscriptions=broker.subscription_count,
        retained_messages=len(broker.retained),
        queues=labelled,
        session_queued_messages=session_messages,
        session_queued_bytes=session_bytes,
        expired=expired,
        dead_lettered=dead_lettered,
        commits=commits,
    )


def metric_families(figures: MetricsSnapshot) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "kittiwake_uptime_seconds", "Seconds since the broker started.", figures.uptime_seconds
    )
    connections = GaugeMetricFamily(
        "kittiwake_connections", "Open client connections.", labels=["protocol"]
    )
    for protocol, count in sorted(figures.connections.items()):
        connections.add_metric([protocol], count)
    yield connections
    per_protocol = {
        "messages_received": "Messages received from clients.",
        "messages_sent": "Messages sent to clients.",
        "bytes_received": "Bytes received from clients.",
        "bytes_sent": "Bytes sent to clients.",
    }
    for name, documentation in per_protocol.items():
        family = CounterMetricFamily(f"kittiwake_{name}", documentation, labels=["protocol"])
        for protocol, counts in sorted(figures.traffic.items()):
            family.add_metric([protocol], getattr(counts, name))
        yield family
    yield CounterMetricFamily(
        "kittiwake_messages_routed",
        "Publications the broker accepted, every protocol together.",
        figures.messages_received,
    )
    yield CounterMetricFamily(
        "kittiwake_messages_delivered",
        "Deliveries to consumers, every protocol together.",
        figures.messages_sent,
    )
    yield CounterMetricFamily(
        "kittiwake_messages_dropped",
        "Messages thrown away: expired, pushed out of a full queue, or too far behind.",
        figures.messages_dropped,
    )
    yield CounterMetricFamily(
        "kittiwake_messages_expired", "Queued messages that expired.", figures.expired
    )
    yield CounterMetricFamily(
        "kittiwake_messages_dead_lettered",
        "Messages moved to a dead-letter queue.",
        figures.dead_lettered,
    )
    yield CounterMetricFamily(
        "kittiwake_subscriber_stalls",
        "Subscribers that made no progress for stalled_subscriber_timeout and stopped holding "
        "publishers back.",
        figures.subscriber_stalls,
    )
    yield GaugeMetricFamily(
        "kittiwake_stalled_subscribers",
        "Subscribers stalled now (their queues fill to their limits).",
        figures.stalled_subscribers,
    )
    yield CounterMetricFamily(
        "kittiwake_total_bound_engaged",
        "Times max_total_queued_bytes held every publisher back.",
        figures.total_bound_engaged,
    )
    yield GaugeMetricFamily("kittiwake_sessions", "Sessions, connected or not.", figures.sessions)
    yield GaugeMetricFamily(
        "kittiwake_subscriptions", "Topic subscriptions of sessions.", figures.subscriptions
    )
    yield GaugeMetricFamily(
        "kittiwake_retained_messages", "Topics with a retained message.", figures.retained_messages
    )
    yield CounterMetricFamily(
        "kittiwake_retained_refused",
        "Retained publications delivered but not retained: payload over max_retained_payload.",
        figures.retained_refused,
    )
    depth = GaugeMetricFamily(
        "kittiwake_queue_depth", "Messages waiting in a queue.", labels=["queue", "kind"]
    )
    size = GaugeMetricFamily(
        "kittiwake_queue_bytes", "Payload bytes waiting in a queue.", labels=["queue", "kind"]
    )
    in_flight = GaugeMetricFamily(
        "kittiwake_queue_in_flight",
        "Messages given to consumers and not settled yet.",
        labels=["queue", "kind"],
    )
    consumers = GaugeMetricFamily(
        "kittiwake_queue_consumers", "Consumers attached to a queue.", labels=["queue", "kind"]
    )
    for view in figures.queues:
        labels = [view.name, view.kind]
        depth.add_metric(labels, view.depth)
        size.add_metric(labels, view.bytes)
        in_flight.add_metric(labels, view.in_flight)
        consumers.add_metric(labels, view.consumers)
    yield depth
    yield size
    yield in_flight
    yield consumers
    yield GaugeMetricFamily(
        "kittiwake_session_queued_messages",
        "Messages waiting in sessions' queues, every session together.",
        figures.session_queued_messages,
    )
    yield GaugeMetricFamily(
        "kittiwake_session_queued_bytes",
        "Payload bytes waiting in sessions' queues, every session together.",
        figures.session_queued_bytes,
    )
    if figures.commits is not None:
        commits = figures.commits
        yield HistogramMetricFamily(
            "kittiwake_store_commit_seconds",
            "How long the store's group commits take.",
            buckets=[(_bound_text(bound), count) for bound, count in commits.buckets],
            sum_value=commits.total_seconds,
        )


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class _SnapshotCollector(Collector):
    def __init__(self, figures: MetricsSnapshot) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        return metric_families(self.figures)


def render(figures: MetricsSnapshot) -> bytes:
    """The exposition text of one snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(figures))
    return generate_latest(registry)
