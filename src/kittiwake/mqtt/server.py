"""The asyncio shell around :class:`MQTTConnection`: bytes in, bytes out, nothing else.

The only module of the MQTT front end that knows the event loop: the connection (and its login)
are sans-IO, and get from here what needs the loop: ``call_soon``, and a password check that
runs on a worker thread.

Every complete packet of a read is decoded at once, and writes are coalesced: what a read
produces for its own connection (answers, and the deliveries its acknowledgements freed) leaves
in one socket write at the end of that read; what other connections' reads produce for it, in
one write per loop turn.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass
from typing import Any

from kittiwake.broker.authentication import Authentication, Credentials
from kittiwake.broker.authorization import RenewPermissions
from kittiwake.broker.broker import Broker
from kittiwake.config import ListenerConfig
from kittiwake.mqtt.codec import AckRunDecoder, PacketDecoder
from kittiwake.mqtt.connection import CallSoon, MQTTConnection
from kittiwake.mqtt.errors import MQTTProtocolError
from kittiwake.mqtt.login import Login, Verdict
from kittiwake.tls import certificate_user, server_context

log = logging.getLogger(__name__)

# A client that has not sent CONNECT this long after connecting is dropped.
CONNECT_TIMEOUT = 10.0
# After the broker ends a connection it closes only its write side and reads (and drops) what
# the client still sends, for at most this long: a client busy writing (PUBRELs, say) then
# reads our last words (DISCONNECT with its reason, a refusing CONNACK) instead of having them
# destroyed by the reset a full close causes when its data arrives. Over TLS (no half-close)
# see MQTTServerProtocol.close().
LINGER_TIMEOUT = 5.0


def _tls_shutdown_drops_input(transport: asyncio.BaseTransport) -> bool:
    """Whether closing this TLS transport lets the client still write until it closes.

    uvloop's does: it sends close_notify, then reads and drops the client's records until
    the client's close_notify or EOF. asyncio's own (CPython 3.11 to 3.13 at least) fails its
    shutdown with APPLICATION_DATA_AFTER_CLOSE_NOTIFY as soon as a record arrives, and resets
    the connection before the client has read what we sent last.
    """
    return type(transport).__module__ != "asyncio.sslproto"


def handle_input(
    connection: MQTTConnection, decoder: PacketDecoder, data: bytes, *, contain_bugs: bool = True
) -> None:
    """Act on one read: every packet in order, then the error of a bad one that followed them
    (a client that pipelines gets its CONNACK and PUBACKs before the DISCONNECT).

    ``contain_bugs=False`` lets an unexpected exception through (unit tests want to see it).
    """
    try:
        packets: list[Any]
        try:
            packets = decoder.feed(data)
            error = None
        except MQTTProtocolError as exc:
            packets, error = exc.packets_before, exc
        connection.handle_all(packets)
        if connection.closed:
            return
        if error is not None:
            connection.protocol_error(error, decoder.protocol_version)
    except MQTTProtocolError as error:
        connection.protocol_error(error, decoder.protocol_version)
    except Exception:
        if not contain_bugs:
            raise
        # A bug must cost one connection, never the loop.
        log.exception("client %s: internal error; closing", connection.client_id)
        connection.protocol_error(MQTTProtocolError(0x83, "internal error"))


@dataclass(frozen=True, slots=True)
class ListenerContext:
    """What a connection needs to know about the listener it came in on."""

    authentication: Authentication
    # None: the broker-wide anonymous policy.
    allow_anonymous: bool | None = None
    # How a verified client certificate names the user ("none", "cn", "subject").
    certificate_user: str = "none"
    # WebSockets: the browser origins whose pages may connect (lower case); empty = any.
    allowed_origins: frozenset[str] = frozenset()


def _peer_text(peer: object) -> str:
    """A socket's peer address as "host:port" (what logs and the console show)."""
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

