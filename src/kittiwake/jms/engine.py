"""The client's AMQP 1.0 connection: drives python-qpid-proton's engine (sans-IO) from an
asyncio stream and turns its events into futures and callbacks. Knows no JMS rule and never
blocks the loop; every mutation of the engine is followed by ``flush()``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

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
    Described,
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
    ulong,
)

from kittiwake.amqp_values import Unsupported, decode_fields
from kittiwake.jms.exceptions import (
    IllegalStateException,
    InvalidClientIDException,
    JMSException,
    JMSSecurityException,
    from_condition,
)
from kittiwake.proton_calls import collector_peek as _collector_peek
from kittiwake.proton_calls import collector_pop as _collector_pop
from kittiwake.proton_calls import delivery_link as _delivery_link
from kittiwake.proton_calls import delivery_partial as _delivery_partial
from kittiwake.proton_calls import delivery_pending as delivery_pending
from kittiwake.proton_calls import delivery_readable as _delivery_readable
from kittiwake.proton_calls import delivery_remote as _delivery_remote
from kittiwake.proton_calls import delivery_remote_state as _delivery_remote_state
from kittiwake.proton_calls import delivery_settle as delivery_settle
from kittiwake.proton_calls import delivery_settled as delivery_settled
from kittiwake.proton_calls import delivery_tag as delivery_tag
from kittiwake.proton_calls import delivery_update as delivery_update
from kittiwake.proton_calls import delivery_updated as _delivery_updated
from kittiwake.proton_calls import event_delivery as _event_delivery
from kittiwake.proton_calls import event_type as _event_type
from kittiwake.proton_calls import ffi as _ffi
from kittiwake.proton_calls import from_buffer as _from_buffer
from kittiwake.proton_calls import link_advance as link_advance
from kittiwake.proton_calls import link_credit as link_credit
from kittiwake.proton_calls import link_recv as _link_recv
from kittiwake.proton_calls import link_send as _link_send
from kittiwake.proton_calls import new_delivery as _new_delivery
from kittiwake.proton_calls import remote_state_fields as _remote_state_fields
from kittiwake.proton_calls import scratch as _scratch
from kittiwake.proton_calls import transport_capacity as _transport_capacity
from kittiwake.proton_calls import transport_peek as _transport_peek
from kittiwake.proton_calls import transport_pending as _transport_pending
from kittiwake.proton_calls import transport_pop as _transport_pop
from kittiwake.proton_calls import transport_push_raw as _transport_push
from kittiwake.proton_calls import unpack as _unpack

# The engine's collector is read, and deliveries handled, through the C calls above (see
# flush); these are the client's own.
_wrap_event: Callable[[Any], Event] = Event.wrap
_wrap_delivery: Callable[[Any], Delivery] = Delivery.wrap
_TRANSPORT: int = _lib.PN_TRANSPORT
_DELIVERY: int = _lib.PN_DELIVERY
_LINK_FLOW: int = _lib.PN_LINK_FLOW
_event_link: Callable[[Any], Any] = _lib.pn_event_link
_ACCEPTED: int = _lib.PN_ACCEPTED
# AMQP 1.0 transactions (section 4.5): the transactional-state's descriptor, accepted's; the
# remote states whose outcome is their data alone (declared, transactional).
TRANSACTIONAL_STATE = 0x34
_ACCEPTED_DESCRIPTOR = 0x24
_DATA_ONLY = frozenset((0x33, TRANSACTIONAL_STATE))
_delivery_local: Callable[[Any], Any] = _lib.pn_delivery_local
link_snd_settle_mode: Callable[[Any], int] = _lib.pn_link_snd_settle_mode
_incref: Callable[[Any], Any] = _lib.pn_incref
_decref: Callable[[Any], None] = _lib.pn_decref
_set_failed: Callable[[Any, bool], None] = _lib.pn_disposition_set_failed
_set_undeliverable: Callable[[Any, bool], None] = _lib.pn_disposition_set_undeliverable
_disposition_data: Callable[[Any], Any] = _lib.pn_disposition_data
_data_clear: Callable[[Any], None] = _lib.pn_data_clear
_data_put_list: Callable[[Any], int] = _lib.pn_data_put_list
_data_put_described: Callable[[Any], int] = _lib.pn_data_put_described
_data_put_binary = _lib.pn_data_put_binary
_data_put_ulong: Callable[[Any, int], int] = _lib.pn_data_put_ulong
_data_enter: Callable[[Any], bool] = _lib.pn_data_enter
_data_exit: Callable[[Any], bool] = _lib.pn_data_exit
# The event types _dispatch acts on (PN_TRANSPORT only before the open: see flush).
_DISPATCHED: frozenset[int] = frozenset(
    (
        _lib.PN_CONNECTION_REMOTE_OPEN,
        _lib.PN_CONNECTION_REMOTE_CLOSE,
        _lib.PN_LINK_REMOTE_OPEN,
        _lib.PN_LINK_REMOTE_CLOSE,
        _lib.PN_LINK_REMOTE_DETACH,
        _lib.PN_TRANSPORT_ERROR,
        _lib.PN_TRANSPORT_CLOSED,
    )
)

SOLE_CONNECTION = "sole-connection-for-container"
# In a broker's open: the connection is refused, the close that follows says why.
ESTABLISHMENT_FAILED = "amqp:connection-establishment-failed"
_READ_SIZE = 65536
_names = itertools.count(1)



class Outcome(NamedTuple):
    """An outgoing delivery's outcome as the broker gave it, read on the loop: its remote
    state code, and (any outcome but accepted) that state's data and error condition. Plain
    values, not the delivery's proton wrapper, which must not be let go on another thread."""

    state: int
    data: Any = None
    condition: Condition | None = None


