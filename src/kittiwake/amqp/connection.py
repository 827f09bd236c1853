"""One AMQP 1.0 connection as a state machine: bytes in, bytes out, engine events handed to the
link layer. Owns the protocol header, the SASL exchange, python-qpid-proton's engine
(Connection, Transport, Collector; never its reactor), the connection's limits and its error
handling. Never touches a socket and never decides a delivery rule (the link layer asks the
core).

Phases: the protocol header, then SASL (or, when anonymous access is allowed, straight to
AMQP), then the AMQP header and frames through the engine, then closed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from proton import (
    Collector,
    Condition,
    Connection,
    Event,
    Link,
    Session,
    SymbolList,
    Transport,
    symbol,
)

from kittiwake.amqp import engine_calls
from kittiwake.amqp.frames import (
    AMQP_HEADER,
    HEADER_SIZE,
    INVALID_FIELD,
    RESOURCE_LIMIT_EXCEEDED,
    SASL_HEADER,
    FrameGate,
    FramingError,
    close_frame,
)
from kittiwake.amqp.sasl import CredentialCheck, Principal, SaslServer
from kittiwake.clock import Clock
from kittiwake.config import AMQPConfig
from kittiwake.logs import ConnectionLog, connection_log

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger(__name__)

CONTAINER_ID = "kittiwake"

# What the broker offers in its open: anonymous-relay producers (the message names its
# destination), delivery delay, and one connection per client id when asked.
OFFERED_CAPABILITIES = ("ANONYMOUS-RELAY", "DELAYED_DELIVERY", "sole-connection-for-container")


# An open property: this open is followed by a close saying why the connection is refused.
ESTABLISHMENT_FAILED = "amqp:connection-establishment-failed"


def symbols(names: tuple[str, ...]) -> SymbolList:
    return SymbolList([symbol(n) for n in names])


class Phase(Enum):
    HEADER = "protocol header"
    SASL = "sasl"
    AMQP_HEADER = "amqp header"
    OPEN = "open"
    CLOSED = "closed"


class LinkHandler(Protocol):
    """The link layer: what the connection hands its engine's link events to."""

    def link_opened(self, link: Link) -> None:
        """The peer attached a link: answer it (open, or refuse with a condition)."""

    def link_flow(self, link: Any) -> None:
        """The peer changed a link's credit (or drain) flag, or the engine reports a flow
        after a transfer sent (``link``: the engine's C object, unwrapped; the link may have
        been closed here since: acted on only while it is open)."""

    def link_closed(self, link: Link, *, closed: bool) -> None:
        """The peer detached (``closed`` False: a durable subscription stays) or closed a
        link; the connection answers in kind afterwards."""

    def delivery_updated(self, delivery: Any) -> None:
        """A transfer arrived, or the peer settled or changed the state of a delivery
        (``delivery``: the engine's C object, unwrapped; see ``engine_calls``)."""

    def connection_ended(self) -> None:
        """The connection is gone: take back whatever its links held."""

    def connection_opened(self, container: str, desired: frozenset[str]) -> str | None:
        """The peer's open arrived: None to accept it, else why its container id (client id)
        is refused."""


