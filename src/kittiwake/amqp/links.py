"""AMQP links onto the core: a link from the client (a producer) publishes into the core; a
link to the client (a consumer) is a core Consumer whose credit is the link credit.

- Queue nodes: a producer puts messages on the queue destination; a consumer competes with the
  queue's other consumers.
- Topic nodes: a producer publishes on the topic tree (MQTT subscribers get it by the delivery
  rule of DESIGN.md section 2); a consumer is a subscription of its own (a core session with
  one subscription, ended with the link).
- Outcomes: accepted, released, modified (delivery-failed counts an attempt,
  undeliverable-here keeps it from this consumer), rejected (to the dead-letter queue) become
  the core's settlements, on queues and topic subscriptions alike (whose queues the front end
  asks for in priority order and dead-lettering, JMS_SUBSCRIPTION_QUEUE); a producer's
  transfer is accepted once the core's completion says so (the commit of a persistent message).
- Presettled transfers are at most once both ways (JMS acknowledgements disabled).

Translation only: every delivery rule is the core's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proton import Condition, Link, Terminus
from proton import Delivery as ProtonDelivery

from kittiwake.amqp import engine_calls
from kittiwake.amqp.coordinator import (
    TRANSACTIONAL_STATE,
    UNKNOWN_ID,
    Coordinator,
    state_fields,
    transactional_outcome,
)
from kittiwake.amqp.frames import (
    INTERNAL_ERROR,
    INVALID_FIELD,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    RESOURCE_LIMIT_EXCEEDED,
    UNAUTHORIZED_ACCESS,
)
from kittiwake.amqp.message_mapping import (
    Clocks,
    DestinationType,
    MappingError,
    from_amqp,
    jms_headers,
    to_amqp,
)
from kittiwake.amqp.terminus import (
    NodeKind,
    NodeRequest,
    TerminusError,
    copy_filter,
    put_filters,
    read_node,
    set_capabilities,
    subscription_name,
)
from kittiwake.broker.authorization import Permissions, RenewPermissions
from kittiwake.broker.broker import Broker, Subscribed, SubscribeRefusal, SubscriptionOptions
from kittiwake.broker.completion import Completion
from kittiwake.broker.consumers import Consumer, Credit, Delivery, Settlement
from kittiwake.broker.destinations import Destination
from kittiwake.broker.durable_subscriptions import SubscriptionDefinition
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.broker.queues import EntryState, QueuedMessage, QueueRules
from kittiwake.broker.sessions import NEVER_EXPIRES, Session
from kittiwake.broker.shared_subscriptions import (
    GLOBAL_SCOPE,
    SharedDefinition,
    SharedRefusal,
    SharedSubscription,
    shared_client_id,
)
from kittiwake.broker.subscription_filters import EntrySelector, EntrySubject, FilteringReceiver
from kittiwake.broker.temporary_destinations import TemporaryDestinations
from kittiwake.broker.topics import TopicError, quoted_topic, validate_topic_name
from kittiwake.selector import InvalidSelector, Selector, compile_selector

if TYPE_CHECKING:
    from kittiwake.amqp.connection import AMQPConnection

log = logging.getLogger(__name__)

SOLE_CONNECTION = "sole-connection-for-container"

# A JMS topic subscription's queue (plain, durable, shared): priority order (higher first,
# FIFO within a priority), and what it gives up on (rejected, failed max_delivery_attempts
# times, expired) goes to the dead-letter or expiry queue, as from a JMS queue.
JMS_SUBSCRIPTION_QUEUE = QueueRules(ordering="priority", dead_letters=True)

# Connection ids, for noLocal and logs; unique within the process.
_connection_ids = itertools.count(1)
# This process among the broker's runs: a stored message's origin (a connection without a
# client id) never names a connection of a later run, whose ids count from 1 again.
_RUN = secrets.token_hex(4)


class LinkLayer:
    """The links of one AMQP connection."""

    def __init__(
        self,
        connection: AMQPConnection,
        broker: Broker,
        queues: QueueDestinations,
        temporaries: TemporaryDestinations,
    ) -> None:
        self.connection = connection
        self.broker = broker
        self.queues = queues
        self.temporaries = temporaries
        self.id = f"$amqp/{next(_connection_ids)}"
        # Who published a message, for noLocal (Message.origin): the client id a JMS
        # connection holds in the registry (claimed when it opens, before any link), else
        # this connection alone (its id in this run: stored with a persistent message, it
        # must not match a connection of a later run). A client id names one connection at a
        # time, and the same one again on the next connection and after a restart, which a
        # durable subscription's noLocal needs (JMS 2.0: nothing published by a connection
        # with its client id is added to it); a connection id is neither.
        self.origin = f"{self.id}@{_RUN}"
        # AMQP's message counts (/metrics): one increment per transfer each way.
        self.traffic = broker.stats.protocol("amqp")
        # By their link's C object (``link_key``; cffi pointers hash and compare by address):
        # a transfer or a credit change finds its link without
        # proton wrapping the link first.
        self.producers: dict[Any, ProducerLink] = {}
        self.consumers: dict[Any, ConsumerLink] = {}
        # Temporary destinations made by a dynamic attach, deleted when that link closes.
        self.dynamic: dict[Link, Destination] = {}
        self.coordinator = Coordinator(self)
        # The client id this connection holds in the broker's registry (a sole connection).
        self.sole_container: str | None = None
        self.ended = False
        self._permissions: Permissions | None = None

    @property
    def principal_name(self) -> str | None:
        """The user this connection authenticated as (None: anonymous)."""
        principal = self.connection.principal
        return principal.username if principal is not None else None

    @property
    def who(self) -> str:
        """Who a refusal's log line is about: user, client (container) id and address."""
        container = None
        # A container id that is not UTF-8 is the peer's malformed input, not a reason to fail.
        with contextlib.suppress(UnicodeDecodeError):
            container = self.connection.engine.remote_container
        user = self.principal_name
        return (
            f"user {quoted_topic(user) if user is not None else '(anonymous)'}, "
            f"client id {quoted_topic(container or '')}, {self.connection.peer}"
        )

    @property
    def permissions(self) -> Permissions:
        """What this connection's user may do: made on first use (links attach only after
        SASL said who it is) and kept, like an MQTT connection's."""
        permissions = self._permissions
        if permissions is None:
            permissions = self._permissions = self.broker.authorizer.permissions(
                self.principal_name, self.connection.engine.remote_container or ""
            )
        return permissions

    def permissions_renewed(self, renew: RenewPermissions) -> None:
        """The rules were reloaded (SIGHUP): later attaches and transfers are checked by the
        new ones (the topic subscriptions' sessions were renewed by the broker)."""
        if self._permissions is not None:
            self._permissions = renew(
                self.principal_name, self.connection.engine.remote_container or ""
            )

    def check_queue_access(self, action: str, queue: str) -> None:
        """A queue named by a link or a transfer: refused unless this user may ``action`` it
        (send, receive or browse). A temporary queue belongs to its connection: no rule
        applies to it."""
        if self.temporaries.is_temporary(queue):
            return
        if not self.permissions.queues.may(action, queue):
            log.info("amqp %s: may not %s queue %s", self.who, action, quoted_topic(queue))
            raise TerminusError(f"may not {action} queue {queue}", UNAUTHORIZED_ACCESS)

    def clocks(self) -> Clocks:
        clock = self.broker.clock
        return Clocks(clock.now(), clock.wall_ms())

    # -- LinkHandler ------------------------------------------------------------------------

    def link_opened(self, link: Link) -> None:
        try:
            if link.is_receiver:
                self._open_producer(link)
            else:
                self._open_consumer(link)
        except TerminusError as exc:
            self._refuse(link, exc.condition, str(exc))

    def link_flow(self, link: Any) -> None:
        """``link``: the engine's C object."""
        consumer = self.consumers.get(link)
        if consumer is not None:
            consumer.flow_event()

    def link_closed(self, link: Link, *, closed: bool) -> None:
        temporary = self.dynamic.pop(link, None)
        if temporary is not None:
            self.temporaries.delete(temporary)  # its lifetime is the link's (delete-on-close)
        key = link_key(link)
        producer = self.producers.pop(key, None)
        if producer is not None:
            producer.closed = True
        consumer = self.consumers.pop(key, None)
        if consumer is not None:
            consumer.close(remove=closed)

    def delivery_updated(self, delivery: Any) -> None:
        """``delivery``: the engine's C object; wrapped in proton's Delivery only off the
        per-message paths (a rejection, a transaction, an answer that waits for the store)."""
        key = engine_calls.delivery_link(delivery)
        producer = self.producers.get(key)
        if producer is not None:
            producer.transfer(delivery)
            return
        consumer = self.consumers.get(key)
        if consumer is not None:
            consumer.disposition(delivery)

    def connection_opened(self, container: str, desired: frozenset[str]) -> str | None:
        """One client-id registry (DESIGN.md section 5): a JMS connection (one asking to be
        the sole connection for its container id, as Qpid JMS does for an explicit client
        id) is refused while that id is in use by an MQTT client or another such
        connection; an MQTT client connecting with it later takes it over (closes this)."""
        if SOLE_CONNECTION not in desired or not container:
            return None
        if not self.broker.client_ids.claim(container, self):
            return f"client id {container!r} is in use"
        self.sole_container = container
        self.origin = container
        return None

    def taken_over(self) -> None:
        """An MQTT client connected with this connection's client id (MQTT's rule)."""
        container = self.sole_container
        self.sole_container = None
        self.connection.fail(
            "amqp:connection:forced", f"client id {container!r} taken over by another client"
        )
        self.connection.wake()

    def connection_ended(self) -> None:
        if self.sole_container is not None:
            self.broker.client_ids.release(self.sole_container, self)
            self.sole_container = None
        self.ended = True
        self.coordinator.connection_ended()
        for consumer in list(self.consumers.values()):
            consumer.close(remove=False)  # a connection drop is a detach: durable ones stay
        self.consumers.clear()
        for producer in self.producers.values():
            producer.closed = True
        self.producers.clear()
        self.temporaries.delete_owned(self.id)
        self.dynamic.clear()

    # -- attaching --------------------------------------------------------------------------

    def _refuse(self, link: Link, condition: str, description: str) -> None:
        terminus = link.remote_target if link.is_receiver else link.remote_source
        log.info(
            "amqp %s: link %s %s %s refused: %s",
            self.who,
            quoted_topic(link.name),
            "to" if link.is_receiver else "from",
            quoted_topic(terminus.address or "(no address)"),
            description,
        )
        link.condition = Condition(condition, description)
        # A refused attach names no node (AMQP 1.0 section 2.6.3).
        _set_address(link.target if link.is_receiver else link.source, None)
        link.open()
        link.close()

    def _create_temporary(self, link: Link, request: NodeRequest) -> NodeRequest:
        destination = self.temporaries.create(topic=_temporary_kind(request), owner=self.id)
        self.dynamic[link] = destination
        return NodeRequest(
            destination.name,
            request.kind,
            dynamic=True,
            temporary=True,
            capabilities=request.capabilities,
        )

    def check_destination(self, kind: NodeKind, name: str, *, consuming: bool) -> None:
        """A queue must exist or be one the configuration lets a client create by using it;
        a temporary destination must exist, and only its owner may consume from it."""
        if not self.temporaries.is_temporary(name):
            if kind is NodeKind.QUEUE and not self.queues.exists(name):
                raise TerminusError(
                    f"queue {quoted_topic(name)} does not exist (queues must be declared in "
                    "the broker's configuration)",
                    NOT_FOUND,
                )
            return
        destination = (
            Destination.topic(name) if kind is NodeKind.TOPIC else Destination.queue(name)
        )
        owner = self.temporaries.owner(destination)
        if owner is None:
            raise TerminusError(f"temporary destination {name} does not exist", NOT_FOUND)
        if consuming and owner != self.id:
            raise TerminusError(
                f"temporary destination {name} belongs to another connection", NOT_ALLOWED
            )

    def _open_producer(self, link: Link) -> None:
        request = read_node(link.remote_target, source=False)
        if request.coordinator:
            self._open_coordinator(link, request)
            return
        if request.dynamic:
            request = self._create_temporary(link, request)
            _set_address(link.target, request.name)
        else:
            if request.name is not None:
                _check_name(request)
                self.check_destination(request.kind, request.name, consuming=False)
                if request.kind is NodeKind.QUEUE:
                    self.check_queue_access("send", request.name)
            _set_address(link.target, link.remote_target.address)
        link.target.durability = link.remote_target.durability
        link.target.expiry_policy = link.remote_target.expiry_policy
        if request.capabilities:
            set_capabilities(link.target, sorted(request.capabilities))
        _set_address(link.source, link.remote_source.address)
        # Settled as the client asks; the broker settles first (no second round trip).
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST
        link.max_message_size = self.connection.config.max_message_size
        producer = ProducerLink(self, link, request)
        self.producers[link_key(link)] = producer
        link.open()
        link.flow(self.connection.config.link_credit)

    def durable_client_id(self, link: Link) -> str:
        """A durable subscription's session: client id (container id) + subscription name;
        the name alone for a global one (Qpid JMS's ``|global`` link name suffix)."""
        return shared_client_id(self._scope(link), subscription_name(link), durable=True)

    def _scope(self, link: Link, global_: bool = False) -> str:
        _, _, suffix = str(link.name).partition("|")
        if global_ or suffix.startswith("global"):
            return GLOBAL_SCOPE
        return self.connection.engine.remote_container or ""

    def _shared_consumer(
        self, link: Link, request: NodeRequest, presettled: bool
    ) -> SharedConsumerLink:
        client_id = shared_client_id(
            self._scope(link, request.global_), subscription_name(link), durable=request.durable
        )
        topic = request.name or ""
        definition = SharedDefinition.of(topic, request.selector, request.no_local)
        joined = self.broker.shared_subscriptions.join(
            client_id, definition, durable=request.durable, queue_rules=JMS_SUBSCRIPTION_QUEUE
        )
        if isinstance(joined, SharedRefusal):
            raise TerminusError(
                f"shared subscription {subscription_name(link)!r}: {joined}",
                "amqp:resource-locked",
            )
        return SharedConsumerLink(self, link, topic, presettled, joined)

    def _durable_source(self, link: Link) -> NodeRequest:
        session = self.broker.sessions.get(self.durable_client_id(link))
        if session is None or len(session.subscriptions) != 1:
            raise TerminusError(f"no durable subscription {subscription_name(link)!r}", NOT_FOUND)
        (topic,) = session.subscriptions
        # Consumed as it was defined: its stored selector and noLocal apply to this link
        # too (none known for one stored before store schema 9).
        definition = self.broker.durable_definitions.get(self.durable_client_id(link))
        if definition is None or definition.topic != topic:
            return NodeRequest(topic, NodeKind.TOPIC, durable=True)
        return NodeRequest(
            topic,
            NodeKind.TOPIC,
            durable=True,
            selector=definition.selector,
            no_local=definition.no_local,
        )

    def _open_coordinator(self, link: Link, request: NodeRequest) -> None:
        link.target.type = Terminus.COORDINATOR
        set_capabilities(link.target, ["amqp:local-transactions"])
        _set_address(link.source, link.remote_source.address)
        link.rcv_settle_mode = Link.RCV_FIRST
        self.producers[link_key(link)] = ProducerLink(self, link, request)
        link.open()
        link.flow(self.connection.config.link_credit)

    def _open_consumer(self, link: Link) -> None:
        request = read_node(link.remote_source, source=True)
        lookup = False
        if request.dynamic:
            request = self._create_temporary(link, request)
        elif request.name is None:
            # No source: a durable subscription looked up by its name (Qpid JMS does this
            # to unsubscribe), answered with the subscription's own source.
            lookup = True
            request = self._durable_source(link)
        browse = link.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
        selector: Selector | None = None
        if request.selector is not None:
            try:
                selector = compile_selector(request.selector)
            except InvalidSelector as exc:
                raise TerminusError(f"invalid selector: {exc}", INVALID_FIELD) from None
        if request.no_local and request.kind is NodeKind.QUEUE:
            raise TerminusError("noLocal applies to topic subscriptions only", NOT_IMPLEMENTED)
        if request.durable and request.kind is NodeKind.QUEUE:
            request = NodeRequest(request.name, request.kind, capabilities=request.capabilities)
        _check_name(request)
        if not request.dynamic:
            self.check_destination(request.kind, request.name or "", consuming=True)
            if request.kind is NodeKind.QUEUE:
                self.check_queue_access("browse" if browse else "receive", request.name or "")
            elif (
                request.shared
                and not self.temporaries.is_temporary(request.name or "")
                and not self.permissions.may_subscribe_wholly(request.name or "")
            ):
                # A shared subscription's queue cannot be filtered per consumer.
                raise TerminusError(f"may not subscribe to {request.name}", UNAUTHORIZED_ACCESS)
        source = link.source
        if request.dynamic or lookup:
            _set_address(source, request.name)
        else:
            _set_address(source, link.remote_source.address)
        if request.durable:
            source.durability = Terminus.DELIVERIES
            source.expiry_policy = Terminus.EXPIRE_NEVER
        else:
            source.durability = Terminus.NONDURABLE
            source.expiry_policy = link.remote_source.expiry_policy
        if request.capabilities:
            set_capabilities(source, sorted(request.capabilities))
        if lookup:
            # The subscription's own filters, as its source is answered.
            put_filters(source, request.selector, request.no_local)
        elif request.selector is not None or request.no_local:
            # The filters in force, echoed: Qpid JMS checks that the broker applies them.
            copy_filter(link.remote_source, source)
        _set_address(link.target, link.remote_target.address)
        presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        link.snd_settle_mode = Link.SND_SETTLED if presettled else Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_FIRST
        consumer: ConsumerLink
        if browse and request.kind is NodeKind.QUEUE:
            source.distribution_mode = Terminus.DIST_MODE_COPY
            consumer = BrowserLink(self, link, request.name or "", presettled)
            consumer.selector = selector
        elif request.kind is NodeKind.QUEUE:
            consumer = QueueConsumerLink(self, link, request.name or "", presettled)
            consumer.selector = selector
        elif request.shared:
            consumer = self._shared_consumer(link, request, presettled)
            consumer.selector = selector
            consumer.no_local = request.no_local
        else:
            consumer = TopicConsumerLink(self, link, request.name or "", presettled)
            consumer.selector = selector
            consumer.no_local = request.no_local
            if request.durable:
                consumer.client_id = self.durable_client_id(link)
                consumer.durable = True
                if not lookup:  # a lookup takes the subscription as it is
                    consumer.definition = SubscriptionDefinition.of(
                        request.name or "", request.selector, request.no_local
                    )
        link.open()
        if not consumer.start():
            if isinstance(consumer, SharedConsumerLink):
                self.broker.shared_subscriptions.leave(consumer.subscription, unsubscribe=False)
            return
        self.consumers[link_key(link)] = consumer


