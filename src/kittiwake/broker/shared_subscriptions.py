"""JMS 2.0 shared subscriptions (shared, and shared durable): one core session whose queue the
subscription's topic feeds, and one consumer on that queue per consumer, so each message goes
to one of them. Owns the naming (client id + subscription name, or the name alone for a global
one), the subscription's life and the checks JMS makes across clients (one topic, selector and
noLocal per subscription); delivers nothing itself and knows no protocol.

The session's own consumer (the hub) takes nothing (no credit): it only keeps the session
connected while any link consumes, and gives back what a restart left in flight to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kittiwake.broker.consumers import Consumer, Credit, Delivery, Receiver, Settlement
from kittiwake.broker.durable_subscriptions import SubscriptionDefinition, redefined
from kittiwake.broker.queues import DEFAULT_QUEUE_RULES, QueuedMessage, QueueRules
from kittiwake.broker.sessions import NEVER_EXPIRES, Session, SessionLink
from kittiwake.broker.store import Store
from kittiwake.broker.subscription_filters import FilteringReceiver
from kittiwake.broker.subscriptions import SubscribeRefusal, SubscriptionOptions

if TYPE_CHECKING:
    from kittiwake.broker.broker import Broker
    from kittiwake.broker.subscription_filters import ProtocolHeaders
    from kittiwake.selector import Selector

# A global subscription (no client id) is named by its subscription name alone.
GLOBAL_SCOPE = "$global"


def shared_client_id(scope: str, name: str, *, durable: bool) -> str:
    """The core session of a shared subscription. Durable ones share the durable
    subscriptions' namespace (JMS: one name per client id, shared or not)."""
    return f"$durable/{scope}/{name}" if durable else f"$shared/{scope}/{name}"


# What a shared subscription is: every consumer of it must ask for the same (JMS 2.0
# section 8.3).
SharedDefinition = SubscriptionDefinition


class SharedRefusal(str):
    """Why a consumer may not join a shared subscription (a sentence for the client)."""


class MarkingReceiver:
    """A consumer's receiver on a durable shared subscription: a stored entry's attempt is
    marked (lazily, as at least once: JMS has no exactly-once hand-over), so a restart gives
    it back counted; the recovered delivery is the hub's, which releases it to the queue."""

    __slots__ = ("link", "queue_name", "store")

    def __init__(self, store: Store, queue_name: str, link: SessionLink) -> None:
        self.store = store
        self.queue_name = queue_name
        self.link = link

    def deliver(self, delivery: Delivery) -> None:
        entry = delivery.entry
        if entry.persistent:
            self.store.mark_delivery(
                self.queue_name, entry.message.message_id, self.link.tag(delivery), "sent",
                lazy=True,
            )
        self.link.deliver(delivery)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        self.link.deliver_settled(entry)


