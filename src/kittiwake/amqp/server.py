"""The asyncio shell around :class:`AMQPConnection`: moves bytes between a socket and the state
machine, coalesces writes to one per loop turn, and runs one timer for every connection's
engine timers. Decides nothing about the protocol.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kittiwake.amqp.connection import AMQPConnection, LinkHandler
from kittiwake.amqp.sasl import CredentialCheck
from kittiwake.broker.authentication import Authentication, Credentials, Principal, Refusal
from kittiwake.broker.broker import Broker
from kittiwake.config import ListenerConfig
from kittiwake.tls import certificate_user, server_context

log = logging.getLogger(__name__)

# A client that has not opened its connection this long after connecting is dropped.
OPEN_TIMEOUT = 10.0
# How often the engines' timers (idle timeout, heartbeats) are run.
TICK_INTERVAL = 0.5

# Builds the link layer of one connection (None: the listener attaches no links).
LinkHandlerFactory = Callable[[AMQPConnection], LinkHandler | None]


class AMQPServerProtocol(asyncio.Protocol):
    """One TCP connection."""

    __slots__ = (
        "_admitted",
        "_allow_anonymous",
        "_certificate_user",
        "_flush_scheduled",
        "_loop",
        "_server",
        "connection",
        "transport",
    )

    def __init__(
        self,
        server: AMQPServer,
        allow_anonymous: bool | None = None,
        certificate_user: str = "none",
    ) -> None:
        self._server = server
        # The listener's anonymous policy; None: the broker's.
        self._allow_anonymous = allow_anonymous
        # The listener's tls.certificate_user: how a client certificate names its user.
        self._certificate_user = certificate_user
        self._loop = asyncio.get_running_loop()
        self._flush_scheduled = False
        self.transport: asyncio.Transport | None = None
        self.connection: AMQPConnection | None = None
        # The client address counted by the broker's admission, until the connection ends.
        self._admitted: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        broker = self._server.broker
        if len(self._server.connections) >= broker.config.limits.max_connections:
            log.warning("refusing amqp %s: max_connections reached", peer_text)
            transport.close()
            return
        authentication = self._server.authentication
        address = peer[0] if isinstance(peer, tuple) else str(peer)
        refusal = broker.admission.admit(address)
        if refusal is not None:
            # Refused before any AMQP frame is read: the socket is closed (no open to answer).
            log.warning("refusing amqp %s: %s", peer_text, refusal.value)
            transport.close()
            return
        self._admitted = address
        connection = AMQPConnection(
            broker.config.amqp,
            broker.clock,
            allow_anonymous=authentication.anonymous_allowed(self._allow_anonymous),
            check=self._server.credential_check(address),
            peer=peer_text,
            certificate_name=certificate_user(
                transport.get_extra_info("peercert"), self._certificate_user
            ),
        )
        connection.handler = self._server.new_handler(connection)
        connection.wakeup = self.schedule_flush
        self.connection = connection
        self._server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        connection = self.connection
        if connection is None or connection.closed:
            return
        self._server.traffic.bytes_received += len(data)
        # Output made during the read (a transfer's outcome, credit) goes out with the
        # read's own flush below, not in a flush of its own on the next loop turn.
        self._flush_scheduled = True
        try:
            connection.receive(data)
        finally:
            self._flush()

    def eof_received(self) -> bool | None:
        if self.connection is not None:
            self.connection.end_of_stream()
            self._flush()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        if self._admitted is not None:
            self._server.broker.admission.release(self._admitted)
            self._admitted = None
        if self.connection is not None:
            self.connection.end_of_stream()

    def schedule_flush(self) -> None:
        """The link layer produced output outside a read (a delivery from the core)."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        connection = self.connection
        transport = self.transport
        if connection is None or transport is None or transport.is_closing():
            return
        data = connection.data_to_send()
        if data:
            self._server.traffic.bytes_sent += len(data)
            transport.write(data)
        if connection.closed:
            transport.close()

    def tick(self, now: float) -> None:
        connection = self.connection
        if connection is None or connection.closed:
            return
        if not connection.opened and now - connection.created > OPEN_TIMEOUT:
            connection.fail("amqp:resource-limit-exceeded", "no open within the time allowed")
        else:
            connection.tick()
        self._flush()

    def close_by_operator(self) -> None:
        """An operator disconnects the client."""
        if self.connection is not None:
            self.connection.fail("amqp:connection:forced", "disconnected by an operator")
        self._flush()

    def shutdown(self) -> None:
        """The broker is stopping."""
        if self.connection is not None:
            self.connection.fail("amqp:connection:forced", "the broker is shutting down")
        self._flush()


