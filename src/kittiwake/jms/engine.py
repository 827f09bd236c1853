"""The client's AMQP 1.0 connection: drives python-qpid-proton's engine (sans-IO) from an
asyncio stream and turns its events into futures and callbacks. Knows no JMS rule and never
blocks the loop; every mutation of the engine is followed by ``flush()``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from cproton_ffi import lib as _lib  # type: ignore[import-not-found]
from proton import (
    SASL,
    UNDESCRIBED,
    Array,
    Collector,
    Condition,
    Connection,
    Data,
    Delivery,
    Endpoint,
    Event,
    Link,
    Receiver,
    Sender,
    Session,
    SSLDomain,
    Terminus,
    Transport,
    symbol,
)

from kittiwake.jms.exceptions import (
    IllegalStateException,
    InvalidClientIDException,
    JMSException,
    JMSSecurityException,
    from_condition,
)

# The engine's collector read through python-qpid-proton's C calls (see flush).
_collector_peek: Callable[[Any], Any] = _lib.pn_collector_peek
_collector_pop: Callable[[Any], Any] = _lib.pn_collector_pop
_event_type: Callable[[Any], int] = _lib.pn_event_type
_wrap_event: Callable[[Any], Event] = Event.wrap
_TRANSPORT: int = _lib.PN_TRANSPORT
# The event types _dispatch acts on (PN_TRANSPORT only before the open: see flush).
_DISPATCHED: frozenset[int] = frozenset(
    (
        _lib.PN_CONNECTION_REMOTE_OPEN,
        _lib.PN_CONNECTION_REMOTE_CLOSE,
        _lib.PN_LINK_REMOTE_OPEN,
        _lib.PN_LINK_REMOTE_CLOSE,
        _lib.PN_LINK_REMOTE_DETACH,
        _lib.PN_LINK_FLOW,
        _lib.PN_DELIVERY,
        _lib.PN_TRANSPORT_ERROR,
        _lib.PN_TRANSPORT_CLOSED,
    )
)

SOLE_CONNECTION = "sole-connection-for-container"
# In a broker's open: the connection is refused, the close that follows says why.
ESTABLISHMENT_FAILED = "amqp:connection-establishment-failed"
_READ_SIZE = 65536
_names = itertools.count(1)

# An outgoing delivery's outcome: the remote state code and the delivery (for its data).
Outcome = tuple[int, Delivery]


class LinkEndpoint:
    """One link's futures and callbacks; the engine routes events here by link name."""

    def __init__(self, engine: EngineConnection, link: Link) -> None:
        self.engine = engine
        self.link = link
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.changed = asyncio.Event()  # credit, drain or a delivery: waiters re-check
        self.on_delivery: Callable[[Delivery], None] | None = None
        self.on_flow: Callable[[], None] | None = None  # a sender waiting for credit
        # A thread blocked in the blocking API's receive() on this link, woken with ``changed``.
        self.waiter: threading.Event | None = None
        self.outcomes: dict[str, asyncio.Future[Outcome]] = {}
        self.error: JMSException | None = None
        self.detached = False

    def fail(self, error: JMSException) -> None:
        self.error = error
        if not self.opened.done():
            self.opened.set_exception(error)
        if not self.closed.done():
            self.closed.set_result(None)
        for future in self.outcomes.values():
            if not future.done():
                future.set_exception(error)
        self.outcomes.clear()
        self.notify()

    def notify(self) -> None:
        """Something changed (credit, a delivery, a close): waiters re-check."""
        self.changed.set()
        waiter = self.waiter
        if waiter is not None:
            waiter.set()

    async def close(self, *, detach: bool = False) -> None:
        """Detach (``detach``: a durable subscription stays) or close the link."""
        if self.link.state & Endpoint.LOCAL_ACTIVE:
            if detach:
                self.detached = True
                self.link.detach()
            else:
                self.link.close()
            self.engine.flush()
        if not self.engine.dead:
            with contextlib.suppress(JMSException):
                await asyncio.wait_for(asyncio.shield(self.closed), self.engine.timeout)
        self.engine.links.pop(self.link, None)

    def check(self) -> None:
        if self.error is not None:
            raise self.error


