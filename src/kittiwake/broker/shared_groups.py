"""MQTT shared subscriptions ($share/{group}/{filter}): one queue per group, its members'
sessions consuming from it by credit, so a message waits for a member that can take it.

What a member is sent is made for that member (its granted QoS caps the level, its own
subscription identifier and Retain As Published apply, MQTT-4.8.2-3). An exactly-once message
becomes the member's own once sent: MQTT-4.8.2-4/5 say it is completed with that client on
reconnect and never given to another member. At-least-once messages a member leaves unsettled
go back to the group when it disconnects (MQTT 5 section 4.8.2 allows it). Knows no wire format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kittiwake.broker.consumers import Consumer, Delivery, Settlement
from kittiwake.broker.queues import Queue, QueuedMessage
from kittiwake.broker.sessions import Session, SessionLink, Subscription

if TYPE_CHECKING:
    from kittiwake.broker.broker import Broker


def group_queue_name(group: str, topic_filter: str) -> str:
    """A group's queue name, also its key in the store; ``$`` keeps it apart from users' queues."""
    return f"$share/{group}/{topic_filter}"


class Member:
    """One session's membership of one group: its subscription and its consumer on the group's
    queue (sharing the session's credit)."""

    __slots__ = ("consumer", "group", "session", "subscription")

    def __init__(self, group: SharedGroup, subscription: Subscription) -> None:
        self.group = group
        self.subscription = subscription
        self.session: Session = subscription.session
        self.consumer = Consumer(
            None, share=self.session.consumer.credit, name=self.session.client_id
        )

    def view(self, entry: QueuedMessage) -> QueuedMessage:
        """The copy of a group entry this member is sent."""
        subscription = self.subscription
        sub_id = subscription.subscription_id
        view = QueuedMessage.of(
            entry.message,
            subscription.max_qos,
            retain=entry.message.retain and subscription.retain_as_published,
            subscription_ids=() if sub_id is None else (sub_id,),
        )
        view.delivery_count = entry.delivery_count
        return view


class SharedGroup:
    """The members of one shared subscription and the queue they share."""

    __slots__ = ("max_qos", "members", "name", "queue", "topic_filter")

    def __init__(self, name: str, topic_filter: str, queue: Queue) -> None:
        self.name = name
        self.topic_filter = topic_filter
        self.queue = queue
        # Ordered by joining time, so taking turns is repeatable.
        self.members: dict[Session, Member] = {}
        # The highest granted QoS among the members: the level group entries are made at (each
        # member's own cap applies when it is sent one).
        self.max_qos = 0

    def refresh(self) -> None:
        """Recompute what depends on the members (after one joins, leaves or resubscribes)."""
        self.max_qos = max((m.subscription.max_qos for m in self.members.values()), default=0)
        self.queue.durable = any(m.session.persistent for m in self.members.values())

    def __repr__(self) -> str:
        return f"<SharedGroup {self.queue.name!r} members={len(self.members)}>"


class MemberReceiver:
    """A connected member's receiver on its group's queue."""

    __slots__ = ("broker", "link", "member")

    def __init__(self, broker: Broker, member: Member, link: SessionLink) -> None:
        self.broker = broker
        self.member = member
        self.link = link

    def deliver(self, delivery: Delivery) -> None:
        member = self.member
        view = member.view(delivery.entry)
        queue = member.group.queue
        if view.qos == 0:
            # Capped to at most once by this member's subscription: sent, and done with.
            queue.settle(delivery, Settlement.ACCEPTED)
            self.link.deliver_settled(view)
            return
        if view.qos == 2:
            # Exactly once: from now on the member's own (MQTT-4.8.2-4/5).
            queue.settle(delivery, Settlement.ACCEPTED)
            self.broker.hand_over(member.session, view)
            return
        delivery.view = view
        entry = delivery.entry
        if entry.persistent and queue.durable:
            # Only for the count: a restart gives the entry back to the group either way.
            self.broker.store.mark_delivery(
                queue.name, entry.message.message_id, self.link.tag(delivery), "sent", lazy=True
            )
        self.link.deliver(delivery)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        self.link.deliver_settled(self.member.view(entry))