def wrap(delivery: Any) -> ProtonDelivery:
    """proton's Delivery for an engine C object, for the paths that need its fields."""
    return engine_calls.wrap_delivery(delivery)


def link_key(link: Link) -> Any:
    """How the link layer finds a link's state: its C object (hashed by address)."""
    return link._impl


def _temporary_kind(request: NodeRequest) -> bool:
    """Whether a dynamic node is to be a topic (capability temporary-topic or topic)."""
    return request.kind is NodeKind.TOPIC


def _set_address(terminus: Terminus, address: str | None) -> None:
    terminus.address = address  # type: ignore[assignment]  # None is "no node"


def _check_name(request: NodeRequest) -> None:
    name = request.name or ""
    if not name:
        raise TerminusError("a node address must not be empty")
    if request.kind is NodeKind.TOPIC and "\x00" in name:
        raise TerminusError("a topic name must not contain NUL")


# -- producers ----------------------------------------------------------------------------------


class ProducerLink:
    """A link from the client: each transfer becomes a core publication."""

    def __init__(self, layer: LinkLayer, link: Link, request: NodeRequest) -> None:
        self.layer = layer
        self.link = link
        self.request = request
        self.closed = False
        self._impl = link._impl
        # Credit is topped up to this once it falls to half of it.
        self.credit = layer.connection.config.link_credit
        # A fixed address is checked per transfer only for what can change under the link: a
        # queue's or a temporary node's existence. A topic's name and whether this user may
        # publish to it are judged once and kept with the Permissions that judged them (a
        # reload of the rules gives the connection new ones, so the verdict is judged again).
        self._temporary = request.name is not None and layer.temporaries.is_temporary(
            request.name
        )
        self._judged_by: Permissions | None = None
        self._refusal: tuple[str, str] | None = None

    def transfer(self, delivery: Any) -> None:
        """A transfer arrived (``delivery``: the engine's C object)."""
        pending = engine_calls.delivery_pending(delivery)
        if not engine_calls.delivery_readable(delivery) or engine_calls.delivery_partial(delivery):
            if pending > self.layer.connection.config.max_message_size:
                self._reject(wrap(delivery), RESOURCE_LIMIT_EXCEEDED, "message too large")
            return
        link = self._impl
        data = engine_calls.receive(link, pending)
        engine_calls.link_advance(link)
        credit = engine_calls.link_credit(link)
        if credit <= self.credit // 2:
            engine_calls.link_flow(link, self.credit - credit)
        if self.request.coordinator:
            self.layer.coordinator.control(wrap(delivery), data)
            self.layer.connection.wake()
            return
        self.layer.traffic.messages_received += 1
        try:
            self._publish(delivery, data)
        except MappingError as exc:
            self._reject(wrap(delivery), exc.condition, str(exc))

    def _publish(self, delivery: Any, data: bytes) -> None:
        layer = self.layer
        request = self.request
        incoming = from_amqp(
            data, topic=request.name or "", clocks=layer.clocks(), origin=layer.origin
        )
        message = incoming.message
        kind, name = request.kind, request.name
        if name is None:
            # An anonymous relay: the message names its destination.
            if not incoming.to:
                self._reject(
                    wrap(delivery), "amqp:invalid-field", "the message names no destination"
                )
                return
            name = incoming.to
            kind = NodeKind.TOPIC if incoming.to_type in _TOPIC_TYPES else NodeKind.QUEUE
            message.topic = name
        presettled = engine_calls.delivery_settled(delivery)  # by the client already
        fixed = request.name is not None
        if (
            not fixed
            or self._temporary
            or (kind is NodeKind.QUEUE and not layer.queues.exists(name))
        ):
            try:
                layer.check_destination(kind, name, consuming=False)
            except TerminusError as exc:
                self._reject(wrap(delivery), exc.condition, str(exc))
                return
        if presettled and not message.persistent:
            message.qos = 0  # acknowledgements disabled: at most once (DESIGN.md section 2)
        if kind is NodeKind.TOPIC:
            if fixed:
                permissions = layer.permissions
                if permissions is not self._judged_by:
                    self._refusal = _topic_refusal(name, permissions)
                    self._judged_by = permissions
                refusal = self._refusal
            else:
                refusal = _topic_refusal(name, layer.permissions)
            if refusal is not None:
                self._reject(wrap(delivery), *refusal, to=name)
                return
        elif not fixed:  # an anonymous relay's queue: checked per transfer
            try:
                layer.check_queue_access("send", name)
            except TerminusError as exc:
                self._reject(wrap(delivery), exc.condition, str(exc), to=name)
                return
        if engine_calls.delivery_remote_state(delivery) == TRANSACTIONAL_STATE:
            staged = layer.coordinator.find(state_fields(delivery))
            if staged is None:
                self._reject(
                    wrap(delivery), UNKNOWN_ID, "the transfer names no declared transaction"
                )
                return
            destination = (
                Destination.topic(name) if kind is NodeKind.TOPIC else Destination.queue(name)
            )
            layer.coordinator.stage_send(delivery, staged, destination, message)
            return
        if kind is NodeKind.TOPIC:
            completion = layer.broker.publish(message)
        else:
            accepted, completion = layer.queues.send(name, message)
            if not accepted:
                self._reject(wrap(delivery), RESOURCE_LIMIT_EXCEEDED, f"queue {name} is full")
                return
        if presettled:
            engine_calls.delivery_settle(delivery)
            return
        self._accept_when(delivery, completion)

    def _accept_when(self, delivery: Any, completion: Completion) -> None:
        if completion is None or completion.done():
            if completion is None or not (
                completion.cancelled() or completion.exception() is not None
            ):
                # The usual answer, at once: through the C calls (no wrapper).
                engine_calls.delivery_update(delivery, engine_calls.ACCEPTED)
                engine_calls.delivery_settle(delivery)
                self.layer.connection.wake()
                return
            self._answer(wrap(delivery), completion)
            return
        # Answered later: the wrapper holds a reference to the delivery meanwhile.
        wrapped = wrap(delivery)
        completion.add_done_callback(lambda done: self._answer(wrapped, done))

    def _answer(self, delivery: ProtonDelivery, completion: Completion) -> None:
        if self.closed or self.layer.ended:
            return
        failed = completion is not None and (
            completion.cancelled() or completion.exception() is not None
        )
        if failed:
            # The store failed: the message is not safe, so it is not accepted.
            delivery.local.condition = Condition(INTERNAL_ERROR, "the message could not be stored")
            delivery.update(ProtonDelivery.REJECTED)
        else:
            delivery.update(ProtonDelivery.ACCEPTED)
        delivery.settle()
        self.layer.connection.wake()

    def _reject(
        self,
        delivery: ProtonDelivery,
        condition: str,
        description: str,
        to: str | None = None,
    ) -> None:
        """Refuse one transfer (the link stays), logged with who sent it and where to: ``to``
        where the transfer itself named it (an anonymous relay), else the link's address."""
        address = to if to is not None else self.request.name
        log.info(
            "amqp %s: transfer to %s rejected: %s",
            self.layer.who,
            quoted_topic(address) if address is not None else "(anonymous relay)",
            description,
        )
        delivery.local.condition = Condition(condition, description)
        delivery.update(ProtonDelivery.REJECTED)
        delivery.settle()