class EngineConnection:
    """A connected, opened AMQP connection."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.connection = Connection()
        self.transport = Transport()
        self.collector = Collector()
        self._collector_impl = self.collector._impl
        self.connection.collect(self.collector)
        # By link (proton's wrappers compare by the engine object), not by name: links of
        # several sessions may share a name (a durable subscription's, while a second attach
        # of it is being refused), and each must keep its own endpoint.
        self.links: dict[Link, LinkEndpoint] = {}
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.error: JMSException | None = None
        self.dead = False
        self.on_failure: Callable[[JMSException], None] | None = None
        self._pending_open: list[LinkEndpoint] = []
        self._flushing = False
        self.sasl: SASL | None = None

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        container_id: str,
        sole: bool,
        username: str | None,
        password: str | None,
        timeout: float,
        ssl_domain: SSLDomain | None = None,
        streams: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
        | None = None,
    ) -> EngineConnection:
        """``streams`` replaces the TCP connection (vm://: an in-process pipe)."""
        self = cls(host, port, timeout)
        self.connection.container = container_id
        self.connection.hostname = host
        if sole:
            wanted: Any = UNDESCRIBED
            self.connection.desired_capabilities = Array(
                wanted, Data.SYMBOL, symbol(SOLE_CONNECTION)
            )
        sasl = self.sasl = self.transport.sasl()
        if username is not None:
            self.connection.user = username
            self.connection.password = password or ""
            sasl.allowed_mechs("PLAIN")
            # proton refuses PLAIN on a connection without TLS unless told (no TLS here yet).
            sasl.allow_insecure_mechs = True
        else:
            sasl.allowed_mechs("ANONYMOUS")
        self.transport.bind(self.connection)
        try:
            reader, self.writer = await asyncio.wait_for(
                streams() if streams is not None else asyncio.open_connection(host, port),
                timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise JMSException(f"cannot connect to {host}:{port}: {exc}") from None
        self.reader_task = asyncio.get_running_loop().create_task(self._read(reader))
        self.connection.open()
        self.flush()
        try:
            await asyncio.wait_for(asyncio.shield(self.opened), timeout)
        except TimeoutError:
            await self.abort()
            raise JMSException(f"no AMQP open from {host}:{port} within {timeout}s") from None
        except JMSException:
            await self.abort()
            raise
        return self

    # -- I/O ----------------------------------------------------------------------------------

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                if not data:
                    break
                view = memoryview(data)
                while view:
                    capacity = self.transport.capacity()
                    if capacity <= 0:
                        break
                    chunk = bytes(view[:capacity])
                    self.transport.push(chunk)
                    view = view[len(chunk) :]
                    self.flush()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not self.dead:
                with contextlib.suppress(Exception):
                    self.transport.close_tail()
                self.flush()
                self._died(self.error or JMSException("the connection to the broker was lost"))

    def flush(self) -> None:
        """Process the engine's events, then write what it has to send."""
        if self._flushing:
            return  # called back from an event: the outer flush finishes the work
        self._flushing = True
        try:
            collector = self._collector_impl
            while True:
                impl = _collector_peek(collector)
                if not impl:
                    break
                try:
                    kind = _event_type(impl)
                    # Only the events _dispatch reads are wrapped in proton's Event (which
                    # wraps its connection, session, link, delivery and transport too):
                    # the engine's own (a transport event per output, local opens...) go
                    # unwrapped, as do transport events once the connection is open.
                    if kind in _DISPATCHED or (kind == _TRANSPORT and not self.opened.done()):
                        self._dispatch(_wrap_event(impl))
                finally:
                    _collector_pop(collector)
            self._settle_opens()
        finally:
            self._flushing = False
        writer = self.writer
        if writer is None or writer.is_closing():
            return
        while True:
            try:
                pending = self.transport.pending()
            except Exception:
                break
            if pending <= 0:
                break
            out = self.transport.peek(pending) or b""
            self.transport.pop(len(out))
            writer.write(out)

    def _settle_opens(self) -> None:
        waiting = self._pending_open
        self._pending_open = []
        for endpoint in waiting:
            if endpoint.opened.done():
                continue
            link = endpoint.link
            if link.state & Endpoint.REMOTE_CLOSED:
                continue  # the close event settles it
            if _refused_attach(link):
                self._pending_open.append(endpoint)  # a refusal: its detach follows
                continue
            endpoint.opened.set_result(None)

    def _dispatch(self, event: Event) -> None:
        kind = event.type
        if kind == Event.CONNECTION_REMOTE_OPEN:
            properties = self.connection.remote_properties
            if properties and properties.get(symbol(ESTABLISHMENT_FAILED)):
                return  # a refusal: the close that follows says why
            if not self.opened.done():
                self.opened.set_result(None)
        elif kind == Event.CONNECTION_REMOTE_CLOSE:
            condition = self.connection.remote_condition
            error = _connection_error(condition)
            self.error = error
            if not self.opened.done():
                self.opened.set_exception(error)
            self.connection.close()
            self._died(error)
        elif kind == Event.LINK_REMOTE_OPEN:
            assert event.link is not None
            endpoint = self.links.get(event.link)
            if endpoint is not None:
                self._pending_open.append(endpoint)
        elif kind in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
            link = event.link
            assert link is not None
            endpoint = self.links.get(link)
            if link.state & Endpoint.LOCAL_ACTIVE and not (endpoint and endpoint.detached):
                if kind == Event.LINK_REMOTE_DETACH:
                    link.detach()
                else:
                    link.close()
            if endpoint is not None:
                condition = link.remote_condition
                if condition is not None or not endpoint.opened.done():
                    endpoint.fail(
                        from_condition(
                            condition.name if condition else None,
                            condition.description if condition else "link closed by the broker",
                        )
                    )
                elif not endpoint.closed.done():
                    endpoint.closed.set_result(None)
                    endpoint.error = IllegalStateException("the link is closed")
                    endpoint.notify()
        elif kind == Event.LINK_FLOW:
            assert event.link is not None
            endpoint = self.links.get(event.link)
            if endpoint is not None:
                endpoint.notify()
                if endpoint.on_flow is not None:
                    endpoint.on_flow()
        elif kind == Event.DELIVERY:
            delivery = event.delivery
            assert delivery is not None
            endpoint = self.links.get(delivery.link)
            if endpoint is None:
                return
            if delivery.link.is_receiver:
                if endpoint.on_delivery is not None and delivery.readable and not delivery.partial:
                    endpoint.on_delivery(delivery)
            elif delivery.updated and delivery.remote_state:
                future = endpoint.outcomes.pop(str(delivery.tag), None)
                if future is not None and not future.done():
                    future.set_result((delivery.remote_state, delivery))
                delivery.settle()
        elif kind == Event.TRANSPORT:
            outcome = self.sasl.outcome if self.sasl is not None else None
            if outcome not in (None, SASL.OK) and not self.opened.done():
                # proton's client reports a refused (or impossible) SASL exchange only here.
                self.error = JMSSecurityException(
                    f"SASL authentication with {self.host}:{self.port} failed (outcome "
                    f"{outcome}): wrong credentials, or the broker needs a username and password"
                )
                self.opened.set_exception(self.error)
        elif kind in (Event.TRANSPORT_ERROR, Event.TRANSPORT_CLOSED):
            condition = self.transport.condition
            if condition is not None and condition.name == "amqp:unauthorized-access":
                self.error = JMSSecurityException(condition.description or "authentication failed")
            if not self.opened.done():
                self.opened.set_exception(
                    self.error or JMSException(_describe(condition, "the broker closed"))
                )

    def _died(self, error: JMSException) -> None:
        if self.dead:
            return
        self.dead = True
        for endpoint in list(self.links.values()):
            endpoint.fail(error)
        if not self.opened.done():
            self.opened.set_exception(error)
        if not self.closed.done():
            self.closed.set_result(None)
        if self.writer is not None:
            self.writer.close()
        if self.on_failure is not None:
            self.on_failure(error)

    # -- endpoints ----------------------------------------------------------------------------

    def session(self) -> Session:
        session = self.connection.session()
        session.open()
        return session

    def check(self) -> None:
        if self.dead:
            raise self.error or IllegalStateException("the connection is closed")

    async def attach(self, link: Link) -> LinkEndpoint:
        """Open a configured link and wait for the broker's attach (or its refusal)."""
        self.check()
        endpoint = LinkEndpoint(self, link)
        self.links[link] = endpoint
        link.open()
        self.flush()
        try:
            await asyncio.wait_for(asyncio.shield(endpoint.opened), self.timeout)
        except TimeoutError:
            raise JMSException(f"no attach for link {link.name} within {self.timeout}s") from None
        except JMSException:
            self.links.pop(link, None)
            raise
        return endpoint

    def sender(self, session: Session, prefix: str = "sender") -> Sender:
        return session.sender(f"{prefix}:{self.connection.container}:{next(_names)}")

    def receiver(self, session: Session, name: str | None = None) -> Receiver:
        return session.receiver(name or f"receiver:{self.connection.container}:{next(_names)}")

    async def close(self) -> None:
        if self.dead:
            return
        self.connection.close()
        self.flush()
        with contextlib.suppress(TimeoutError, JMSException):
            await asyncio.wait_for(asyncio.shield(self.closed), self.timeout)
        await self.abort()

    async def abort(self) -> None:
        self._died(IllegalStateException("the connection is closed"))
        if self.reader_task is not None:
            self.reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader_task


def _refused_attach(link: Link) -> bool:
    """A refused attach names no node on the broker's side (AMQP 1.0 section 2.6.3)."""
    if link.is_sender:
        target = link.remote_target
        if target.type == Terminus.COORDINATOR:
            return False
        anonymous = link.target.address is None and not link.target.dynamic
        return target.address is None and not anonymous
    source = link.remote_source
    lookup = link.source.address is None and not link.source.dynamic
    return source.address is None and not lookup


def put_symbols(data: Data, names: list[str]) -> None:
    _put_symbols(data, names)


def _put_symbols(data: Data, names: list[str]) -> None:
    data.clear()
    data.put_array(False, Data.SYMBOL)
    data.enter()
    for name in names:
        data.put_symbol(symbol(name))
    data.exit()


def _describe(condition: Condition | None, default: str) -> str:
    if condition is None:
        return default
    return f"{condition.description or default} ({condition.name})"


def _connection_error(condition: Condition | None) -> JMSException:
    if condition is None:
        return IllegalStateException("the broker closed the connection")
    text = _describe(condition, "the broker closed the connection")
    if condition.name == "amqp:invalid-field":
        info: Any = condition.info
        if isinstance(info, dict) and info.get(symbol("invalid-field")) == symbol("container-id"):
            return InvalidClientIDException(text, condition.name)
    if condition.name == "amqp:unauthorized-access":
        return JMSSecurityException(text, condition.name)
    return from_condition(condition.name, condition.description)