class MQTTServerProtocol(asyncio.Protocol):
    """One TCP connection; implements the connection's Transport."""

    __slots__ = (
        "_admitted",
        "_buffer",
        "_context",
        "_first_read",
        "_flush_scheduled",
        "_linger",
        "_paused",
        "_reading",
        "_server",
        "connection",
        "decoder",
        "transport",
    )

    def __init__(self, server: MQTTServer, context: ListenerContext) -> None:
        self._server = server
        self._context = context
        # What waits for the next flush: made by a write, dropped by the flush.
        self._buffer: list[bytes] | None = None
        self._flush_scheduled = False
        # Set while a read is handled: what is written meanwhile is flushed at its end.
        self._reading = False
        self._first_read = True
        # Set while the socket's send buffer is above its high-water mark (pause_writing).
        self._paused = False
        # The timer that ends a lingering close (see LINGER_TIMEOUT); None until then.
        self._linger: asyncio.TimerHandle | None = None
        # The client address counted by the broker's admission, until the connection ends.
        self._admitted: str | None = None
        self.transport: asyncio.Transport | None = None
        self.decoder = AckRunDecoder(server.broker.config.limits.max_packet_size)
        self.connection: MQTTConnection | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if len(self._server.connections) >= self._server.broker.config.limits.max_connections:
            log.warning("refusing %s: max_connections reached", _peer_text(peer))
            transport.close()
            return
        context = self._context
        address = peer[0] if isinstance(peer, tuple) else str(peer)
        login = Login(
            context.authentication,
            allow_anonymous=context.allow_anonymous,
            certificate_name=certificate_user(
                transport.get_extra_info("peercert"), context.certificate_user
            ),
            address=address,
            verify=self._verify_off_loop,
        )
        server = self._server
        broker = server.broker
        # The server's one bound ``call_soon``, not one made for each connection.
        call_soon = server.call_soon
        if call_soon is None:
            server.call_soon = call_soon = self._loop.call_soon
        # The peer's text is worked out when asked (see peer_text).
        self.connection = MQTTConnection(broker, self, self, login, call_soon=call_soon)
        refusal = broker.admission.admit(address)
        if refusal is None:
            # Interned: the connections from one address (behind a NAT, a load balancer)
            # share one copy of it.
            self._admitted = sys.intern(address)
        else:
            # Its CONNECT is answered with the reason (a CONNACK), then it is closed.
            log.warning("refusing %s: %s", _peer_text(peer), refusal.value)
            self.connection.admission_refusal = refusal
        self._server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.mqtt_received(data)

    def _verify_off_loop(self, credentials: Credentials) -> asyncio.Future[Verdict]:
        """A password check (scrypt) on a worker thread, so it never blocks the loop."""
        verify = self._context.authentication.verify
        return self._loop.run_in_executor(None, verify, credentials)

    def mqtt_received(self, data: bytes) -> None:
        """MQTT bytes from the client (straight from TCP, or out of WebSocket frames)."""
        connection = self.connection
        if connection is None or connection.closed or not data:
            return
        if self._first_read:
            self._first_read = False
            if data[0] != 0x10:
                # Not even the start of a CONNECT (an HTTP request, say): answer at once rather
                # than buffer up to max_packet_size waiting for a packet to end.
                connection.protocol_error(
                    MQTTProtocolError(0x82, "the first packet must be CONNECT")
                )
                return
        server = self._server
        server.traffic.bytes_received += len(data)
        broker = server.broker
        connection.last_received = broker.clock.now()
        # Writes made while the read is handled wait for its end (no flush scheduled each).
        self._reading = True
        try:
            handle_input(connection, self.decoder, data)
            # What the read's acknowledgements freed and its publications queued goes out
            # now, with its answers, not after every other read of this loop turn.
            broker.pumps.run()
        finally:
            self._reading = False
        if self._buffer:
            self._flush()

    def eof_received(self) -> bool:
        # The client is done writing (after our half-close, or of its own accord): what we
        # answered to its last packets goes out before the close.
        if self._buffer:
            self._flush()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        self._server.connections.discard(self)
        if self._admitted is not None:
            self._server.broker.admission.release(self._admitted)
            self._admitted = None
        if self.connection is not None:
            self.connection.connection_lost()
        self._buffer = None

    # Transport for MQTTConnection

    def write(self, data: bytes) -> None:
        if self._linger is not None:
            return  # our side is shut: nothing more goes out
        buffer = self._buffer
        if buffer is None:
            self._buffer = buffer = []
        buffer.append(data)
        if not self._flush_scheduled and not self._reading:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        # Asked for where needed (never per packet): a slot would cost each connection 16
        # bytes (its object grows past a size class).
        return asyncio.get_running_loop()

    def peer_text(self) -> str:
        transport = self.transport
        return "?" if transport is None else _peer_text(transport.get_extra_info("peername"))

    def write_backlog(self) -> int:
        # Below the high-water mark the answer cannot matter, so skip asking the transport.
        transport = self.transport
        if not self._paused or transport is None:
            return 0
        return transport.get_write_buffer_size()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False

    def close(self) -> None:
        """End the connection: what was written goes first, then a half-close and a bounded
        wait for the client's own close.

        TLS cannot half-close TCP. Closing uvloop's TLS transport does the same instead
        (close_notify, the client's records dropped until it closes, at most the listener's
        ``ssl_shutdown_timeout``, LINGER_TIMEOUT). On asyncio's (see
        _tls_shutdown_drops_input), when we have just written last words the connection
        stays open instead, its input dropped (the connection is closed), until the client
        closes or LINGER_TIMEOUT; with nothing to read, it is closed at once.
        """
        last_words = bool(self._buffer)
        if last_words:
            self._flush()
        transport = self.transport
        if transport is None or transport.is_closing() or self._linger is not None:
            return
        if not transport.can_write_eof():  # TLS
            if last_words and not _tls_shutdown_drops_input(transport):
                self._linger = self._loop.call_later(LINGER_TIMEOUT, transport.close)
            else:
                transport.close()
            return
        try:
            transport.write_eof()
        except OSError:
            transport.close()
            return
        self._linger = self._loop.call_later(LINGER_TIMEOUT, transport.close)

    def _flush(self) -> None:
        self._flush_scheduled = False
        buffer = self._buffer
        if not buffer:
            return
        # Dropped, not cleared: the next write makes a list (from the free list, as cheap as
        # refilling this one), and between writes an idle connection holds none.
        self._buffer = None
        transport = self.transport
        if transport is None or transport.is_closing() or self._linger is not None:
            return
        data = buffer[0] if len(buffer) == 1 else b"".join(buffer)
        self._server.traffic.bytes_sent += len(data)
        self.send_mqtt(transport, data)

    def send_mqtt(self, transport: asyncio.Transport, data: bytes) -> None:
        """Put MQTT bytes on the wire (a WebSocket listener frames them first)."""
        transport.write(data)