class AMQPServer:
    """All AMQP listeners of one broker."""

    def __init__(
        self,
        broker: Broker,
        new_handler: LinkHandlerFactory | None = None,
        authentication: Authentication | None = None,
    ) -> None:
        self.broker = broker
        self._new_handler = new_handler
        if authentication is None:
            policy = broker.config.auth.allow_anonymous
            authentication = Authentication(allow_anonymous=None if policy == "auto" else policy)
        # The broker's one authentication service (DESIGN.md section 5): SASL PLAIN checks it.
        self.authentication = authentication
        # AMQP's traffic, for $SYS and /metrics.
        self.traffic = broker.stats.protocol("amqp")
        self.connections: set[AMQPServerProtocol] = set()
        self._servers: list[asyncio.Server] = []
        self._ticker: asyncio.TimerHandle | None = None

    def new_handler(self, connection: AMQPConnection) -> LinkHandler | None:
        return None if self._new_handler is None else self._new_handler(connection)

    def credential_check(self, address: str) -> CredentialCheck | None:
        """SASL PLAIN's check against the broker's users (None while there are none: any
        credentials pass, as before users existed).

        A password that must be hashed (scrypt, ~50 ms) is checked on a worker thread, as the
        MQTT login does: the answer is then a future, and the event loop goes on meanwhile.
        """
        authentication = self.authentication
        if not authentication.users_configured:
            return None

        def accepted(username: str, verdict: Principal | Refusal) -> bool:
            if not isinstance(verdict, Principal):
                log.warning(
                    "amqp login refused: user %r from %s: %s", username, address, verdict.value
                )
                return False
            return True

        def check(username: str, password: str) -> bool | asyncio.Future[bool]:
            credentials = Credentials(username, password, address=address)
            verdict = authentication.check(credentials)
            if verdict is not None:
                return accepted(username, verdict)
            loop = asyncio.get_running_loop()
            answer: asyncio.Future[bool] = loop.create_future()

            def verified(done: asyncio.Future[Principal | Refusal]) -> None:
                if answer.done():
                    return
                try:
                    answer.set_result(accepted(username, done.result()))
                except Exception:
                    log.exception("amqp %s: the credentials check failed", address)
                    answer.set_result(False)

            loop.run_in_executor(None, authentication.verify, credentials).add_done_callback(
                verified
            )
            return answer

        return check

    async def listen(
        self, host: str, port: int, *, listener: ListenerConfig | None = None
    ) -> tuple[str, int]:
        """Start a listener; returns the address actually bound (port 0 picks one)."""
        loop = asyncio.get_running_loop()
        listener = listener or ListenerConfig(protocol="amqp", host=host, port=port)
        policy = listener.allow_anonymous
        allow_anonymous = None if policy == "auto" else bool(policy)
        tls = server_context(listener.tls) if listener.tls.enabled else None
        mode = listener.tls.certificate_user
        server = await loop.create_server(
            lambda: AMQPServerProtocol(self, allow_anonymous, mode), host, port, ssl=tls
        )
        self._servers.append(server)
        address = server.sockets[0].getsockname()
        log.info("AMQP%s listening on %s:%s", " over TLS" if tls else "", address[0], address[1])
        if self._ticker is None:
            self._ticker = loop.call_later(TICK_INTERVAL, self._tick)
        return address[0], address[1]

    def accept_in_process(self, transport: asyncio.Transport) -> AMQPServerProtocol:
        """A connection from this process over an in-memory transport (kittiwake.embedded),
        handled as a listener's connection is."""
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(TICK_INTERVAL, self._tick)
        protocol = AMQPServerProtocol(self)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        return protocol

    def _tick(self) -> None:
        """One timer for every connection's engine timers, instead of one timer each."""
        now = self.broker.clock.now()
        for protocol in list(self.connections):
            try:
                protocol.tick(now)
            except Exception:
                log.exception("amqp tick failed")
        self._ticker = asyncio.get_running_loop().call_later(TICK_INTERVAL, self._tick)

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for server in self._servers:
            server.close()
        for protocol in list(self.connections):
            protocol.shutdown()
        for server in self._servers:
            await server.wait_closed()
