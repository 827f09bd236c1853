"""The asyncio core of kittiwake.jms: connections, sessions, producers, consumers, browsers
and transactions over one AMQP connection each, with every acknowledgement mode's rule in one
place (``Session._hand_over`` and ``Session._after_listener``). Everything here runs on one
event loop; the blocking API (``kittiwake.jms``) drives it from other threads."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from enum import IntEnum
from types import TracebackType
from typing import Any

from proton import Delivery, Described, Link, Receiver, Sender, Terminus, symbol, ulong
from proton import Message as ProtonMessage
from proton import Session as ProtonSession

from kittiwake.jms import messages as codec
from kittiwake.jms.destinations import (
    Destination,
    Queue,
    TemporaryQueue,
    TemporaryTopic,
    Topic,
)
from kittiwake.jms.engine import (
    EngineConnection,
    LinkEndpoint,
    Outcome,
    delivery_settle,
    delivery_settled,
    delivery_update,
    hold_delivery,
    link_advance,
    link_credit,
    link_snd_settle_mode,
    new_transfer,
    put_symbols,
    receive_transfer,
    release_delivery,
    settle_delivery,
    transactional_update,
)
from kittiwake.jms.exceptions import (
    IllegalStateException,
    InvalidClientIDException,
    InvalidDestinationException,
    InvalidSelectorException,
    JMSException,
    JMSSecurityException,
    TransactionRolledBackException,
    from_condition,
)
from kittiwake.jms.factories import MessageFactory, ProducerSettings
from kittiwake.jms.messages import (
    DeliveryMode,
    Message,
)
from kittiwake.jms.urls import parse_url
from kittiwake.jms.vm import open_streams as vm_streams

log = logging.getLogger(__name__)

DEFAULT_PREFETCH = 1000
# Posted (blocking, asynchronous) sends a producer holds before send() waits for the loop.
OUTBOX_LIMIT = 1000
# How often call_from_thread looks whether the loop's thread is still there while it waits.
_CALL_WAIT_SLICE = 1.0
ACCEPTED_OUTCOME = 0x24
DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
SELECTOR_FILTER = symbol("apache.org:selector-filter:string")
NO_LOCAL_FILTER = symbol("apache.org:no-local-filter:list")


class AcknowledgeMode(IntEnum):
    """javax.jms.Session's constants, and Qpid JMS's extensions (same numbers)."""

    SESSION_TRANSACTED = 0
    AUTO_ACKNOWLEDGE = 1
    CLIENT_ACKNOWLEDGE = 2
    DUPS_OK_ACKNOWLEDGE = 3
    INDIVIDUAL_ACKNOWLEDGE = 101
    NO_ACKNOWLEDGE = 100
    PRE_ACKNOWLEDGE = 102


class ConnectionState(IntEnum):
    """What a state listener is told (reconnection makes it observable)."""

    CONNECTED = 1
    RECONNECTING = 2
    FAILED = 3
    CLOSED = 4


# The modes whose acknowledgement, in receive(), needs nothing back from the loop before the
# message is handed over (CLIENT and INDIVIDUAL attach an acknowledger; a browser copies).
_POSTED_MODES = frozenset(
    {
        AcknowledgeMode.AUTO_ACKNOWLEDGE,
        AcknowledgeMode.DUPS_OK_ACKNOWLEDGE,
        AcknowledgeMode.SESSION_TRANSACTED,
        AcknowledgeMode.PRE_ACKNOWLEDGE,
        AcknowledgeMode.NO_ACKNOWLEDGE,
    }
)

# Of those, the modes whose rule takes effect only later (commit, a lazy batch, never): their
# hand-over is posted to the loop, receive() does not wait for it.
_LATER_MODES = frozenset(
    {
        AcknowledgeMode.DUPS_OK_ACKNOWLEDGE,
        AcknowledgeMode.SESSION_TRANSACTED,
        AcknowledgeMode.NO_ACKNOWLEDGE,
    }
)

AsyncListener = Callable[[Message], Awaitable[None]]
CompletionListener = Callable[[Message, JMSException | None], None]


class ConnectionFactory:
    """Where and how to connect: ``amqp://host:port``, ``vm://name`` (a broker in this
    process, started on first use: kittiwake.jms.vm), or Qpid JMS's
    ``failover:(amqp://a:5672,amqp://b:5672)?failover.maxReconnectAttempts=N`` (reconnects,
    to the next address in turn, with the options' back-off; see kittiwake.jms.urls);
    ``disable_ack`` makes every transfer presettled both ways (fire and forget); ``prefetch``
    is each consumer's link credit."""

    def __init__(
        self,
        url: str = "amqp://127.0.0.1:5672",
        client_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
        disable_ack: bool = False,
        prefetch: int = DEFAULT_PREFETCH,
        *,
        allow_pickle: bool = False,
        timeout: float = 15.0,
        reconnect: bool = False,
        reconnect_attempts: int = 20,
        reconnect_delay: float = 0.1,
    ) -> None:
        parsed = parse_url(url)
        if prefetch < 0:
            raise ValueError("prefetch must be 0 or more")
        self.url = url
        self.addresses = parsed.addresses
        self.vm = parsed.vm
        self.host = parsed.addresses[0].host
        self.port = parsed.addresses[0].port
        self.client_id = client_id
        self.username = username if username is not None else parsed.username
        self.password = password if password is not None else parsed.password
        self.disable_ack = disable_ack
        self.prefetch = prefetch
        self.allow_pickle = allow_pickle
        self.timeout = timeout
        # Reconnect: reopen the connection, its sessions and links after a failure, waiting
        # ``reconnect_delay`` (multiplied by ``reconnect_backoff``, at most
        # ``reconnect_max_delay``) between at most ``reconnect_attempts`` (None: no end)
        # rounds over the addresses. A failover: URL reconnects with its own options.
        failover = parsed.failover
        self.reconnect = reconnect or failover is not None
        self.reconnect_attempts: int | None = reconnect_attempts
        self.reconnect_delay = reconnect_delay
        self.reconnect_max_delay = 2.0
        self.reconnect_backoff = 2.0
        if failover is not None:
            self.reconnect_attempts = failover.max_attempts
            self.reconnect_delay = failover.initial_delay_ms / 1000
            self.reconnect_max_delay = failover.max_delay_ms / 1000
            self.reconnect_backoff = failover.backoff

    async def create_connection(
        self, username: str | None = None, password: str | None = None
    ) -> Connection:
        explicit = self.client_id is not None
        container = self.client_id if explicit else f"ID:{uuid.uuid4()}"
        user = username if username is not None else self.username
        secret = password if password is not None else self.password

        addresses = self.addresses
        # The address to try first: the last one that answered.
        current = 0
        vm = self.vm
        streams = None if vm is None else functools.partial(vm_streams, vm)

        async def open_engine() -> EngineConnection:
            """One round over the addresses, from the last good one; the last error when
            none answers."""
            nonlocal current
            error: JMSException | None = None
            for step in range(len(addresses)):
                index = (current + step) % len(addresses)
                address = addresses[index]
                try:
                    engine = await EngineConnection.open(
                        address.host,
                        address.port,
                        container_id=container or "",
                        sole=explicit,
                        username=user,
                        password=secret,
                        timeout=self.timeout,
                        streams=streams,
                    )
                except JMSSecurityException:
                    raise  # the same credentials go to every address
                except InvalidClientIDException:
                    raise
                except JMSException as exc:
                    error = exc
                    continue
                current = index
                return engine
            assert error is not None
            raise error

        connection = Connection(self, await open_engine(), self.client_id)
        connection.open_engine = open_engine
        return connection

    async def create_context(
        self, session_mode: AcknowledgeMode = AcknowledgeMode.AUTO_ACKNOWLEDGE
    ) -> JMSContext:
        connection = await self.create_connection()
        try:
            session = await connection.create_session(
                session_mode == AcknowledgeMode.SESSION_TRANSACTED, session_mode
            )
        except BaseException:
            await connection.close()
            raise
        return JMSContext(connection, session)


class Connection:
    """One AMQP connection. Messages flow to consumers only between ``start()`` and
    ``stop()``; ``close()`` closes every session and deletes its temporary destinations."""

    def __init__(
        self, factory: ConnectionFactory, engine: EngineConnection, client_id: str | None
    ) -> None:
        self.factory = factory
        self.engine = engine
        self.client_id = client_id
        self.sessions: list[Session] = []
        self.started = False
        self.closed = False
        self.exception_listener: Callable[[JMSException], None] | None = None
        self.state = ConnectionState.CONNECTED
        self.state_listener: Callable[[ConnectionState], None] | None = None
        self.open_engine: Callable[[], Awaitable[EngineConnection]] | None = None
        self._reconnected = asyncio.Event()
        self._reconnected.set()
        self._reconnect_task: asyncio.Task[None] | None = None
        # The AMQP session holding temporary destinations' links (made on first use).
        self._temporaries: ProtonSession | None = None
        self._temporaries_engine: EngineConnection | None = None
        engine.on_failure = self._failed

    def _temporaries_session(self) -> ProtonSession:
        if self._temporaries is None or self._temporaries_engine is not self.engine:
            self._temporaries = self.engine.session()
            self._temporaries_engine = self.engine
        return self._temporaries

    def set_state_listener(self, listener: Callable[[ConnectionState], None] | None) -> None:
        self.state_listener = listener

    def _set_state(self, state: ConnectionState) -> None:
        self.state = state
        if self.state_listener is not None:
            try:
                self.state_listener(state)
            except Exception:
                log.exception("connection state listener failed")

    def _failed(self, error: JMSException) -> None:
        if self.closed:
            return
        if self.factory.reconnect and self.open_engine is not None:
            self._reconnected.clear()
            self._set_state(ConnectionState.RECONNECTING)
            for session in self.sessions:
                session._connection_lost()
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect(error))
            return
        self._set_state(ConnectionState.FAILED)
        for session in self.sessions:
            session._release_deliveries()
        if self.exception_listener is not None:
            self.exception_listener(error)

    async def _reconnect(self, error: JMSException) -> None:
        """Reopen the connection, then every session, producer and consumer on it."""
        assert self.open_engine is not None
        factory = self.factory
        delay = factory.reconnect_delay
        attempts = factory.reconnect_attempts
        for _attempt in itertools.count() if attempts is None else range(attempts):
            await asyncio.sleep(delay)  # back-off between attempts, not synchronisation
            delay = min(delay * factory.reconnect_backoff, factory.reconnect_max_delay)
            if self.closed:
                return
            try:
                engine = await self.open_engine()
            except JMSException as exc:
                error = exc
                continue
            self.engine = engine
            engine.on_failure = self._failed
            try:
                for session in list(self.sessions):
                    await session._reopen(engine)
            except JMSException as exc:
                error = exc
                await engine.abort()
                if self.engine is not engine or self.state != ConnectionState.RECONNECTING:
                    return  # the abort started another round
                continue
            self._set_state(ConnectionState.CONNECTED)
            self._reconnected.set()
            for session in self.sessions:
                for consumer in session.consumers:
                    consumer._wake()
            return
        self._set_state(ConnectionState.FAILED)
        self._reconnected.set()
        if self.exception_listener is not None:
            self.exception_listener(error)

    async def _ready(self) -> None:
        """Wait while reconnecting (operations resume on the new connection)."""
        if not self._reconnected.is_set():
            await self._reconnected.wait()

    def get_client_id(self) -> str | None:
        return self.client_id

    def set_exception_listener(self, listener: Callable[[JMSException], None] | None) -> None:
        self.exception_listener = listener

    def _check(self) -> None:
        if self.closed:
            raise IllegalStateException("the connection is closed")
        if self.state == ConnectionState.RECONNECTING:
            return  # operations wait for the new connection (``_ready``)
        self.engine.check()

    async def create_session(
        self,
        transacted: bool = False,
        acknowledge_mode: AcknowledgeMode = AcknowledgeMode.AUTO_ACKNOWLEDGE,
    ) -> Session:
        self._check()
        mode = (
            AcknowledgeMode.SESSION_TRANSACTED if transacted else AcknowledgeMode(acknowledge_mode)
        )
        if mode == AcknowledgeMode.SESSION_TRANSACTED and not transacted:
            transacted = True
        session = Session(self, mode)
        await session._open()
        self.sessions.append(session)
        return session

    async def start(self) -> None:
        self._check()
        self.started = True
        for session in self.sessions:
            for consumer in session.consumers:
                consumer._wake()

    async def stop(self) -> None:
        """Holds deliveries back; returns once no listener is running (JMS)."""
        self._check()
        self.started = False
        for session in self.sessions:
            for consumer in session.consumers:
                if consumer._listener_task is not asyncio.current_task():
                    await consumer._idle.wait()

    async def close(self) -> None:
        if self.closed:
            return
        task = self._reconnect_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for session in list(self.sessions):
            with contextlib.suppress(JMSException):
                await session.close()
        self.closed = True
        await self.engine.close()
        self.state = ConnectionState.CLOSED
        self._reconnected.set()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _gone_with_old_connection(destination: Destination | None, engine: EngineConnection) -> bool:
    """A temporary destination made on another (lost) connection than ``engine``."""
    if not isinstance(destination, (TemporaryQueue, TemporaryTopic)):
        return False
    node = destination.lifetime
    return isinstance(node, TemporaryNode) and node.engine is not engine