def _outcome(delivery: Any, state: int) -> Outcome:
    if state == _ACCEPTED:
        return Outcome(state)
    if state == TRANSACTIONAL_STATE:  # every transacted send's: read without proton's Data
        encoded = _remote_state_fields(delivery)
        if encoded is not None:
            with contextlib.suppress(Unsupported):
                return Outcome(state, decode_fields(encoded))
    if state in _DATA_ONLY:  # a transactional send's (every one), a declare's: data alone
        data = Data(_disposition_data(_delivery_remote(delivery)))
        data.rewind()
        data.next()
        value = data.get_object()
        data.rewind()
        return Outcome(state, value)
    remote = _wrap_delivery(delivery).remote  # rare: a refusal (its condition), a release...
    return Outcome(state, remote.data, remote.condition)


def receive_transfer(link: Any, delivery: Any) -> bytes | None:
    """The bytes of ``link``'s current incoming delivery; the link moves past it. None when
    the sender aborted it (AMQP 1.0 2.6.12: nothing to deliver)."""
    size = delivery_pending(delivery)
    buffer = _scratch.at_least(size)
    got = _link_recv(link, buffer, size)
    link_advance(link)
    return None if got < 0 else bytes(_unpack(buffer, got))


def new_transfer(link: Any, tag: bytes, data: bytes) -> Any:
    """A new outgoing delivery on ``link`` holding ``data`` (not advanced yet: a
    transactional state goes on it first); its C object."""
    delivery = _new_delivery(link, (len(tag), _from_buffer(tag)))
    _link_send(link, data, len(data))
    return delivery


def hold_delivery(delivery: Any) -> Any:
    """Keep an incoming delivery's C object past its event (as proton's wrapper would, without
    the wrapper); ``release_delivery`` lets it go, on the loop's thread."""
    _incref(delivery)
    return delivery


def release_delivery(delivery: Any) -> None:
    _decref(delivery)


