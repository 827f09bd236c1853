"""The protocol-free broker: sessions, subscriptions, routing, retained messages, wills.

Publish path: route (topic tree) → filter (noLocal) → enqueue on each matching session →
persist (when persistent) → acknowledge the publisher (the caller waits on the completion
publish returns) → dispatch to consumers. Every operation a client is answered for returns a
completion (see completion.py): this module alone decides what must be durable first. Runs on
one event loop and never blocks; it holds no locks.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from kittiwake import __version__
from kittiwake.broker.authorization import Authorizer
from kittiwake.broker.completion import NOT_FOUND, Completion, Outcome
from kittiwake.broker.delivery import delivery_level
from kittiwake.broker.message import Message
from kittiwake.broker.queues import MessageQueue, QueuedMessage
from kittiwake.broker.retained import RetainedMessages
from kittiwake.broker.sessions import (
    NEVER_EXPIRES,
    InflightDelivery,
    Session,
    SessionConsumer,
    SharedGroup,
    Subscription,
    session_producer_name,
    session_queue_name,
)
from kittiwake.broker.store import MemoryStore, SessionRecord, Store, SubscriptionRecord
from kittiwake.broker.topic_tree import TopicTree
from kittiwake.broker.topics import (
    MAX_CACHED_TOPIC_CHARS,
    TopicError,
    parse_shared,
    validate_topic_filter,
)
from kittiwake.clock import Clock, MonotonicClock
from kittiwake.config import Config

log = logging.getLogger(__name__)


class SubscribeRefusal(Enum):
    """Why a subscription was refused; front ends map these to their reason codes."""

    INVALID_FILTER = "invalid topic filter"
    NOT_AUTHORIZED = "not authorized"
    QUOTA_EXCEEDED = "too many subscriptions"


@dataclass(slots=True)
class SubscriptionOptions:
    """What a subscriber asks for, on the MQTT 5 scale (older protocols use the defaults)."""

    max_qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


@dataclass(slots=True)
class Subscribed:
    """A subscription that was accepted; ``new`` is False when it replaced an existing one;
    ``completion`` says when it is durable."""

    subscription: Subscription
    new: bool
    completion: Completion = None

    @property
    def granted_qos(self) -> int:
        return self.subscription.max_qos


@dataclass(slots=True)
class BrokerStats:
    """Counters for $SYS and the logs."""

    messages_received: int = 0
    messages_sent: int = 0
    messages_dropped: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    clients_connected: int = 0


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
        self.sessions: dict[str, Session] = {}
        self.retained = RetainedMessages()
        self.tree: TopicTree[TreeEntry] = TopicTree(cache_size=self.config.limits.match_cache_size)
        self.shared_groups: dict[tuple[str, str], SharedGroup] = {}
        self.stats = BrokerStats()
        self.started_at = self.clock.now()
        self.version = __version__
        # Sessions without a connection, the only ones whose expiry and will timers can fire.
        self._detached: set[Session] = set()
        # (due, sequence, session) for detached sessions with a will or expiry timer, so a tick
        # touches only what is due, not every offline session. Entries go stale when a session
        # reattaches or ends; tick skips those.
        self._timers: list[tuple[float, int, Session]] = []
        self._timer_sequence = itertools.count()
        # Sessions to pump at the end of this loop turn: one pump serves every acknowledgement
        # and publication of a read, instead of one pump each. None = no loop, pump at once.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pump_pending: dict[Session, None] = {}
        # Publications (with the sessions they were queued on) waiting for their commit.
        self._held_for_commit: dict[asyncio.Future[None], list[tuple[Message, list[Session]]]] = {}
        # A commit and a drain both waited for: one shared future per pair, not one per message.
        self._both_waiters: dict[
            tuple[asyncio.Future[None], asyncio.Future[None]], asyncio.Future[None]
        ] = {}
        # Bumped by every change that can alter who receives a live publication (subscribe,
        # unsubscribe, connect, disconnect); caches of routing answers compare against it.
        self.routing_generation = 0
        self._flow_depth = self.config.limits.flow_control_depth
        self._plain_cache: dict[str, tuple[Session, ...] | None] = {}
        self._plain_generation = -1
        # Sessions whose queue holds messages not yet visible (delivery time): tick pumps them.
        self._delayed: set[Session] = set()
        self._next_anonymous = 0
        # The store's journal keeps some QoS 0 publications: they must take the full path.
        self._journal_qos0 = self.store.keeps_qos0

    # -- recovery -------------------------------------------------------------------------

    def recover(self) -> None:
        """Rebuild sessions, queues, in-flight deliveries and retained messages from the store.

        Called once before any listener accepts connections. Every recovered session starts
        detached: its clients were cut off by the stop, so their wills are due (after their
        delay) unless they reconnect first.
        """
        state = self.store.recover()
        now = self.clock.now()
        for message in state.retained.values():
            self.retained.restore(message)
        for record in state.sessions.values():
            session = Session(
                client_id=record.client_id,
                queue=self._new_queue(record.client_id),
                expiry_interval=record.expiry_interval,
                will=record.will,
                will_delay=record.will_delay,
                will_expiry=record.will_expiry,
            )
            self.sessions[record.client_id] = session
            for stored in record.subscriptions:
                options = SubscriptionOptions(
                    stored.max_qos,
                    stored.no_local,
                    stored.retain_as_published,
                    stored.retain_handling,
                    stored.subscription_id,
                )
                self._attach_subscription(session, stored.topic_filter, options)
            session.incoming_qos2 = {
                int(key)
                for key in state.duplicates.get(session_producer_name(record.client_id), ())
            }
            if session.expiry_interval != NEVER_EXPIRES:
                session.expires_at = now + session.expiry_interval
            if session.will is not None:
                session.will_at = now + session.will_delay
            self._detach(session)
        recovered = 0
        by_queue = {session.queue.name: session for session in self.sessions.values()}
        for queued in state.queued:
            owner = by_queue.get(queued.queue)
            stored_message = state.messages.get(queued.message_id)
            if owner is None or stored_message is None:
                continue
            entry = QueuedMessage(
                stored_message,
                queued.qos,
                True,
                queued.retain,
                queued.subscription_ids,
                queued.delivery_count,
            )
            if queued.state in ("sent", "received") and queued.delivery_id:
                owner.inflight[queued.delivery_id] = InflightDelivery(entry, queued.state)
            else:
                owner.queue.push(entry)
            recovered += 1
        log.info(
            "recovered %d sessions, %d messages, %d retained",
            len(state.sessions),
            recovered,
            len(state.retained),
        )

    # -- sessions -------------------------------------------------------------------------

    def connect(
        self,
        client_id: str,
        consumer: SessionConsumer,
        *,
        clean_start: bool,
        expiry_interval: int,
        window: int,
        will: Message | None = None,
        will_delay: int = 0,
        will_expiry: int | None = None,
    ) -> Connected:
        """Attach a connection to its session."""
        now = self.clock.now()
        existing = self.sessions.get(client_id)
        # Whether the store was asked to change anything: then the answer waits for it.
        stored = existing is not None and existing.persistent
        if existing is not None and existing.consumer is not None:
            old = existing.consumer
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
            self._detached.discard(session)
        else:
            session = Session(client_id=client_id, queue=self._new_queue(client_id))
            self.sessions[client_id] = session
            session_present = False
        was_persistent = session.persistent
        session.expiry_interval = expiry_interval
        session.will = will
        session.will_delay = will_delay
        session.will_expiry = will_expiry
        session.window = max(1, min(window, self.config.limits.max_inflight))
        session.consumer = consumer
        self.routing_generation += 1
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
        consumer = session.consumer
        if consumer is None:
            return
        for delivery_id, inflight in list(session.inflight.items()):
            if inflight.state == "received":
                consumer.release(delivery_id)
            else:
                consumer.deliver(delivery_id, inflight.entry, resend=True)
        self.pump(session)

    def disconnect(self, session: Session, *, publish_will: bool, keep_will: bool = False) -> None:
        """The session's connection ended (cleanly or not).

        ``keep_will``: the broker is stopping, which is not the client's doing: a persistent
        session keeps its will, stored, to be due after the restart like after a crash.
        """
        if session.consumer is None:
            return
        self._end_connection(
            session, publish_will=publish_will, now=self.clock.now(), keep_will=keep_will
        )

    def set_session_expiry(self, session: Session, expiry_interval: int) -> Completion:
        """A v5 DISCONNECT may change the expiry interval."""
        was_persistent = session.persistent
        session.expiry_interval = expiry_interval
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
        session.consumer = None
        self._release_drain_waiter(session)
        self.routing_generation += 1
        self.stats.clients_connected -= 1
        if keep_will and session.persistent:
            self._detach(session)
            self._save_session(session)
            return
        if not publish_will:
            session.will = None
        if session.will is not None:
            if session.will_delay == 0 or session.expiry_interval == 0:
                self._publish_will(session)
            else:
                session.will_at = now + session.will_delay
        if session.expiry_interval == 0:
            self._end_session(session, now)
            return
        if session.expiry_interval != NEVER_EXPIRES:
            session.expires_at = now + session.expiry_interval
        self._detach(session)
        if session.persistent:
            self._save_session(session)

    def _end_session(self, session: Session, now: float) -> None:
        """The session is over: its will goes out if still pending, its state is dropped."""
        if session.will is not None and session.consumer is None:
            self._publish_will(session)
        for subscription in list(session.subscriptions.values()):
            self._remove_subscription(subscription)
        session.subscriptions.clear()
        session.queue.drain()
        session.inflight.clear()
        session.incoming_qos2.clear()
        self._detached.discard(session)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        if session.persistent:  # a session that ends with its connection was never stored
            self._forget_stored_session(session)
        log.debug("session %s ended", session.client_id)

    def _publish_will(self, session: Session) -> None:
        will = session.will
        session.will = None
        session.will_at = None
        if will is None:
            return
        if not self.authorizer.may_publish(will.topic):
            log.info("client %s: will to %s not authorised", session.client_id, will.topic)
            return
        log.debug("client %s: publishing will to %s", session.client_id, will.topic)
        will.created = self.clock.now()
        if session.will_expiry is not None:
            will.expiry = will.created + session.will_expiry
        self.publish(will)

    def _detach(self, session: Session) -> None:
        """The session has no connection now; its will and expiry timers start to count."""
        self._detached.add(session)
        due = _next_timer(session)
        if due is not None:
            heapq.heappush(self._timers, (due, next(self._timer_sequence), session))

    def tick(self) -> None:
        """Fire due timers: wills, session expiry, retained expiry. Called about once a second."""
        now = self.clock.now()
        timers = self._timers
        while timers and timers[0][0] <= now:
            at, _, session = heapq.heappop(timers)
            if session not in self._detached or _next_timer(session) != at:
                continue  # reattached, ended, or re-armed under a later entry
            if session.will_at is not None and now >= session.will_at:
                self._publish_will(session)
                if session.persistent:
                    self._save_session(session)
            if session.expires_at is not None and now >= session.expires_at:
                log.info("session %s expired", session.client_id)
                self._end_session(session, now)
            elif (later := _next_timer(session)) is not None:
                heapq.heappush(timers, (later, next(self._timer_sequence), session))
        for message in self.retained.remove_expired(now):
            if message.persistent:
                self.store.set_retained(message.topic, None)
        for session in list(self._delayed):
            due = session.queue.next_visible_time()
            if due is None or self.sessions.get(session.client_id) is not session:
                self._delayed.discard(session)
            elif due <= now and session.consumer is not None:
                self.pump(session)

    # -- subscriptions --------------------------------------------------------------------

    def subscribe(
        self, session: Session, full_filter: str, options: SubscriptionOptions
    ) -> SubscribeRefusal | Subscribed:
        """Add or replace a subscription, or say why not.

        Retained messages are not sent here: the front end acknowledges the subscription first
        and then calls :meth:`send_retained`, so they never overtake the acknowledgement.
        """
        try:
            _group, topic_filter = parse_shared(full_filter)
            validate_topic_filter(topic_filter, self.config.limits.max_topic_levels)
        except TopicError:
            return SubscribeRefusal.INVALID_FILTER
        if not self.authorizer.may_subscribe(topic_filter):
            return SubscribeRefusal.NOT_AUTHORIZED
        existing = session.subscriptions.get(full_filter)
        if existing is None and len(session.subscriptions) >= (
            self.config.limits.max_subscriptions_per_session
        ):
            return SubscribeRefusal.QUOTA_EXCEEDED
        if existing is not None:
            existing.max_qos = options.max_qos
            existing.no_local = options.no_local
            existing.retain_as_published = options.retain_as_published
            existing.retain_handling = options.retain_handling
            existing.subscription_id = options.subscription_id
            subscription = existing
            self.routing_generation += 1
        else:
            subscription = self._attach_subscription(session, full_filter, options)
        if not session.persistent:
            return Subscribed(subscription, existing is None)
        self._save_session(session)
        return Subscribed(subscription, existing is None, self._durable())

    def unsubscribe(self, session: Session, full_filter: str) -> Outcome:
        subscription = session.subscriptions.pop(full_filter, None)
        if subscription is None:
            return NOT_FOUND
        self._remove_subscription(subscription)
        if not session.persistent:
            return True, None
        self._save_session(session)
        return True, self._durable()

    @property
    def subscription_count(self) -> int:
        return sum(len(s.subscriptions) for s in self.sessions.values())

    def _attach_subscription(
        self, session: Session, full_filter: str, options: SubscriptionOptions
    ) -> Subscription:
        """Create a subscription from a (validated) filter and route messages to it."""
        group, topic_filter = parse_shared(full_filter)
        subscription = Subscription(
            session=session,
            topic_filter=topic_filter,
            max_qos=options.max_qos,
            share_group=group,
            no_local=options.no_local,
            retain_as_published=options.retain_as_published,
            retain_handling=options.retain_handling,
            subscription_id=options.subscription_id,
        )
        session.subscriptions[full_filter] = subscription
        self._add_subscription(subscription)
        return subscription

    def _add_subscription(self, subscription: Subscription) -> None:
        self.routing_generation += 1
        if subscription.share_group is None:
            self.tree.insert(subscription.topic_filter, subscription)
            return
        key = (subscription.share_group, subscription.topic_filter)
        group = self.shared_groups.get(key)
        if group is None:
            group = SharedGroup(subscription.share_group, subscription.topic_filter)
            self.shared_groups[key] = group
            self.tree.insert(subscription.topic_filter, group)
        group.members[subscription.session] = subscription

    def _remove_subscription(self, subscription: Subscription) -> None:
        self.routing_generation += 1
        if subscription.share_group is None:
            self.tree.remove(subscription.topic_filter, subscription)
            return
        key = (subscription.share_group, subscription.topic_filter)
        group = self.shared_groups.get(key)
        if group is None:
            return
        group.members.pop(subscription.session, None)
        if not group.members:
            del self.shared_groups[key]
            self.tree.remove(subscription.topic_filter, group)

    def send_retained(self, subscribed: Subscribed) -> None:
        """Deliver the retained messages a new subscription should see (retain handling)."""
        subscription = subscribed.subscription
        if subscription.share_group is not None:
            return  # shared subscriptions never receive retained messages (MQTT-4.8.2)
        handling = subscription.retain_handling
        if handling == 2 or (handling == 1 and not subscribed.new):
            return
        now = self.clock.now()
        session = subscription.session
        sub_ids = () if subscription.subscription_id is None else (subscription.subscription_id,)
        for message in self.retained.matching(subscription.topic_filter, now):
            qos, persistent = delivery_level(message.qos, message.persistent, subscription.max_qos)
            entry = QueuedMessage(message, qos, persistent, True, sub_ids)
            self._enqueue(session, entry)
        self.pump(session)

    # -- publishing -----------------------------------------------------------------------

    def publish(self, message: Message) -> Completion:
        """Accept a publication; the completion says when the publisher may be told it is
        safe (its commit, and room at its congested receivers: see _flow_control)."""
        if not message.created:
            message.created = self.clock.now()
        self.stats.messages_received += 1
        if message.persistent:
            if not message.message_id:
                self.store.journal(message)
        elif self._journal_qos0 and self.store.journals_qos0(message.topic):
            self.store.journal(message)  # opted in for the data pipeline; nothing waits
        if message.retain:
            self._retain(message)
        touched = self._route(message)
        commit = self.store.commit() if message.persistent else None
        drained = self._flow_control(touched) if message.qos and touched else None
        if commit is None:
            for session in touched:
                self.pump_soon(session)
            return drained
        if touched:
            message.awaiting_commit = True
            # One callback per commit, however many publications it holds.
            held = self._held_for_commit.get(commit)
            if held is None:
                held = self._held_for_commit[commit] = []
                commit.add_done_callback(self._after_commit)
            held.append((message, touched))
        if drained is None:
            return commit
        return self._commit_and_drain(commit, drained)

    def _durable(self) -> Completion:
        """Completes once every state change made so far is durable."""
        return self.store.commit()

    def _flow_control(self, touched: list[Session]) -> asyncio.Future[None] | None:
        """A future that resolves once every congested receiver has drained, or None.

        Only connected receivers count: an offline session's queue does not drain, and a
        publisher must never wait on a subscriber that is not there.
        """
        depth = self._flow_depth
        if not depth or self._loop is None:
            return None
        for session in touched:
            if session.consumer is not None and session.queue.count >= depth:
                # One future per congested session, shared by every publisher waiting on it.
                waiter = session.drain_waiter
                if waiter is None:
                    waiter = session.drain_waiter = self._loop.create_future()
                return waiter
        return None

    def _commit_and_drain(
        self, commit: asyncio.Future[None], drained: asyncio.Future[None]
    ) -> asyncio.Future[None]:
        """Resolves once both are done: with the drain's cancellation or error if it has one,
        else with the commit's outcome (a failed commit must reach the publisher)."""
        key = (commit, drained)
        both = self._both_waiters.get(key)
        if both is not None:
            return both
        both = self._both_waiters[key] = commit.get_loop().create_future()

        def settle(_: object) -> None:
            if not (commit.done() and drained.done()):
                return
            self._both_waiters.pop(key, None)
            if both.done():
                return
            for source in (drained, commit):
                if source.cancelled():
                    both.cancel()
                    return
                error = source.exception()
                if error is not None:
                    both.set_exception(error)
                    return
            both.set_result(None)

        commit.add_done_callback(settle)
        drained.add_done_callback(settle)
        return both

    def _release_drain_waiter(self, session: Session) -> None:
        waiter = session.drain_waiter
        session.drain_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def plain_targets(self, topic: str) -> tuple[Session, ...] | None:
        """The connected sessions a QoS 0, non-retained publication on ``topic`` reaches as is.

        "As is" means every matching subscription is a plain one (not shared, no noLocal, no
        subscription identifier), so a front end may forward the publication without building
        a Message. None means some match needs the full publish path. Cached per topic until
        the routing generation changes.
        """
        if self._plain_generation != self.routing_generation:
            self._plain_cache.clear()
            self._plain_generation = self.routing_generation
        cache = self._plain_cache
        try:
            return cache[topic]
        except KeyError:
            pass
        sessions: dict[Session, None] = {}
        result: tuple[Session, ...] | None = None
        if self._journal_qos0 and self.store.journals_qos0(topic):
            return None  # the journal keeps it: the full publish path writes it
        for entry in self.tree.match(topic):
            if (
                isinstance(entry, SharedGroup)
                or entry.no_local
                or entry.subscription_id is not None
            ):
                break
            if entry.session.consumer is not None:  # offline sessions never queue QoS 0
                sessions[entry.session] = None
        else:
            result = tuple(sessions)
        if len(topic) <= MAX_CACHED_TOPIC_CHARS:
            if len(cache) >= 4096:
                cache.clear()
            cache[topic] = result
        return result

    def _after_commit(self, future: asyncio.Future[None]) -> None:
        """Dispatch what a commit made safe; if it failed, deliver none of it."""
        held = self._held_for_commit.pop(future, [])
        failed = future.cancelled() or future.exception() is not None
        for message, touched in held:
            message.awaiting_commit = False
            for session in touched:
                if failed:
                    # Not stored, and its publisher is told so: it must not be delivered.
                    session.queue.remove_message(message)
                else:
                    self.pump_soon(session)

    def pump_soon(self, session: Session) -> None:
        """Pump this session once the current loop turn has done its reading."""
        if self._loop is None:
            self.pump(session)
            return
        pending = self._pump_pending
        if not pending:
            self._loop.call_soon(self._run_pumps)
        pending[session] = None

    def _run_pumps(self) -> None:
        sessions = list(self._pump_pending)
        self._pump_pending.clear()
        for session in sessions:
            self.pump(session)

    def _retain(self, message: Message) -> None:
        previous = self.retained.update(message)
        if message.persistent and message.payload:
            self.store.set_retained(message.topic, message)
        elif previous is not None and previous.persistent:
            self.store.set_retained(message.topic, None)

    def _route(self, message: Message) -> list[Session]:
        """Enqueue the message on every session that should get it; returns those sessions."""
        matches = self.tree.match(message.topic)
        if not matches:
            return []
        if len(matches) == 1:
            only = matches[0]
            if isinstance(only, Subscription):
                return self._route_one(message, only)
        # One copy per session at the highest QoS of its overlapping (non-shared) subscriptions.
        merged: dict[Session, tuple[int, list[int], bool]] = {}
        shared: list[Subscription] = []
        origin = message.origin
        for entry in matches:
            if isinstance(entry, SharedGroup):
                member = entry.pick()
                if member is not None:
                    shared.append(member)
                continue
            if entry.no_local and origin is not None and entry.session.client_id == origin:
                continue
            session = entry.session
            retain = message.retain and entry.retain_as_published
            previous = merged.get(session)
            if previous is None:
                ids = [] if entry.subscription_id is None else [entry.subscription_id]
                merged[session] = (entry.max_qos, ids, retain)
            else:
                qos, ids, was_retain = previous
                if entry.subscription_id is not None:
                    ids.append(entry.subscription_id)
                merged[session] = (max(qos, entry.max_qos), ids, was_retain or retain)
        touched: list[Session] = []
        for session, (max_qos, ids, retain) in merged.items():
            qos, persistent = delivery_level(message.qos, message.persistent, max_qos)
            if self._enqueue(session, QueuedMessage(message, qos, persistent, retain, tuple(ids))):
                touched.append(session)
        for member in shared:
            qos, persistent = delivery_level(message.qos, message.persistent, member.max_qos)
            ids_t = () if member.subscription_id is None else (member.subscription_id,)
            retain = message.retain and member.retain_as_published
            entry_q = QueuedMessage(message, qos, persistent, retain, ids_t)
            if self._enqueue(member.session, entry_q):
                touched.append(member.session)
        return touched

    def _route_one(self, message: Message, subscription: Subscription) -> list[Session]:
        """The common case of one matching subscription, without the merging machinery."""
        session = subscription.session
        if subscription.no_local and session.client_id == message.origin:
            return []
        qos, persistent = delivery_level(message.qos, message.persistent, subscription.max_qos)
        sub_id = subscription.subscription_id
        entry = QueuedMessage(
            message,
            qos,
            persistent,
            message.retain and subscription.retain_as_published,
            () if sub_id is None else (sub_id,),
        )
        return [session] if self._enqueue(session, entry) else []

    def _enqueue(self, session: Session, entry: QueuedMessage) -> bool:
        """Queue one copy; QoS 0 goes straight out or nowhere. True when pumping is needed."""
        if entry.qos == 0:
            consumer = session.consumer
            if consumer is None:
                return False
            consumer.deliver(0, entry)
            self.stats.messages_sent += 1
            return False
        consumer = session.consumer
        if consumer is None and not session.persistent:
            return False
        stored = entry.persistent and session.persistent
        if (
            consumer is not None
            and not stored
            and not session.queue.count
            and len(session.inflight) < session.window
            and entry.message.delivery_time is None
            # A QoS 2 copy of a message still being committed waits for the commit: if it
            # fails, the publisher is refused and resends, and this copy would be a duplicate.
            and (entry.qos < 2 or not entry.message.persistent)
        ):
            # Nothing to wait for (no commit, no queue ahead, room in the window): send now.
            self._start_delivery(session, consumer, entry, False)
            return False
        accepted, victims = session.queue.push(entry)
        for victim in victims:
            self.stats.messages_dropped += 1
            if victim.persistent and session.persistent:
                self.store.remove(session.queue.name, victim.message.message_id)
        if not accepted:
            self.stats.messages_dropped += 1
            return False
        if stored:
            if entry.message.message_id == 0:
                self.store.journal(entry.message)
            self.store.enqueue(session.queue.name, entry)
        return True

    # -- delivery -------------------------------------------------------------------------

    def pump(self, session: Session) -> None:
        """Move queued messages into flight while the consumer's window has room."""
        consumer = session.consumer
        if consumer is None:
            return
        queue = session.queue
        if not queue.count:
            return
        inflight = session.inflight
        now = self.clock.now()
        stored = session.persistent
        expired: list[QueuedMessage] = []
        while len(inflight) < session.window:
            entry = queue.pop(now, expired)
            if entry is None:
                break
            if entry.message.awaiting_commit and (entry.qos == 2 or (stored and entry.persistent)):
                # Its commit's callback pumps again. (A QoS 1 copy nobody stores may go first,
                # as in _enqueue: a failed commit only makes it a duplicate, which QoS 1 allows.)
                queue.push_front(entry)
                break
            self._start_delivery(session, consumer, entry, stored and entry.persistent)
        if session.drain_waiter is not None and queue.count <= self._flow_depth // 2:
            self._release_drain_waiter(session)
        if queue.next_visible_time() is not None:
            self._delayed.add(session)
        for dead in expired:  # expired while queued: the store must forget them too
            if stored and dead.persistent:
                self.store.remove(session.queue.name, dead.message.message_id)
        if queue.counters.expired:
            self.stats.messages_dropped += queue.counters.expired
            queue.counters.expired = 0

    def _start_delivery(
        self, session: Session, consumer: SessionConsumer, entry: QueuedMessage, stored: bool
    ) -> None:
        """Put one QoS 1/2 entry in flight under a fresh delivery id and send it."""
        delivery_id = session.allocate_delivery_id()
        session.inflight[delivery_id] = InflightDelivery(entry)
        entry.delivery_count += 1
        self.stats.messages_sent += 1
        if stored:
            self.store.mark_delivery(
                session.queue.name,
                entry.message.message_id,
                delivery_id,
                "sent",
                lazy=entry.qos == 1,
            )
            if entry.qos == 2:
                # The client will hold this id until PUBREL: the broker must not forget it.
                commit = self.store.commit()
                if commit is not None:

                    def send(f: asyncio.Future[None]) -> None:
                        current = session.inflight.get(delivery_id)
                        if f.cancelled() or f.exception() is not None:
                            return  # stays in flight; resent on the next connection
                        if (
                            session.consumer is consumer
                            and current is not None
                            and current.entry is entry
                        ):
                            consumer.deliver(delivery_id, entry)

                    commit.add_done_callback(send)
                    return
        consumer.deliver(delivery_id, entry)

    def acknowledge(self, session: Session, delivery_id: int) -> Outcome:
        """The final acknowledgement of a delivery (PUBACK, PUBCOMP, or a failing PUBREC)."""
        inflight = session.inflight.pop(delivery_id, None)
        if inflight is None:
            return NOT_FOUND
        entry = inflight.entry
        completion = None
        if entry.persistent and session.persistent:
            self.store.remove(session.queue.name, entry.message.message_id)
            completion = self.store.commit()  # _durable(), without a call per acknowledgement
        if session.queue.count:
            self.pump_soon(session)
        return True, completion

    def received(self, session: Session, delivery_id: int) -> Outcome:
        """A QoS 2 delivery reached the client (PUBREC); only its release remains."""
        inflight = session.inflight.get(delivery_id)
        if inflight is None:
            return NOT_FOUND
        inflight.state = "received"
        entry = inflight.entry
        if not (entry.persistent and session.persistent):
            return True, None
        self.store.mark_delivery(
            session.queue.name, entry.message.message_id, delivery_id, "received"
        )
        return True, self._durable()

    def begin_incoming_qos2(self, session: Session, packet_id: int) -> bool:
        """Record an incoming QoS 2 id; False means it is a resend that must not be routed."""
        if packet_id in session.incoming_qos2:
            return False
        session.incoming_qos2.add(packet_id)
        if session.persistent:
            self.store.add_duplicate(session_producer_name(session.client_id), packet_id)
        return True

    def incoming_qos2_resent(self, session: Session, packet_id: int) -> Completion:
        """A QoS 2 publication resent under an id the session still holds: it is not routed
        again; the completion says when the original's state is durable.

        A session that lives only as long as its connection saw the original on the same
        connection, whose own answer comes first: nothing more to wait for.
        """
        return self._durable() if session.persistent else None

    def release_incoming_qos2(self, session: Session, packet_id: int) -> Outcome:
        """PUBREL: the exactly-once handshake for this id is over."""
        if packet_id not in session.incoming_qos2:
            return NOT_FOUND
        session.incoming_qos2.discard(packet_id)
        if not session.persistent:
            return True, None
        self.store.remove_duplicate(session_producer_name(session.client_id), packet_id)
        return True, self._durable()

    # -- helpers --------------------------------------------------------------------------

    def _new_queue(self, client_id: str) -> MessageQueue:
        limits = self.config.limits
        return MessageQueue(
            session_queue_name(client_id),
            max_messages=limits.max_queued_messages,
            max_bytes=limits.max_queued_bytes,
            policy=limits.queue_full_policy,
        )

    def _forget_stored_session(self, session: Session) -> None:
        """Drop everything stored for a session: its record, its queue, its QoS 2 state."""
        self.store.delete_session(session.client_id)
        self.store.delete_queue(session.queue.name)
        self.store.delete_duplicates(session_producer_name(session.client_id))

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
            )
        )

    def schedule_ticks(
        self, loop: asyncio.AbstractEventLoop, interval: float = 0.5
    ) -> Callable[[], None]:
        """Run :meth:`tick` on the loop every ``interval`` seconds; returns a canceller.

        From here on, pumps triggered by acknowledgements and publications are batched per
        loop turn on this loop.
        """
        handle: asyncio.TimerHandle | None = None
        self._loop = loop

        def run() -> None:
            nonlocal handle
            try:
                self.tick()
            except Exception:  # a timer bug must not stop every later timer
                log.exception("broker tick failed")
            handle = loop.call_later(interval, run)

        handle = loop.call_later(interval, run)

        def cancel() -> None:
            if handle is not None:
                handle.cancel()

        return cancel


def _next_timer(session: Session) -> float | None:
    """The earlier of a detached session's will and expiry times, or None."""
    times = [t for t in (session.will_at, session.expires_at) if t is not None]
    return min(times) if times else None
