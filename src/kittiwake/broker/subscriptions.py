"""Subscribing and unsubscribing: the checks a new subscription passes, the queue it is bound
to (the session's, or its shared group's), and the retained messages it is sent. Knows no
protocol: options are on the MQTT 5 scale, which older protocols and JMS map onto.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from kittiwake.broker.completion import NOT_FOUND, Completion, Outcome
from kittiwake.broker.dispatch import enqueue
from kittiwake.broker.message import Message
from kittiwake.broker.queues import Queue, QueuedMessage, Removal
from kittiwake.broker.sessions import Session, Subscription, SubscriptionMap
from kittiwake.broker.shared_groups import Member, MemberReceiver, SharedGroup, group_queue_name
from kittiwake.broker.subscription_filters import RouteFilter
from kittiwake.broker.topics import (
    TopicError,
    is_wildcard,
    parse_shared,
    topic_matches,
    validate_topic_filter,
)
from kittiwake.selector import InvalidSelector, compile_selector

if TYPE_CHECKING:
    from kittiwake.broker.broker import Broker
    from kittiwake.broker.durable_subscriptions import SubscriptionDefinition

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


def subscribe(
    broker: Broker, session: Session, full_filter: str, options: SubscriptionOptions
) -> SubscribeRefusal | Subscribed:
    """Add or replace a subscription, or say why not.

    Retained messages are not sent here: the front end acknowledges the subscription first
    and then calls :meth:`send_retained`, so they never overtake the acknowledgement.
    """
    limits = broker.config.limits
    group: str | None = None
    topic_filter = full_filter
    try:
        # parse_shared's test, without its call (nor startswith's) for a filter that does
        # not start with "$": a one-character slice is a cached string.
        if full_filter[:1] == "$" and full_filter.startswith("$share/"):
            group, topic_filter = parse_shared(full_filter)
        validate_topic_filter(topic_filter, limits.max_topic_levels)
    except TopicError:
        return SubscribeRefusal.INVALID_FILTER
    permissions = session.permissions
    if permissions is None:
        permissions = session.permissions = broker.authorizer.permissions(None, session.client_id)
    # A shared group's queue cannot be filtered per member: its filter must be wholly
    # readable. Any other granted filter is filtered per message (route plans, retained).
    # A principal no read rule restricts may subscribe to anything (no call per filter).
    if permissions.restricts_reading and not (
        permissions.may_subscribe_wholly(topic_filter)
        if group is not None
        else permissions.may_subscribe(topic_filter)
    ):
        return SubscribeRefusal.NOT_AUTHORIZED
    subscriptions = session.subscriptions
    existing = subscriptions.get(full_filter)
    if existing is None and len(subscriptions) >= limits.max_subscriptions_per_session:
        return SubscribeRefusal.QUOTA_EXCEEDED
    if existing is not None:
        existing.max_qos = options.max_qos
        existing.no_local = options.no_local
        existing.retain_as_published = options.retain_as_published
        existing.retain_handling = options.retain_handling
        existing.subscription_id = options.subscription_id
        _drop_copy(existing)
        subscription = existing
        broker.routes.subscription_changed(existing)
        member = session.members.get(full_filter)
        if member is not None:
            member.group.refresh()
    else:
        subscription = _attach(broker, session, full_filter, group, topic_filter, options)
    if session.expiry_interval <= 0:  # not session.persistent, without the property's call
        return Subscribed(subscription, existing is None)
    broker._save_session(session)
    return Subscribed(subscription, existing is None, broker._durable())


def unsubscribe(broker: Broker, session: Session, full_filter: str) -> Outcome:
    """Remove a subscription; whether there was one, and when its removal is durable."""
    subscription = session.pop_subscription(full_filter)
    if subscription is None:
        return NOT_FOUND
    remove_subscription(broker, subscription)
    if not session.persistent:
        return True, None
    broker._save_session(session)
    return True, broker._durable()


def attach_subscription(
    broker: Broker, session: Session, full_filter: str, options: SubscriptionOptions
) -> Subscription:
    """Create a subscription from a stored filter (recovery) and route messages to it.

    Raises TopicError for a filter no subscriber could have been granted.
    """
    group, topic_filter = parse_shared(full_filter)
    validate_topic_filter(topic_filter)
    return _attach(broker, session, full_filter, group, topic_filter, options)


def _attach(
    broker: Broker,
    session: Session,
    full_filter: str,
    group: str | None,
    topic_filter: str,
    options: SubscriptionOptions,
) -> Subscription:
    """Create a subscription from a filter parsed and validated once, and route to it."""
    queue = session.made_queue
    if queue is None:
        queue = session.queue
    # The binding's fields positionally and the options left at their defaults unpassed:
    # keyword arguments for all ten cost a fleet's subscribe about a twentieth of a filter.
    subscription = Subscription(
        topic_filter, queue, options.max_qos, options.no_local, session.client_id, session=session
    )
    if (
        group is not None
        or options.retain_as_published
        or options.retain_handling
        or options.subscription_id is not None
    ):
        subscription.share_group = group
        subscription.retain_as_published = options.retain_as_published
        subscription.retain_handling = options.retain_handling
        subscription.subscription_id = options.subscription_id
    subscriptions = session.subscriptions
    if type(subscriptions) is SubscriptionMap:
        subscriptions[full_filter] = subscription  # session.add_subscription, inlined
    else:
        session.add_subscription(full_filter, subscription)
    if group is None:  # add_subscription's first lines: a fleet's filter, one call less
        broker.routes.subscription_changed(subscription)
        broker.tree.insert_valid(topic_filter, subscription)
    else:
        add_subscription(broker, subscription)
    return subscription


def add_subscription(broker: Broker, subscription: Subscription) -> None:
    """Bind a subscription (its filter validated): into the topic tree, or, for a shared one,
    into its group (made on first use), whose queue the session then consumes from with its
    own credit."""
    broker.routes.subscription_changed(subscription)
    if subscription.share_group is None:
        broker.tree.insert_valid(subscription.topic_filter, subscription)
        return
    key = (subscription.share_group, subscription.topic_filter)
    group = broker.shared_groups.get(key)
    if group is None:
        name = group_queue_name(*key)
        group = SharedGroup(
            subscription.share_group,
            subscription.topic_filter,
            Queue(
                name,
                max_messages=broker.config.limits.max_queued_messages,
                max_bytes=broker.config.limits.max_queued_bytes,
                policy=broker.config.limits.queue_full_policy,
                totals=broker.queue_totals,
                offers_at_most_once=True,
                max_groups=broker.config.limits.max_message_groups,
            ),
        )
        group.queue.on_removed = broker._entry_removed
        broker.shared_groups[key] = group
        broker.tree.insert_valid(subscription.topic_filter, group)
    session = subscription.session
    subscription.queue = group.queue
    member = Member(group, subscription)
    group.members[session] = member
    session.add_member(subscription.full_filter, member)
    group.queue.attach(member.consumer)
    group.refresh()
    if session.link is not None and session.delivering:
        member.consumer.receiver = MemberReceiver(broker, member, session.link)
        broker.pump_soon(group)


def remove_subscription(broker: Broker, subscription: Subscription) -> None:
    """Unbind a subscription; a group's last member leaving ends the group and its queue."""
    broker.routes.subscription_changed(subscription)
    _drop_copy(subscription)
    if subscription.share_group is None:
        broker.tree.remove(subscription.topic_filter, subscription)
        if broker.retained_cursors:
            forget_retained_cursors(broker, subscription)
        return
    key = (subscription.share_group, subscription.topic_filter)
    group = broker.shared_groups.get(key)
    session = subscription.session
    member = session.pop_member(subscription.full_filter)
    if group is None or member is None:
        return
    del group.members[session]
    # What the member has not acknowledged goes back to the group.
    group.queue.detach(member.consumer)
    if group.members:
        group.refresh()
        broker.pump_soon(group)
        return
    del broker.shared_groups[key]
    broker.tree.remove(subscription.topic_filter, group)
    for entry in group.queue.drain():  # nobody left to take them
        broker._entry_removed(group.queue, entry, Removal.PURGED)
    group.queue.end_drop_report()


