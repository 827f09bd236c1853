"""Recovery at start-up: sessions, their queues and in-flight deliveries, shared groups' queues,
JMS durable subscriptions' definitions, retained messages and fenced writers' fences, rebuilt
from what the store kept. Runs once, before any listener accepts a connection; never writes to
the store.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kittiwake.broker.consumers import DeliveryState
from kittiwake.broker.queues import Queue, QueuedMessage
from kittiwake.broker.sessions import NEVER_EXPIRES, session_producer_name, session_queue_name
from kittiwake.broker.subscriptions import SubscriptionOptions, attach_subscription

if TYPE_CHECKING:
    from kittiwake.broker.broker import Broker

log = logging.getLogger(__name__)


def recover(broker: Broker) -> None:
    """Rebuild sessions, queues, in-flight deliveries and retained messages from the store.

    Called once before any listener accepts connections. Every recovered session starts
    detached: its clients were cut off by the stop, so their wills are due (after their
    delay) unless they reconnect first.
    """
    state = broker.store.recover()
    now = broker.clock.now()
    for message in state.retained.values():
        broker.retained.restore(message)
    for record in state.sessions.values():
        session = broker._new_session(record.client_id, record.queue_rules)
        session.expiry_interval = record.expiry_interval  # (its queue, once made, is durable)
        session.will = record.will
        session.will_delay = record.will_delay
        session.will_expiry = record.will_expiry
        broker.sessions[record.client_id] = session
        # Filtered by its user's rules from now on, not only once its client is back.
        session.principal = record.principal
        session.permissions = broker.authorizer.permissions(record.principal, record.client_id)
        for stored in record.subscriptions:
            options = SubscriptionOptions(
                stored.max_qos,
                stored.no_local,
                stored.retain_as_published,
                stored.retain_handling,
                stored.subscription_id,
            )
            attach_subscription(broker, session, stored.topic_filter, options)
        session.exactly_once_keys = {
            int(key)
            for key in state.duplicates.get(session_producer_name(record.client_id), ())
        }
        if session.expiry_interval != NEVER_EXPIRES:
            session.expires_at = now + session.expiry_interval
        if session.will is not None:
            session.will_at = now + session.will_delay
        broker.timers.detach(session)
    # JMS durable subscriptions' selectors and noLocal, in force before any publication is
    # accepted: a consumer asking for another one replaces the subscription, as before the stop.
    broker.durable_definitions.restore(
        {
            client_id: definition
            for client_id, definition in state.durable_definitions.items()
            if client_id in broker.sessions
        }
    )
    # The Spark sink's fences (see fenced_writes.py).
    broker.fenced_writes.restore(state.duplicates)
    recovered = 0
    # By their queues' names: a session's queue is made here only for its entries (or was,
    # by a subscription); one with neither gets it on first use.
    by_queue = {
        session_queue_name(client_id): session for client_id, session in broker.sessions.items()
    }
    groups = {group.queue.name: group for group in broker.shared_groups.values()}
    # Entries queued (not marked in flight) per queue, in queue order, for the crash rule,
    # and how many were marked in flight (they took part of the window).
    waiting: dict[Queue, list[QueuedMessage]] = {}
    marked: dict[Queue, int] = {}
    for queued in state.queued:
        stored_message = state.messages.get(queued.message_id)
        if stored_message is None:
            continue
        entry = QueuedMessage.restored(
            stored_message,
            queued.qos,
            queued.retain,
            queued.subscription_ids,
            queued.delivery_count,
        )
        in_flight = queued.state in ("sent", "received") and queued.delivery_id
        owner = by_queue.get(queued.queue)
        if owner is None:
            group = groups.get(queued.queue)
            if group is None:
                continue
            # A member's unacknowledged delivery: back to the group, the attempt counted
            # (the stored count includes it). The restart disconnected every member.
            group.queue.push(entry)
            if not in_flight:
                waiting.setdefault(group.queue, []).append(entry)
            else:
                marked[group.queue] = marked.get(group.queue, 0) + 1
        elif in_flight:
            marked[owner.queue] = marked.get(owner.queue, 0) + 1
            # The stored count includes the attempt in flight; resuming counts it again.
            entry.delivery_count = max(0, queued.delivery_count - 1)
            state_now = DeliveryState(queued.state)
            delivery = owner.queue.restore(owner.consumer, entry, state_now)
            delivery.tag = queued.delivery_id
        else:
            owner.queue.push(entry)
            waiting.setdefault(owner.queue, []).append(entry)
        recovered += 1
    # A lazily written in-flight mark is lost in a crash: whatever the window of the
    # connection attached at the time let out may have been seen (DESIGN.md section 2).
    # (By queue name: a session with nothing stored has no queue.)
    windows = {
        session_queue_name(record.client_id): record.window for record in state.sessions.values()
    }
    # A queue whose consumers' credit is not a session's window (a JMS shared durable
    # subscription's) stored its own.
    for name, window in state.queue_windows.items():
        if name in by_queue:
            windows[name] = max(windows.get(name, 0), window)
    for group in broker.shared_groups.values():
        windows[group.queue.name] = sum(
            windows.get(session_queue_name(m.session.client_id), 0)
            for m in group.members.values()
        )
    store = broker.store
    for queue, entries in waiting.items():
        room = windows.get(queue.name, 0) - marked.get(queue, 0)
        if queue.ordering == "priority":
            # Dispatch order: higher priority first, then arrival (a stable sort keeps it).
            entries.sort(key=lambda e: -e.message.priority)
        for entry in entries[: max(0, room)]:
            entry.delivery_count += 1
            store.count_possible_delivery(queue.name, entry.message.message_id)
    for hook in broker.recovery_hooks:
        hook(state)  # other owners of stored queues (queue destinations) take theirs
    log.info(
        "recovered %d sessions, %d messages, %d retained",
        len(state.sessions),
        recovered,
        len(state.retained),
    )