_TOPIC_TYPES = (DestinationType.TOPIC, DestinationType.TEMPORARY_TOPIC)


def _topic_refusal(name: str, permissions: Permissions) -> tuple[str, str] | None:
    """Why a transfer may not publish to topic ``name`` (condition, description); None
    when it may."""
    try:
        validate_topic_name(name)
    except TopicError as exc:
        return "amqp:invalid-field", f"not a valid topic name: {exc}"
    if not permissions.may_publish(name):
        return UNAUTHORIZED_ACCESS, f"may not publish to {name}"
    return None


# -- consumers ----------------------------------------------------------------------------------


class ConsumerLink:
    """A link to the client: a core consumer whose credit is the link credit."""

    destination_type = DestinationType.QUEUE

    def __init__(self, layer: LinkLayer, link: Link, name: str, presettled: bool) -> None:
        self.layer = layer
        self.link = link
        self.name = name
        self.presettled = presettled
        # Core deliveries in flight on this link, by the engine's delivery (its C object:
        # hashed by address, alive until settled here, so a disposition finds its delivery
        # without reading its tag). One sent settled is never here: the engine reports
        # nothing more about it, so the core is done with it as it goes.
        self.unsettled: dict[Any, Delivery] = {}
        self.consumer: Consumer | None = None
        self.closed = False
        self._settled_tags = 0
        self._impl = link._impl
        # Presettled transfers waiting for the commit of what the core did on sending them
        # (see _deliver_forgotten), in order: (the commit, tag, entry, delivery count); made
        # on first use. And what waits for them to go (a drain's answer).
        self._held: deque[_Held] | None = None
        self._after_held: list[Callable[[], None]] = []

    def start(self) -> bool:
        raise NotImplementedError

    def close(self, *, remove: bool) -> None:
        raise NotImplementedError

    def pump(self) -> None:
        raise NotImplementedError

    def pump_now(self) -> None:
        raise NotImplementedError

    def flow(self) -> None:
        """The client's credit changed: the consumer's credit follows it."""
        consumer = self.consumer
        if consumer is None:
            return
        credit = engine_calls.link_credit(self._impl)
        consumer.credit.available = max(0, credit)
        if credit <= 0:
            return
        if not engine_calls.link_get_drain(self._impl):
            self.pump()
            return
        # Drain: send what waits now, then the rest of the credit is used up.
        self.pump_then(self._drained)

    def flow_event(self) -> None:
        """The engine reported a flow event for this link. It reports one after every
        transfer the link sends too (its credit went down by one, as the core's did when it
        delivered): when the credit is the core's and no drain is asked, nothing changed, and
        the pump :meth:`flow` would schedule (one a delivery) would find nothing to do."""
        consumer = self.consumer
        if (
            consumer is not None
            and engine_calls.link_credit(self._impl) == consumer.credit.available
            and not engine_calls.link_get_drain(self._impl)
        ):
            return
        if self.open_locally():
            self.flow()

    def open_locally(self) -> bool:
        """Is the link still open on the broker's side (not closed since the event was made)?
        Asked only when a flow event calls for work: the one after every transfer sent
        needs none."""
        return bool(engine_calls.link_state(self._impl) & engine_calls.LOCAL_ACTIVE)

    def pump_then(self, then: Callable[[], None]) -> None:
        """Pump now, then call ``then`` once what waits has gone out (a queue's link may
        have to wait for its in-flight window to be stored first)."""
        self.pump_now()
        then()

    def _drained(self) -> None:
        """End a drain: the credit left is used up (unless the client changed its mind)."""
        consumer = self.consumer
        link = self.link
        if self.closed or consumer is None:
            return
        if self._held:
            # Transfers the drain's credit paid for have not gone yet: answer after them.
            self._after_held.append(self._drained)
            return
        if link.drain_mode and link.credit > 0:
            link.drained()
            consumer.credit.available = 0
        self.layer.connection.wake()

    # -- Receiver (the core's side) ----------------------------------------------------------

    def deliver(self, delivery: Delivery) -> None:
        """Send one attempt (the core spent one credit on it)."""
        entry = delivery.entry
        if self.presettled:
            self._deliver_forgotten(delivery)
            return
        wire = self._send(str(delivery.id).encode(), delivery.view, entry.delivery_count)
        if wire is None:
            # Sent settled (a presettled link, or an at-most-once entry: a JMS queue's
            # message sent with acknowledgements disabled): done as soon as it is sent. No
            # disposition will ever come for it.
            self._settle_core(delivery, Settlement.ACCEPTED)
            return
        self.unsettled[wire] = delivery

    def _deliver_forgotten(self, delivery: Delivery) -> None:
        """A delivery on a presettled link (JMS NO_ACKNOWLEDGE, DisableACK): at most once,
        so the broker forgets the entry as it sends it, and a stored entry's transfer leaves
        only once that removal is committed (persist, then send): a crash just after the
        send cannot deliver it again. The core settles it first; transfers go in order, any
        that follow a held one wait behind it. Held when the link closes: not sent (at most
        once allows the loss). A failed commit sends nothing: the entry is still stored."""
        entry = delivery.entry
        tag = str(delivery.id).encode()
        view = delivery.view
        count = entry.delivery_count
        self._settle_core(delivery, Settlement.ACCEPTED)
        commit = self.layer.broker.store.commit() if entry.persistent else None
        held = self._held
        if not held and (commit is None or commit.done()):
            if commit is None or not (commit.cancelled() or commit.exception() is not None):
                self._send(tag, view, count)
            return
        if held is None:
            held = self._held = deque()
        held.append((commit, tag, view, count))
        if commit is not None and not commit.done():
            commit.add_done_callback(self._release_held)
        else:
            self._release_held(None)

    def _release_held(self, _: object) -> None:
        """Send the held transfers whose commits are done, in order, up to the first that
        is not; then what waited for them all (a drain's answer)."""
        held = self._held
        while held:
            commit, tag, view, count = held[0]
            if commit is not None and not commit.done():
                return
            held.popleft()
            failed = commit is not None and (commit.cancelled() or commit.exception() is not None)
            if not failed and not self.closed and not self.layer.ended:
                self._send(tag, view, count)
        after = self._after_held
        self._after_held = []
        for then in after:
            then()

    def deliver_settled(self, entry: QueuedMessage) -> None:
        """An at-most-once entry (spends no core credit; the link's credit still counts)."""
        if self.link.credit <= 0:
            return  # the client gave no credit: at most once means it is dropped
        self._settled_tags += 1
        self._send(b"s%d" % self._settled_tags, entry, entry.delivery_count)

    def _send(self, tag: bytes, entry: QueuedMessage, delivery_count: int) -> Any:
        """Send one transfer; returns the engine's delivery (its C object), None when it
        went settled."""
        layer = self.layer
        encoded = to_amqp(
            entry.message,
            durable=entry.persistent,
            delivery_count=delivery_count,
            clocks=layer.clocks,
            destination_type=self.destination_type,
            retained=entry.retain,
        )
        wire = engine_calls.send(self._impl, tag, encoded)
        layer.traffic.messages_sent += 1
        layer.connection.wake()
        if self.presettled or entry.qos == 0:
            engine_calls.delivery_settle(wire)
            return None
        return wire

    # -- the client's side -------------------------------------------------------------------

    def disposition(self, wire: Any) -> None:
        """The client settled, or gave an outcome for, a delivery (``wire``: the engine's C
        object)."""
        state = engine_calls.delivery_remote_state(wire)
        if state == TRANSACTIONAL_STATE:
            self._transactional(wire)
            return
        if state not in _TERMINAL and not engine_calls.delivery_settled(wire):
            return  # only a received state, or nothing yet (an outcome needs no second look)
        delivery = self.unsettled.pop(wire, None)
        if delivery is None:
            engine_calls.delivery_settle(wire)
            return
        if state == engine_calls.ACCEPTED:
            settlement = Settlement.ACCEPTED
            undeliverable = False
        else:
            remote = engine_calls.delivery_remote(wire)
            modified = state == engine_calls.MODIFIED
            if state == engine_calls.REJECTED:
                settlement = Settlement.REJECTED
            elif modified and engine_calls.disposition_is_failed(remote):
                settlement = Settlement.MODIFIED
            elif modified or state == engine_calls.RELEASED:
                settlement = Settlement.RELEASED
            else:
                # Settled with no outcome: the client leaves it to the broker (the source's
                # default outcome, which is modified: it may have been seen).
                settlement = Settlement.MODIFIED
            undeliverable = modified and bool(engine_calls.disposition_is_undeliverable(remote))
        engine_calls.delivery_settle(wire)  # after the last look at its state
        self._settle_core(delivery, settlement, undeliverable)

    def _transactional(self, wire: Any) -> None:
        """An outcome under a transaction: staged there; the core settles it on commit
        (``wire``: the engine's C object)."""
        coordinator = self.layer.coordinator
        data = state_fields(wire)
        staged = coordinator.find(data)
        settlement = transactional_outcome(data)
        if staged is None or settlement is None:
            return  # not (yet) an outcome of a transaction we know: wait for one
        delivery = self.unsettled.pop(wire, None)
        engine_calls.delivery_settle(wire)
        if delivery is not None:
            coordinator.stage_settlement(staged, delivery, settlement)

    def _settle_core(
        self, delivery: Delivery, settlement: Settlement, undeliverable: bool = False
    ) -> None:
        raise NotImplementedError


