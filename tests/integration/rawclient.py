"""A deliberately dumb MQTT client on a plain socket, for what real clients will not do:
withhold acknowledgements, resend with DUP, break the protocol, go silent.

It uses Kittiwake's own codec for framing only; every assertion about the broker's behaviour
is made by the tests on the packets received.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections import deque
from typing import Any, TypeVar

from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    Will,
)
from kittiwake.mqtt.properties import Properties

P = TypeVar("P")


class ConnectionClosed(Exception):
    """The broker closed the connection (EOF or reset)."""


class RawClient:
    """One TCP connection speaking MQTT ``version`` (3, 4 or 5) one packet at a time; over TLS
    when given a client ``tls`` context (the server's name is taken to be ``localhost``)."""

    def __init__(
        self,
        address: tuple[str, int],
        version: int = 4,
        timeout: float = 5.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.version = version
        plain = socket.create_connection(address, timeout=timeout)
        plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = plain if tls is None else tls.wrap_socket(plain, server_hostname="localhost")
        self.decoder = PacketDecoder()
        self.decoder.protocol_version = version
        self._pending: deque[Packet] = deque()
        self.eof = False
        self._next_id = 0

    # -- sending ----------------------------------------------------------------------

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, self.version))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_id(self) -> int:
        self._next_id = self._next_id % 65535 + 1
        return self._next_id

    # -- receiving --------------------------------------------------------------------

    def recv(self, timeout: float = 3.0) -> Packet:
        """The next packet; TimeoutError if none within ``timeout``, ConnectionClosed on EOF."""
        deadline = time.monotonic() + timeout
        while not self._pending:
            if self.eof:
                raise ConnectionClosed("the broker closed the connection")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no packet within {timeout}s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError(f"no packet within {timeout}s") from None
            except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError):
                self.eof = True
                continue
            if not data:
                self.eof = True
                continue
            self._pending.extend(self.decoder.feed(data))
        return self._pending.popleft()

    def expect(self, cls: type[P], timeout: float = 3.0) -> P:
        """The next packet, which must be a ``cls``."""
        packet = self.recv(timeout)
        assert isinstance(packet, cls), f"expected {cls.__name__}, got {packet!r}"
        return packet

    def wait_for(self, cls: type[P], timeout: float = 3.0, **fields: Any) -> P:
        """The first ``cls`` packet (with the given field values) to arrive; packets of other
        kinds received meanwhile stay queued, in order, for later :meth:`recv` calls."""
        deadline = time.monotonic() + timeout
        skipped: list[Packet] = []
        try:
            while True:
                packet = self.recv(max(deadline - time.monotonic(), 0.001))
                if isinstance(packet, cls) and all(
                    getattr(packet, k) == v for k, v in fields.items()
                ):
                    return packet
                skipped.append(packet)
        except TimeoutError:
            raise AssertionError(
                f"no {cls.__name__} {fields or ''} within {timeout}s; received {skipped!r}"
            ) from None
        finally:
            self._pending.extendleft(reversed(skipped))

    def recv_until_closed(self, timeout: float = 3.0) -> list[Packet]:
        """Every packet the broker sends before closing; AssertionError if it stays open."""
        packets: list[Packet] = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                packets.append(self.recv(max(remaining, 0.001)))
            except ConnectionClosed:
                return packets
            except TimeoutError:
                raise AssertionError(
                    f"the broker kept the connection open for {timeout}s; received {packets!r}"
                ) from None

    def is_open(self, within: float = 0.3) -> bool:
        """True if the connection is still open after ``within`` seconds of listening
        (packets that arrive meanwhile are kept for later :meth:`recv` calls)."""
        deadline = time.monotonic() + within
        got: list[Packet] = []
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                got.append(self.recv(remaining))
        except TimeoutError:
            pass
        except ConnectionClosed:
            self._pending.extendleft(reversed(got))
            return False
        self._pending.extendleft(reversed(got))
        return True

    def no_packet(self, within: float = 0.5) -> None:
        """Assert that nothing arrives for ``within`` seconds (and the connection stays up)."""
        try:
            packet = self.recv(within)
        except TimeoutError:
            return
        raise AssertionError(f"expected silence, received {packet!r}")

    # -- conversations ----------------------------------------------------------------

    def connect(
        self,
        client_id: str,
        *,
        clean_start: bool = True,
        keepalive: int = 10,
        properties: Properties | None = None,
        will: Will | None = None,
        username: str | None = None,
        password: bytes | None = None,
        expect_success: bool = True,
    ) -> ConnAck:
        self.send(
            Connect(
                client_id,
                protocol_version=self.version,
                clean_start=clean_start,
                keepalive=keepalive,
                will=will,
                username=username,
                password=password,
                properties=properties or Properties(),
            )
        )
        connack = self.expect(ConnAck)
        if expect_success:
            assert connack.reason_code == 0, f"CONNECT refused: {connack!r}"
        return connack

    def subscribe(self, topic_filter: str, qos: int = 0, **options: Any) -> SubAck:
        properties = options.pop("properties", None) or Properties()
        packet_id = self.next_id()
        self.send(
            Subscribe(packet_id, [SubscriptionRequest(topic_filter, qos, **options)], properties)
        )
        suback = self.expect(SubAck)
        assert suback.packet_id == packet_id
        return suback

    def publish(
        self, topic: str, payload: bytes, qos: int = 0, *, retain: bool = False,
        properties: Properties | None = None, wait_ack: bool = True,
    ) -> Publish:
        packet = Publish(
            topic, payload, qos, retain, False, self.next_id() if qos else None,
            properties or Properties(),
        )
        self.send(packet)
        if qos == 1 and wait_ack:
            ack = self.wait_for(PubAck, packet_id=packet.packet_id)
            assert ack.reason_code == 0, f"publication refused: {ack!r}"
        return packet

    def disconnect(self, reason_code: int = 0, properties: Properties | None = None) -> None:
        with contextlib.suppress(OSError):
            self.send(Disconnect(reason_code, properties or Properties()))
        self.close()

    def close(self) -> None:
        """Drop the TCP connection without DISCONNECT (an abnormal end as far as MQTT goes)."""
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
