"""MQTT over WebSockets (MQTT 5 §6): the asyncio shell that unwraps WebSocket frames into the
same MQTT byte stream a TCP listener reads, and wraps what the connection writes into binary
frames. Served at path ``/mqtt`` with subprotocol ``mqtt`` (``mqttv3.1`` too, for old clients).

The WebSocket protocol itself (HTTP upgrade, framing, masking, ping, the closing handshake) is
the ``websockets`` library's sans-IO ServerProtocol: bytes in, events and bytes out, no event
loop of its own, so it sits under our shell as the MQTT codec does and keeps writes coalesced.
Nothing MQTT-specific happens here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from kittiwake.mqtt.server import LINGER_TIMEOUT, ListenerContext, MQTTServerProtocol

if TYPE_CHECKING:
    from websockets.typing import Subprotocol

    from kittiwake.mqtt.server import MQTTServer

log = logging.getLogger(__name__)
# The library's own diagnostics: a client's failed handshake is logged (with a traceback) at
# debug level and every open at info; our own lines say what matters, so only its warnings
# and errors (a bug in it or in us) pass.
_library_log = logging.getLogger(f"{__name__}.protocol")
_library_log.setLevel(logging.WARNING)

PATH = "/mqtt"
SUBPROTOCOLS: tuple[Subprotocol, ...] = ("mqtt", "mqttv3.1")  # type: ignore[assignment]
# Close codes (RFC 6455 §7.4.1).
_NORMAL_CLOSURE = 1000
_UNSUPPORTED_DATA = 1003


class MQTTWebSocketProtocol(MQTTServerProtocol):
    """One WebSocket connection carrying MQTT; implements the connection's Transport."""

    __slots__ = ("_allowed_origins", "_closing_timer", "_first_bytes", "websocket")

    def __init__(self, server: MQTTServer, context: ListenerContext) -> None:
        super().__init__(server, context)
        self._allowed_origins = context.allowed_origins
        self.websocket = ServerProtocol(
            subprotocols=list(SUBPROTOCOLS),
            # One frame holds at most one largest packet (a client may still split a packet
            # over several frames, or put several small ones in one).
            max_size=server.broker.config.limits.max_packet_size,
            logger=_library_log,
        )
        self._closing_timer: asyncio.TimerHandle | None = None
        self._first_bytes = True

    # asyncio.Protocol

    def data_received(self, data: bytes) -> None:
        websocket = self.websocket
        if self._first_bytes and not data.startswith(b"GET "[: len(data)]):
            # Not an HTTP upgrade (plain MQTT on the wrong port, say): close at once rather
            # than wait for a request line that never comes.
            log.info("connection from %s is not a WebSocket upgrade; closing", self._peer_text())
            if self.transport is not None:
                self.transport.close()
            return
        self._first_bytes = False
        websocket.receive_data(data)
        for event in websocket.events_received():
            if isinstance(event, Request):
                self._handshake(event)
            elif isinstance(event, Frame):
                self._frame(event)
        self._send_websocket_output()

    def eof_received(self) -> bool:
        self.websocket.receive_eof()
        self._send_websocket_output()
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closing_timer is not None:
            self._closing_timer.cancel()
        super().connection_lost(exc)

    # WebSocket events

    def _handshake(self, request: Request) -> None:
        websocket = self.websocket
        path = request.path.partition("?")[0]
        refused_origin = self._refused_origin(request)
        if path != PATH:
            response = websocket.reject(404, f"MQTT over WebSockets is served at {PATH}\n")
        elif refused_origin is not None:
            response = websocket.reject(403, "origin not allowed\n")
        else:
            response = websocket.accept(request)
        websocket.send_response(response)
        if refused_origin is not None and path == PATH:
            log.warning(
                "websocket from %s refused (403): origin %s not in allowed_origins",
                self._peer_text(),
                refused_origin[:200],
            )
        elif response.status_code != 101:
            log.info(
                "websocket from %s refused (%s): %s %s",
                self._peer_text(),
                response.status_code,
                request.path[:100],
                websocket.handshake_exc or "",
            )

    def _refused_origin(self, request: Request) -> str | None:
        """The request's Origin when the listener does not allow it (None: allowed).

        Browsers send Origin with every WebSocket handshake and let any page open one to any
        host, so without a check a page on any site a user visits can reach a broker on
        their network as them. Clients that are not browsers send none (or any they like):
        the check guards browsers, and such a handshake is not refused.
        """
        allowed = self._allowed_origins
        if not allowed:
            return None
        origins = request.headers.get_all("Origin")
        if not origins:
            return None
        if len(origins) > 1:  # RFC 6454 §7.3: one Origin header at most
            return ", ".join(origins)
        origin = origins[0]
        return None if origin.lower() in allowed else origin

    def _frame(self, frame: Frame) -> None:
        if frame.opcode is Opcode.BINARY or frame.opcode is Opcode.CONT:
            # MQTT-6.0.0-2: packets may span frames and frames may hold several packets; the
            # decoder sees one byte stream either way.
            self.mqtt_received(bytes(frame.data))
        elif frame.opcode is Opcode.TEXT:
            # MQTT-6.0.0-1: only binary frames carry MQTT; anything else closes.
            log.info("websocket from %s sent a text frame; closing", self._peer_text())
            self._close_websocket(_UNSUPPORTED_DATA, "MQTT needs binary frames")
            connection = self.connection
            if connection is not None and not connection.closed:
                connection.connection_lost()
        # PING, PONG and CLOSE are answered by the protocol itself.

    # Transport for MQTTConnection

    def send_mqtt(self, transport: asyncio.Transport, data: bytes) -> None:
        if self.websocket.state is not State.OPEN:
            return
        self.websocket.send_binary(data)
        self._send_websocket_output()

    def close(self) -> None:
        """End the connection with the WebSocket closing handshake; the client then closes TCP
        (RFC 6455 §7.1.1), or we do after LINGER_TIMEOUT."""
        if self._buffer:
            self._flush()
        self._close_websocket(_NORMAL_CLOSURE, "")

    def _close_websocket(self, code: int, reason: str) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        websocket = self.websocket
        if websocket.state is State.OPEN:
            websocket.send_close(code, reason)
            self._send_websocket_output()
        elif websocket.state is State.CONNECTING:
            transport.close()
            return
        if self._closing_timer is None and not transport.is_closing():
            self._closing_timer = self._loop.call_later(LINGER_TIMEOUT, transport.close)

    def _send_websocket_output(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        websocket = self.websocket
        for data in websocket.data_to_send():
            if data:
                transport.write(data)
            elif transport.can_write_eof():  # the protocol's end of stream: half-close
                transport.write_eof()
            else:
                transport.close()
                return
        if websocket.close_expected() and self._closing_timer is None:
            self._closing_timer = self._loop.call_later(LINGER_TIMEOUT, transport.close)

    def _peer_text(self) -> str:
        connection = self.connection
        return connection.peer if connection is not None else "?"