# A presettled transfer held for its commit (ConsumerLink._deliver_forgotten).
_Held = tuple["asyncio.Future[None] | None", bytes, QueuedMessage, int]

_TERMINAL = frozenset(
    (engine_calls.ACCEPTED, engine_calls.REJECTED, engine_calls.RELEASED, engine_calls.MODIFIED)
)


class QueueConsumerLink(ConsumerLink):
    """A consumer on a queue destination, competing with its other consumers; with a
    selector, it takes only what its selector selects and leaves the rest for them."""

    def __init__(self, layer: LinkLayer, link: Link, name: str, presettled: bool) -> None:
        super().__init__(layer, link, name, presettled)
        self.selector: Selector | None = None

    def start(self) -> bool:
        selector = self.selector
        selects = (
            None
            if selector is None or selector.selects_everything
            else EntrySelector(selector, jms_headers)
        )
        self.consumer = Consumer(
            self, credit=0, name=f"{self.layer.id}/{self.link.name}", selects=selects
        )
        self.layer.queues.attach(self.name, self.consumer)
        self.flow()
        return True

    def pump(self) -> None:
        if self.consumer is not None and self.consumer.queue is not None:
            self.layer.queues.pump_soon(self.consumer.queue)

    def pump_now(self) -> None:
        if self.consumer is not None and self.consumer.queue is not None:
            self.layer.queues.pump(self.consumer.queue)

    def pump_then(self, then: Callable[[], None]) -> None:
        if self.consumer is not None and self.consumer.queue is not None:
            self.layer.queues.pump_then(self.consumer.queue, then)
        else:
            then()

    def close(self, *, remove: bool) -> None:
        if self.closed:
            return
        self.closed = True
        consumer = self.consumer
        if consumer is not None:
            consumer.receiver = None
            self.layer.queues.detach(consumer)
        self.unsettled.clear()

    def deliver(self, delivery: Delivery) -> None:
        self.layer.queues.mark_sent(delivery)
        super().deliver(delivery)

    def _settle_core(
        self, delivery: Delivery, settlement: Settlement, undeliverable: bool = False
    ) -> None:
        self.layer.queues.settle(delivery, settlement, undeliverable_here=undeliverable)