class MQTTServer:
    """All MQTT listeners of one broker and the timers their connections need."""

    def __init__(self, broker: Broker, authentication: Authentication | None = None) -> None:
        self.broker = broker
        if authentication is None:
            policy = broker.config.auth.allow_anonymous
            authentication = Authentication(allow_anonymous=None if policy == "auto" else policy)
        self.authentication = authentication
        # MQTT's traffic (over TCP and WebSockets alike), for $SYS and /metrics.
        self.traffic = broker.stats.protocol("mqtt")
        self.connections: set[MQTTServerProtocol] = set()
        self._servers: list[asyncio.Server] = []
        self._sweeper: asyncio.TimerHandle | None = None
        # The loop's call_soon, bound once and handed to every connection (see connection_made).
        self.call_soon: CallSoon | None = None

    async def listen(
        self, host: str, port: int, *, listener: ListenerConfig | None = None
    ) -> tuple[str, int]:
        """Start a listener; returns the address actually bound (port 0 picks one)."""
        loop = asyncio.get_running_loop()
        listener = listener or ListenerConfig(host=host, port=port)
        context = self.listener_context(listener)
        tls = server_context(listener.tls) if listener.tls.enabled else None
        protocol: type[MQTTServerProtocol] = MQTTServerProtocol
        kind = "MQTT"
        if listener.protocol == "websockets":
            from kittiwake.mqtt.websocket import PATH, MQTTWebSocketProtocol

            protocol = MQTTWebSocketProtocol
            kind = f"MQTT over WebSockets ({'wss' if tls else 'ws'}://...{PATH})"
        server = await loop.create_server(
            lambda: protocol(self, context),
            host,
            port,
            ssl=tls,
            # How long a closed TLS connection waits for the client's close (see close()).
            ssl_shutdown_timeout=LINGER_TIMEOUT if tls else None,
        )
        self._servers.append(server)
        address = server.sockets[0].getsockname()
        if tls and listener.protocol == "mqtt":
            kind += " over TLS"
        log.info("%s listening on %s:%s", kind, address[0], address[1])
        if self._sweeper is None:
            self._sweeper = loop.call_later(0.5, self._sweep)
        return address[0], address[1]

    def listener_context(self, listener: ListenerConfig) -> ListenerContext:
        policy = listener.allow_anonymous
        return ListenerContext(
            self.authentication,
            None if policy == "auto" else bool(policy),
            listener.tls.certificate_user,
            frozenset(origin.lower() for origin in listener.allowed_origins),
        )

    def _sweep(self) -> None:
        """One timer for every connection's keepalive, instead of one timer each."""
        now = self.broker.clock.now()
        try:
            for protocol in list(self.connections):
                connection = protocol.connection
                if connection is None or connection.closed:
                    continue
                if connection.session is None:
                    if now - connection.last_received > CONNECT_TIMEOUT:
                        log.info(
                            "client %s: no CONNECT within %ss", connection.peer, CONNECT_TIMEOUT
                        )
                        protocol.close()
                elif connection.keepalive_expired(now):
                    connection.close_for_keepalive()
        except Exception:
            log.exception("keepalive sweep failed")
        self._sweeper = asyncio.get_running_loop().call_later(0.5, self._sweep)

    def permissions_renewed(self, renew: RenewPermissions) -> None:
        """The rules were reloaded (SIGHUP): every connection is checked by the new ones."""
        for protocol in self.connections:
            if protocol.connection is not None:
                protocol.connection.permissions_renewed(renew)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for server in self._servers:
            server.close()
        for protocol in list(self.connections):
            if protocol.connection is not None:
                protocol.connection.shutdown()
        for server in self._servers:
            await server.wait_closed()