class TemporaryNode:
    """A temporary destination this connection created (its TemporaryLifetime): a dynamic
    node held by a link on the connection's own AMQP session, so it outlives the JMS session
    that asked for it, and goes with the connection (JMS). A reconnection is a new
    connection: the broker deleted the node with the old one, and it is not made again."""

    def __init__(self, connection: Connection, endpoint: LinkEndpoint, name: str) -> None:
        self.connection = connection
        self.endpoint = endpoint
        self.engine = connection.engine
        self.name = name
        self.destination: Destination | None = None
        self.deleted = False
        # Set by the blocking API: runs a coroutine on the connection's I/O thread.
        self.run: Callable[[Coroutine[Any, Any, None]], None] | None = None

    @classmethod
    async def create(cls, connection: Connection, *, topic: bool) -> TemporaryNode:
        engine = connection.engine
        sender = engine.sender(connection._temporaries_session(), "temporary")
        sender.target.dynamic = True
        sender.target.expiry_policy = Terminus.EXPIRE_WITH_LINK
        put_symbols(sender.target.capabilities, ["temporary-topic" if topic else "temporary-queue"])
        sender.source.address = sender.name
        endpoint = await engine.attach(sender)
        name = sender.remote_target.address
        if not name:
            raise JMSException("the broker named no temporary destination")
        return cls(connection, endpoint, name)

    async def delete_async(self) -> None:
        connection = self.connection
        if connection.closed:
            raise IllegalStateException("the connection that created it is closed")
        if self.deleted or self.engine is not connection.engine:
            self.deleted = True  # gone already (twice, or with the connection it was made on)
            return
        for session in connection.sessions:
            for consumer in session.consumers:
                if not consumer.closed and consumer.destination == self.destination:
                    raise IllegalStateException(
                        f"temporary destination {self.name} has a consumer (close it first)"
                    )
        self.deleted = True
        await self.endpoint.close()

    def delete(self) -> None:
        if self.run is None:
            raise IllegalStateException("with the asyncio API: await destination.delete_async()")
        if self.connection.closed:  # its I/O thread is gone too
            raise IllegalStateException("the connection that created it is closed")
        self.run(self.delete_async())