class BrowserLink(ConsumerLink):
    """A queue browser (source distribution-mode copy): sends what the queue holds when the
    link attaches, in the order consumers would get it, selected by its selector, and takes
    nothing; settling a browsed message changes nothing."""

    def __init__(self, layer: LinkLayer, link: Link, name: str, presettled: bool) -> None:
        super().__init__(layer, link, name, presettled)
        self.selector: Selector | None = None
        self.snapshot: list[QueuedMessage] = []
        self.position = 0

    def start(self) -> bool:
        queue = self.layer.queues.queue(self.name)
        selector = self.selector
        rows = queue.browse(self.layer.broker.clock.now())
        self.snapshot = [
            row.entry
            for row in rows
            if row.state is not EntryState.DELAYED
            and (selector is None or selector.matches(EntrySubject(row.entry, jms_headers)))
        ]
        self.consumer = Consumer(None, credit=0, name=f"{self.layer.id}/{self.link.name}")
        self.flow()
        return True

    def flow_event(self) -> None:
        # Its consumer's credit is never spent (pump_now sends by the link's own credit), so
        # an unchanged number does not mean nothing changed: every flow event pumps.
        if self.open_locally():
            self.flow()

    def pump(self) -> None:
        self.pump_now()

    def pump_now(self) -> None:
        link = self.link
        while link.credit > 0 and self.position < len(self.snapshot):
            entry = self.snapshot[self.position]
            self.position += 1
            self._send(b"b%d" % self.position, entry, entry.delivery_count)

    def disposition(self, wire: Any) -> None:
        engine_calls.delivery_settle(wire)  # a browsed message stays, whatever the outcome

    def close(self, *, remove: bool) -> None:
        self.closed = True
        self.snapshot = []

    def _settle_core(
        self, delivery: Delivery, settlement: Settlement, undeliverable: bool = False
    ) -> None:
        """Never called: a browser has no core deliveries."""