class SharedSubscription:
    """One shared subscription: its session and the links consuming from its queue."""

    def __init__(
        self,
        broker: Broker,
        client_id: str,
        definition: SharedDefinition,
        durable: bool,
        queue_rules: QueueRules = DEFAULT_QUEUE_RULES,
    ) -> None:
        self.broker = broker
        self.client_id = client_id
        self.definition = definition
        self.topic = definition.topic
        self.durable = durable
        # Its queue's order and dead-lettering, as the front end asked (broker.connect).
        self.queue_rules = queue_rules
        self.session: Session | None = None
        self.consumers: dict[SessionLink, Consumer] = {}
        self.new = False
        # The in-flight window as stored (a durable subscription's crash rule).
        self.stored_window = 0

    # -- the hub: the session's own link (SessionLink) ----------------------------------------

    def deliver(self, delivery: Delivery) -> None:
        """Only what a restart left in flight to the hub comes here: back to the queue."""
        queue = delivery.consumer.queue
        session = self.session
        released = queue is not None and queue.settle(delivery, Settlement.RELEASED)
        if released and session is not None:
            self.broker.pump_soon(session)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        """At most once, with a credit of 0: nobody asked for it (never sent)."""

    def tag(self, delivery: Delivery) -> int:
        if not delivery.tag:
            delivery.tag = delivery.id
        return delivery.tag

    def taken_over(self) -> None:
        """Cannot happen: the id is the subscription's own."""

    # -- life -------------------------------------------------------------------------------

    def open(self, previous: SharedDefinition | None = None) -> str | None:
        """Connect the session (made, or resumed for a durable one); an error text when the
        topic cannot be subscribed. A durable subscription nobody consumes from, asked for
        with another topic, selector or noLocal than ``previous`` (its definition), is
        replaced: JMS says it is deleted and created anew."""
        broker = self.broker
        existing = broker.sessions.get(self.client_id)
        if existing is not None and existing.link is not None and existing.link is not self:
            return "the subscription name is in use by an unshared durable subscription"
        replace = redefined(existing, previous, self.definition)
        connected = broker.connect(
            self.client_id,
            self,  # the hub is the session's link
            clean_start=not self.durable or replace,
            expiry_interval=NEVER_EXPIRES if self.durable else 0,
            window=1,
            queue_rules=self.queue_rules,
        )
        session = self.session = connected.session
        session.consumer.credit = Credit(available=0)  # the hub never takes anything
        if self.topic not in session.subscriptions:
            result = broker.subscribe(session, self.topic, SubscriptionOptions(max_qos=2))
            if isinstance(result, SubscribeRefusal):
                broker.set_session_expiry(session, 0)
                broker.disconnect(session, publish_will=False)
                self.session = None
                return f"cannot subscribe: {result.value}"
            self.new = result.new
            if result.new:
                broker.send_retained(result)  # only when it is created
        broker.start_delivery(session)
        return None

    def add(
        self,
        link: SessionLink,
        *,
        selector: Selector | None,
        no_local_origin: str | None,
        protocol_headers: ProtocolHeaders,
    ) -> Consumer:
        """A link consumes from the subscription's queue, with its own link credit."""
        session = self.session
        assert session is not None
        receiver: Receiver = link
        if session.persistent:
            receiver = MarkingReceiver(self.broker.store, session.queue.name, link)
        if selector is not None or no_local_origin is not None:
            receiver = FilteringReceiver(
                receiver,
                selector=selector,
                no_local_origin=no_local_origin,
                protocol_headers=protocol_headers,
            )
        consumer = Consumer(receiver, credit=0, name=f"{self.client_id}#{len(self.consumers)}")
        session.queue.attach(consumer)
        self.consumers[link] = consumer
        return consumer

    def remove(self, link: SessionLink, *, unsubscribe: bool) -> None:
        """A link is gone; what it left unsettled goes back to the others. The last one
        ends a non-durable subscription, and a durable one only when it unsubscribes."""
        consumer = self.consumers.pop(link, None)
        session = self.session
        if consumer is None or session is None:
            return
        consumer.receiver = None
        session.queue.detach(consumer)
        if self.consumers:
            self.broker.pump_soon(session)
            return
        if self.stored_window:
            self.stored_window = 0
            self.broker.store.save_queue_window(session.queue.name, 0)
        if unsubscribe and self.durable:
            self.broker.set_session_expiry(session, 0)
        self.broker.disconnect(session, publish_will=False)
        self.session = None

    def window_stored(self, consumer: Consumer, credit: int, then: Callable[[], None]) -> bool:
        """Whether ``consumer`` may have ``credit`` now: a durable subscription stores its
        in-flight window (its consumers' unsettled deliveries and credit) before it grows,
        so recovery after a crash counts what may have been in flight (DESIGN.md section 2).
        False while that commit is pending; ``then`` runs once it is done."""
        session = self.session
        if not self.durable or session is None:
            return True
        window = len(consumer.unsettled) + max(0, credit)
        for other in self.consumers.values():
            if other is not consumer:
                window += len(other.unsettled) + max(0, other.credit.available)
        if window <= self.stored_window:
            return True
        self.stored_window = window
        store = self.broker.store
        store.save_queue_window(session.queue.name, window)
        commit = store.commit()
        if commit is None:
            return True
        commit.add_done_callback(lambda _: then())
        return False

    def pump(self) -> None:
        if self.session is not None:
            self.broker.pump_soon(self.session)

    def pump_now(self) -> None:
        if self.session is not None:
            self.broker.pump(self.session)

    def acknowledge(self, delivery: Delivery) -> None:
        if self.session is not None:
            self.broker.acknowledge(self.session, delivery)

    def settle(self, delivery: Delivery, settlement: Settlement, undeliverable: bool) -> None:
        """Released, modified or rejected (see :meth:`Broker.settle`)."""
        if self.session is not None:
            self.broker.settle(
                self.session, delivery, settlement, undeliverable_here=undeliverable
            )


class SharedSubscriptions:
    """Every shared subscription of the broker, by its session's client id: the ones with
    consumers; the definitions of durable ones (so re-creating one nobody consumes from with
    another topic or selector replaces it) are the broker's durable definitions, shared with
    unshared durable subscriptions (see durable_subscriptions.py)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.active: dict[str, SharedSubscription] = {}
        self.definitions = broker.durable_definitions

    def join(
        self,
        client_id: str,
        definition: SharedDefinition,
        *,
        durable: bool,
        queue_rules: QueueRules = DEFAULT_QUEUE_RULES,
    ) -> SharedSubscription | SharedRefusal:
        """The subscription a new consumer joins (made when it has no consumer), or why it
        may not: while others consume, its topic, selector and noLocal are fixed (JMS 2.0:
        a JMSException for a consumer asking for others). ``queue_rules`` are its queue's
        when it is made (see :meth:`Broker.connect`)."""
        subscription = self.active.get(client_id)
        if subscription is not None:
            if subscription.definition != definition:
                return SharedRefusal(
                    "the shared subscription has active consumers with another topic, "
                    "selector or noLocal"
                )
            return subscription
        subscription = SharedSubscription(
            self.broker, client_id, definition, durable, queue_rules
        )
        self.active[client_id] = subscription
        return subscription

    def open(self, subscription: SharedSubscription) -> str | None:
        """Connect a subscription that has no session yet (see :meth:`SharedSubscription.open`)."""
        client_id = subscription.client_id
        previous = self.definitions.get(client_id) if subscription.durable else None
        error = subscription.open(previous)
        if error is None and subscription.durable:
            self.definitions.define(client_id, subscription.definition)
        return error

    def leave(self, subscription: SharedSubscription, *, unsubscribe: bool) -> None:
        """Forget a subscription once its last consumer is gone (and the definition of a
        durable one that is unsubscribed)."""
        if subscription.consumers:
            return
        client_id = subscription.client_id
        if self.active.get(client_id) is subscription:
            del self.active[client_id]
        if unsubscribe or not subscription.durable:
            self.definitions.forget(client_id)
