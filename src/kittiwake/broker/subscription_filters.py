"""Selectors and noLocal as the queues apply them. A subscription that has a queue of its own
(a JMS topic subscription) filters where that queue hands an entry to its consumer, so an entry
the filter refuses is accepted unseen, as if it had never been queued for it. A consumer of a
queue others consume too (a JMS queue) gets an :class:`EntrySelector`, which the queue's own
dispatch asks, so a refused entry stays for the others. Knows no protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kittiwake.broker.consumers import Delivery, Receiver, Settlement
from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage
from kittiwake.selector import Selector

# Header fields a protocol keeps in its own form (JMSMessageID, JMSCorrelationID, JMSType):
# the front end that received the message reads them for the selector.
ProtocolHeaders = Callable[[Message], Mapping[str, object]]


class EntrySubject:
    """One queued entry as a selector sees it (:class:`kittiwake.selector.SelectorSubject`)."""

    __slots__ = ("_protocol", "_protocol_headers", "entry")

    def __init__(self, entry: QueuedMessage, protocol_headers: ProtocolHeaders | None) -> None:
        self.entry = entry
        self._protocol_headers = protocol_headers
        self._protocol: Mapping[str, object] | None = None

    def get_header(self, name: str) -> object:
        entry = self.entry
        if name == "JMSXDeliveryCount":
            return entry.delivery_count + 1
        return self._header(entry.message, name)

    def _header(self, message: Message, name: str) -> object:
        if name == "JMSPriority":
            return message.priority
        if name == "JMSDeliveryMode":
            return "PERSISTENT" if message.persistent else "NON_PERSISTENT"
        if name == "JMSTimestamp":
            return message.timestamp or None
        if self._protocol_headers is None:
            return None
        if self._protocol is None:
            self._protocol = self._protocol_headers(message)
        return self._protocol.get(name)

    def get_property(self, name: str) -> object:
        properties = self.entry.message.properties
        return None if properties is None else properties.get(name)


class MessageSubject(EntrySubject):
    """A publication as a selector sees it while it is routed, before any copy is queued: its
    first delivery is the one to come (JMSXDeliveryCount 1)."""

    __slots__ = ("message",)

    def __init__(self, message: Message, protocol_headers: ProtocolHeaders | None) -> None:
        self.message = message
        self._protocol_headers = protocol_headers
        self._protocol = None

    def get_header(self, name: str) -> object:
        if name == "JMSXDeliveryCount":
            return 1
        return self._header(self.message, name)

    def get_property(self, name: str) -> object:
        properties = self.message.properties
        return None if properties is None else properties.get(name)


class HeadersSource:
    """Where a route filter finds the front end's protocol headers for its selector: set by
    the front end that reads them (the AMQP one), possibly after the filters are made (at
    recovery, before any listener runs)."""

    __slots__ = ("protocol_headers",)

    def __init__(self) -> None:
        self.protocol_headers: ProtocolHeaders | None = None


class RouteFilter:
    """A subscription's selector applied where a publication is routed
    (:attr:`kittiwake.broker.routing.Binding.selector`): a message it refuses is never queued
    for the subscription, nor stored for it. A durable subscription's (JMS: what its selector
    refuses is not added to it), which collects messages while nobody consumes: a copy
    refused only where it is handed to a consumer would be kept, stored and counted against
    the queue's limits until then."""

    __slots__ = ("headers", "key", "selector")

    def __init__(self, selector: Selector, headers: HeadersSource, key: object) -> None:
        self.selector = selector
        self.headers = headers
        # What it was made from (a subscription's definition), so that one made again from
        # the same is seen to change nothing.
        self.key = key

    def __call__(self, message: Message) -> bool:
        return self.selector.matches(MessageSubject(message, self.headers.protocol_headers))


class EntrySelector:
    """A queue consumer's selector (:attr:`kittiwake.broker.consumers.Consumer.selects`)."""

    __slots__ = ("protocol_headers", "selector")

    def __init__(self, selector: Selector, protocol_headers: ProtocolHeaders | None) -> None:
        self.selector = selector
        self.protocol_headers = protocol_headers

    def __call__(self, entry: QueuedMessage) -> bool:
        return self.selector.matches(EntrySubject(entry, self.protocol_headers))


class FilteringReceiver:
    """Wraps a consumer's receiver: entries its selector or noLocal refuses are accepted
    without being sent, and the credit they took is given back."""

    __slots__ = ("inner", "no_local_origin", "protocol_headers", "selector")

    def __init__(
        self,
        inner: Receiver,
        *,
        selector: Selector | None = None,
        no_local_origin: str | None = None,
        protocol_headers: ProtocolHeaders | None = None,
    ) -> None:
        self.inner = inner
        self.selector = selector
        # noLocal: messages published by this origin (the subscriber's connection) are refused.
        self.no_local_origin = no_local_origin
        self.protocol_headers = protocol_headers

    def accepts(self, entry: QueuedMessage) -> bool:
        origin = self.no_local_origin
        # noLocal does not filter retained messages (DESIGN.md section 2).
        if origin is not None and entry.message.origin == origin and not entry.retain:
            return False
        selector = self.selector
        if selector is None or selector.selects_everything:
            return True
        return selector.matches(EntrySubject(entry, self.protocol_headers))

    def deliver(self, delivery: Delivery) -> None:
        if self.accepts(delivery.view):
            self.inner.deliver(delivery)
            return
        consumer = delivery.consumer
        queue = consumer.queue
        settled = queue is not None and queue.settle(delivery, Settlement.ACCEPTED)
        if settled and consumer.credit.window is None:
            consumer.credit.available += 1  # link credit: the entry never used it

    def deliver_settled(self, entry: QueuedMessage) -> None:
        if self.accepts(entry):
            self.inner.deliver_settled(entry)