class TopicConsumerLink(ConsumerLink):
    """A non-durable topic subscription: a core session of its own with one subscription
    (the MQTT topic filter it names), its consumer's credit the link credit."""

    destination_type = DestinationType.TOPIC

    def __init__(self, layer: LinkLayer, link: Link, name: str, presettled: bool) -> None:
        super().__init__(layer, link, name, presettled)
        self.session: Session | None = None
        self.client_id = f"{layer.id}/{link.name}"
        self.selector: Selector | None = None
        self.no_local = False
        self.durable = False
        # What a durable subscription is asked for as (None: not durable, or a lookup by name).
        self.definition: SubscriptionDefinition | None = None

    def start(self) -> bool:
        broker = self.layer.broker
        existing = broker.sessions.get(self.client_id)
        if existing is not None and existing.link is not None:
            return self._refuse(
                "amqp:resource-locked", "the subscription has an active consumer already"
            )
        definition = self.definition
        if definition is not None:
            # Another topic, selector or noLocal replaces a durable subscription (JMS).
            replace = broker.durable_definitions.replaces(self.client_id, existing, definition)
        else:
            replace = existing is not None and self.name not in existing.subscriptions
        connected = broker.connect(
            self.client_id,
            self,
            clean_start=not self.durable or replace,
            expiry_interval=NEVER_EXPIRES if self.durable else 0,
            window=1,
            principal=self.layer.principal_name,
            queue_rules=JMS_SUBSCRIPTION_QUEUE,
        )
        session = self.session = connected.session
        # Filtered by what this connection's user may read, as an MQTT session is.
        session.permissions = self.layer.permissions
        # Link credit, not a window: spent by deliveries, topped up only by the client. None
        # until the filters are in place (below).
        session.consumer.credit = Credit(available=0)
        self.consumer = session.consumer
        subscribed: Subscribed | None = None
        if self.name not in session.subscriptions:
            options = SubscriptionOptions(max_qos=0 if self.presettled else 2)
            result = broker.subscribe(session, self.name, options)
            if isinstance(result, SubscribeRefusal):
                self.close(remove=True)
                condition = (
                    "amqp:unauthorized-access"
                    if result is SubscribeRefusal.NOT_AUTHORIZED
                    else NOT_ALLOWED
                )
                return self._refuse(condition, f"cannot subscribe: {result.value}")
            subscribed = result
        if definition is not None:
            broker.durable_definitions.define(self.client_id, definition)
        broker.start_delivery(session)  # what was in flight goes out again, nothing new yet
        if self.selector is not None or self.no_local:
            # Applied where the subscription's own queue hands entries over (see
            # broker.subscription_filters).
            receiver = session.consumer.receiver
            session.consumer.receiver = FilteringReceiver(
                receiver if receiver is not None else self,
                selector=self.selector,
                no_local_origin=self.layer.origin if self.no_local else None,
                protocol_headers=jms_headers,
            )
        if subscribed is not None and subscribed.new:
            # Retained messages: for a durable subscription only when it is created.
            broker.send_retained(subscribed)
        self.flow()
        return True

    def _refuse(self, condition: str, description: str) -> bool:
        log.info(
            "amqp %s: link %s from topic %s refused: %s",
            self.layer.who,
            quoted_topic(self.link.name),
            quoted_topic(self.name),
            description,
        )
        self.link.condition = Condition(condition, description)
        self.link.close()
        return False

    def pump(self) -> None:
        if self.session is not None:
            self.layer.broker.pump_soon(self.session)

    def pump_now(self) -> None:
        if self.session is not None:
            self.layer.broker.pump(self.session)

    def pump_then(self, then: Callable[[], None]) -> None:
        """A durable subscription's exactly-once copies go out once their in-flight marks
        are committed (broker.dispatch.DurableReceiver): ``then`` (a drain's answer) waits
        for that commit, so it comes after them and does not use up their credit."""
        self.pump_now()
        session = self.session
        persistent = session is not None and session.persistent
        commit = self.layer.broker.store.commit() if persistent else None
        if commit is None or commit.done():
            then()
            return
        commit.add_done_callback(lambda _: then())

    def close(self, *, remove: bool) -> None:
        """End the subscription, or, for a durable one merely detached, only its link (the
        subscription keeps collecting messages)."""
        if self.closed:
            return
        self.closed = True
        session = self.session
        if session is not None and session.link is self:
            broker = self.layer.broker
            if remove and self.durable:
                broker.set_session_expiry(session, 0)  # unsubscribed: it ends now
                broker.durable_definitions.forget(self.client_id)
            broker.disconnect(session, publish_will=False)
        self.unsettled.clear()

    # SessionLink
    def tag(self, delivery: Delivery) -> int:
        if not delivery.tag:
            delivery.tag = delivery.id
        return delivery.tag

    def taken_over(self) -> None:
        """Its session was taken (cannot happen: the id is this link's own)."""

    def _settle_core(
        self, delivery: Delivery, settlement: Settlement, undeliverable: bool = False
    ) -> None:
        session = self.session
        if session is None:
            return
        if settlement is Settlement.ACCEPTED:
            self.layer.broker.acknowledge(session, delivery)  # what settle() calls for it
            return
        self.layer.broker.settle(session, delivery, settlement, undeliverable_here=undeliverable)