@dataclass(slots=True)
class Received:
    """A message the broker delivered to a consumer, with its wire delivery.

    ``delivery`` is the delivery's C object (no proton wrapper: engine.hold_delivery keeps
    it), let go and set to None once settled here (``Session._settle``, ``_forget``) on the
    loop: a Received may be let go last by the application's thread (the blocking receive()
    takes it there), and a reference dropped on another thread runs proton's unsynchronised
    pn_decref beside the loop's engine calls (seen: crashes). ``presettled`` is read on that
    thread instead of the delivery."""

    consumer: MessageConsumer
    delivery: Any
    message: Message
    presettled: bool


def _remotely_settled(received: Received) -> bool:
    """Settled by the broker (presettled), or already here: nothing to acknowledge."""
    delivery = received.delivery
    return delivery is None or bool(delivery_settled(delivery))


def _forget(received: Received) -> None:
    """Let go of ``received``'s delivery without settling it (on the loop; see Received)."""
    delivery = received.delivery
    received.delivery = None
    if delivery is not None:
        release_delivery(delivery)


class Session(MessageFactory):
    """A JMS session: its consumers, producers, and (transacted) its current transaction."""

    def __init__(self, connection: Connection, mode: AcknowledgeMode) -> None:
        self.connection = connection
        self.engine = connection.engine
        self.mode = mode
        self.transacted = mode == AcknowledgeMode.SESSION_TRANSACTED
        self.presettled = connection.factory.disable_ack or mode == AcknowledgeMode.NO_ACKNOWLEDGE
        self.proton_session = self.engine.session()
        self.consumers: list[MessageConsumer] = []
        self.producers: list[MessageProducer] = []
        self.unacked: list[Received] = []  # delivered to the application, not yet acknowledged
        self.lazy: list[Received] = []  # DUPS_OK acknowledgements not yet sent
        self.coordinator: LinkEndpoint | None = None
        self.txn_id: Any = None
        self.closed = False
        self._tags = itertools.count(1)
        self.loop = asyncio.get_running_loop()
        self._transaction_lost = False
        # Messages the blocking API's receive() took from a consumer's buffer on the caller's
        # thread (MessageConsumer._take_ready): their acknowledgement rule runs here, on the
        # loop, in one batch per wake-up (_run_posted) instead of a thread hop per message.
        self._posted: deque[tuple[Received, bool]] = deque()
        self._post_scheduled = False
        # The first failed send of the open transaction (the blocking API's transacted sends
        # do not wait for their outcome, as Qpid JMS's: commit() rolls back and says so).
        self._failed_send: JMSException | None = None

    async def _open(self) -> None:
        if not self.transacted:
            return
        sender = self.engine.sender(self.proton_session, "txn")
        sender.target.type = Terminus.COORDINATOR
        put_symbols(sender.target.capabilities, ["amqp:local-transactions"])
        sender.source.address = f"txn-{uuid.uuid4()}"
        self.coordinator = await self.engine.attach(sender)
        await self._declare()

    def _check(self) -> None:
        if self.closed:
            raise IllegalStateException("the session is closed")
        self.connection._check()

    def _connection_lost(self) -> None:
        """Deliveries of the lost connection cannot be acknowledged any more: the broker
        delivers them again (redelivered); a transaction in progress is lost."""
        self._release_deliveries()
        self.unacked.clear()
        self.lazy.clear()
        self._posted.clear()
        if self.transacted:
            self._transaction_lost = True
            self._failed_send = None
            for producer in self.producers:
                producer._outbox.clear()  # rolled back with the connection, never resent
        for consumer in self.consumers:
            consumer.buffer.clear()
            consumer.outstanding = 0

    def _release_deliveries(self) -> None:
        """Let go (on the loop) of the deliveries this session's messages still hold, when
        they can no longer be settled (the connection is gone, or the session closed)."""
        # Over copies: each release is a C call that lets the application's thread run,
        # and a blocking receive() takes from a consumer's buffer and posts meanwhile.
        for received in list(self.unacked):
            _forget(received)
        for received in list(self.lazy):
            _forget(received)
        for received, _ in list(self._posted):
            _forget(received)
        for consumer in list(self.consumers):
            for received in list(consumer.buffer):
                _forget(received)

    async def _reopen(self, engine: EngineConnection) -> None:
        self.engine = engine
        self.proton_session = engine.session()
        if self.transacted:
            await self._open()
        for producer in list(self.producers):
            if _gone_with_old_connection(producer.destination, engine):
                producer.closed = True  # its temporary destination went with the connection
                self.producers.remove(producer)
            else:
                await producer._reattach()
        for consumer in list(self.consumers):
            if _gone_with_old_connection(consumer.destination, engine):
                consumer.closed = True
                consumer._wake()
                self.consumers.remove(consumer)
            else:
                await consumer._reattach()

    def get_acknowledge_mode(self) -> AcknowledgeMode:
        return self.mode

    def get_transacted(self) -> bool:
        return self.transacted

    def _allows_pickle(self) -> bool:
        return self.connection.factory.allow_pickle

    # -- endpoints ----------------------------------------------------------------------------

    async def create_producer(self, destination: Destination | None = None) -> MessageProducer:
        self._check()

        def build() -> Link:
            sender = self.engine.sender(self.proton_session)
            if destination is not None:
                sender.target.address = destination.name
                put_symbols(sender.target.capabilities, [destination.capability])
            sender.source.address = sender.name
            if self.connection.factory.disable_ack:
                sender.snd_settle_mode = Link.SND_SETTLED
            return sender

        endpoint = await self.engine.attach(build())
        producer = MessageProducer(self, endpoint, destination)
        producer.build = build
        self.producers.append(producer)
        return producer

    async def create_consumer(
        self,
        destination: Destination,
        message_selector: str | None = None,
        no_local: bool = False,
    ) -> MessageConsumer:
        return await self._consumer(destination, message_selector, no_local)

    async def create_durable_consumer(
        self,
        topic: Topic,
        name: str,
        message_selector: str | None = None,
        no_local: bool = False,
    ) -> MessageConsumer:
        if self.connection.client_id is None:
            raise IllegalStateException("a durable subscription needs a client id")
        return await self._consumer(topic, message_selector, no_local, durable_name=name)

    create_durable_subscriber = create_durable_consumer

    async def create_shared_consumer(
        self, topic: Topic, name: str, message_selector: str | None = None
    ) -> MessageConsumer:
        """JMS 2.0 shared non-durable subscription (consumers with the same name share it)."""
        return await self._consumer(topic, message_selector, False, shared_name=name)

    async def create_shared_durable_consumer(
        self, topic: Topic, name: str, message_selector: str | None = None
    ) -> MessageConsumer:
        return await self._consumer(
            topic, message_selector, False, durable_name=name, shared_name=name
        )

    async def create_browser(
        self, queue: Queue, message_selector: str | None = None
    ) -> QueueBrowser:
        consumer = await self._consumer(queue, message_selector, False, browse=True)
        return QueueBrowser(consumer)

    async def _consumer(
        self,
        destination: Destination,
        selector: str | None,
        no_local: bool,
        *,
        durable_name: str | None = None,
        shared_name: str | None = None,
        browse: bool = False,
    ) -> MessageConsumer:
        self._check()
        if not isinstance(destination, Destination):
            raise InvalidDestinationException("a consumer needs a Queue or a Topic")
        capabilities = [destination.capability]
        link_name = durable_name
        if shared_name is not None:
            # Qpid JMS's naming: the subscription name, "|global" without a client id,
            # "|volatileN" for a non-durable shared subscription.
            capabilities.append("shared")
            link_name = shared_name
            if self.connection.client_id is None:
                capabilities.append("global")
                link_name += "|global"
            if durable_name is None:
                link_name += f"|volatile{next(self._tags)}"

        def build() -> Link:
            receiver = self.engine.receiver(self.proton_session, link_name)
            source = receiver.source
            source.address = destination.name
            put_symbols(source.capabilities, capabilities)
            filters: dict[symbol, Any] = {}
            if selector is not None and selector.strip():
                filters[symbol("jms-selector")] = Described(SELECTOR_FILTER, selector)
            if no_local:
                filters[symbol("no-local")] = Described(NO_LOCAL_FILTER, [])
            if filters:
                source.filter.put_object(filters)
            if durable_name is not None:
                source.durability = Terminus.DELIVERIES
                source.expiry_policy = Terminus.EXPIRE_NEVER
            else:
                source.expiry_policy = Terminus.EXPIRE_WITH_LINK
            if browse:
                source.distribution_mode = Terminus.DIST_MODE_COPY
            receiver.target.address = receiver.name
            if self.presettled and not browse:
                receiver.snd_settle_mode = Link.SND_SETTLED
            return receiver

        try:
            endpoint = await self.engine.attach(build())
        except JMSException as exc:
            if selector is not None and "selector" in str(exc):
                raise InvalidSelectorException(str(exc), exc.error_code) from None
            raise
        consumer = MessageConsumer(
            self, endpoint, destination, browse=browse, durable=durable_name is not None
        )
        consumer.build = build
        consumer.selector = selector
        self.consumers.append(consumer)
        consumer._top_up()
        return consumer

    async def unsubscribe(self, name: str) -> None:
        """Remove a durable subscription (as Qpid JMS: attach by name alone, then close);
        without a client id, the global one of that name (``name|global``)."""
        self._check()
        link_name = name if self.connection.client_id is not None else f"{name}|global"
        # Refused while a consumer of this connection, on any of its sessions, uses it (JMS:
        # erroneous; the broker would refuse it too). Checked before the lookup link exists,
        # so a refusal leaves no link behind that a later attach of that name in this session
        # could be matched to.
        for session in self.connection.sessions:
            for consumer in session.consumers:
                if consumer.link.name == link_name and not consumer.closed:
                    raise IllegalStateException(f"subscription {name!r} has an active consumer")
        receiver = self.engine.receiver(self.proton_session, link_name)
        receiver.source.address = None  # type: ignore[assignment]
        receiver.target.address = receiver.name
        try:
            endpoint = await self.engine.attach(receiver)
        except JMSException as exc:
            if exc.error_code == "amqp:resource-locked":
                # A consumer of another connection (a global subscription) has it.
                raise IllegalStateException(
                    f"subscription {name!r} has an active consumer: {exc}", exc.error_code
                ) from None
            raise InvalidDestinationException(f"no durable subscription {name!r}: {exc}") from None
        await endpoint.close()

    async def create_temporary_queue(self) -> TemporaryQueue:
        self._check()
        node = await TemporaryNode.create(self.connection, topic=False)
        queue = TemporaryQueue(node.name, node)
        node.destination = queue
        return queue

    async def create_temporary_topic(self) -> TemporaryTopic:
        self._check()
        node = await TemporaryNode.create(self.connection, topic=True)
        topic = TemporaryTopic(node.name, node)
        node.destination = topic
        return topic

    # -- acknowledgement ----------------------------------------------------------------------

    def _settle(
        self,
        received: Received,
        state: int,
        failed: bool = False,
        undeliverable: bool = False,
        *,
        unsettled: bool = False,
    ) -> None:
        """``unsettled``: the caller just found it not settled by the broker."""
        delivery = received.delivery
        received.delivery = None  # let go here, on the loop (see Received)
        if delivery is not None:
            settle_delivery(
                delivery, state, failed=failed, undeliverable=undeliverable, unsettled=unsettled
            )
            release_delivery(delivery)
        received.consumer._settled()

    def _transactional_accept(self, received: Received) -> None:
        delivery = received.delivery
        received.delivery = None
        if delivery is not None:
            if not delivery_settled(delivery):
                transactional_update(delivery, self.txn_id, accepted=True)
                delivery_settle(delivery)
            release_delivery(delivery)
        received.consumer._settled()

    def _post(self, received: Received, *, expired: bool) -> None:
        """From the caller's thread: run ``received``'s hand-over (or, ``expired``, its
        return as undeliverable) on the loop. One wake-up of the loop serves every message
        posted until it runs (the flag is cleared there before the queue is read, so a
        message posted meanwhile is either seen by that run or schedules the next one)."""
        self._posted.append((received, expired))
        if not self._post_scheduled:
            self._post_scheduled = True
            self.loop.call_soon_threadsafe(self._run_posted)

    def _run_posted(self) -> None:
        """The posted hand-overs, in the order the application got them, then one flush.
        Every operation that depends on them (commit, rollback, recover, close, a receive
        on the loop) calls this first."""
        self._post_scheduled = False
        posted = self._posted
        if not posted:
            return
        while posted:
            received, expired = posted.popleft()
            if expired:
                received.consumer._expire(received)
            else:
                self._hand_over(received, listener=False, flush=False)
        if not self.engine.dead:
            self.engine.flush()

    def _hand_over_now(self, received: Received) -> None:
        """A receive()'s hand-over, after those posted before it: on the loop, or on the
        receiving thread under the loop's lock (the blocking API's ``_IOThread.borrow``),
        which writes what this flushes."""
        self._run_posted()
        self._hand_over(received, listener=False)

    def _hand_over(self, received: Received, *, listener: bool, flush: bool = True) -> None:
        """The acknowledgement rule of this session's mode at the moment the application gets
        a message (``listener``: before the listener runs, else as receive() returns)."""
        mode = self.mode
        message = received.message
        if _remotely_settled(received) or received.consumer.browse:
            if received.consumer.browse:
                self._settle(received, Delivery.ACCEPTED)
            else:
                _forget(received)  # presettled: nothing to acknowledge (see Received)
                received.consumer._settled()
        elif mode == AcknowledgeMode.SESSION_TRANSACTED:
            self._transactional_accept(received)
        elif mode == AcknowledgeMode.PRE_ACKNOWLEDGE:
            self._settle(received, Delivery.ACCEPTED)
        elif mode in (AcknowledgeMode.CLIENT_ACKNOWLEDGE, AcknowledgeMode.INDIVIDUAL_ACKNOWLEDGE):
            self.unacked.append(received)
            message._acknowledger = self._acknowledger(received)
        elif not listener:
            self._acknowledged_by_return(received)
        if flush:
            self.engine.flush()

    def _acknowledged_by_return(self, received: Received) -> None:
        """The callers found ``received`` not settled by the broker, in this same loop turn
        (nothing can settle it meanwhile): not asked of the engine again."""
        if self.mode == AcknowledgeMode.DUPS_OK_ACKNOWLEDGE:
            self.lazy.append(received)
            if len(self.lazy) >= max(1, received.consumer.prefetch // 2):
                self._flush_lazy()
        elif self.mode == AcknowledgeMode.AUTO_ACKNOWLEDGE:
            self._settle(received, Delivery.ACCEPTED, unsettled=True)

    def _after_listener(self, received: Received, ok: bool) -> None:
        if self.mode not in (AcknowledgeMode.AUTO_ACKNOWLEDGE, AcknowledgeMode.DUPS_OK_ACKNOWLEDGE):
            return
        if _remotely_settled(received):
            return
        if ok:
            self._acknowledged_by_return(received)
        else:
            # The listener failed: the broker delivers it again, counted (modified, failed).
            self._settle(received, Delivery.MODIFIED, failed=True)
        self.engine.flush()

    def _flush_lazy(self) -> None:
        lazy, self.lazy = self.lazy, []
        for received in lazy:
            self._settle(received, Delivery.ACCEPTED)
        self.engine.flush()

    def _acknowledger(self, received: Received) -> Callable[[Message], None]:
        def acknowledge_here() -> None:
            if self.closed:
                raise IllegalStateException("the session is closed")
            if self.mode == AcknowledgeMode.INDIVIDUAL_ACKNOWLEDGE:
                if received in self.unacked:
                    self.unacked.remove(received)
                    self._settle(received, Delivery.ACCEPTED)
            else:
                self.acknowledge()
            self.engine.flush()

        def acknowledge(message: Message) -> None:
            # The engine belongs to the loop: from another thread (the blocking API, a
            # listener thread) the acknowledgement runs there and this call waits for it.
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self.loop:
                acknowledge_here()
                return
            call_from_thread(self.loop, acknowledge_here)

        return acknowledge

    def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: every message the session delivered so far."""
        self._run_posted()
        unacked, self.unacked = self.unacked, []
        for received in unacked:
            self._settle(received, Delivery.ACCEPTED)
        self.engine.flush()

    async def recover(self) -> None:
        """Redeliver every unacknowledged message (count +1), in order."""
        self._check()
        if self.transacted:
            raise IllegalStateException("recover() on a transacted session (use rollback())")
        self._run_posted()
        self._release_buffered()
        unacked, self.unacked = self.unacked, []
        for received in unacked:
            self._settle(received, Delivery.MODIFIED, failed=True)
        self._refill()

    def _release_buffered(self) -> None:
        """Return prefetched, undelivered messages so redelivered ones keep their order."""
        for consumer in self.consumers:
            while consumer.buffer:
                received = consumer.buffer.popleft()
                self._settle(received, Delivery.RELEASED)

    def _refill(self) -> None:
        for consumer in self.consumers:
            consumer._top_up()
        self.engine.flush()

    # -- transactions -------------------------------------------------------------------------

    async def _control(self, body: Described) -> Outcome:
        assert self.coordinator is not None
        endpoint = self.coordinator
        link = endpoint.link
        await _wait_credit(endpoint)
        tag = str(next(self._tags)).encode()
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        endpoint.outcomes[tag] = future
        link_impl = link._impl
        new_transfer(link_impl, tag, bytes(ProtonMessage(body=body).encode()))
        link_advance(link_impl)
        self.engine.flush()
        return await asyncio.wait_for(future, self.engine.timeout)

    async def _sends_done(self) -> None:
        """Wait until every send of this session is on the wire and answered (before a
        discharge: the transaction holds them all)."""
        for producer in list(self.producers):
            await producer._wait_outbox()
            if producer._pending:
                await asyncio.wait(list(producer._pending), timeout=self.engine.timeout)

    async def _declare(self) -> None:
        outcome = await self._control(Described(symbol("amqp:declare:list"), [None]))
        if outcome.state != DECLARED:
            raise _outcome_error(outcome, "the broker refused to declare a transaction")
        self.txn_id = outcome.data[0]

    async def _discharge(self, fail: bool) -> Outcome:
        return await self._control(Described(symbol("amqp:discharge:list"), [self.txn_id, fail]))

    async def commit(self) -> None:
        self._check()
        if not self.transacted:
            raise IllegalStateException("commit() on a session that is not transacted")
        self._run_posted()
        if self._transaction_lost:
            self._transaction_lost = False
            raise TransactionRolledBackException(
                "the connection failed during the transaction; it was rolled back"
            )
        await self._sends_done()
        failed, self._failed_send = self._failed_send, None
        if failed is not None:
            self._release_buffered()
            await self._discharge(True)
            await self._declare()
            self._refill()
            raise TransactionRolledBackException(
                f"a send of the transaction failed, so it was rolled back: {failed}",
                failed.error_code,
            )
        outcome = await self._discharge(False)
        await self._declare()
        if outcome.state != Delivery.ACCEPTED:
            self._release_buffered()
            self._refill()
            raise _outcome_error(
                outcome, "the transaction was rolled back", TransactionRolledBackException
            )

    async def rollback(self) -> None:
        self._check()
        if not self.transacted:
            raise IllegalStateException("rollback() on a session that is not transacted")
        self._run_posted()
        if self._transaction_lost:
            self._transaction_lost = False  # already rolled back with the old connection
            return
        await self._sends_done()  # in this transaction, not the next
        self._failed_send = None
        self._release_buffered()
        outcome = await self._discharge(True)
        await self._declare()
        self._refill()
        if outcome.state != Delivery.ACCEPTED:
            raise _outcome_error(outcome, "rollback failed")

    async def close(self) -> None:
        """Close consumers (waiting for a running listener) and producers; a transacted
        session's open transaction is rolled back."""
        if self.closed:
            return
        if not self.engine.dead:
            self._run_posted()
        for consumer in list(self.consumers):
            await consumer.close()
        if self.lazy and not self.engine.dead:
            self._flush_lazy()
        for producer in list(self.producers):
            await producer.close()
        if self.transacted and self.txn_id is not None and not self.engine.dead:
            with contextlib.suppress(JMSException, TimeoutError):
                await self._discharge(True)
        if self.coordinator is not None:
            await self.coordinator.close()
        self.closed = True
        self._release_deliveries()  # unacknowledged ones: the broker delivers them again
        if not self.engine.dead:
            self.proton_session.close()
            self.engine.flush()
        with contextlib.suppress(ValueError):
            self.connection.sessions.remove(self)

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def transaction(self) -> Transaction:
        """``async with session.transaction():`` commits on success, rolls back on error."""
        if not self.transacted:
            raise IllegalStateException("transaction() on a session that is not transacted")
        return Transaction(self)


class Transaction:
    def __init__(self, session: Session) -> None:
        self.session = session

    async def __aenter__(self) -> Session:
        return self.session

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            await self.session.commit()
        else:
            await self.session.rollback()


def call_from_thread(
    loop: asyncio.AbstractEventLoop,
    function: Callable[[], None],
    alive: Callable[[], bool] | None = None,
) -> None:
    """Run ``function`` on ``loop`` (from another thread) and wait for it: a callback and a
    bare lock, not a task and a concurrent Future (a thread's acknowledgement, receive()'s
    hand-over). RuntimeError when the loop is closed, or when ``alive`` says its thread
    has ended with the call still queued (a loop stopped and closed meanwhile drops it);
    ``function``'s error is raised here."""
    done = threading.Lock()
    done.acquire()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            function()
        except BaseException as exc:
            failed.append(exc)
        finally:
            done.release()

    loop.call_soon_threadsafe(run)
    if alive is None:
        done.acquire()
    else:
        while not done.acquire(timeout=_CALL_WAIT_SLICE):
            if not alive():
                if done.acquire(blocking=False):
                    break
                raise RuntimeError("the connection's loop is closed")
    if failed:
        raise failed[0]


def _outcome_error(
    outcome: Outcome, default: str, kind: type[JMSException] = JMSException
) -> JMSException:
    condition = outcome.condition
    if condition is not None:
        error = from_condition(condition.name, condition.description, kind)
        if kind is TransactionRolledBackException and not isinstance(error, kind):
            return kind(str(error), error.error_code)
        return error
    return kind(f"{default} (outcome {outcome.state})")


async def _wait_credit(endpoint: LinkEndpoint) -> None:
    link = endpoint.link
    while link.credit <= 0:
        endpoint.check()
        endpoint.engine.check()
        endpoint.changed.clear()
        await endpoint.changed.wait()
    endpoint.check()


class MessageProducer:
    """Sends with the JMS message headers: PERSISTENT sends wait for the broker's
    acceptance (synchronous), NON_PERSISTENT ones do not; all are presettled under
    disable_ack."""

    def __init__(
        self, session: Session, endpoint: LinkEndpoint, destination: Destination | None
    ) -> None:
        self.session = session
        self.endpoint = endpoint
        self.link: Sender = endpoint.link  # type: ignore[assignment]
        self.destination = destination
        self.delivery_mode = DeliveryMode.PERSISTENT
        self.priority = codec.DEFAULT_PRIORITY
        self.time_to_live = 0  # milliseconds, 0 = never expires
        self.delivery_delay = 0  # milliseconds
        self.disable_message_id = False
        self.disable_message_timestamp = False
        self.closed = False
        self._tags = itertools.count(1)
        self._pending: set[asyncio.Future[Any]] = set()
        # Encoded sends the blocking API posted (``_post_send``), not yet on the link.
        self._outbox: deque[bytes] = deque()
        self._pump_scheduled = False
        self.build: Callable[[], Link] | None = None

    async def _reattach(self) -> None:
        if self.closed or self.build is None:
            return
        self.endpoint = await self.session.engine.attach(self.build())
        self.link = self.endpoint.link  # type: ignore[assignment]
        self._pump()  # posted sends go on the new link as its credit comes

    def get_destination(self) -> Destination | None:
        return self.destination

    def set_delivery_mode(self, mode: DeliveryMode) -> None:
        self.delivery_mode = DeliveryMode(mode)

    def set_priority(self, priority: int) -> None:
        if not 0 <= priority <= 9:
            raise JMSException("priority is 0-9")
        self.priority = priority

    def set_time_to_live(self, milliseconds: int) -> None:
        self.time_to_live = milliseconds

    def set_delivery_delay(self, milliseconds: int) -> None:
        self.delivery_delay = milliseconds

    def set_disable_message_id(self, value: bool) -> None:
        self.disable_message_id = value

    def set_disable_message_timestamp(self, value: bool) -> None:
        self.disable_message_timestamp = value

    async def send(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: DeliveryMode | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
        completion_listener: CompletionListener | None = None,
    ) -> None:
        if self.closed:
            raise IllegalStateException("the producer is closed")
        session = self.session
        await session.connection._ready()
        session._check()
        mode, data = self._prepare(message, destination, delivery_mode, priority, time_to_live)
        await self._wait_outbox()  # the sends posted before this one go first
        await _wait_credit(self.endpoint)
        future = self._transmit(data)
        session.engine.flush()
        if future is None:  # presettled
            if completion_listener is not None:
                completion_listener(message, None)
            return
        if completion_listener is not None:
            future.add_done_callback(lambda f: completion_listener(message, _send_error(f)))
            self._track(future)
            return
        if mode == DeliveryMode.PERSISTENT or session.transacted:
            try:
                outcome = await future
            except JMSException:
                connection = session.connection
                if connection.state != ConnectionState.RECONNECTING or session.transacted:
                    raise
                # In doubt: send again on the new connection (at least once, as Qpid JMS).
                await connection._ready()
                await self.send(
                    message,
                    destination,
                    delivery_mode=delivery_mode,
                    priority=priority,
                    time_to_live=time_to_live,
                )
                return
            error = _send_error(outcome)
            if error is not None:
                raise error
        else:
            self._track(future)

    def _prepare(
        self,
        message: Message,
        destination: Destination | None,
        delivery_mode: DeliveryMode | None,
        priority: int | None,
        time_to_live: int | None,
    ) -> tuple[DeliveryMode, bytes]:
        """Stamp the JMS headers on ``message`` and encode it. Pure: no engine, no loop (the
        blocking API runs it on the caller's thread)."""
        if self.destination is not None:
            if destination is not None and destination != self.destination:
                raise ValueError("this producer has a destination; send(message) only")
            target = self.destination
        elif destination is None:
            raise InvalidDestinationException("an anonymous producer needs a destination")
        else:
            target = destination
        mode = DeliveryMode(delivery_mode if delivery_mode is not None else self.delivery_mode)
        ttl = self.time_to_live if time_to_live is None else time_to_live
        now = codec.now_ms()
        message.jms_destination = target
        message.jms_delivery_mode = mode
        message.jms_priority = self.priority if priority is None else priority
        message.jms_timestamp = 0 if self.disable_message_timestamp else now
        message.jms_expiration = now + ttl if ttl > 0 else 0
        message.jms_delivery_time = now + self.delivery_delay
        message.jms_message_id = None if self.disable_message_id else codec.new_message_id()
        if ttl > 0 and self.disable_message_timestamp:
            message.jms_timestamp = now  # the expiry is computed from it
        data = codec.encode(
            message,
            address=target.name,
            destination=target,
            delivery_delay_ms=self.delivery_delay,
            allow_pickle=self.session.connection.factory.allow_pickle,
        )
        if self.disable_message_timestamp:
            message.jms_timestamp = 0
        return mode, data

    def _transmit(self, data: bytes) -> asyncio.Future[Outcome] | None:
        """One transfer on the link (it has credit); the future of its outcome, None when it
        goes presettled. The caller flushes."""
        session = self.session
        link = self.link._impl
        tag = str(next(self._tags)).encode()
        delivery = new_transfer(link, tag, data)
        if session.transacted:
            transactional_update(delivery, session.txn_id, accepted=False)
        link_advance(link)
        if link_snd_settle_mode(link) == Link.SND_SETTLED:
            delivery_settle(delivery)
            return None
        future: asyncio.Future[Outcome] = session.loop.create_future()
        self.endpoint.outcomes[tag] = future
        return future

    def _post_send(
        self,
        message: Message,
        destination: Destination | None,
        delivery_mode: DeliveryMode | None,
        priority: int | None,
        time_to_live: int | None,
    ) -> bool:
        """send() without the loop, for the blocking API on the caller's thread, when the
        send need not wait for the broker (NON_PERSISTENT or presettled; in a transaction,
        whose commit waits for every send and rolls back if one failed, as Qpid JMS does):
        the message is stamped and encoded here and queued in the outbox, which the loop
        sends in order as credit allows (``_pump``), one wake-up per batch. False: take the
        loop's path (it waits, and raises what it must); so does a full outbox, which is how
        a producer without credit blocks."""
        session = self.session
        connection = session.connection
        mode = delivery_mode if delivery_mode is not None else self.delivery_mode
        if (
            self.closed
            or session.closed
            or session._transaction_lost
            or (
                mode == DeliveryMode.PERSISTENT
                and not session.transacted
                and self.link.snd_settle_mode != Link.SND_SETTLED
            )
            or connection.closed
            or connection.state != ConnectionState.CONNECTED
            or session.engine.dead
            or self.endpoint.error is not None
            or len(self._outbox) >= OUTBOX_LIMIT
        ):
            return False
        _, data = self._prepare(message, destination, delivery_mode, priority, time_to_live)
        self._outbox.append(data)
        if not self._pump_scheduled:
            self._pump_scheduled = True
            try:
                session.loop.call_soon_threadsafe(self._pump)
            except RuntimeError:  # the loop is closed: the connection went meanwhile
                raise IllegalStateException("the connection is closed") from None
        return True

    def _pump(self) -> None:
        """Send the outbox while the link has credit (LINK_FLOW calls it again); the flag is
        cleared before the outbox is read, so a post meanwhile is seen or schedules again."""
        self._pump_scheduled = False
        outbox = self._outbox
        endpoint = self.endpoint
        if not outbox or self.session.engine.dead or endpoint.error is not None:
            return
        link = self.link
        sent = False
        while outbox and link.credit > 0:
            future = self._transmit(outbox.popleft())
            if future is not None:
                self._track(future)
            sent = True
        endpoint.on_flow = self._pump if outbox else None
        if sent:
            self.session.engine.flush()
            endpoint.changed.set()  # a send waiting for the outbox re-checks

    async def _wait_outbox(self) -> None:
        while self._outbox:
            self._pump()
            if not self._outbox:
                return
            endpoint = self.endpoint
            endpoint.check()
            self.session.engine.check()
            endpoint.changed.clear()
            await endpoint.changed.wait()

    def _track(self, future: asyncio.Future[Any]) -> None:
        self._pending.add(future)
        future.add_done_callback(self._tracked_done)

    def _tracked_done(self, future: asyncio.Future[Any]) -> None:
        self._pending.discard(future)
        error = _send_error(future)
        if error is None:
            return
        session = self.session
        if session.transacted:
            if session._failed_send is None:
                session._failed_send = error  # commit() rolls back and raises it
        else:
            log.warning("an asynchronous send failed: %s", error)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        timeout = self.session.engine.timeout
        if self._outbox:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._wait_outbox(), timeout)
            if self._outbox:
                log.warning("%d asynchronous sends were not sent", len(self._outbox))
                self._outbox.clear()
        if self._pending:
            with contextlib.suppress(Exception):
                await asyncio.wait(list(self._pending), timeout=timeout)
        await self.endpoint.close()
        with contextlib.suppress(ValueError):
            self.session.producers.remove(self)


