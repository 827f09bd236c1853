"""The publish path: journal a persistent message, keep it if retained, route it to every
queue that should get a copy (per the topic's route plan), and say when the publisher may be
told it is safe. Knows no protocol.

An at-least-once (QoS 1) publication is dispatched while its commit is pending
(store-and-dispatch, DESIGN.md section 3): its stored copies go to their consumers at once, and
a copy accepted before its batch reaches the writer is never written (the store cancels the
insert and its delete). Its publisher is acknowledged once its batch is committed or once every
stored copy of the batch is accepted, whichever comes first (:class:`Acceptances`); while only
such publishers wait, the store holds a batch of copies bound for connected subscribers back
for a moment (``store.acceptance_window``) so that most are accepted before it is written. A
crash may lose a copy that was delivered but not yet committed: only ever one whose publisher
was not acknowledged, who resends it (at-least-once allows the duplicate), or one its
subscriber had already accepted. With
``store.store_and_dispatch`` off, and always for exactly-once publications (QoS 2, JMS
PERSISTENT), copies of a message whose commit is pending are held back (persist -> acknowledge
-> dispatch) and dropped if the commit fails; a unit applied whole (a fenced write) holds back
every copy.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kittiwake.broker.completion import Completion
from kittiwake.broker.delivery import LEVELS
from kittiwake.broker.dispatch import (
    deliver_stored_now,
    enqueue,
    enqueue_run,
    enqueue_shared,
)
from kittiwake.broker.message import Message
from kittiwake.broker.queues import Queue, QueuedMessage
from kittiwake.broker.sessions import Session
from kittiwake.broker.shared_groups import SharedGroup
from kittiwake.broker.topics import quoted_topic

if TYPE_CHECKING:
    from kittiwake.broker.broker import Broker
    from kittiwake.broker.mqtt_subscriptions import SessionCopy
    from kittiwake.broker.route_plans import RoutePlan

log = logging.getLogger(__name__)


def publish(broker: Broker, message: Message) -> Completion:
    """Accept a publication; the completion says when the publisher may be told it is
    safe (its commit, and room at its congested receivers: see flow_control.py)."""
    _accept(broker, message)
    dispatch_now = message.qos == 1 and broker.store_and_dispatch
    # The stored copies of a store-and-dispatch publication (see Acceptances).
    stored: list[QueuedMessage] | None = [] if dispatch_now and message.persistent else None
    touched = route(broker, message, stored)
    # Acknowledged at the commit or once every stored copy is accepted (see Acceptances):
    # not a retained message, nor one the journal keeps (their rows are always written).
    early = bool(stored) and not message.retain and not broker.store.keeps_in_journal(message)
    if not message.persistent:
        commit = None
    elif not early:
        commit = broker.store.commit()
    else:
        # Every copy on its way to a connected subscriber: the store may hold the batch back
        # for their acceptances. An absent session's copy (or a shared group's) is not
        # accepted soon: its batch goes to the writer at once.
        commit = broker.store.commit_unhurried()
        for target in touched:
            if not isinstance(target, Session) or target.link is None:
                commit = broker.store.commit()
                break
    drained = broker.flow.congested(touched) if message.qos and touched else None
    if commit is None:
        pending = broker.pumps.pending  # one pump per read: no call for a queued target
        for session in touched:
            if session not in pending:
                broker.pump_soon(session)
        return drained
    if dispatch_now:
        # Store-and-dispatch: a failed commit refuses the publisher, who resends; a copy
        # delivered meanwhile is then a duplicate, which QoS 1 allows. (A copy that went at
        # once is in no touched list, so this is not under ``if touched``.)
        if touched:
            pending = broker.pumps.pending
            for session in touched:
                if session not in pending:
                    broker.pump_soon(session)
        if early and stored and not commit.done():
            commit = broker.acceptances.watch(commit, stored)
    elif touched:
        broker.pending_commits.hold(commit, message, touched)
    if drained is None:
        return commit
    return broker.flow.commit_and_drain(commit, drained)


def publish_run(broker: Broker, messages: list[Message], completions: list[Completion]) -> None:
    """:func:`publish` for each of a run of publications on one topic, as a publisher's flood
    brings them (the MQTT front end's PublishRun): at least once (QoS 1, persistent), not
    retained, without delivery time or message group. Their completions are appended to
    ``completions``, in order.

    When every copy goes to a connected session that stores none of them and whose queue
    takes the whole run (a flood's usual case), the topic's plan, each copy's level and the
    store's commit are worked out once for the run, each session gets its copies in one step
    (:func:`enqueue_run`) and flow control is asked once (``FlowControl.congested_run``),
    with the one-by-one outcome: the same messages, copies, deliveries in the same order on
    each connection, counts and completions. (Only the interleaving of writes to different
    connections differs, which nobody can see.) Anything else is published one by one."""
    topic = messages[0].topic
    routes = broker.routes
    plan = routes.by_topic.get(topic)
    if plan is None:
        plan = routes.missed(topic)
    targets = _run_targets(broker, plan, messages)
    store = broker.store
    # What each publication's commit would be: the run adds nothing to the store (no copy
    # stored, no journal row kept), so the same for all.
    commit = store.commit() if targets is not None else None
    if targets is None or (commit is not None and not broker.store_and_dispatch):
        for message in messages:
            completions.append(publish(broker, message))
        return
    # _accept for each.
    stats = broker.stats
    journal = store.journal
    for taken, message in enumerate(messages):
        try:
            if not message.created:
                message.created = broker.clock.now()
            stats.messages_received += 1
            if not message.message_id:
                journal(message)
        except BaseException:
            # As one by one: the publications taken before the failure are routed.
            if taken:
                _route_run(broker, targets, messages[:taken], commit, completions)
            raise
    _route_run(broker, targets, messages, commit, completions)


def _route_run(
    broker: Broker,
    targets: list[_RunTarget],
    messages: list[Message],
    commit: Completion,
    completions: list[Completion],
) -> None:
    """The routing half of :func:`publish_run`, for publications already accepted."""
    count = len(messages)
    queued: list[tuple[Session, list[QueuedMessage], int]] = []
    pending = broker.pumps.pending
    for session, queue, (qos, persistent), subscription_ids in targets:
        entries = [
            QueuedMessage(message, qos, persistent, False, subscription_ids)
            for message in messages
        ]
        start = enqueue_run(broker, session, queue, entries)
        if start < count:
            queued.append((session, entries, start))
            if session not in pending:
                broker.pump_soon(session)
    drained = broker.flow.congested_run(queued, count)
    if drained is None:
        completions.extend([commit] * count)
    elif commit is None:
        completions.extend(drained)
    else:
        both = broker.flow.commit_and_drain
        completions.extend(commit if d is None else both(commit, d) for d in drained)


# A session that gets a copy of every publication of a run: its queue, the copies' level
# (QoS, persistent) and subscription ids.
_RunTarget = tuple[Session, Queue, tuple[int, bool], tuple[int, ...]]


def _run_targets(
    broker: Broker, plan: RoutePlan, messages: list[Message]
) -> list[_RunTarget] | None:
    """For :func:`publish_run`: each session that gets a copy of every publication of the
    run (its queue, the copies' level and subscription ids), in route order; None when some
    copy needs the one-by-one path (a shared group, a noLocal or filtered subscription, an
    at-most-once subscription, a stored copy, a retained message owed ahead, a queue that
    would not take the whole run at its back, a journal that keeps the topic)."""
    first = messages[0]
    if (
        first.qos != 1
        or not first.persistent
        or first.retain
        or first.delivery_time is not None
        or first.group_id is not None
        or plan.groups
        or broker.retained_cursors
        or broker.store.keeps_in_journal(first)
    ):
        return None
    count = len(messages)
    size = -1  # the run's bytes, once a queue is to be asked
    levels = LEVELS[1][True]
    targets: list[_RunTarget] = []
    for copy in plan.copies:
        options = copy.options
        if copy.own is not options:
            return None
        level = levels[options.max_qos]
        if not level[0]:
            return None
        session = copy.session
        queue = session.made_queue
        if queue is None:
            queue = session.queue
        if queue.durable:
            return None
        if session.link is None:
            continue  # as enqueue(): nothing for a session that is not connected
        if size < 0:
            size = len(first.topic) * count
            for message in messages:
                size += len(message.payload)
        if not queue.takes_run(count, size):
            return None
        targets.append((session, queue, level, options.subscription_ids))
    return targets


# A copy held back until its unit's commit: a session's copy, or a shared group's message.
HeldCopy = tuple[Session, QueuedMessage] | tuple[SharedGroup, Message]


def publish_held(
    broker: Broker, message: Message, commit: asyncio.Future[None], held: list[HeldCopy]
) -> Completion:
    """One message of a unit applied whole (a fenced write, a JMS transaction's topic send)
    whose commit ``commit`` is pending: persist -> acknowledge -> dispatch for every copy,
    QoS 0 included, so a unit retried after a failed commit delivers nothing twice and a
    crash before the commit shows none of the unit.

    Copies the commit stores (persistent ones on durable queues) are queued now, their rows
    joining the commit, and wait for it as any stored copy does. Every other copy, which would
    go out at once, is added to ``held`` for :func:`release_held` to send once the commit is
    durable (nothing, if it fails). The steps before routing are :func:`publish`'s.
    """
    _accept(broker, message)
    plan = broker.routes.plan(message.topic)
    touched: list[Session | SharedGroup] = []
    for copy in plan.copies:
        entry = session_entry(copy, message)
        if entry is None:
            continue
        session = copy.session
        if entry.persistent and session.queue.durable:
            if enqueue(broker, session, entry):
                touched.append(session)
        else:
            held.append((session, entry))
    for group in plan.groups:
        if group.queue.durable and QueuedMessage.of(message, group.max_qos).persistent:
            if enqueue_shared(broker, group, message):
                touched.append(group)
        else:
            held.append((group, message))
    if touched:
        broker.pending_commits.hold(commit, message, touched)
    drained = broker.flow.congested(touched) if message.qos and touched else None
    if drained is None:
        return commit
    return broker.flow.commit_and_drain(commit, drained)


def release_held(broker: Broker, held: list[HeldCopy], commit: asyncio.Future[None]) -> None:
    """The unit's commit is done: send the copies it held, in the unit's order; none if the
    commit failed (the unit's fence was not stored either: its retry sends them)."""
    if commit.cancelled() or commit.exception() is not None:
        return
    for target, item in held:
        if isinstance(target, SharedGroup):
            assert isinstance(item, Message)
            needs_pump = enqueue_shared(broker, target, item)
        else:
            assert isinstance(item, QueuedMessage)
            needs_pump = enqueue(broker, target, item)
        if needs_pump:
            broker.pump_soon(target)


def _accept(broker: Broker, message: Message) -> None:
    """What every publication gets before routing: its time, its count, its journal row (a
    persistent one; a non-persistent one, QoS 0 or JMS NON_PERSISTENT, where the operator
    opted its topic in, nothing waiting for it) and its place among the retained messages."""
    if not message.created:
        message.created = broker.clock.now()
    broker.stats.messages_received += 1
    if message.persistent:
        if not message.message_id:
            broker.store.journal(message)
    elif broker.journal_qos0 and broker.store.journals_qos0(message.topic):
        broker.store.journal(message)
    if message.retain:
        retain(broker, message)


def retained_too_large(broker: Broker, message: Message) -> bool:
    """Is this a retained publication whose payload is over ``limits.max_retained_payload``?
    Such a one is delivered live but not retained (:func:`retain`); front ends ask this to
    pick their answer (MQTT 5: 0x97 Quota exceeded)."""
    limit = broker.config.limits.max_retained_payload
    return bool(limit and message.retain and len(message.payload) > limit)


def retain(broker: Broker, message: Message) -> None:
    """The newest retained message of its topic replaces the older (kept if persistent),
    unless its payload is over the configured limit: then the older one stays."""
    if retained_too_large(broker, message):
        broker.stats.retained_refused += 1
        log.info(
            "retained message on %s from %s not retained: its payload of %d bytes is over "
            "limits.max_retained_payload (%d); delivered live, the topic's retained message "
            "is unchanged",
            quoted_topic(message.topic),
            message.origin if message.origin is not None else "the broker",
            len(message.payload),
            broker.config.limits.max_retained_payload,
        )
        return
    previous = broker.retained.update(message)
    if message.persistent and message.payload:
        broker.store.set_retained(message.topic, message)
    elif previous is not None and previous.persistent:
        broker.store.set_retained(message.topic, None)


def route(
    broker: Broker, message: Message, stored: list[QueuedMessage] | None = None
) -> list[Session | SharedGroup]:
    """Enqueue the message on every session and group that should get it; returns those
    that need pumping. ``stored``, when given, gets every copy a queue stored."""
    routes = broker.routes
    plan = routes.by_topic.get(message.topic)  # RoutePlans.plan, inlined: once a message
    if plan is None:
        plan = routes.missed(message.topic)
    touched: list[Session | SharedGroup] = []
    # The delivery rule's row for this message (what QueuedMessage.of looks up), once, not
    # once per copy: a fan-out makes every copy here.
    levels = LEVELS[message.qos][message.persistent]
    retain = message.retain
    for copy in plan.copies:
        options = copy.options
        if copy.own is options:
            # session_entry without noLocal subscriptions (nearly every copy), inlined.
            qos, persistent = levels[options.max_qos]
            entry = QueuedMessage(
                message,
                qos,
                persistent,
                retain and options.retain_as_published,
                options.subscription_ids,
            )
        else:
            own = session_entry(copy, message)
            if own is None:
                continue
            entry = own
        session = copy.session
        if stored is not None and entry.persistent:
            queue = session.made_queue
            if queue is not None and queue.durable:
                # A stored copy that may go before its commit: at once, when it can.
                if not deliver_stored_now(broker, session, queue, entry):
                    if not enqueue(broker, session, entry):
                        continue  # dropped (a full queue): nothing stored
                    touched.append(session)
                stored.append(entry)
                continue
        if enqueue(broker, session, entry):
            touched.append(session)
            if stored is not None and entry.persistent:
                queue = session.made_queue  # (enqueue made it: the attribute, not the property)
                if queue is not None and queue.durable:
                    stored.append(entry)
    for group in plan.groups:
        shared = QueuedMessage.of(message, group.max_qos)
        if enqueue_shared(broker, group, message, shared):
            touched.append(group)
            if stored is not None and group.queue.durable and shared.persistent:
                stored.append(shared)
    return touched


def session_entry(copy: SessionCopy, message: Message) -> QueuedMessage | None:
    """A session's copy of ``message`` as its route plan says (the options of the
    subscriptions that take it); None when the session published it and only noLocal
    subscriptions match, or when the copy's route filter refuses it."""
    admits = copy.admits
    if admits is not None and not admits(message):
        return None
    options = copy.options
    if copy.own is not options and message.origin == copy.session.client_id:
        own = copy.own  # the session published it: its noLocal subscriptions skip it
        if own is None:
            return None
        options = own
    return QueuedMessage.of(
        message,
        options.max_qos,
        message.retain and options.retain_as_published,
        options.subscription_ids,
    )


class PendingCommits:
    """Publications whose commit is pending, with the queues their copies wait on."""

    __slots__ = ("_broker", "_held")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._held: dict[asyncio.Future[None], list[tuple[Message, list[Session | SharedGroup]]]]
        self._held = {}

    def hold(
        self, commit: asyncio.Future[None], message: Message, touched: list[Session | SharedGroup]
    ) -> None:
        message.awaiting_commit = True
        # One callback per commit, however many publications it holds.
        held = self._held.get(commit)
        if held is None:
            held = self._held[commit] = []
            commit.add_done_callback(self._after_commit)
        held.append((message, touched))

    def _after_commit(self, future: asyncio.Future[None]) -> None:
        """Dispatch what a commit made safe; if it failed, deliver none of it."""
        held = self._held.pop(future, [])
        failed = future.cancelled() or future.exception() is not None
        for message, touched in held:
            message.awaiting_commit = False
            for target in touched:
                if failed:
                    # Not stored, and its publisher is told so: it must not be delivered.
                    target.queue.remove_message(message)
                else:
                    self._broker.pump_soon(target)


class _Watch:
    """The publications of one commit that may be acknowledged before it (see Acceptances):
    how many of their stored copies are not accepted yet, and the future their publishers
    wait on. Each such copy points to it (``QueuedMessage.watch``)."""

    __slots__ = ("commit", "future", "outstanding")

    def __init__(self, commit: asyncio.Future[None]) -> None:
        self.commit = commit
        self.future: asyncio.Future[None] = commit.get_loop().create_future()
        self.outstanding = 0


# QueuedMessage.watch of a stored copy accepted already (possibly before any watch existed:
# a receiver that settles a copy as it is handed one, while its publication is routed).
_ACCEPTED = object()


class Acceptances:
    """The publisher's side of store-and-dispatch (DESIGN.md section 3): a QoS 1 publication
    whose copies went out while their commit is pending is acknowledged at that commit or
    once every stored copy is accepted, whichever comes first. A copy accepted before its
    batch reaches the writer is never written (the store cancels it), so without this its
    publisher would still wait for a commit that no longer holds anything of its message.

    Nothing is lost by the early answer: every copy the message had to survive in was taken
    by its subscriber. A crash may leave a written copy whose removal was not committed yet;
    it is delivered again, which QoS 1 allows. One future per commit, shared by every
    publication of its batch (as the commit future is), never one per message: the batch goes
    early once every stored copy of each of its publications is accepted (a batch with a copy
    for an absent session waits for its commit). A watched copy points to its watch
    (``QueuedMessage.watch``), so nothing is kept or looked up per copy here.
    """

    __slots__ = ("_by_commit",)

    def __init__(self) -> None:
        # The watch publications of a pending commit join (None of its own once it is done).
        self._by_commit: dict[asyncio.Future[None], _Watch] = {}

    def watch(
        self, commit: asyncio.Future[None], copies: list[QueuedMessage]
    ) -> asyncio.Future[None]:
        """What the publisher of a message whose stored ``copies`` are in ``commit``'s batch
        waits for instead of ``commit``. A copy accepted already (while it was routed) is
        not waited for."""
        watch = self._by_commit.get(commit)
        if watch is None:
            for copy in copies:
                if copy.watch is None:
                    break
            else:
                # Every copy is accepted already: the publisher goes now.
                done: asyncio.Future[None] = commit.get_loop().create_future()
                done.set_result(None)
                return done
            watch = self._by_commit[commit] = _Watch(commit)
            commit.add_done_callback(self._committed)
        for copy in copies:
            if copy.watch is None:
                copy.watch = watch
                watch.outstanding += 1
        return watch.future

    def accepted(self, copy: QueuedMessage) -> None:
        """A stored copy was accepted (its subscriber acknowledged it)."""
        watch = copy.watch
        copy.watch = _ACCEPTED
        if not isinstance(watch, _Watch):
            return  # not watched (yet: see watch), or accepted already
        watch.outstanding -= 1
        if watch.outstanding == 0 and not watch.future.done():
            watch.future.set_result(None)
            # Publications of this batch that come later need a future of their own.
            if self._by_commit.get(watch.commit) is watch:
                del self._by_commit[watch.commit]

    def _committed(self, commit: asyncio.Future[None]) -> None:
        """The commit is done: whoever still waits goes with its outcome (a failed commit
        refuses the publishers whose copies were not all accepted). Copies accepted later
        find their watch done."""
        watch = self._by_commit.pop(commit, None)
        # A watch resolved early left _by_commit already; its copies are all accepted.
        if watch is None or watch.future.done():
            return
        if commit.cancelled():
            watch.future.cancel()
        elif (error := commit.exception()) is not None:
            watch.future.set_exception(error)
        else:
            watch.future.set_result(None)