def _drop_copy(subscription: Subscription) -> None:
    """The subscription lets its copy go (removed, or new options). A copy of its own loses
    its plan too: the plan holds the copy, a cycle the collector may never see once frozen
    (kittiwake.collector); a session's shared plain copy keeps it for its other filters."""
    copy = subscription.copy
    if copy is None:
        return
    subscription.copy = None
    plain = subscription.session.plain_copies
    options = copy.options
    if not plain or plain.get((options.max_qos, options.retain_as_published)) is not copy:
        copy.plan = None


def filter_durable(broker: Broker, client_id: str, definition: SubscriptionDefinition) -> None:
    """A JMS durable subscription's selector goes where its publications are routed (a
    :class:`RouteFilter` as its subscription's selector): what it refuses is never queued
    nor stored for it while nobody consumes (JMS: not added to the subscription). Its
    consumers still apply it as they are handed entries (subscription_filters), for what
    comes another way: retained messages, entries queued before the definition was known."""
    session = broker.sessions.get(client_id)
    subscription = None if session is None else session.subscriptions.get(definition.topic)
    if subscription is None:
        return
    current = subscription.selector
    if current is None and definition.selector is None:
        return
    if isinstance(current, RouteFilter) and current.key == definition.selector:
        return  # resumed as it was
    route_filter = None
    if definition.selector is not None:
        try:
            selector = compile_selector(definition.selector)
        except InvalidSelector as exc:  # checked when it was asked for; stored since
            log.warning("durable subscription %s: selector not applied: %s", client_id, exc)
            selector = None
        if selector is not None and not selector.selects_everything:
            route_filter = RouteFilter(selector, broker.selector_headers, definition.selector)
    if route_filter is None and current is None:
        return
    subscription.selector = route_filter
    _drop_copy(subscription)
    broker.routes.subscription_changed(subscription)