def _send_error(result: Any) -> JMSException | None:
    if isinstance(result, asyncio.Future):
        if result.cancelled():
            return JMSException("the send was cancelled")
        exc = result.exception()
        if exc is not None:
            return exc if isinstance(exc, JMSException) else JMSException(str(exc))
        result = result.result()
    state = result.state
    if state == Delivery.ACCEPTED:
        return None
    if state == TRANSACTIONAL_STATE:
        data = result.data
        outcome = data[1] if isinstance(data, list) and len(data) > 1 else None
        if isinstance(outcome, Described) and outcome.descriptor in (
            ulong(ACCEPTED_OUTCOME),
            symbol("amqp:accepted:list"),
        ):
            return None
        return TransactionRolledBackException("the transactional send was not accepted")
    condition = result.condition
    if condition is not None:
        return from_condition(condition.name, condition.description)
    return JMSException(f"the broker did not accept the message (outcome {state})")


class MessageConsumer:
    """Receives from one destination; prefetch is the link's credit (0: one pull per
    receive, drained when it times out)."""

    def __init__(
        self,
        session: Session,
        endpoint: LinkEndpoint,
        destination: Destination,
        *,
        browse: bool = False,
        durable: bool = False,
    ) -> None:
        self.session = session
        self.endpoint = endpoint
        self.link: Receiver = endpoint.link  # type: ignore[assignment]
        self.destination = destination
        self.browse = browse
        self.durable = durable
        self.prefetch = session.connection.factory.prefetch
        self.buffer: deque[Received] = deque()
        self.outstanding = 0  # received and not yet settled: counts against the prefetch
        self.closed = False
        self.listener: AsyncListener | None = None
        self._listener_task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()  # clear while the listener runs
        self._idle.set()
        self.build: Callable[[], Link] | None = None
        self.selector: str | None = None
        # The link's drain flag as _drain sets it (read here, not asked of the engine, by
        # every top-up).
        self._drain_mode = False
        endpoint.on_delivery = self._arrived

    async def _reattach(self) -> None:
        if self.closed or self.build is None:
            return
        self.buffer.clear()
        self.outstanding = 0
        waiter = self.endpoint.waiter
        self.endpoint = await self.session.engine.attach(self.build())
        self.link = self.endpoint.link  # type: ignore[assignment]
        self._drain_mode = False  # a new link
        self.endpoint.on_delivery = self._arrived
        self.endpoint.waiter = waiter
        self._top_up()

    def _arrived(self, delivery: Any) -> None:
        """A complete incoming delivery (its C object, valid for this call: held past it)."""
        data = receive_transfer(self.link._impl, delivery)
        if data is None:  # aborted by its sender: dropped, its credit given back
            delivery_settle(delivery)
            self._top_up()
            return
        factory = self.session.connection.factory
        try:
            message = codec.decode(
                data, fallback=self.destination, allow_pickle=factory.allow_pickle
            )
        except Exception as exc:
            log.warning("undecodable message rejected: %s", exc)
            delivery_update(delivery, Delivery.REJECTED)
            delivery_settle(delivery)
            return
        self.outstanding += 1
        presettled = bool(delivery_settled(delivery))
        self.buffer.append(Received(self, hold_delivery(delivery), message, presettled))
        self.endpoint.notify()

    def _settled(self) -> None:
        """One of this consumer's deliveries was settled: its credit may come back. Not
        flushed here: every settling caller flushes once after its batch, so the settlements
        of a batch (DUPS_OK's, acknowledge()'s, a recover's) go out as one range, not cut by
        a flow written after the first few."""
        self.outstanding = max(0, self.outstanding - 1)
        self._top_up(flush=False)

    def _top_up(self, *, flush: bool = True) -> None:
        if self.closed or self.prefetch == 0:
            return
        if self._drain_mode:
            return
        link = self.link._impl
        credit = link_credit(link)
        want = self.prefetch - credit - self.outstanding
        if want > 0 and (want >= max(1, self.prefetch // 4) or credit == 0):
            self.link.flow(want)
            if flush:
                self.session.engine.flush()

    def _wake(self) -> None:
        self.endpoint.notify()

    def get_message_selector(self) -> str | None:
        return self.selector

    async def _next(self, timeout: float | None, *, no_wait: bool = False) -> Received | None:
        """The next buffered delivery, pulling when prefetch is 0; None on timeout or close."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        connection = self.session.connection
        pulled = False
        while True:
            if self.closed:
                return None
            if not connection._reconnected.is_set():
                await connection._ready()
                continue
            try:
                self.endpoint.check()
            except JMSException:
                if connection.state == ConnectionState.RECONNECTING:
                    continue
                raise
            if self.buffer and connection.started:
                received = self.buffer.popleft()
                if self._expired(received):
                    continue
                return received
            if no_wait and connection.started:
                if not await self._drain():
                    return None
                continue
            if connection.started and self.prefetch == 0 and not pulled and self.link.credit == 0:
                self.link.flow(1)
                self.session.engine.flush()
                pulled = True
            self.endpoint.changed.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                if connection.started and self.prefetch == 0 and self.link.credit > 0:
                    await self._drain()
                    if self.buffer:
                        continue
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.endpoint.changed.wait(), remaining)

    def _expired(self, received: Received) -> bool:
        """A prefetched message that expired while buffered is not delivered (JMS); it goes
        back as undeliverable here, as Qpid JMS does, and the broker expires it."""
        if not self._is_expired(received):
            return False
        self._expire(received)
        return True

    def _is_expired(self, received: Received) -> bool:
        expiration = received.message.jms_expiration
        return bool(expiration) and codec.now_ms() >= expiration and not self.browse

    def _ready_here(self) -> bool:
        """Whether receive() may take a prefetched message on the caller's thread (or wait
        there for one): started, no listener, not closing or reconnecting, and an
        acknowledgement rule that runs after the message is handed over. Reads plain flags
        the loop writes; a change the reader misses only sends it down the loop's path."""
        session = self.session
        connection = session.connection
        return not (
            self.closed
            or self.listener is not None
            or self.browse
            or session.closed
            or session.mode not in _POSTED_MODES
            or not connection.started
            or connection.state != ConnectionState.CONNECTED
            or self.endpoint.error is not None
        )

    def _take_ready(self, hand_over: Callable[[Callable[[], None]], None]) -> Message | None:
        """receive() without the loop's wait, for the blocking API on the caller's thread: the
        next buffered message when one is there and ``_ready_here``. Where the mode's rule
        only takes effect later (in a transaction, at commit; DUPS_OK, lazily; presettled,
        never) its hand-over is posted to the loop (Session._post); AUTO and PRE acknowledge
        before receive() returns, so ``hand_over`` runs it on the engine and writes it
        first (the blocking API's ``_IOThread.borrow``: here, under the loop's lock).
        None: take the loop's path, which waits, pulls, and raises what it must."""
        if not self._ready_here():
            return None
        session = self.session
        buffer = self.buffer
        while True:
            try:
                received = buffer.popleft()
            except IndexError:
                return None
            expired = self._is_expired(received)
            try:
                if expired or session.mode in _LATER_MODES or received.presettled:
                    session._post(received, expired=expired)
                else:
                    hand_over(functools.partial(session._hand_over_now, received))
            except RuntimeError:  # the loop is closed: the connection went meanwhile
                return None
            if not expired:
                return received.message

    def _expire(self, received: Received) -> None:
        if not _remotely_settled(received):
            self.session._settle(received, Delivery.MODIFIED, failed=True, undeliverable=True)
        else:
            _forget(received)
            self._settled()
        self.session.engine.flush()

    async def _drain(self) -> bool:
        """Ask the broker for what it has now (drain); True when something arrived."""
        link = self.link
        before = len(self.buffer)
        self._drain_mode = True
        if self.prefetch == 0 and link.credit == 0:
            link.drain(1)
        else:
            link.drain(0)
        self.session.engine.flush()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.session.engine.timeout
        while link.draining() and len(self.buffer) == before:
            self.endpoint.check()
            self.endpoint.changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise JMSException("the broker did not answer a drain")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.endpoint.changed.wait(), remaining)
        link.drain_mode = False
        self._drain_mode = False
        arrived = len(self.buffer) > before
        self._top_up()
        self.session.engine.flush()
        return arrived

    def _check_receive(self) -> None:
        if self.closed:
            raise IllegalStateException("the consumer is closed")
        if self.listener is not None:
            raise IllegalStateException("this consumer has a message listener")
        self.session._check()

    async def receive(self, timeout: float | None = None) -> Message | None:
        """The next message; waits at most ``timeout`` seconds (None: until one comes or
        the consumer closes)."""
        self._check_receive()
        self.session._run_posted()
        received = await self._next(timeout)
        if received is None:
            return None
        self.session._hand_over(received, listener=False)
        return received.message

    async def receive_no_wait(self) -> Message | None:
        self._check_receive()
        self.session._run_posted()
        received = await self._next(0, no_wait=True)
        if received is None:
            return None
        self.session._hand_over(received, listener=False)
        return received.message

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            message = await self.receive()
            if message is None:
                return
            yield message

    def set_message_listener(self, listener: AsyncListener | None) -> None:
        """Run ``listener`` for each message, one at a time, acknowledging per the session's
        mode (AUTO: after it returns; a listener that raises gets the message again)."""
        self.session._check()
        self.listener = listener
        if listener is not None and self._listener_task is None:
            self._listener_task = asyncio.get_running_loop().create_task(self._listen())
        self._wake()

    async def _listen(self) -> None:
        session = self.session
        while not self.closed:
            listener = self.listener
            if listener is None:
                return
            try:
                received = await self._next(None)
            except JMSException:
                return
            if received is None:
                return
            session._hand_over(received, listener=True)
            ok = True
            self._idle.clear()
            try:
                await listener(received.message)
            except Exception:
                log.exception("message listener failed on %s", received.message.jms_message_id)
                ok = False
            finally:
                self._idle.set()
            if not session.engine.dead:
                session._after_listener(received, ok)
            else:
                _forget(received)  # its connection is gone for good: nothing to settle

    async def close(self) -> None:
        """Waits for a running listener to return; unconsumed prefetched messages go back."""
        if self.closed:
            return
        self.closed = True
        self._wake()
        task = self._listener_task
        if task is not None and task is not asyncio.current_task():
            with contextlib.suppress(Exception):
                await task
        if not self.session.engine.dead:
            while self.buffer:
                received = self.buffer.popleft()
                self.session._settle(received, Delivery.RELEASED)
            if self.session.lazy:
                self.session._flush_lazy()
            await self.endpoint.close(detach=self.durable)
        else:
            for received in self.buffer:
                _forget(received)
        with contextlib.suppress(ValueError):
            self.session.consumers.remove(self)


