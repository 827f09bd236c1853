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
from kittiwake.broker.consumers import Consumer, Delivery, DeliveryState, Settlement
from kittiwake.broker.dispatch import DurableReceiver, resend
from kittiwake.broker.message import Message
from kittiwake.broker.queues import Queue, QueuedMessage, Removal
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
from kittiwake.broker.shared_groups import (
    Member,
    MemberReceiver,
    SharedGroup,
    group_queue_name,
)
from kittiwake.broker.store import (
    MemoryStore,
    RecoveredState,
    SessionRecord,
    Store,
    SubscriptionRecord,
)
from kittiwake.broker.topic_tree import TopicTree
from kittiwake.broker.topics import (
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
        self._pump_pending: dict[Session | SharedGroup, None] = {}
        # Publications (with the sessions they were queued on) waiting for their commit.
        self._held_for_commit: dict[
            asyncio.Future[None], list[tuple[Message, list[Session | SharedGroup]]]
        ] = {}
        # A commit and a drain both waited for: one shared future per pair, not one per message.
        self._both_waiters: dict[
            tuple[asyncio.Future[None], asyncio.Future[None]], asyncio.Future[None]
        ] = {}
        # Who gets a publication on a topic, per topic (the publish path's one cache).
        self.routes = RoutePlans(self.tree)
        self._flow_depth = self.config.limits.flow_control_depth
        # Sessions whose queue holds messages not yet visible (delivery time): tick pumps them.
        self._delayed: set[Session] = set()
        self._next_anonymous = 0
        # Called with the recovered state at the end of recover(): queues this class does not
        # own (queue destinations) rebuild theirs from it.
        self.recovery_hooks: list[Callable[[RecoveredState], None]] = []

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
            session = self._new_session(record.client_id)
            session.expiry_interval = record.expiry_interval
            session.queue.durable = True
            session.will = record.will
            session.will_delay = record.will_delay
            session.will_expiry = record.will_expiry
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
            session.exactly_once_keys = {
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
        groups = {group.queue.name: group for group in self.shared_groups.values()}
        # Entries queued (not marked in flight) per queue, in queue order, for the crash rule.
        waiting: dict[Queue, list[QueuedMessage]] = {}
        for queued in state.queued:
            stored_message = state.messages.get(queued.message_id)
            if stored_message is None:
                continue
            entry = QueuedMessage(
                stored_message,
                queued.qos,
                True,
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
            elif in_flight:
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
        windows = {
            self.sessions[record.client_id].queue: record.window
            for record in state.sessions.values()
        }
        for group in self.shared_groups.values():
            windows[group.queue] = sum(
                windows.get(m.session.queue, 0) for m in group.members.values()
            )
        for queue, entries in waiting.items():
            for entry in entries[: windows.get(queue, 0)]:
                entry.delivery_count += 1
        for hook in self.recovery_hooks:
            hook(state)  # other owners of stored queues (queue destinations) take theirs
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
        link: SessionLink,
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
            self._detached.discard(session)
        else:
            session = self._new_session(client_id)
            self.sessions[client_id] = session
            session_present = False
        was_persistent = session.persistent
        session.expiry_interval = expiry_interval
        session.queue.durable = session.persistent
        session.will = will
        session.will_delay = will_delay
        session.will_expiry = will_expiry
        # The receiver comes with start_delivery: nothing may go out before the CONNACK.
        session.consumer.set_window(max(1, min(window, self.config.limits.max_inflight)))
        session.link = link
        self.routes.changed()
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
        self.pump(session)

    def _attach_receiver(self, session: Session, link: SessionLink) -> None:
        """The consumer's receiver: the link itself, or, when the session's copies are
        stored, a receiver that writes their in-flight marks first; and its receivers on the
        queues of the shared subscriptions it is a member of."""
        if session.persistent:
            session.consumer.receiver = DurableReceiver(self.store, session, link)
        else:
            session.consumer.receiver = link
        for member in session.members.values():
            member.consumer.receiver = MemberReceiver(self, member, link)

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

    def set_session_expiry(self, session: Session, expiry_interval: int) -> Completion:
        """A v5 DISCONNECT may change the expiry interval."""
        was_persistent = session.persistent
        session.expiry_interval = expiry_interval
        session.queue.durable = session.persistent
        if session.link is not None and session.consumer.receiver is not None:
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
        session.consumer.receiver = None
        for member in session.members.values():
            # What it has not acknowledged goes back to the group, for the other members.
            member.consumer.receiver = None
            if member.group.queue.recall(member.consumer, received_too=True):
                self.pump_soon(member.group)
        self._release_drain_waiter(session)
        self.routes.changed()
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
        if session.will is not None and session.link is None:
            self._publish_will(session)
        for subscription in list(session.subscriptions.values()):
            self._remove_subscription(subscription)
        session.subscriptions.clear()
        session.queue.drain()
        session.consumer.unsettled.clear()
        session.queue.in_flight = 0
        session.exactly_once_keys.clear()
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
            elif due <= now and session.link is not None:
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
            self.routes.changed()
            member = session.members.get(full_filter)
            if member is not None:
                member.group.refresh()
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
            queue=session.queue,
            owner=session.client_id,
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
        self.routes.changed()
        if subscription.share_group is None:
            self.tree.insert(subscription.topic_filter, subscription)
            return
        key = (subscription.share_group, subscription.topic_filter)
        group = self.shared_groups.get(key)
        if group is None:
            name = group_queue_name(*key)
            group = SharedGroup(
                subscription.share_group,
                subscription.topic_filter,
                Queue(
                    name,
                    max_messages=self.config.limits.max_queued_messages,
                    max_bytes=self.config.limits.max_queued_bytes,
                    policy=self.config.limits.queue_full_policy,
                ),
            )
            group.queue.on_removed = self._group_entry_removed
            self.shared_groups[key] = group
            self.tree.insert(subscription.topic_filter, group)
        session = subscription.session
        subscription.queue = group.queue
        member = Member(group, subscription)
        group.members[session] = member
        session.members[subscription.full_filter] = member
        group.queue.attach(member.consumer)
        group.refresh()
        if session.link is not None and session.consumer.receiver is not None:
            member.consumer.receiver = MemberReceiver(self, member, session.link)
            self.pump_soon(group)

    def _remove_subscription(self, subscription: Subscription) -> None:
        self.routes.changed()
        if subscription.share_group is None:
            self.tree.remove(subscription.topic_filter, subscription)
            return
        key = (subscription.share_group, subscription.topic_filter)
        group = self.shared_groups.get(key)
        session = subscription.session
        member = session.members.pop(subscription.full_filter, None)
        if group is None or member is None:
            return
        del group.members[session]
        # What the member has not acknowledged goes back to the group.
        group.queue.detach(member.consumer)
        if group.members:
            group.refresh()
            self.pump_soon(group)
            return
        del self.shared_groups[key]
        self.tree.remove(subscription.topic_filter, group)
        for entry in group.queue.drain():  # nobody left to take them
            self._group_entry_removed(group.queue, entry, Removal.PURGED)

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
            entry = QueuedMessage.of(
                message, subscription.max_qos, retain=True, subscription_ids=sub_ids
            )
            self._enqueue(session, entry)
        self.pump(session)

    # -- publishing -----------------------------------------------------------------------

    def publish(self, message: Message) -> Completion:
        """Accept a publication; the completion says when the publisher may be told it is
        safe (its commit, and room at its congested receivers: see _flow_control)."""
        if not message.created:
            message.created = self.clock.now()
        self.stats.messages_received += 1
        if message.persistent and not message.message_id:
            self.store.journal(message)
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

    def _flow_control(self, touched: list[Session | SharedGroup]) -> asyncio.Future[None] | None:
        """A future that resolves once every congested receiver has drained, or None.

        Only connected receivers count: an offline session's queue does not drain, and a
        publisher must never wait on a subscriber that is not there.
        """
        depth = self._flow_depth
        if not depth or self._loop is None:
            return None
        for session in touched:
            if isinstance(session, SharedGroup):
                continue
            if session.link is not None and session.queue.count >= depth:
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

    def route_plan(self, topic: str) -> RoutePlan:
        """Who gets a publication on ``topic`` (cached until routing changes)."""
        return self.routes.plan(topic)

    def count_forwarded(self, receivers: int) -> None:
        """A front end sent a QoS 0 publication as is to the ``direct`` receivers of its plan
        (without building a Message): counted like any publication."""
        stats = self.stats
        stats.messages_received += 1
        stats.messages_sent += receivers

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

    def pump_soon(self, target: Session | SharedGroup) -> None:
        """Pump this session (or group) once the current loop turn has done its reading."""
        if self._loop is None:
            self.pump(target)
            return
        pending = self._pump_pending
        if not pending:
            self._loop.call_soon(self._run_pumps)
        pending[target] = None

    def _run_pumps(self) -> None:
        targets = list(self._pump_pending)
        self._pump_pending.clear()
        for target in targets:
            self.pump(target)

    def _retain(self, message: Message) -> None:
        previous = self.retained.update(message)
        if message.persistent and message.payload:
            self.store.set_retained(message.topic, message)
        elif previous is not None and previous.persistent:
            self.store.set_retained(message.topic, None)

    def _route(self, message: Message) -> list[Session | SharedGroup]:
        """Enqueue the message on every session and group that should get it; returns those
        that need pumping."""
        plan = self.routes.plan(message.topic)
        touched: list[Session | SharedGroup] = []
        origin = message.origin
        for copy in plan.copies:
            options = copy.options
            if copy.own is not options and origin == copy.session.client_id:
                own = copy.own  # the session published it: its noLocal subscriptions skip it
                if own is None:
                    continue
                options = own
            if self._enqueue(copy.session, options.copy(message)):
                touched.append(copy.session)
        for group in plan.groups:
            if self._enqueue_shared(group, message):
                touched.append(group)
        return touched

    def _enqueue_shared(self, group: SharedGroup, message: Message) -> bool:
        """Queue one copy for a shared group (each member's own cap applies when it is sent
        one); QoS 0 goes to a connected member or nowhere. True when pumping is needed."""
        entry = QueuedMessage.of(message, group.max_qos)
        queue = group.queue
        if entry.qos == 0:
            if queue.offer(entry):
                self.stats.messages_sent += 1
            return False
        if not queue.push(entry)[0]:
            self.stats.messages_dropped += 1
            return False
        if entry.persistent and queue.durable:
            if message.message_id == 0:
                self.store.journal(message)
            self.store.enqueue(queue.name, entry)
        return True

    def _enqueue(self, session: Session, entry: QueuedMessage) -> bool:
        """Queue one copy; QoS 0 goes straight out or nowhere. True when pumping is needed."""
        queue = session.queue
        if entry.qos == 0:
            if queue.offer(entry):
                self.stats.messages_sent += 1
            return False
        if session.link is None and not session.persistent:
            return False
        stored = entry.persistent and session.persistent
        consumer = session.consumer
        if (
            not stored
            and not queue.count
            and consumer.credit.available > 0
            and consumer.receiver is not None
            and entry.message.delivery_time is None
            # A QoS 2 copy of a message still being committed waits for the commit: if it
            # fails, the publisher is refused and resends, and this copy would be a duplicate.
            and (entry.qos < 2 or not entry.message.persistent)
        ):
            # Nothing to wait for (no commit, no queue ahead, room in the window): send now.
            queue.deliver_now(consumer, entry)
            self.stats.messages_sent += 1
            return False
        if not queue.push(entry)[0]:
            self.stats.messages_dropped += 1
            return False
        if stored:
            if entry.message.message_id == 0:
                self.store.journal(entry.message)
            self.store.enqueue(session.queue.name, entry)
        return True

    # -- delivery -------------------------------------------------------------------------

    def pump(self, target: Session | SharedGroup) -> None:
        """Move queued messages into flight while the consumers' windows have room.

        A session's pump also serves the groups it is a member of, since the credit an
        acknowledgement frees may be theirs to use.
        """
        if isinstance(target, SharedGroup):
            if target.queue.count:
                self.stats.messages_sent += target.queue.dispatch(self.clock.now())
            return
        session = target
        if session.consumer.receiver is None:
            return
        queue = session.queue
        if queue.count:
            self.stats.messages_sent += queue.dispatch(self.clock.now())
            if session.drain_waiter is not None and queue.count <= self._flow_depth // 2:
                self._release_drain_waiter(session)
            if queue.next_visible_time() is not None:
                self._delayed.add(session)
        if session.members:
            for member in session.members.values():
                if member.group.queue.count:
                    self.pump(member.group)

    def acknowledge(self, session: Session, delivery: Delivery) -> Outcome:
        """The final acknowledgement of a delivery (PUBACK, PUBCOMP, or a failing PUBREC)."""
        queue = delivery.consumer.queue
        if queue is None or not queue.settle(delivery, Settlement.ACCEPTED):
            return NOT_FOUND
        completion = None
        if delivery.entry.persistent and queue.durable:
            # Its stored entry is removed (see _entry_removed): the answer waits for that.
            completion = self.store.commit()  # _durable(), without a call per acknowledgement
        if queue.count:
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
        session.exactly_once_keys.add(key)
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
        session.exactly_once_keys.discard(key)
        if not session.persistent:
            return True, None
        self.store.remove_duplicate(session_producer_name(session.client_id), key)
        return True, self._durable()

    # -- helpers --------------------------------------------------------------------------

    def _new_session(self, client_id: str) -> Session:
        """A session with its queue and its consumer (not yet connected)."""
        limits = self.config.limits
        queue = Queue(
            session_queue_name(client_id),
            max_messages=limits.max_queued_messages,
            max_bytes=limits.max_queued_bytes,
            policy=limits.queue_full_policy,
        )
        consumer = Consumer(None, window=limits.max_inflight, name=client_id)
        queue.attach(consumer)
        session = Session(client_id, queue, consumer)
        queue.on_removed = lambda _queue, entry, reason: self._entry_removed(session, entry, reason)
        return session

    def _group_entry_removed(self, queue: Queue, entry: QueuedMessage, reason: Removal) -> None:
        """An entry left a shared group's queue for good: the store forgets it too."""
        if reason is not Removal.ACCEPTED:
            self.stats.messages_dropped += 1
        if entry.persistent and queue.durable:
            self.store.remove(queue.name, entry.message.message_id)

    def _entry_removed(self, session: Session, entry: QueuedMessage, reason: Removal) -> None:
        """An entry left a session's queue for good: the store forgets it too."""
        if reason is not Removal.ACCEPTED:
            # Expired or pushed out of a full queue: never delivered. (MQTT sessions do not
            # dead-letter: their queues have no maximum delivery count.)
            self.stats.messages_dropped += 1
        if entry.persistent and session.queue.durable:
            self.store.remove(session.queue.name, entry.message.message_id)

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
                window=session.window if session.link is not None else 0,
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
