"""The broker: the one object front ends talk to. It owns every session and its lifecycle
(connect, resume, take over, disconnect, expire) and answers each operation with a completion
(see completion.py): this package alone decides what must be durable before a client is told.

The rest lives where its name says: the publish path in publishing.py, queues to connections
in dispatch.py, subscribing in subscriptions.py, MQTT shared subscriptions in shared_groups.py
and JMS ones in shared_subscriptions.py, what makes a JMS durable subscription the same one in
durable_subscriptions.py, the client-id registry in client_ids.py, recovery in
recovery.py, wills and session expiry in wills.py, producer flow control in flow_control.py.
Knows no protocol and no store implementation; runs on one event loop and never blocks; it
holds no locks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from kittiwake import __version__
from kittiwake.broker import dispatch, publishing, recovery, subscriptions, wills
from kittiwake.broker.authorization import Authorizer, Permissions, RenewPermissions
from kittiwake.broker.client_ids import ClientIds
from kittiwake.broker.completion import NOT_FOUND, Completion, Outcome
from kittiwake.broker.connection_admission import ConnectionAdmission
from kittiwake.broker.consumers import Consumer, Delivery, Receiver, Settlement
from kittiwake.broker.dispatch import DurableReceiver, PumpSchedule, resend
from kittiwake.broker.durable_subscriptions import DurableDefinitions
from kittiwake.broker.fenced_writes import FencedWrites
from kittiwake.broker.flow_control import FlowControl
from kittiwake.broker.message import Message
from kittiwake.broker.periodic import run_every
from kittiwake.broker.publishing import Acceptances, PendingCommits
from kittiwake.broker.queues import (
    DEFAULT_QUEUE_RULES,
    Queue,
    QueuedMessage,
    QueueRules,
    QueueTotals,
    Removal,
    RemovalHandler,
)
from kittiwake.broker.retained import RetainedMessages
from kittiwake.broker.route_plans import RoutePlan, RoutePlans
from kittiwake.broker.sessions import (
    NEVER_EXPIRES,
    Session,
    SessionLink,
    Subscription,
    session_producer_name,
    session_queue_name,
)
from kittiwake.broker.shared_groups import MemberReceiver, SharedGroup
from kittiwake.broker.shared_subscriptions import SharedSubscriptions
from kittiwake.broker.store import (
    MemoryStore,
    RecoveredState,
    SessionRecord,
    Store,
    SubscriptionRecord,
)
from kittiwake.broker.subscription_filters import HeadersSource
from kittiwake.broker.subscriptions import (
    RetainedCursor,
    Subscribed,
    SubscribeRefusal,
    SubscriptionOptions,
    filter_durable,
)
from kittiwake.broker.topic_tree import TopicTree
from kittiwake.broker.wills import SessionTimers
from kittiwake.clock import Clock, MonotonicClock
from kittiwake.config import AuthConfig, Config

__all__ = [
    "Broker",
    "BrokerStats",
    "Connected",
    "ProtocolStats",
    "SubscribeRefusal",
    "Subscribed",
    "SubscriptionOptions",
]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ProtocolStats:
    """One protocol's traffic, counted by its front end with plain increments (a front end
    keeps a reference, so counting is one attribute update); read at scrape time."""

    messages_received: int = 0
    messages_sent: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0


@dataclass(slots=True)
class BrokerStats:
    """Counters for $SYS, /metrics and the logs."""

    messages_received: int = 0
    messages_sent: int = 0
    messages_dropped: int = 0
    clients_connected: int = 0
    # Congested subscribers found making no progress (flow_control.py), ever and now.
    subscriber_stalls: int = 0
    stalled_subscribers: int = 0
    # Times the broker-wide queued-bytes bound held every publisher back.
    total_bound_engaged: int = 0
    # Retained publications not retained: payload over limits.max_retained_payload.
    retained_refused: int = 0
    # Per protocol, by the front end's name for itself ("mqtt", "amqp"...).
    protocols: dict[str, ProtocolStats] = field(default_factory=dict)

    def protocol(self, name: str) -> ProtocolStats:
        """The counters of one protocol, made on first use."""
        stats = self.protocols.get(name)
        if stats is None:
            stats = self.protocols[name] = ProtocolStats()
        return stats

    @property
    def bytes_received(self) -> int:
        return sum(p.bytes_received for p in self.protocols.values())

    @property
    def bytes_sent(self) -> int:
        return sum(p.bytes_sent for p in self.protocols.values())


class Connected(NamedTuple):
    """A connection attached to its session; ``completion`` says when the session as
    announced (present or not, deleted by a clean start, stored) is durable."""

    session: Session
    present: bool
    completion: Completion


TreeEntry = Subscription | SharedGroup


class Broker:
    """Owns every session and subscription and the rules that connect them."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        clock: Clock | None = None,
        store: Store | None = None,
    ) -> None:
        self.config = config or Config()
        self.clock: Clock = clock or MonotonicClock()
        self.store: Store = store or MemoryStore()
        self.authorizer = Authorizer(self.config.auth)
        # New connections per client address, for every listener (connection_admission.py).
        self.admission = ConnectionAdmission(self.config.limits, self.clock)
        self.sessions: dict[str, Session] = {}
        # Bytes waiting in all of this broker's queues (max_total_queued_bytes reads it), and
        # those whose drops the tick reports.
        self.queue_totals = QueueTotals()
        # Ids held by connections of other protocols than MQTT (JMS), one registry with them.
        self.client_ids = ClientIds(self.sessions)
        self.retained = RetainedMessages()
        # Sessions still being sent the retained messages of a new wildcard subscription,
        # as their window opens (subscriptions.feed_retained); empty nearly always.
        self.retained_cursors: dict[Session, list[RetainedCursor]] = {}
        # No match cache of its own: the route plans below are the per-topic cache over it.
        self.tree: TopicTree[TreeEntry] = TopicTree(cache_size=0)
        self.shared_groups: dict[tuple[str, str], SharedGroup] = {}
        # Where route filters read the protocol headers a selector may name (JMSMessageID,
        # JMSType...): set by the front end that knows them (subscription_filters).
        self.selector_headers = HeadersSource()
        # JMS durable subscriptions' topic, selector and noLocal (shared or not), stored; a
        # selector applies where publications are routed (subscriptions.filter_durable).
        self.durable_definitions = DurableDefinitions(
            self.store, functools.partial(filter_durable, self)
        )
        # JMS shared subscriptions (a namespace apart from MQTT's groups, DESIGN.md section 5).
        self.shared_subscriptions = SharedSubscriptions(self)
        self.stats = BrokerStats()
        self.started_at = self.clock.now()
        self.version = __version__
        # The store's journal keeps some QoS 0 publications: they must take the full path.
        self.journal_qos0 = self.store.keeps_qos0
        # Who gets a publication on a topic, per topic (the publish path's one cache).
        self.routes = RoutePlans(
            self.tree,
            self.store.journals_qos0 if self.journal_qos0 else None,
            self.config.limits.match_cache_size,
            self.retained_cursors,
        )
        self.timers = SessionTimers()
        self.flow = FlowControl(self.config.limits, self.stats)
        self.pumps = PumpSchedule(self)
        # Pump a session (or group) at the end of this loop turn.
        self.pump_soon = self.pumps.soon
        self.pending_commits = PendingCommits(self)
        # QoS 1 publishers acknowledged once every stored copy is accepted, if before the commit.
        self.acceptances = Acceptances()
        # QoS 1 publications are dispatched while their commit is pending (publishing.py).
        self.store_and_dispatch = self.config.store.store_and_dispatch
        # Writes from outside the protocols (the Spark sink), at most once per fence.
        self.fenced_writes = FencedWrites(self)
        self._next_anonymous = 0
        # One bound method for every session's queue, not one made per session.
        self._on_removed = self._entry_removed
        # Every session's maker of its queue, one bound method for them all (as above).
        self._make_session_queue = self._make_queue
        self._on_removed_dead_lettering = self._entry_given_up
        # Moves what a dead-lettering session queue gives up on to the dead-letter or expiry
        # queue (QueueRules.dead_letters); set by the owner of those queues (the queue
        # destinations). None: there are none, so such entries are dropped, as MQTT's are.
        self.dead_letters: RemovalHandler | None = None
        # Dead-lettering sessions with no connection (JMS durable subscriptions nobody
        # consumes from): tick() moves their expired entries on, as a queue's are swept.
        self.unattended: dict[Session, None] = {}
        # Called with the recovered state at the end of recover(): queues this class does not
        # own (queue destinations) rebuild theirs from it.
        self.recovery_hooks: list[Callable[[RecoveredState], None]] = []

    # Rebuild everything the store kept; once, before any listener accepts connections.
    recover = recovery.recover

    # -- sessions -------------------------------------------------------------------------

    def connect(
        self,
        client_id: str,
        link: SessionLink,
        *,
        clean_start: bool,
        expiry_interval: int,
        window: int,
        will: Message | None = None,
        will_delay: int = 0,
        will_expiry: int | None = None,
        principal: str | None = None,
        queue_rules: QueueRules = DEFAULT_QUEUE_RULES,
    ) -> Connected:
        """Attach a connection to its session; whoever held the id before (a session's
        connection, or a JMS connection) is taken over. ``principal`` is the user it connected
        as (None: anonymous), stored with a persistent session. ``queue_rules``: the order of
        the session's queue and whether what it gives up on is dead-lettered, as the front
        end's protocol wants it (JMS subscriptions: priority order and dead letters)."""
        now = self.clock.now()
        if self.client_ids.holders:
            self.client_ids.take_over(client_id)
        existing = self.sessions.get(client_id)
        # Whether the store was asked to change anything: then the answer waits for it.
        stored = existing is not None and existing.persistent
        if existing is not None and existing.link is not None:
            old = existing.link
            log.info("client %s: session taken over by a new connection", client_id)
            self._end_connection(existing, publish_will=True, now=now)
            old.taken_over()
            # A session with expiry 0 ended with its old connection; start afresh then.
            existing = self.sessions.get(client_id)
        if existing is not None and existing.will_at is not None:
            # A new connection for this client id before the will delay passed deletes the
            # will, whether or not it resumes the session (MQTT 5 §3.1.2.5).
            existing.will = None
            existing.will_at = None
        if existing is not None and clean_start:
            self._end_session(existing, now)
            existing = None
        if existing is not None:
            session = existing
            session_present = True
            session.expires_at = None
            self.timers.attach(session)
        else:
            session = self._new_session(client_id, queue_rules)
            self.sessions[client_id] = session
            session_present = False
        if session.queue_rules is not queue_rules:
            self._apply_queue_rules(session, queue_rules)
        was_persistent = session.persistent
        session.expiry_interval = expiry_interval
        queue = session.made_queue
        if queue is not None:  # (a queue made later is durable when its session is)
            queue.durable = session.persistent
        session.will = will
        session.will_delay = will_delay
        session.will_expiry = will_expiry
        session.principal = principal
        # The receiver comes with start_delivery: nothing may go out before the CONNACK.
        session.set_window(max(1, min(window, self.config.limits.max_inflight)))
        session.link = link
        if self.unattended:
            self.unattended.pop(session, None)
        self.routes.session_changed(session)
        self.stats.clients_connected += 1
        if session.persistent:
            self._save_session(session)
            stored = True
        elif was_persistent:
            self._forget_stored_session(session)
        return Connected(session, session_present, self._durable() if stored else None)

    def assign_client_id(self) -> str:
        """A unique id for a client that connected without one."""
        while True:
            self._next_anonymous += 1
            candidate = f"kittiwake-{self._next_anonymous:08d}"
            if candidate not in self.sessions:
                return candidate

    def start_delivery(self, session: Session) -> None:
        """Once the connection is accepted: resend what was in flight, then the queue.

        The front end calls this when it has sent its acceptance, or has arranged that what
        the consumer sends from now on follows it (the acceptance may wait for a completion).
        """
        link = session.link
        if link is None:
            return
        self._attach_receiver(session, link)
        resend(self, session, link)
        dispatch.pump(self, session)

    def _attach_receiver(self, session: Session, link: SessionLink) -> None:
        """The consumer's receiver: the link itself, or, when the session's copies are
        stored, a receiver that writes their in-flight marks first; and its receivers on the
        queues of the shared subscriptions it is a member of. A session with no consumer yet
        gets its receiver when the consumer is made (_make_queue)."""
        session.delivering = True
        consumer = session.made_consumer
        if consumer is not None:
            consumer.receiver = self._receiver(session, link)
        for member in session.members.values():
            member.consumer.receiver = MemberReceiver(self, member, link)

    def _receiver(self, session: Session, link: SessionLink) -> Receiver:
        if session.persistent:
            return DurableReceiver(self.store, session, link)
        return link

    def hand_over(self, session: Session, entry: QueuedMessage) -> None:
        """A shared group's exactly-once message becomes this member's own, in flight now."""
        if entry.persistent and session.persistent:
            if entry.message.message_id == 0:
                self.store.journal(entry.message)
            self.store.enqueue(session.queue.name, entry)
        session.queue.deliver_now(session.consumer, entry)

    def disconnect(self, session: Session, *, publish_will: bool, keep_will: bool = False) -> None:
        """The session's connection ended (cleanly or not).

        ``keep_will``: the broker is stopping, which is not the client's doing: a persistent
        session keeps its will, stored, to be due after the restart like after a crash.
        """
        if session.link is None:
            return
        self._end_connection(
            session, publish_will=publish_will, now=self.clock.now(), keep_will=keep_will
        )

    def delete_session(self, client_id: str) -> bool | None:
        """An operator deletes a session without a connection (an MQTT persistent session, a
        JMS durable subscription) with what waits in it: True once done, False when there is
        no such session, None when a connection holds it (disconnect that first)."""
        session = self.sessions.get(client_id)
        if session is None:
            return False
        if session.link is not None:
            return None
        log.info("session %s deleted by an operator", client_id)
        # Its will is the client's last word for an unexpected end; an operator's delete is
        # not one.
        session.will = None
        session.will_at = None
        self._end_session(session, self.clock.now())
        return True

    def set_session_expiry(self, session: Session, expiry_interval: int) -> Completion:
        """A v5 DISCONNECT may change the expiry interval."""
        was_persistent = session.persistent
        session.expiry_interval = expiry_interval
        queue = session.made_queue
        if queue is not None:
            queue.durable = session.persistent
        if session.link is not None and session.delivering:
            self._attach_receiver(session, session.link)
        for member in session.members.values():
            member.group.refresh()
        if session.persistent:
            self._save_session(session)
        elif was_persistent:
            self._forget_stored_session(session)
        else:
            return None
        return self._durable()

    def _end_connection(
        self, session: Session, *, publish_will: bool, now: float, keep_will: bool = False
    ) -> None:
        session.link = None
        session.delivering = False
        consumer = session.made_consumer
        if consumer is not None:
            consumer.receiver = None
        if session.queue_rules.dead_letters:
            self.unattended[session] = None  # (_end_session takes it out again)
        for member in session.members.values():
            # What it has not acknowledged goes back to the group, for the other members.
            member.consumer.receiver = None
            if member.group.queue.recall(member.consumer, received_too=True):
                self.pump_soon(member.group)
        self.flow.release(session)
        self.routes.session_changed(session)
        self.stats.clients_connected -= 1
        if keep_will and session.persistent:
            self.timers.detach(session)
            self._save_session(session)
            return
        if not publish_will:
            session.will = None
        if session.will is not None:
            if session.will_delay == 0 or session.expiry_interval == 0:
                wills.publish_will(self, session)
            else:
                session.will_at = now + session.will_delay
        if session.expiry_interval == 0:
            self._end_session(session, now)
            return
        if session.expiry_interval != NEVER_EXPIRES:
            session.expires_at = now + session.expiry_interval
        self.timers.detach(session)
        if session.persistent:
            self._save_session(session)

    def _end_session(self, session: Session, now: float) -> None:
        """The session is over: its will goes out if still pending, its state is dropped."""
        if session.will is not None and session.link is None:
            wills.publish_will(self, session)
        for subscription in list(session.subscriptions.values()):
            subscriptions.remove_subscription(self, subscription)
        session.clear_subscriptions()
        self.retained_cursors.pop(session, None)
        self.unattended.pop(session, None)
        queue = session.made_queue
        if queue is not None:
            queue.drain()
            queue.end_drop_report()
            consumer = session.consumer
            consumer.unsettled.clear()
            queue.in_flight = 0
            # The queue and its consumer point at each other: a cycle the collector may never
            # see once frozen (kittiwake.collector), broken here.
            queue.consumers.clear()
            consumer.queue = None
        session.clear_keys()
        self.timers.attach(session)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        if session.persistent:  # a session that ends with its connection was never stored
            self._forget_stored_session(session)
        log.debug("session %s ended", session.client_id)

    def tick(self) -> None:
        """Fire due timers: wills, session expiry, retained expiry, finished fenced writers,
        delayed messages; report queues' drops. Called about once a second."""
        now = self.clock.now()
        for session in self.timers.due(now):
            if session.will_at is not None and now >= session.will_at:
                wills.publish_will(self, session)
                if session.persistent:
                    self._save_session(session)
            if session.expires_at is not None and now >= session.expires_at:
                log.info("session %s expired", session.client_id)
                self._end_session(session, now)
            else:
                self.timers.rearm(session)
        for message in self.retained.remove_expired(now):
            if message.persistent:
                self.store.set_retained(message.topic, None)
        self.fenced_writes.drop_finished()
        for target in self.pumps.due(now):
            dispatch.pump(self, target)
        self.flow.check(now, self.queued_bytes())
        for session in self.unattended:
            queue = session.made_queue
            if queue is not None and queue.count and queue.expire(now):
                self._durable()  # the removals (and moves) are written without waiting
        self.queue_totals.report_drops()

    def queued_bytes(self) -> int:
        """Bytes waiting in every session's, shared group's and JMS queue (a running total
        the queues keep: no walk over them)."""
        return self.queue_totals.bytes

    # -- subscriptions (see subscriptions.py) ----------------------------------------------

    # The module functions themselves, bound as methods: no extra call on these paths.
    subscribe = subscriptions.subscribe
    unsubscribe = subscriptions.unsubscribe
    send_retained = subscriptions.send_retained
    may_send_retained = subscriptions.may_send_retained
    feed_retained = subscriptions.feed_retained
    retained_ahead = subscriptions.retained_ahead

    def replace_authorization(self, auth: AuthConfig) -> RenewPermissions:
        """New authorisation rules (SIGHUP), applied without dropping anyone.

        Every session's principal gets its new rules (a Permissions shared by a connection
        and its session stays shared); route plans, which hold per-topic read verdicts, are
        worked out again. Subscriptions are kept, as Mosquitto keeps them: the per-message
        read check filters what their principal may no longer read, so one that lies wholly
        inside a newly denied area receives nothing until the rules allow it again. A shared
        subscription's queue cannot be filtered per member: a member whose filter is no
        longer wholly readable leaves its group (logged). Messages already queued for a
        session were authorised when routed and stay queued.

        Returns where front ends get their connections' new Permissions (by principal).
        """
        self.config = replace(self.config, auth=auth)
        authorizer = self.authorizer
        authorizer.replace_config(auth)
        renewed: dict[tuple[str | None, str], Permissions] = {}

        def renew(user: str | None, client_id: str) -> Permissions:
            new = renewed.get((user, client_id))
            if new is None:
                new = renewed[user, client_id] = authorizer.permissions(user, client_id)
            return new

        for session in list(self.sessions.values()):
            if session.permissions is None:
                continue
            permissions = session.permissions = renew(session.principal, session.client_id)
            for full_filter, member in list(session.members.items()):
                if not permissions.may_subscribe_wholly(member.group.topic_filter):
                    log.warning(
                        "rules reloaded: %s (user %s) may no longer read all of %s; "
                        "its shared subscription is removed",
                        session.client_id,
                        session.principal or "(anonymous)",
                        full_filter,
                    )
                    self.unsubscribe(session, full_filter)
        self.routes.changed()
        return renew

    @property
    def subscription_count(self) -> int:
        return sum(len(s.subscriptions) for s in self.sessions.values())

    # -- publishing (see publishing.py) ----------------------------------------------------

    # Accept a publication; the completion says when the publisher may be told it is safe.
    publish = publishing.publish
    # The same for each of a run of plain QoS 1 publications on one topic (a flood).
    publish_run = publishing.publish_run
    # A retained publication over limits.max_retained_payload: delivered, not retained.
    retained_too_large = publishing.retained_too_large

    def route_plan(self, topic: str) -> RoutePlan:
        """Who gets a publication on ``topic`` (cached until routing changes)."""
        return self.routes.plan(topic)

    # -- delivery (see dispatch.py) --------------------------------------------------------

    # Move queued messages into flight while the consumers' windows have room.
    pump = dispatch.pump

    def acknowledge(self, session: Session, delivery: Delivery) -> Outcome:
        """The final acknowledgement of a delivery (PUBACK, PUBCOMP, or a failing PUBREC)."""
        queue = delivery.consumer.queue
        if queue is None or not queue.settle(delivery, _ACCEPTED):
            return NOT_FOUND
        completion = None
        if delivery.entry.persistent and queue.durable:
            # Its stored entry is removed (see _entry_removed): the answer waits for that. An
            # at-least-once acceptance nobody waits for may let its batch wait for more.
            completion = self.store.commit_unhurried()
        if (queue.count or self.retained_cursors) and session not in self.pumps.pending:
            self.pump_soon(session)
        return True, completion

    def acknowledge_all(self, session: Session, deliveries: list[Delivery]) -> None:
        """:meth:`acknowledge` for the deliveries one read acknowledged (a subscriber's run of
        PUBACKs) when nobody waits for the answers: one call for the run, and the store's
        batch and the session's pump seen to once."""
        queue = deliveries[0].consumer.queue if deliveries else None
        if queue is not None:
            # Nearly always the session's own queue's: settled by it in one call.
            stored, waiting = queue.accept_all(deliveries)
        else:
            stored = False
            waiting = False
            for delivery in deliveries:
                queue = delivery.consumer.queue
                if queue is None or not queue.settle(delivery, _ACCEPTED):
                    continue
                if delivery.entry.persistent and queue.durable:
                    stored = True
                if queue.count:
                    waiting = True
        if stored:
            # As acknowledge: an acceptance nobody waits for may let its batch wait for more.
            self.store.commit_unhurried()
        if (waiting or self.retained_cursors) and session not in self.pumps.pending:
            self.pump_soon(session)

    def settle(
        self,
        session: Session,
        delivery: Delivery,
        settlement: Settlement,
        *,
        undeliverable_here: bool = False,
    ) -> Outcome:
        """Any outcome of a delivery: accepted is :meth:`acknowledge`; released and modified
        bring the entry back (modified counts an attempt); rejected, or modified once too often,
        make its queue give up on it (dead-lettered when the session's rules say so). The
        completion says when a removal (and a dead letter's move) is durable."""
        if settlement is _ACCEPTED:
            return self.acknowledge(session, delivery)
        queue = delivery.consumer.queue
        if queue is None or not queue.settle(
            delivery, settlement, undeliverable_here=undeliverable_here
        ):
            return NOT_FOUND
        completion = None
        if settlement is not Settlement.RELEASED and delivery.entry.persistent:
            completion = self._durable()
        self.pump_soon(session)
        return True, completion

    def received(self, session: Session, delivery: Delivery) -> Outcome:
        """A QoS 2 delivery reached the client (PUBREC); only its release remains."""
        queue = delivery.consumer.queue
        if queue is None or not queue.mark_received(delivery):
            return NOT_FOUND
        entry = delivery.entry
        if not (entry.persistent and queue.durable):
            return True, None
        self.store.mark_delivery(queue.name, entry.message.message_id, delivery.tag, "received")
        return True, self._durable()

    def begin_exactly_once(self, session: Session, key: int) -> bool:
        """An exactly-once publication arrived under ``key`` (an MQTT QoS 2 packet id): True
        the first time, False for a resend that must not be routed again. The key is kept,
        stored with the publication, until :meth:`end_exactly_once`."""
        if key in session.exactly_once_keys:
            return False
        session.hold_key(key)
        if session.persistent:
            self.store.add_duplicate(session_producer_name(session.client_id), key)
        return True

    def exactly_once_resent(self, session: Session, key: int) -> Completion:
        """An exactly-once publication resent under a key the session still holds: it is not
        routed again; the completion says when the original's state is durable.

        A session that lives only as long as its connection saw the original on the same
        connection, whose own answer comes first: nothing more to wait for.
        """
        return self._durable() if session.persistent else None

    def end_exactly_once(self, session: Session, key: int) -> Outcome:
        """The publisher released ``key`` (an MQTT PUBREL): the exactly-once exchange is over
        and the key may be used again."""
        if key not in session.exactly_once_keys:
            return NOT_FOUND
        session.release_key(key)
        if not session.persistent:
            return True, None
        self.store.remove_duplicate(session_producer_name(session.client_id), key)
        return True, self._durable()

    # -- helpers --------------------------------------------------------------------------

    def _new_session(
        self, client_id: str, queue_rules: QueueRules = DEFAULT_QUEUE_RULES
    ) -> Session:
        """A session (not yet connected); its queue and consumer come on first use."""
        session = Session(
            client_id, self._make_session_queue, granted_window=self.config.limits.max_inflight
        )
        if queue_rules is not DEFAULT_QUEUE_RULES:
            self._apply_queue_rules(session, queue_rules)
        return session

    def _make_queue(self, session: Session) -> tuple[Queue, Consumer]:
        """A session's queue and consumer, as its state so far asks for them: made on their
        first use (a subscription, a delivery, recovered entries), not at connect."""
        limits = self.config.limits
        client_id = session.client_id
        queue = Queue(
            session_queue_name(client_id),
            max_messages=limits.max_queued_messages,
            max_bytes=limits.max_queued_bytes,
            policy=limits.queue_full_policy,
            totals=self.queue_totals,
            offers_at_most_once=True,  # QoS 0 goes out at once (or when due), never queued
            max_groups=limits.max_message_groups,
        )
        queue.durable = session.persistent
        consumer = Consumer(None, window=session.granted_window, name=client_id)
        queue.attach(consumer)
        queue.on_removed = self._on_removed
        if session.queue_rules is not DEFAULT_QUEUE_RULES:
            self._rule_queue(queue, session.queue_rules)
        link = session.link
        if session.delivering and link is not None:
            consumer.receiver = self._receiver(session, link)
        return queue, consumer

    def _apply_queue_rules(self, session: Session, rules: QueueRules) -> None:
        """Give a session the rules its front end asks for (its queue, now or when made:
        ordering, delivery limit, a removal handler that dead-letters)."""
        session.queue_rules = rules
        if rules.dead_letters:
            if session.link is None:
                self.unattended[session] = None
        else:
            self.unattended.pop(session, None)
        queue = session.made_queue
        if queue is not None:
            self._rule_queue(queue, rules)

    def _rule_queue(self, queue: Queue, rules: QueueRules) -> None:
        """The Queue's own ordering and delivery limit, and a removal handler that
        dead-letters (QueueRules.dead_letters)."""
        queue.reorder(rules.ordering)
        if rules.dead_letters:
            queue.max_delivery_attempts = self.config.queues.settings(
                queue.name
            ).max_delivery_attempts
            queue.on_removed = self._on_removed_dead_lettering
        else:
            queue.max_delivery_attempts = 0
            queue.on_removed = self._on_removed

    def _entry_removed(self, queue: Queue, entry: QueuedMessage, reason: Removal) -> None:
        """An entry left a session's or a group's queue for good: the store forgets it too."""
        accepted = reason is _REMOVAL_ACCEPTED
        if not accepted:
            # Expired or pushed out of a full queue: never delivered. (MQTT's queues do not
            # dead-letter: they have no maximum delivery count.)
            self.stats.messages_dropped += 1
        if entry.persistent and queue.durable:
            message_id = entry.message.message_id
            name = queue.name
            self.store.remove(name, message_id)
            if accepted:
                self.acceptances.accepted(entry)

    def _entry_given_up(self, queue: Queue, entry: QueuedMessage, reason: Removal) -> None:
        """An entry left a dead-lettering session's queue for good: as any session's, and
        a dead letter or an expired entry moves on (in the same store commit as its removal)."""
        self._entry_removed(queue, entry, reason)
        if reason is not Removal.ACCEPTED and self.dead_letters is not None:
            self.dead_letters(queue, entry, reason)

    def _forget_stored_session(self, session: Session) -> None:
        """Drop everything stored for a session: its record, its queue, its QoS 2 state."""
        self.store.delete_session(session.client_id)
        self.store.delete_queue(session_queue_name(session.client_id))
        self.store.delete_duplicates(session_producer_name(session.client_id))

    def _durable(self) -> Completion:
        """Completes once every state change made so far is durable."""
        return self.store.commit()

    def _save_session(self, session: Session) -> None:
        self.store.save_session(
            SessionRecord(
                client_id=session.client_id,
                expiry_interval=session.expiry_interval,
                subscriptions=[
                    SubscriptionRecord(
                        s.full_filter,
                        s.max_qos,
                        s.no_local,
                        s.retain_as_published,
                        s.retain_handling,
                        s.subscription_id,
                    )
                    for s in session.subscriptions.values()
                ],
                will=session.will,
                will_delay=session.will_delay,
                will_expiry=session.will_expiry,
                window=session.window if session.link is not None else 0,
                principal=session.principal,
                queue_rules=session.queue_rules,
            )
        )

    def schedule_ticks(
        self, loop: asyncio.AbstractEventLoop, interval: float = 0.5
    ) -> Callable[[], None]:
        """Run :meth:`tick` on the loop every ``interval`` seconds; returns a canceller.

        From here on, pumps triggered by acknowledgements and publications are batched per
        loop turn on this loop.
        """
        self.pumps.loop = loop
        self.flow.loop = loop
        return run_every(loop, interval, self.tick, "broker tick")


# Read per acknowledgement; an Enum class attribute lookup costs several plain ones.
_ACCEPTED = Settlement.ACCEPTED
_REMOVAL_ACCEPTED = Removal.ACCEPTED