class QueueBrowser:
    """Looks at a queue's messages without consuming them (a copy-mode link)."""

    def __init__(self, consumer: MessageConsumer) -> None:
        self.consumer = consumer

    def get_queue(self) -> Destination:
        return self.consumer.destination

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._enumerate()

    async def _enumerate(self) -> AsyncIterator[Message]:
        consumer = self.consumer
        while True:
            if not consumer.buffer and not await consumer._drain():
                return
            while consumer.buffer:
                received = consumer.buffer.popleft()
                consumer.session._hand_over(received, listener=False)
                yield received.message

    async def get_enumeration(self) -> list[Message]:
        return [message async for message in self]

    async def close(self) -> None:
        await self.consumer.close()


class JMSContext(MessageFactory):
    """JMS 2.0's simplified API: one connection and one session, started on first consume."""

    def __init__(self, connection: Connection, session: Session) -> None:
        self.connection = connection
        self.session = session
        self.auto_start = True
        self._producer: MessageProducer | None = None

    def _allows_pickle(self) -> bool:
        return self.connection.factory.allow_pickle

    async def create_producer(self) -> JMSProducer:
        if self._producer is None:
            self._producer = await self.session.create_producer(None)
        return JMSProducer(self, self._producer)

    async def create_consumer(
        self, destination: Destination, message_selector: str | None = None, no_local: bool = False
    ) -> MessageConsumer:
        consumer = await self.session.create_consumer(destination, message_selector, no_local)
        if self.auto_start:
            await self.connection.start()
        return consumer

    async def create_temporary_queue(self) -> TemporaryQueue:
        return await self.session.create_temporary_queue()

    async def commit(self) -> None:
        await self.session.commit()

    async def rollback(self) -> None:
        await self.session.rollback()

    def acknowledge(self) -> None:
        self.session.acknowledge()

    async def close(self) -> None:
        await self.connection.close()

    async def __aenter__(self) -> JMSContext:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class JMSProducer(ProducerSettings):
    """JMS 2.0's producer: settings chain, and ``send(destination, body)`` takes a message,
    a str (TextMessage), bytes (BytesMessage) or a dict (MapMessage)."""

    def __init__(self, context: JMSContext, producer: MessageProducer) -> None:
        super().__init__()
        self.context = context
        self.producer = producer

    async def send(
        self, destination: Destination, body: Message | str | bytes | dict[str, Any] | None
    ) -> JMSProducer:
        message = self.message_of(body)
        self.producer.delivery_delay = self.delivery_delay
        await self.producer.send(
            message,
            destination,
            delivery_mode=self.delivery_mode,
            priority=self.priority,
            time_to_live=self.time_to_live,
        )
        return self


_ = time  # the clock used by callers through codec.now_ms
