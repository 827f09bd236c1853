"""What operators see of the core: plain, read-only snapshots of sessions, subscriptions,
queues and retained messages, made on demand (admin API, console, /metrics scrapes).

Never on the message path and never changes what it looks at; the operators' actions live
with the state they change (Broker.delete_session, QueueDestinations.purge). Knows no protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kittiwake.broker.broker import Broker
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.broker.queues import EntryState, Queue
from kittiwake.broker.sessions import NEVER_EXPIRES, Session, session_queue_name

QueueKind = Literal["queue", "session", "shared"]


@dataclass(frozen=True, slots=True)
class SessionView:
    """One session: a client's (MQTT) or a durable subscription's (JMS), connected or not."""

    client_id: str
    connected: bool
    persistent: bool
    # Seconds; None = never expires (or lives as long as its connection when not persistent).
    expiry_interval: int | None
    # Seconds left before a disconnected session expires; None while connected or never.
    expires_in: float | None
    subscriptions: int
    queued: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class SubscriptionView:
    """One topic filter of one session."""

    client_id: str
    topic_filter: str
    max_qos: int
    # Its session outlives the connection (an MQTT persistent session, a JMS durable one).
    durable: bool
    connected: bool
    shared_group: str | None
    no_local: bool


@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue: a JMS queue destination, a session's queue or a shared group's."""

    name: str
    kind: QueueKind
    depth: int
    bytes: int
    in_flight: int
    consumers: int
    durable: bool
    expired: int
    dead_lettered: int
    discarded: int
    rejected: int


@dataclass(frozen=True, slots=True)
class RetainedView:
    topic: str
    bytes: int
    qos: int
    persistent: bool
    # Seconds left before it expires; None = never.
    expires_in: float | None


def sessions(broker: Broker) -> list[SessionView]:
    now = broker.clock.now()
    views = []
    for session in broker.sessions.values():
        expiry: int | None = session.expiry_interval
        if expiry == NEVER_EXPIRES:
            expiry = None
        views.append(
            SessionView(
                client_id=session.client_id,
                connected=session.link is not None,
                persistent=session.persistent,
                expiry_interval=expiry,
                expires_in=None
                if session.expires_at is None
                else max(0.0, session.expires_at - now),
                subscriptions=len(session.subscriptions),
                queued=session.queued,
                in_flight=len(session.inflight),
            )
        )
    views.sort(key=lambda view: view.client_id)
    return views


def subscriptions(broker: Broker) -> list[SubscriptionView]:
    views = [
        SubscriptionView(
            client_id=session.client_id,
            topic_filter=subscription.topic_filter,
            max_qos=subscription.max_qos,
            durable=session.persistent,
            connected=session.link is not None,
            shared_group=subscription.share_group,
            no_local=subscription.no_local,
        )
        for session in broker.sessions.values()
        for subscription in session.subscriptions.values()
    ]
    views.sort(key=lambda view: (view.client_id, view.topic_filter))
    return views


def queues(
    broker: Broker, destinations: QueueDestinations | None = None, *, session_queues: bool = True
) -> list[QueueView]:
    """Queue destinations first (by name), then shared groups' and (unless ``session_queues`` is
    False) sessions' queues."""
    views = []
    if destinations is not None:
        views += [
            _queue_view(queue, "queue")
            for _name, queue in sorted(destinations.router.queues.items())
        ]
    views += [
        _queue_view(group.queue, "shared")
        for _key, group in sorted(broker.shared_groups.items())
    ]
    if session_queues:
        views += [
            _queue_view(session.made_queue, "session")
            if session.made_queue is not None
            else _unmade_queue_view(session)
            for _client_id, session in sorted(broker.sessions.items())
        ]
    return views


def _unmade_queue_view(session: Session) -> QueueView:
    """A session's queue before its first use (see Session.made_queue): empty, as made."""
    return QueueView(
        name=session_queue_name(session.client_id),
        kind="session",
        depth=0,
        bytes=0,
        in_flight=0,
        consumers=1 if session.delivering else 0,
        durable=session.persistent,
        expired=0,
        dead_lettered=0,
        discarded=0,
        rejected=0,
    )


def _queue_view(queue: Queue, kind: QueueKind) -> QueueView:
    counters = queue.counters
    return QueueView(
        name=queue.name,
        kind=kind,
        depth=queue.count,
        bytes=queue.bytes,
        in_flight=queue.in_flight,
        consumers=sum(1 for consumer in queue.consumers if consumer.receiver is not None),
        durable=queue.durable,
        expired=counters.expired,
        dead_lettered=counters.dead_lettered,
        discarded=counters.discarded,
        rejected=counters.rejected,
    )


@dataclass(frozen=True, slots=True)
class EntryView:
    """One message of a queue as a browse shows it: where it stands and what it is, never
    its payload (an operator's view must not leak message contents)."""

    message_id: int
    # The topic (or queue) it was sent to.
    destination: str
    # "waiting", "delayed" or "in flight"
    state: str
    priority: int
    bytes: int
    persistent: bool
    # Earlier attempts that may have reached a consumer.
    delivery_count: int
    # Seconds since the broker accepted it.
    age: float
    expires_in: float | None
    # Seconds before a delayed message becomes visible; None when it is visible.
    visible_in: float | None


def find_queue(
    broker: Broker, destinations: QueueDestinations | None, name: str
) -> Queue | None:
    """A queue by the name ``queues`` shows: a JMS queue's, a shared group's or a session's."""
    if destinations is not None and name in destinations.router.queues:
        return destinations.router.queues[name]
    for group in broker.shared_groups.values():
        if group.queue.name == name:
            return group.queue
    for session in broker.sessions.values():
        if session_queue_name(session.client_id) == name:
            return session.queue  # (an operator's look at it makes it, if not made yet)
    return None


def browse(queue: Queue, now: float, limit: int) -> list[EntryView]:
    """The first ``limit`` entries of ``queue`` in the order consumers get them (the queue's
    own read-only walk: nothing is taken, counted or expired)."""
    views = []
    for row in queue.browse(now)[:limit]:
        entry, message = row.entry, row.entry.message
        due = message.delivery_time
        visible_in = round(due - now, 3) if row.state is EntryState.DELAYED and due else None
        views.append(
            EntryView(
                message_id=message.message_id,
                destination=message.topic,
                state=row.state.value,
                priority=message.priority,
                bytes=message.size,
                persistent=entry.persistent,
                delivery_count=entry.delivery_count,
                age=round(max(0.0, now - message.created), 3),
                expires_in=None if message.expiry is None else round(message.expiry - now, 3),
                visible_in=visible_in,
            )
        )
    return views


def retained(broker: Broker) -> list[RetainedView]:
    now = broker.clock.now()
    views = [
        RetainedView(
            topic=message.topic,
            bytes=len(message.payload),
            qos=message.qos,
            persistent=message.persistent,
            expires_in=None if message.expiry is None else max(0.0, message.expiry - now),
        )
        for message in broker.retained.messages()
    ]
    views.sort(key=lambda view: view.topic)
    return views
