"""From queues to connections: putting a copy on a session's or group's queue (or straight in
flight when nothing waits), pumping queues into their consumers' windows, once per loop turn,
the in-flight marks a durable session's deliveries need, and resending on resumption.
Knows no protocol; never writes to a socket itself (the link does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from kittiwake.broker.consumers import Delivery, DeliveryState
from kittiwake.broker.message import Message
from kittiwake.broker.queues import Queue, QueuedMessage
from kittiwake.broker.sessions import Session, SessionLink, session_queue_name
from kittiwake.broker.shared_groups import SharedGroup
from kittiwake.broker.store import Store

if TYPE_CHECKING:
    from kittiwake.broker.broker import Broker


class DurableReceiver:
    """The consumer's receiver while a persistent session is connected.

    A session whose copies are not stored needs none of this: its consumer's receiver is the
    link itself, so the common path costs no extra call.
    """

    __slots__ = ("link", "queue_name", "session", "store")

    def __init__(self, store: Store, session: Session, link: SessionLink) -> None:
        self.store = store
        self.session = session
        self.link = link
        # The store's key of the session's queue (what session.queue.name says, without
        # making the queue or a property call per delivery).
        self.queue_name = session_queue_name(session.client_id)

    def deliver(self, delivery: Delivery) -> None:
        entry = delivery.entry
        link = self.link
        if not entry.persistent:
            link.deliver(delivery)
            return
        tag = link.tag(delivery)
        if entry.qos != 2:
            # An at-least-once mark may be written late (or never, if the acknowledgement
            # comes first): recovery counts an unmarked entry within the window as possibly
            # delivered.
            self.store.mark_delivery(self.queue_name, entry.message.message_id, tag, "sent", True)
            link.deliver(delivery)
            return
        self.store.mark_delivery(self.queue_name, entry.message.message_id, tag, "sent")
        # Exactly once: the client holds this id until the release, so the broker must not
        # forget it.
        commit = self.store.commit()
        if commit is not None:
            commit.add_done_callback(lambda done: self._send_committed(done, delivery, link))
            return
        link.deliver(delivery)

    def _send_committed(
        self, done: asyncio.Future[None], delivery: Delivery, link: SessionLink
    ) -> None:
        if done.cancelled() or done.exception() is not None:
            return  # stays in flight; resent on the next connection
        consumer = delivery.consumer
        if self.session.link is link and consumer.unsettled.get(delivery.id) is delivery:
            link.deliver(delivery)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        self.link.deliver_settled(entry)


def resend(broker: Broker, session: Session, link: SessionLink) -> None:
    """A connection resumed the session: what was in flight goes out again, in order, first.

    An attempt the client may have seen counts (delivery count + 1, so it is marked as a
    redelivery); a delivery the client holds already gets its release again.
    """
    store = broker.store
    stored = session.persistent
    for delivery in list(session.inflight.values()):
        entry = delivery.entry
        if delivery.state is DeliveryState.SENT:
            entry.delivery_count += 1
            if stored and entry.persistent and delivery.tag:
                store.mark_delivery(
                    session.queue.name, entry.message.message_id, delivery.tag, "sent", lazy=True
                )
        link.deliver(delivery)


def enqueue(broker: Broker, session: Session, entry: QueuedMessage) -> bool:
    """Queue one copy for a session; QoS 0 goes straight out or nowhere (once its delivery
    time has come, if it has one). True when pumping is needed."""
    queue = session.made_queue  # (the attribute, not the property's call, per copy)
    if queue is None:
        queue = session.queue
    cursors = broker.retained_cursors  # empty nearly always: one check per copy
    owed = session in cursors if cursors else False
    if owed:
        # The topic's retained message still owed to a new subscription goes first.
        broker.retained_ahead(session, entry.message.topic)
    if entry.qos == 0:
        if entry.message.delivery_time is None:
            if queue.offer(entry):
                broker.stats.messages_sent += 1
            return False
        return hold_until_due(broker, queue, entry)
    # The queue of a persistent session is durable (an attribute: no property call here).
    if session.link is None and not queue.durable:
        return False
    stored = entry.persistent and queue.durable
    consumer = session.made_consumer or session.consumer
    message = entry.message
    if (
        not stored
        and not queue.count
        and consumer.credit.available > 0
        and consumer.receiver is not None
        and message.delivery_time is None
        # A QoS 2 copy of a message still being committed waits for the commit: if it
        # fails, the publisher is refused and resends, and this copy would be a duplicate.
        and (entry.qos < 2 or not message.persistent)
        # One the queue could never hold is its policy's to refuse (push, below), whether
        # or not it would have to wait: the same copy is not kept or dropped by chance.
        and len(message.payload) + len(message.topic) <= queue.max_bytes
        # Retained messages a new subscription has not been sent yet go first (feed_retained).
        and not owed
    ):
        # Nothing to wait for (no commit, no queue ahead, room in the window): send now.
        queue.deliver_now(consumer, entry)
        broker.stats.messages_sent += 1
        return False
    if not queue.push(entry)[0]:
        broker.stats.messages_dropped += 1
        return False
    if stored:
        if message.message_id == 0:
            broker.store.journal(message)
        broker.store.enqueue(queue.name, entry)
    return True


def enqueue_run(
    broker: Broker, session: Session, queue: Queue, entries: list[QueuedMessage]
) -> int:
    """:func:`enqueue` for each of a run of at-least-once copies nobody stores (one per
    publication of publishing.publish_run, in order) to a connected session whose queue
    takes them all (``Queue.takes_run``): while nothing waits and the window has room they go
    in flight at once, the rest are queued in one step. Returns the index of the first one
    queued (``len(entries)`` when none was)."""
    consumer = session.made_consumer or session.consumer
    credit = consumer.credit
    sent = 0
    count = len(entries)
    receiver = consumer.receiver
    deliver_all: Callable[[list[Delivery]], None] | None
    deliver_all = getattr(receiver, "deliver_all", None)
    if deliver_all is not None:
        # A receiver that takes runs never acts on the queue while it sends: what the window
        # takes goes at once, in one hand-over (one write).
        if not queue.count and credit.available > 0:
            sent = min(count, credit.available)
            going = entries[:sent] if sent < count else entries
            queue.deliver_now_all(consumer, going, deliver_all)
    else:
        while (
            sent < count
            and not queue.count
            and credit.available > 0
            and consumer.receiver is not None
        ):
            queue.deliver_now(consumer, entries[sent])
            sent += 1
    if sent:
        broker.stats.messages_sent += sent
        if sent == count:
            return count
        queue.push_all(entries[sent:])
    else:
        queue.push_all(entries)
    return sent


def deliver_stored_now(
    broker: Broker, session: Session, queue: Queue, entry: QueuedMessage
) -> bool:
    """A stored at-least-once copy of a store-and-dispatch publication (DESIGN.md section 3)
    on the session's durable ``queue`` goes in flight at once, as :func:`enqueue` sends a copy
    nobody stores, when nothing waits ahead of it and the window has room: its stored entry
    first, so that the in-flight mark its delivery makes joins the pending insert (and is
    dropped with it on acceptance); no push, pump and dispatch round. False when it cannot
    (nothing done): the caller enqueues it (and the queue's policy refuses a copy larger than
    its byte limit, as :func:`enqueue` leaves it to)."""
    consumer = session.made_consumer
    message = entry.message
    if (
        queue.count
        or consumer is None
        or consumer.credit.available <= 0
        or consumer.receiver is None
        or message.delivery_time is not None
        or len(message.payload) + len(message.topic) > queue.max_bytes
        or (broker.retained_cursors and session in broker.retained_cursors)
    ):
        return False
    if message.message_id == 0:
        broker.store.journal(message)
    broker.store.enqueue(queue.name, entry)
    queue.deliver_now(consumer, entry)
    broker.stats.messages_sent += 1
    return True


def enqueue_shared(
    broker: Broker, group: SharedGroup, message: Message, entry: QueuedMessage | None = None
) -> bool:
    """Queue one copy for a shared group (each member's own cap applies when it is sent
    one); QoS 0 goes to a connected member or nowhere. True when pumping is needed.
    ``entry``: the copy, when the caller made it (``QueuedMessage.of(message,
    group.max_qos)``)."""
    if entry is None:
        entry = QueuedMessage.of(message, group.max_qos)
    queue = group.queue
    if entry.qos == 0:
        if message.delivery_time is None:
            if queue.offer(entry):
                broker.stats.messages_sent += 1
            return False
        return hold_until_due(broker, queue, entry)
    if not queue.push(entry)[0]:
        broker.stats.messages_dropped += 1
        return False
    if entry.persistent and queue.durable:
        if message.message_id == 0:
            broker.store.journal(message)
        broker.store.enqueue(queue.name, entry)
    return True


def hold_until_due(broker: Broker, queue: Queue, entry: QueuedMessage) -> bool:
    """An at-most-once copy with a delivery time: it waits in the queue's delayed entries
    (never stored) and is offered when due (``Queue.offers_at_most_once``), to whoever is
    connected then. Nobody connected now: nowhere, as any QoS 0 copy. True when pumping is
    needed (the pump registers the queue for the ticks that make it due)."""
    delivery_time = entry.message.delivery_time
    if delivery_time is None or delivery_time <= broker.clock.now():
        if queue.offer(entry):
            broker.stats.messages_sent += 1
        return False
    if not any(consumer.receiver is not None for consumer in queue.consumers):
        return False
    if not queue.push(entry)[0]:
        broker.stats.messages_dropped += 1
        return False
    return True


def pump(broker: Broker, target: Session | SharedGroup) -> None:
    """Move queued messages into flight while the consumers' windows have room.

    A session's pump also serves the groups it is a member of, since the credit an
    acknowledgement frees may be theirs to use.
    """
    if isinstance(target, SharedGroup):
        group_queue = target.queue
        if group_queue.count:
            broker.stats.messages_sent += group_queue.dispatch(broker.clock.now())
            if group_queue.next_visible_time() is not None:
                broker.pumps.delayed.add(target)
        return
    session = target
    queue = session.made_queue
    if queue is None or not session.delivering:
        return  # (no queue: nothing queued, no retained messages to send, nothing in flight)
    cursors = broker.retained_cursors
    if cursors and session in cursors:
        # A new subscription's retained messages go before what was queued since it started.
        broker.feed_retained(session)
    if queue.count:
        broker.stats.messages_sent += queue.dispatch(broker.clock.now())
        broker.flow.pumped(session)
        if queue.next_visible_time() is not None:
            broker.pumps.delayed.add(session)
        if cursors and session in cursors:
            broker.feed_retained(session)  # what was queued before it may have gone now
    if session.members:
        for member in session.members.values():
            if member.group.queue.count:
                pump(broker, member.group)


class PumpSchedule:
    """Sessions and groups to pump at the end of this read (see :meth:`run`), or else of this
    loop turn: one pump serves every acknowledgement and publication of a read, instead of one
    pump each."""

    __slots__ = ("_broker", "delayed", "loop", "pending")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        # None = no loop (unit tests): pump at once.
        self.loop: asyncio.AbstractEventLoop | None = None
        # What runs at the end of this read (or turn). Public so that a caller doing this per
        # message (a read's publications, its acknowledgements) can skip the call for a
        # target already in it: ``if target not in pumps.pending: pump_soon(target)``.
        self.pending: dict[Session | SharedGroup, None] = {}
        # Sessions and groups whose queue holds entries not visible yet (delivery time):
        # ticks pump them.
        self.delayed: set[Session | SharedGroup] = set()

    def soon(self, target: Session | SharedGroup) -> None:
        """Pump this session (or group) once the current loop turn has done its reading."""
        if self.loop is None:
            pump(self._broker, target)
            return
        pending = self.pending
        if not pending:
            self.loop.call_soon(self._run)
        pending[target] = None

    def run(self) -> None:
        """Pump what is pending now: a front end's transport calls this once a read's packets
        are handled, so what they freed or queued goes out with that read's answers instead
        of after every other read of the loop turn (the scheduled run then finds nothing)."""
        if not self.pending:
            return
        targets = list(self.pending)
        self.pending.clear()
        for target in targets:
            pump(self._broker, target)

    _run = run

    def due(self, now: float) -> list[Session | SharedGroup]:
        """Sessions and groups whose delayed entries are visible by now (and that can take
        them: a session while connected; a group's pump finds its connected members)."""
        ready: list[Session | SharedGroup] = []
        for target in list(self.delayed):
            due = target.queue.next_visible_time()
            if due is None or not self._alive(target):
                self.delayed.discard(target)
            elif due <= now and (isinstance(target, SharedGroup) or target.link is not None):
                ready.append(target)
        return ready

    def _alive(self, target: Session | SharedGroup) -> bool:
        broker = self._broker
        if isinstance(target, SharedGroup):
            return broker.shared_groups.get((target.name, target.topic_filter)) is target
        return broker.sessions.get(target.client_id) is target