def settle_delivery(
    delivery: Any,
    state: int,
    *,
    failed: bool = False,
    undeliverable: bool = False,
    unsettled: bool = False,
) -> None:
    """Settle an incoming delivery with ``state`` unless the broker settled it already
    (presettled; ``unsettled``: the caller knows it did not)."""
    if not unsettled and delivery_settled(delivery):
        return
    if failed or undeliverable:
        local = _delivery_local(delivery)
        if failed:
            _set_failed(local, True)
        if undeliverable:
            _set_undeliverable(local, True)
    delivery_update(delivery, state)
    delivery_settle(delivery)




def transactional_update(delivery: Any, txn_id: Any, *, accepted: bool) -> None:
    """Give ``delivery`` the transactional state of ``txn_id`` (``accepted``: with the
    accepted outcome, a consumer's acknowledgement; else a send's) through C calls: the
    same value proton's wrapper writes for ``[txn_id]`` / ``[txn_id, Described(0x24, [])]``."""
    data = _disposition_data(_delivery_local(delivery))
    _data_clear(data)
    if type(txn_id) is not bytes:  # not what a broker gives (binary): proton encodes it
        value: list[Any] = [txn_id]
        if accepted:
            value.append(Described(ulong(_ACCEPTED_DESCRIPTOR), []))
        Data(data).put_object(value)
    else:
        _data_put_list(data)
        _data_enter(data)
        _data_put_binary(data, (len(txn_id), _from_buffer(txn_id)))
        if accepted:
            _data_put_described(data)
            _data_enter(data)
            _data_put_ulong(data, _ACCEPTED_DESCRIPTOR)
            _data_put_list(data)
            _data_exit(data)
        _data_exit(data)
    delivery_update(delivery, TRANSACTIONAL_STATE)




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
        self.receiver = bool(link.is_receiver)
        self.outcomes: dict[bytes, asyncio.Future[Outcome]] = {}  # by delivery tag
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
        self.engine.forget(self.link)

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
        self._transport_impl = self.transport._impl
        self.collector = Collector()
        self._collector_impl = self.collector._impl
        self.connection.collect(self.collector)
        # By link (proton's wrappers compare by the engine object), not by name: links of
        # several sessions may share a name (a durable subscription's, while a second attach
        # of it is being refused), and each must keep its own endpoint.
        self.links: dict[Link, LinkEndpoint] = {}
        # The same by the link's C object, for the delivery fast path (flush), which reads
        # a delivery's link without wrapping it.
        self._by_impl: dict[Any, LinkEndpoint] = {}
        # Closed links' wrappers, let go here on the loop once nothing else holds them: an
        # application drops a closed consumer or producer on its own thread, and a wrapper
        # freed there runs proton's unsynchronised pn_decref beside the loop (see forget).
        self._retired: list[Any] = []
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
        # While another thread does engine work (``borrowed``): flush() leaves the events
        # for the loop and the output for that thread, which writes it once at the end.
        self._borrowed = False
        # The socket's file descriptor when the output may be written to it from another
        # thread (``write_through``): a plain TCP connection, not vm://'s pipes.
        self._fd: int | None = None

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
            if streams is not None:
                reader, self.writer = await asyncio.wait_for(streams(), timeout)
                self.reader_task = asyncio.get_running_loop().create_task(self._read(reader))
            else:
                self.writer = await asyncio.wait_for(self._connect(host, port), timeout)
        except (OSError, TimeoutError) as exc:
            raise JMSException(f"cannot connect to {host}:{port}: {exc}") from None
        self._fd = _socket_fd(self.writer)
        _bound_reads(self.writer)
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

    async def _connect(self, host: str, port: int) -> asyncio.StreamWriter:
        """A TCP connection whose bytes go into the engine as the loop reads them
        (``_EngineProtocol``); a StreamWriter over it, as vm://'s streams give."""
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(
            lambda: _EngineProtocol(self), host, port
        )
        return asyncio.StreamWriter(transport, protocol, None, loop)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        """vm://'s pipe read into the engine (a TCP connection's: ``_EngineProtocol``)."""
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                if not data:
                    break
                if not self._push(data):
                    break
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._input_ended()

    def _input_ended(self) -> None:
        """The broker's bytes ended (closed, failed, or the engine takes no more)."""
        if not self.dead:
            with contextlib.suppress(Exception):
                self.transport.close_tail()
            self.flush()
            self._died(self.error or JMSException("the connection to the broker was lost"))

    def _push(self, data: bytes) -> bool:
        """Hand what was read to the engine, processing it as it goes; False: the engine
        takes no more (its input is closed, or it failed)."""
        transport = self._transport_impl
        offset = 0
        size = len(data)
        while offset < size:
            capacity = _transport_capacity(transport)
            if capacity <= 0:
                return False
            chunk = data if offset == 0 and capacity >= size else data[offset : offset + capacity]
            taken = _transport_push(transport, chunk, len(chunk))
            if taken < 0:
                return False
            offset += len(chunk)
            self.flush()
        return True

    def flush(self) -> None:
        """Process the engine's events, then write what it has to send."""
        if self._borrowed:
            return  # on another thread: see borrowed()
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
                    # unwrapped, as do transport events once the connection is open, and
                    # deliveries, the events of every message, take C calls alone.
                    if kind == _DELIVERY:
                        self._delivery(_event_delivery(impl))
                    elif kind == _LINK_FLOW:  # a producer's credit, by C calls too
                        self._flow(_event_link(impl))
                    elif kind in _DISPATCHED or (kind == _TRANSPORT and not self.opened.done()):
                        self._dispatch(_wrap_event(impl))
                finally:
                    _collector_pop(collector)
            self._settle_opens()
        finally:
            self._flushing = False
        writer = self.writer
        if writer is None or writer.is_closing():
            return
        transport = self._transport_impl
        while True:
            pending = _transport_pending(transport)
            if pending <= 0:
                break  # nothing, or the output is closed (PN_EOS) or failed
            buffer = _scratch.at_least(pending)
            got = _transport_peek(transport, buffer, pending)
            if got <= 0:
                break
            _transport_pop(transport, got)
            writer.write(bytes(_unpack(buffer, got)))

    def borrowed(self, function: Callable[[], None]) -> bool:
        """Run ``function``'s engine work on this thread, not the loop's, then write its
        output straight to the socket; the caller holds the lock the loop's thread holds
        whenever it is not waiting for I/O (the blocking API's), so the two never touch the
        engine at once. Events stay in the collector for the loop's next flush: they would
        touch the loop's futures, which are not thread-safe (what a settlement and a credit
        top-up post is only the engine's own). False: some output is left for the loop
        (no socket to write to, or the loop's transport has bytes queued ahead of it)."""
        self._borrowed = True
        try:
            function()
        finally:
            self._borrowed = False
        return self.write_through()

    def write_through(self) -> bool:
        """Write what the engine has to send to the socket from this thread (which holds
        the loop's lock: see ``borrowed``), when nothing is queued ahead of it in the loop's
        transport; what the socket does not take stays in the engine. True: all written."""
        transport = self._transport_impl
        fd = self._fd
        writer = self.writer
        if writer is None or writer.is_closing():
            return True  # nothing goes out any more (the loop's flush would write nothing)
        if fd is None or writer.transport.get_write_buffer_size():
            return _transport_pending(transport) <= 0
        while True:
            pending = _transport_pending(transport)
            if pending <= 0:
                return True  # nothing, or the output is closed (PN_EOS) or failed
            buffer = _scratch.at_least(pending)
            got = _transport_peek(transport, buffer, pending)
            if got <= 0:
                return True
            try:
                written = os.write(fd, _ffi.buffer(buffer, got))
            except OSError:  # full (BlockingIOError), or failed: the loop's I/O says which
                return False
            _transport_pop(transport, written)
            if written < got:
                return False

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

    def _flow(self, link: Any) -> None:
        """A link's credit or drain state changed (its C object): waiters re-check, and a
        producer with posted sends sends them."""
        endpoint = self._by_impl.get(link)
        if endpoint is not None:
            endpoint.notify()
            if endpoint.on_flow is not None:
                endpoint.on_flow()

    def _delivery(self, delivery: Any) -> None:
        """A delivery event, through C calls alone: an incoming message complete (handed to
        its consumer as the C object), or an outgoing one's outcome (its future's result)."""
        endpoint = self._by_impl.get(_delivery_link(delivery))
        if endpoint is None:
            return
        if endpoint.receiver:
            on_delivery = endpoint.on_delivery
            if (
                on_delivery is not None
                and _delivery_readable(delivery)
                and not _delivery_partial(delivery)
            ):
                on_delivery(delivery)
        elif _delivery_updated(delivery):
            state = _delivery_remote_state(delivery)
            if state:
                future = endpoint.outcomes.pop(delivery_tag(delivery), None)
                if future is not None and not future.done():
                    future.set_result(_outcome(delivery, state))
                delivery_settle(delivery)

    def forget(self, link: Link) -> None:
        """A closed link: no longer routed to; its wrapper retired (see ``_retired``)."""
        self.links.pop(link, None)
        self._by_impl.pop(link._impl, None)
        self._retired.append(link)
        self._retired = _held_elsewhere(self._retired)  # the others go now, on the loop

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
        self._by_impl[link._impl] = endpoint
        link.open()
        self.flush()
        try:
            await asyncio.wait_for(asyncio.shield(endpoint.opened), self.timeout)
        except TimeoutError:
            raise JMSException(f"no attach for link {link.name} within {self.timeout}s") from None
        except JMSException:
            self.links.pop(link, None)
            self._by_impl.pop(link._impl, None)
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