class SharedConsumerLink(ConsumerLink):
    """One consumer of a JMS shared subscription (see broker.shared_subscriptions): its
    consumer competes with the subscription's other links for its queue's entries."""

    destination_type = DestinationType.TOPIC

    def __init__(
        self,
        layer: LinkLayer,
        link: Link,
        name: str,
        presettled: bool,
        subscription: SharedSubscription,
    ) -> None:
        super().__init__(layer, link, name, presettled)
        self.subscription = subscription
        self.selector: Selector | None = None
        self.no_local = False

    def start(self) -> bool:
        subscription = self.subscription
        if subscription.session is None:
            error = self.layer.broker.shared_subscriptions.open(subscription)
            if error is not None:
                self.link.condition = Condition(NOT_ALLOWED, error)
                self.link.close()
                return False
        self.consumer = subscription.add(
            self,
            selector=self.selector,
            no_local_origin=self.layer.origin if self.no_local else None,
            protocol_headers=jms_headers,
        )
        self.flow()
        return True

    def flow(self) -> None:
        consumer = self.consumer
        if self.closed or consumer is None:
            return
        if not self.subscription.window_stored(consumer, self.link.credit, self.flow):
            consumer.credit.available = 0  # until the larger window is stored
            return
        super().flow()

    def pump(self) -> None:
        self.subscription.pump()

    def pump_now(self) -> None:
        self.subscription.pump_now()

    def close(self, *, remove: bool) -> None:
        """Leave the subscription; the last consumer's close (not a detach) of a durable
        one unsubscribes it."""
        if self.closed:
            return
        self.closed = True
        self.subscription.remove(self, unsubscribe=remove)
        self.layer.broker.shared_subscriptions.leave(self.subscription, unsubscribe=remove)
        self.unsettled.clear()

    def tag(self, delivery: Delivery) -> int:
        if not delivery.tag:
            delivery.tag = delivery.id
        return delivery.tag

    def taken_over(self) -> None:
        """Cannot happen: the subscription's session belongs to no link."""

    def _settle_core(
        self, delivery: Delivery, settlement: Settlement, undeliverable: bool = False
    ) -> None:
        if settlement is Settlement.ACCEPTED:
            self.subscription.acknowledge(delivery)
        else:
            self.subscription.settle(delivery, settlement, undeliverable)


def link_layer_factory(
    broker: Broker, queues: QueueDestinations, temporaries: TemporaryDestinations
) -> Callable[[AMQPConnection], LinkLayer]:
    """What the AMQP server calls for each new connection."""
    # Durable subscriptions' selectors, applied as publications are routed, read JMS's
    # headers as AMQP carries them.
    broker.selector_headers.protocol_headers = jms_headers

    def make(connection: AMQPConnection) -> LinkLayer:
        return LinkLayer(connection, broker, queues, temporaries)

    return make