def may_send_retained(broker: Broker) -> bool:
    """False when :func:`send_retained` has nothing to do for any subscription: nothing is
    retained, and no earlier cursor is there to restart (a fleet subscribing before anything
    is retained skips it, and a front end need not arrange to call it)."""
    return bool(broker.retained or broker.retained_cursors)


def send_retained(broker: Broker, subscribed: Subscribed) -> None:
    """Deliver the retained messages a new subscription should see (retain handling).

    A session whose consumer has a window (MQTT) is served from a cursor as its window opens
    (see dispatch.feed_retained): any number arrive, none is cut by a queue limit, and the
    first goes out without collecting the rest. Others (link credit) get them queued at once.
    """
    if not may_send_retained(broker):
        return
    subscription = subscribed.subscription
    if subscription.share_group is not None:
        return  # shared subscriptions never receive retained messages (MQTT-4.8.2)
    handling = subscription.retain_handling
    if handling == 2 or (handling == 1 and not subscribed.new):
        return
    session = subscription.session
    if session.consumer.credit.window is not None and is_wildcard(subscription.topic_filter):
        cursors = broker.retained_cursors.setdefault(session, [])
        # A subscription sent again restarts its retained messages (MQTT 3.1.1 resends them).
        cursors[:] = [c for c in cursors if c.subscription is not subscription]
        started = broker.retained.updates
        messages = broker.retained.cursor(subscription.topic_filter, started)
        cursor = RetainedCursor(subscription, messages, behind=bool(session.queue.count))
        cursor.started = started
        if not cursors:
            # Out of the QoS 0 fast path's plans while it sends (see retained_ahead).
            broker.routes.session_changed(session)
        cursors.append(cursor)
        broker.pump(session)
        return
    now = broker.clock.now()
    for message in broker.retained.matching(subscription.topic_filter, now):
        entry = retained_entry(session, subscription, message)
        if entry is not None and enqueue(broker, session, entry):
            broker.pump_soon(session)
    broker.pump(session)


def retained_entry(
    session: Session, subscription: Subscription, message: Message
) -> QueuedMessage | None:
    """The session's copy of a retained message, or None when its principal may not read it."""
    permissions = session.permissions
    if permissions is not None and not permissions.may_read(message.topic):
        return None
    sub_ids = () if subscription.subscription_id is None else (subscription.subscription_id,)
    return QueuedMessage.of(message, subscription.max_qos, retain=True, subscription_ids=sub_ids)


class RetainedCursor:
    """Where a subscription is in sending its retained messages. They go as if queued when
    it subscribed: after what its session's queue held then (``behind``: until the queue is
    first seen empty), before every copy queued since. A live copy of a topic never overtakes
    that topic's older retained message (MQTT 4.6, ordered topics: a publisher's messages on
    a topic reach a subscriber in the order they were received): a copy arriving while the
    cursor has not sent its topic's retained message yet (while an older backlog drains, or a
    QoS 0 copy, which is never queued) takes that message with it, just ahead of itself
    (:func:`retained_ahead`), and the cursor skips it later."""

    __slots__ = ("behind", "messages", "sent", "started", "subscription")

    def __init__(
        self, subscription: Subscription, messages: Iterator[Message], behind: bool = False
    ) -> None:
        self.subscription = subscription
        self.messages = messages
        self.behind = behind
        # The retained store's update count when it started (RetainedMessages.set_before),
        # and the topics it has sent (or a live copy took ahead): not sent twice.
        self.started = 0
        self.sent: set[str] = set()