class _EngineProtocol(asyncio.Protocol):
    """A TCP connection's bytes straight into its engine, in the loop's read callback: a
    StreamReader and a reading task took a second loop turn and a future a read."""

    def __init__(self, engine: EngineConnection) -> None:
        self.engine = engine

    def data_received(self, data: bytes) -> None:
        if not self.engine._push(data):
            self.engine._input_ended()

    def eof_received(self) -> bool:
        self.engine._input_ended()
        return False  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.engine._input_ended()


def _bound_reads(writer: asyncio.StreamWriter | None) -> None:
    """asyncio's socket transport reads up to 256 KiB a call into a new bytes object, which
    costs five times a 64 KiB read (measured: 16 against 3 us a recv of 2 KB, the large
    buffer being mapped and unmapped each time); the engine reads 64 KiB at a time anyway."""
    transport: Any = None if writer is None else writer.transport
    if isinstance(getattr(transport, "max_size", None), int):
        transport.max_size = _READ_SIZE


def _socket_fd(writer: asyncio.StreamWriter | None) -> int | None:
    """The file descriptor of ``writer``'s plain TCP socket (None for TLS, or for
    vm://'s in-memory pipes, whose bytes only the loop may write; and off POSIX, where a
    socket is no file descriptor that os.write takes)."""
    if os.name != "posix" or writer is None or writer.get_extra_info("sslcontext") is not None:
        return None
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    fd = sock.fileno()
    return fd if isinstance(fd, int) and fd >= 0 else None


def _held_elsewhere(objects: list[Any]) -> list[Any]:
    """Those of ``objects`` that something besides the list holds."""
    counts = _reference_counts(objects)
    return [item for item, count in zip(objects, counts, strict=True) if count > _ALONE]


def _reference_counts(objects: list[Any]) -> list[int]:
    return [sys.getrefcount(item) for item in objects]


# What _reference_counts says of an object only its list holds (measured: the list's, the
# comprehension variable's and getrefcount's argument's references vary across versions).
(_ALONE,) = _reference_counts([object()])


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