class AMQPConnection:
    """The per-connection state machine; a shell feeds :meth:`receive` and writes
    :meth:`data_to_send`, calls :meth:`tick` by the deadline it returns, and closes the socket
    once :attr:`closed` is set and the output is written."""

    def __init__(
        self,
        config: AMQPConfig,
        clock: Clock,
        *,
        allow_anonymous: bool,
        check: CredentialCheck | None = None,
        handler: LinkHandler | None = None,
        peer: str = "",
        certificate_name: str | None = None,
    ) -> None:
        self.config = config
        # The user a verified client certificate names, offered as SASL EXTERNAL.
        self.certificate_name = certificate_name
        self.clock = clock
        self.peer = peer
        self.allow_anonymous = allow_anonymous
        self.handler = handler
        self.phase = Phase.HEADER
        self.principal: Principal | None = None
        self.sasl: SaslServer | None = None
        self.closed = False
        # When the socket connected, for the shell's open timeout.
        self.created = clock.now()
        # Called when output is ready outside :meth:`receive` (the link layer sent something).
        self.wakeup: Callable[[], None] | None = None
        # Why the broker closed the connection (condition, description); None for a peer's
        # close or end of stream.
        self.error: tuple[str, str] | None = None
        self._header = b""
        self._output: list[bytes | bytearray] = []
        self._gate = FrameGate(config.max_frame_size)
        self._check = check
        self._handler_ended = False
        self.transport = Transport(Transport.SERVER)
        self._transport_impl = self.transport._impl
        self.transport.max_frame_size = config.max_frame_size
        self.transport.channel_max = max(0, config.max_sessions - 1)
        if config.idle_timeout:
            self.transport.idle_timeout = config.idle_timeout
        self.engine = Connection()
        self._engine_impl = self.engine._impl
        self.collector = Collector()
        self._collector_impl = self.collector._impl
        self.engine.collect(self.collector)
        self.transport.bind(self.engine)
        # Links per session, counted here to apply max_links_per_session.
        self._links: dict[Session, int] = {}
        # The peer's close arrived (its engine event was handled): until then a read that
        # leaves the engine reading needs no look at the connection's state.
        self._close_seen = False

    # -- the shell's side -------------------------------------------------------------------

    @property
    def _log(self) -> ConnectionLog:
        """The module's logger, its records tagged with this connection's id (the client's
        container id once its open arrived, its address before)."""
        container = None
        if self.opened:
            # A container id that is not UTF-8 is the very thing some records report.
            with contextlib.suppress(UnicodeDecodeError):
                container = self.engine.remote_container
        return connection_log(log, container or self.peer)

    def receive(self, data: bytes) -> None:
        """Bytes from the peer; whatever goes wrong closes this connection with a reason."""
        if self.closed or not data:
            return
        self._receive_guarded(data)

    def _receive_guarded(self, data: bytes) -> None:
        try:
            if self.phase is Phase.OPEN:
                # The usual read, frames for the engine: one call fewer than through _receive.
                self._gate.check(data)
                self._push(data)
            else:
                self._receive(data)
        except FramingError as exc:
            self.fail(exc.condition, exc.description)
        except UnicodeDecodeError:
            # proton's binding decodes the peer's strings (container id, names) strictly when
            # they are read: invalid UTF-8 is the peer's malformed input, not our bug.
            self._log.info("amqp %s: a string in its frames is not valid UTF-8", self.peer)
            self.fail("amqp:decode-error", "a string in the frames is not valid UTF-8")
        except Exception:  # an engine or handler bug must not escape to the loop
            self._log.exception("amqp %s: internal error", self.peer)
            self.fail("amqp:internal-error", "internal error in the broker")

    def data_to_send(self) -> bytes:
        """Everything ready to write, in order; empty when there is nothing."""
        output = self._output
        phase = self.phase
        if phase is Phase.OPEN or phase is Phase.CLOSED:
            # One pending count a turn when there is nothing to write (the usual flush after
            # a read that only took an acknowledgement), each count's bytes taken at once.
            transport = self._transport_impl
            pending = engine_calls.transport_pending(transport)
            if pending < engine_calls.EOS:
                pending = self.transport.pending()  # an engine error, raised by proton
            if pending >= 0:
                while pending > 0:
                    chunk = engine_calls.take_output(transport, pending)
                    if chunk is not None:
                        output.append(chunk)
                    pending = self._pending()
                    if chunk is None:
                        break
                if phase is Phase.OPEN and pending < 0:
                    # Both closes exchanged (or the engine gave up): nothing more to say.
                    self._finish()
        if not output:
            return b""
        out = output[0] if len(output) == 1 else b"".join(output)
        output.clear()
        return out if type(out) is bytes else bytes(out)

    @property
    def opened(self) -> bool:
        """Has the peer's open arrived (or the connection ended)?"""
        return self.closed or not self.engine.state & Connection.REMOTE_UNINIT

    def wake(self) -> None:
        """Output is ready: the shell writes it soon."""
        if self.wakeup is not None:
            self.wakeup()

    def tick(self) -> float | None:
        """Run the engine's timers (idle timeout, heartbeats); returns the next deadline on the
        connection's clock, or None."""
        if self.phase is not Phase.OPEN or self.closed:
            return None
        try:
            deadline = self.transport.tick(self.clock.now())
            self._process_events()
        except Exception:
            self._log.exception("amqp %s: internal error in tick", self.peer)
            self.fail("amqp:internal-error", "internal error in the broker")
            return None
        self._check_engine_state()
        return deadline or None

    def end_of_stream(self) -> None:
        """The peer closed its side (or the socket broke)."""
        if self.closed:
            return
        if self.phase is Phase.OPEN:
            if self._gate.mid_frame:
                self.fail("amqp:connection:framing-error", "the stream ended inside a frame")
                return
            if not self.transport.closed:
                self.transport.close_tail()
                self._process_events()
        self._finish()

    # -- phases -----------------------------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        """The phases before the engine's (an OPEN connection's reads go straight to it, see
        :meth:`_receive_guarded`)."""
        if self.phase is Phase.HEADER:
            data = self._take_header(data)
            if self.closed:
                return
            if self._header != SASL_HEADER:
                # No SASL asked for: allowed only while anonymous access is.
                if self._header == AMQP_HEADER and self.allow_anonymous:
                    self.principal = Principal("NONE", None)
                    self._start_engine(data)
                    return
                self._refuse_header()
                return
            self.sasl = SaslServer(
                allow_anonymous=self.allow_anonymous,
                check=self._check,
                certificate_name=self.certificate_name,
            )
            self._output.append(SASL_HEADER + self.sasl.start())
            self.phase = Phase.SASL
            self._header = b""
        if self.phase is Phase.SASL:
            assert self.sasl is not None
            checking = self.sasl.checking
            self._output.append(self.sasl.receive(data))
            if self.sasl.checking is not None and checking is None:
                # The password is checked off the loop; what follows waits in sasl.rest.
                self.sasl.checking.add_done_callback(self._credentials_checked)
            if not self.sasl.done:
                return
            self.principal = self.sasl.principal
            if self.principal is None:
                self._log.info("amqp %s: authentication failed", self.peer)
                self.error = ("amqp:unauthorized-access", "authentication failed")
                self._finish()
                return
            self.phase = Phase.AMQP_HEADER
            data = self.sasl.rest
        if self.phase is Phase.AMQP_HEADER:
            data = self._take_header(data)
            if self.closed or len(self._header) < HEADER_SIZE:
                return
            if self._header != AMQP_HEADER:
                self._refuse_header(AMQP_HEADER)
                return
            self._start_engine(data)

    def _credentials_checked(self, answer: asyncio.Future[bool]) -> None:
        """The SASL credential check answered: send the outcome and go on with what the
        client sent meanwhile."""
        sasl = self.sasl
        if self.closed or sasl is None or sasl.checking is not answer:
            return
        accepted = not answer.cancelled() and answer.exception() is None and answer.result()
        self._output.append(sasl.finish_check(accepted))
        self._receive_guarded(b"")
        if self.wakeup is not None:
            self.wakeup()

    def _take_header(self, data: bytes) -> bytes:
        """Collect the 8-byte protocol header; returns the bytes after it."""
        needed = HEADER_SIZE - len(self._header)
        self._header += data[:needed]
        if not (AMQP_HEADER.startswith(self._header) or SASL_HEADER.startswith(self._header)):
            self._refuse_header()
        return data[needed:]

    def _refuse_header(self, supported: bytes = SASL_HEADER) -> None:
        """Section 2.2: answer an unsupported header with a supported one, then close."""
        self._log.info("amqp %s: unsupported protocol header %r", self.peer, self._header)
        self._output.append(supported)
        self.error = ("amqp:connection:framing-error", "unsupported protocol header")
        self._finish()

    def _start_engine(self, data: bytes) -> None:
        self.phase = Phase.OPEN
        self._push(AMQP_HEADER)
        self._gate.check(data)
        self._push(data)

    # -- the engine -------------------------------------------------------------------------

    @property
    def _engine_done(self) -> bool:
        return self._pending() < 0

    # The engine's C calls for what every read and write asks (see ``engine_calls``); an
    # engine error (below end of stream) goes through proton's wrapper, which raises it.

    def _pending(self) -> int:
        pending = engine_calls.transport_pending(self._transport_impl)
        return pending if pending >= engine_calls.EOS else self.transport.pending()

    def _capacity(self) -> int:
        capacity = engine_calls.transport_capacity(self._transport_impl)
        return capacity if capacity >= engine_calls.EOS else self.transport.capacity()

    def _push(self, data: bytes) -> None:
        transport = self._transport_impl
        while data:
            # Pushed without asking the engine's capacity first: the push takes what fits
            # (usually the whole read, not copied) and says how much, or why none (one
            # engine call a read fewer). A socket's read is a bytes object: straight to C.
            if type(data) is bytes:
                taken = engine_calls.transport_push_bytes(transport, data, len(data))
            else:
                taken = engine_calls.transport_push(transport, data)
            if taken < 0:
                if taken < engine_calls.EOS:
                    self.transport._check(taken)  # an engine error, raised as proton's push does
                break  # the engine reads no more input
            if taken == 0:
                # The engine holds a whole frame's worth of input; it processes it on push.
                raise FramingError("the engine cannot take more input", RESOURCE_LIMIT_EXCEEDED)
            self._process_events()
            if taken == len(data):
                break
            data = data[taken:]
        if (
            not self._close_seen
            and not self.closed
            and engine_calls.transport_capacity(transport) >= 0
        ):
            return  # the usual read: the engine still reads and the peer has not closed
        self._check_engine_state()

    def _check_engine_state(self) -> None:
        if self.closed:
            return
        capacity = self._capacity()
        if capacity < 0 and not self._peer_closed:
            condition = self.transport.condition
            if condition is None:
                # The engine stopped reading without naming why: the input was undecodable.
                self.fail("amqp:decode-error", "undecodable frame")
                return
            self.error = (condition.name, condition.description or "")
            self._log.info("amqp %s: %s (%s)", self.peer, condition.name, condition.description)
            self._finish()
            return
        # A transport still reading (capacity >= 0) is not closed: one engine call fewer on
        # every read.
        if (capacity < 0 and engine_calls.transport_closed(self._transport_impl)) or (
            self._peer_closed and self._pending() < 0
        ):
            self._finish()

    @property
    def _peer_closed(self) -> bool:
        return bool(engine_calls.connection_state(self._engine_impl) & engine_calls.REMOTE_CLOSED)

    def _process_events(self) -> None:
        """Hand the engine's events over. The two that come with every message (a delivery
        changed, a link's credit changed) are read through the C calls (a delivery handed over
        as its C object, a link wrapped); the rare ones go through proton's Event; the rest
        are skipped unwrapped (see ``engine_calls``)."""
        collector = self._collector_impl
        handler = self.handler
        peek = engine_calls.collector_peek
        pop = engine_calls.collector_pop
        event_type = engine_calls.event_type
        delivery_kind = engine_calls.DELIVERY
        flow_kind = engine_calls.LINK_FLOW
        while True:
            impl = peek(collector)
            if not impl:
                return
            try:
                kind = event_type(impl)
                if kind == delivery_kind:
                    if handler is not None:
                        handler.delivery_updated(engine_calls.event_delivery(impl))
                elif kind == flow_kind:
                    if handler is not None:
                        handler.link_flow(engine_calls.event_link(impl))
                elif kind in engine_calls.HANDLED:
                    self._on_event(engine_calls.wrap_event(impl))
            finally:
                pop(collector)

    def _on_event(self, event: Event) -> None:
        """The rare events (see :meth:`_process_events` for the per-message ones)."""
        kind = event.type
        if kind is Event.LINK_REMOTE_OPEN:
            if event.link is not None:
                self._link_opened(event.link)
        elif kind in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
            if event.link is not None:
                self._link_ended(event.link, closed=kind is Event.LINK_REMOTE_CLOSE)
        elif kind is Event.SESSION_REMOTE_OPEN:
            if event.session is not None:
                self._session_opened(event.session)
        elif kind is Event.SESSION_REMOTE_CLOSE:
            session = event.session
            if session is not None:
                self._links.pop(session, None)
                session.close()
        elif kind is Event.CONNECTION_REMOTE_OPEN:
            self._opened()
        elif kind is Event.CONNECTION_REMOTE_CLOSE:
            self._close_seen = True
            condition = self.engine.remote_condition
            if condition is not None:
                self._log.info("amqp %s: peer closed with %s", self.peer, condition.name)
            self._end_handler()
            self.engine.close()

    def _opened(self) -> None:
        engine = self.engine
        engine.container = CONTAINER_ID
        engine.offered_capabilities = symbols(OFFERED_CAPABILITIES)
        refusal = None
        if self.handler is not None:
            desired = engine.remote_desired_capabilities
            names = frozenset(str(c) for c in desired) if desired else frozenset()
            refusal = self.handler.connection_opened(engine.remote_container or "", names)
        if refusal is not None:
            # Tells the client the close that follows is the answer (as Qpid JMS reads it).
            engine.properties = {symbol(ESTABLISHMENT_FAILED): True}
        engine.open()
        if refusal is not None:
            # The client id is in use (DESIGN.md section 5): open, then close at once.
            self._log.info("amqp %s: %s", self.peer, refusal)
            self.error = (INVALID_FIELD, refusal)
            info: dict[Any, Any] = {symbol("invalid-field"): symbol("container-id")}
            engine.condition = Condition(INVALID_FIELD, refusal, info)
            engine.close()
            self._end_handler()

    def _session_opened(self, session: Session) -> None:
        if len(self._links) >= self.config.max_sessions:
            session.condition = Condition(
                RESOURCE_LIMIT_EXCEEDED, f"at most {self.config.max_sessions} sessions"
            )
            session.open()
            session.close()
            return
        self._links[session] = 0
        config = self.config
        session.incoming_capacity = max(config.session_capacity, config.max_frame_size)
        session.open()

    def _link_ended(self, link: Link, *, closed: bool) -> None:
        active = bool(link.state & Link.LOCAL_ACTIVE)
        if active:
            if self.handler is not None:
                self.handler.link_closed(link, closed=closed)
            if link.session in self._links:
                self._links[link.session] -= 1
        if closed:
            link.close()
        else:
            link.detach()

    def _link_opened(self, link: Link) -> None:
        session = link.session
        if session not in self._links:
            return  # its session was refused
        if self._links[session] >= self.config.max_links_per_session:
            link.condition = Condition(
                RESOURCE_LIMIT_EXCEEDED,
                f"at most {self.config.max_links_per_session} links per session",
            )
            link.open()
            link.close()
            return
        self._links[session] += 1
        if self.handler is None:
            link.condition = Condition("amqp:not-implemented", "this listener attaches no links")
            link.open()
            link.close()
            self._links[session] -= 1
            return
        self.handler.link_opened(link)

    def _pull_engine_output(self) -> None:
        transport = self._transport_impl
        while True:
            chunk = engine_calls.take_output(transport)
            if chunk is None:
                return
            self._output.append(chunk)

    # -- closing ----------------------------------------------------------------------------

    def fail(self, condition: str, description: str) -> None:
        """Close the connection with an error condition (bad input, a broken limit)."""
        if self.closed:
            return
        self._log.info("amqp %s: closing: %s (%s)", self.peer, condition, description)
        self.error = (condition, description)
        if self.phase is Phase.OPEN:
            engine = self.engine
            if not engine.state & Connection.LOCAL_ACTIVE:
                engine.container = CONTAINER_ID
                engine.open()
            self._pull_engine_output()
            # The engine writes a close only after the peer's open, and nothing once it has
            # stopped reading; otherwise the close goes by hand.
            healthy = self.transport.capacity() >= 0 and self.transport.pending() >= 0
            if healthy and not engine.state & Connection.REMOTE_UNINIT:
                engine.condition = Condition(condition, description)
                engine.close()
                self._pull_engine_output()
            else:
                self._output.append(close_frame(condition, description))
        self._finish()

    def _finish(self) -> None:
        if self.phase is Phase.OPEN:
            self._pull_engine_output()
        self.phase = Phase.CLOSED
        self.closed = True
        self._end_handler()

    def _end_handler(self) -> None:
        if self._handler_ended:
            return
        self._handler_ended = True
        if self.handler is not None:
            try:
                self.handler.connection_ended()
            except Exception:
                self._log.exception("amqp %s: error while ending the connection's links", self.peer)