# Retained messages sent at QoS 0 (no window to pace them) per pump: the rest go on the next
# loop turns, so a huge retained set never holds the loop, and the first leaves at once.
RETAINED_UNPACED_PER_TURN = 256


def feed_retained(broker: Broker, session: Session) -> None:
    """Send retained messages from the session's cursors while its window has room, ahead of
    what was queued since they started (copies arriving meanwhile wait in the queue: see
    dispatch.enqueue), behind what was queued before; the rest wait for the next
    acknowledgement (or loop turn)."""
    cursors = broker.retained_cursors.get(session)
    if not cursors:
        return
    queue = session.queue
    consumer = session.consumer
    credit = consumer.credit
    now = broker.clock.now()
    budget = RETAINED_UNPACED_PER_TURN
    while cursors and budget and credit.available > 0 and consumer.receiver is not None:
        cursor = cursors[0]
        if cursor.behind:
            if queue.count:
                break  # what was queued before the subscription goes first
            cursor.behind = False
        message = next(cursor.messages, None)
        if message is None:
            cursors.pop(0)
            continue
        sent = cursor.sent
        if message.topic in sent:
            continue  # a live copy of its topic took it ahead (retained_ahead)
        sent.add(message.topic)
        if message.expired(now):
            continue
        entry = retained_entry(session, cursor.subscription, message)
        if entry is None:
            continue
        budget -= 1
        _send_retained(broker, session, queue, entry, now)
    if not cursors:
        del broker.retained_cursors[session]
        broker.routes.session_changed(session)  # back in the QoS 0 fast path's plans
    elif not budget:
        broker.pump_soon(session)


def retained_ahead(broker: Broker, session: Session, topic: str) -> None:
    """A live copy on ``topic`` is about to be queued (or sent) for a session whose retained
    cursors have not all finished: the topic's retained message, when a cursor still owes it
    (set before the cursor started, not sent yet, its filter matching), goes first, queued as
    any copy (or sent at once, at QoS 0), and the cursor skips it. MQTT 4.6 asks this of a
    message and a later one from the same publisher at the same QoS; any live copy takes it
    ahead, which only sends a retained message sooner. A retained publication that replaced
    the topic's message is set after every cursor started: nothing older is owed, and it
    reaches the session live only. Sessions with a cursor are kept out of the QoS 0 fast
    path's plans (route_plans: ``direct``), so every live copy comes through here."""
    cursors = broker.retained_cursors.get(session)
    if not cursors:
        return
    retained = broker.retained
    now = broker.clock.now()
    for cursor in list(cursors):
        sent = cursor.sent
        if topic in sent:
            continue
        message = retained.set_before(topic, cursor.started)
        if message is None:
            continue
        subscription = cursor.subscription
        if not topic_matches(subscription.topic_filter, topic):
            continue
        sent.add(topic)
        if message.expired(now):
            continue
        entry = retained_entry(session, subscription, message)
        if entry is not None:
            enqueue(broker, session, entry)


def _send_retained(
    broker: Broker, session: Session, queue: Queue, entry: QueuedMessage, now: float
) -> None:
    """One retained copy from a cursor, in flight now (the caller checked the window), ahead
    of whatever waits in the queue; stored first when the session stores its copies. Never
    queued, so no queue limit cuts it, but one larger than the queue's byte limit, which the
    queue's policy refuses as it would any such copy (dispatch.enqueue)."""
    message = entry.message
    stats = broker.stats
    if entry.qos == 0:
        if message.delivery_time is None or message.delivery_time <= now:
            if queue.offer(entry):
                stats.messages_sent += 1
            return
    elif len(message.payload) + len(message.topic) > queue.max_bytes:
        queue.push(entry)  # refused: counted and logged as the queue's drop
        stats.messages_dropped += 1
        return
    if message.delivery_time is not None and message.delivery_time > now:
        # Not visible yet: it waits in the queue, as any copy with a delivery time.
        if enqueue(broker, session, entry):
            stats.messages_sent += queue.dispatch(now)
        return
    if entry.persistent and queue.durable:
        if message.message_id == 0:
            broker.store.journal(message)
        broker.store.enqueue(queue.name, entry)
    queue.deliver_now(session.consumer, entry)
    stats.messages_sent += 1


def forget_retained_cursors(broker: Broker, subscription: Subscription) -> None:
    """The subscription is gone: so is what remained of its retained messages."""
    cursors = broker.retained_cursors.get(subscription.session)
    if cursors is None:
        return
    cursors[:] = [c for c in cursors if c.subscription is not subscription]
    if not cursors:
        del broker.retained_cursors[subscription.session]
        broker.routes.session_changed(subscription.session)
