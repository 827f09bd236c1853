"""How a durable session's deliveries reach its connection: the in-flight mark the store needs
to resend a delivery after a restart, and the commit an exactly-once delivery waits for before
it goes out. Knows no protocol; never writes to a socket itself (the link does).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from kittiwake.broker.consumers import Delivery, DeliveryState
from kittiwake.broker.queues import QueuedMessage
from kittiwake.broker.sessions import Session, SessionLink
from kittiwake.broker.store import Store

if TYPE_CHECKING:
    from kittiwake.broker.broker import Broker


class DurableReceiver:
    """The consumer's receiver while a persistent session is connected.

    A session whose copies are not stored needs none of this: its consumer's receiver is the
    link itself, so the common path costs no extra call.
    """

    __slots__ = ("link", "session", "store")

    def __init__(self, store: Store, session: Session, link: SessionLink) -> None:
        self.store = store
        self.session = session
        self.link = link

    def deliver(self, delivery: Delivery) -> None:
        entry = delivery.entry
        link = self.link
        if not entry.persistent:
            link.deliver(delivery)
            return
        tag = link.tag(delivery)
        exactly_once = entry.qos == 2
        # An at-least-once mark may be written late (or never, if the acknowledgement comes
        # first): recovery counts an unmarked entry within the window as possibly delivered.
        self.store.mark_delivery(
            self.session.queue.name,
            entry.message.message_id,
            tag,
            "sent",
            lazy=not exactly_once,
        )
        if exactly_once:
            # The client holds this id until the release: the broker must not forget it.
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
    for delivery in list(session.consumer.unsettled.values()):
        entry = delivery.entry
        if delivery.state is DeliveryState.SENT:
            entry.delivery_count += 1
            if stored and entry.persistent and delivery.tag:
                store.mark_delivery(
                    session.queue.name, entry.message.message_id, delivery.tag, "sent", lazy=True
                )
        link.deliver(delivery)
