"""SASL PLAIN on AMQP checks the password off the event loop: while one client's password is
being hashed (here: held until the test lets it finish), another connection's traffic flows.
Shown by ordering, not timing: the hash cannot finish before the other exchange completes, so
a check on the loop would deadlock the exchange (and the test would fail at its bound).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
from proton import Described, symbol, ulong

from kittiwake.amqp.frames import FRAME_TYPE_SASL, SASL_HEADER, encode_frame
from kittiwake.amqp.server import AMQPServer
from kittiwake.broker.authentication import Authentication, Credentials, PasswordHash
from kittiwake.broker.broker import Broker
from kittiwake.mqtt.packets import ConnAck, PingReq, PingResp
from kittiwake.mqtt.server import MQTTServer

from ..rawclient import RawClient

SASL_INIT = 0x41
SASL_OUTCOME = 0x44


class HeldAuthentication(Authentication):
    """Its slow check waits until the test releases it, and says when it started."""

    def __init__(self) -> None:
        super().__init__({"carol": PasswordHash.make("secret", log2_n=4)}, allow_anonymous=False)
        self.started = threading.Event()
        self.release = threading.Event()

    def verify(self, credentials: Credentials):  # type: ignore[no-untyped-def]
        self.started.set()
        assert self.release.wait(30), "never released"
        return super().verify(credentials)


@pytest.fixture
def servers() -> Iterator[tuple[HeldAuthentication, tuple[str, int], tuple[str, int]]]:
    """An AMQP and an MQTT listener of one broker on one event loop, in a thread."""
    authentication = HeldAuthentication()
    loop = asyncio.new_event_loop()
    ready: dict[str, tuple[str, int]] = {}
    started = threading.Event()
    stop = asyncio.Event()

    async def main() -> None:
        broker = Broker()
        broker.schedule_ticks(asyncio.get_running_loop())
        amqp = AMQPServer(broker, authentication=authentication)
        mqtt = MQTTServer(broker)  # anonymous, as by default
        ready["amqp"] = await amqp.listen("127.0.0.1", 0)
        ready["mqtt"] = await mqtt.listen("127.0.0.1", 0)
        started.set()
        await stop.wait()
        await mqtt.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10)
    yield authentication, ready["amqp"], ready["mqtt"]
    authentication.release.set()
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


def _sasl_frames(sock: socket.socket) -> bytes:
    data = b""
    while len(data) < 8 or len(data) < 8 + struct.unpack_from(">I", data, 8)[0]:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_another_connection_is_served_while_a_password_is_checked(servers) -> None:
    authentication, amqp_address, mqtt_address = servers
    amqp = socket.create_connection(amqp_address, timeout=10)
    amqp.sendall(SASL_HEADER)
    assert _sasl_frames(amqp).startswith(SASL_HEADER)  # header + sasl-mechanisms
    init = Described(ulong(SASL_INIT), [symbol("PLAIN"), b"\x00carol\x00secret"])
    amqp.sendall(encode_frame(FRAME_TYPE_SASL, 0, init))
    assert authentication.started.wait(10), "the password check never started"
    # The check is running and cannot finish: the loop must still serve another client.
    mqtt = RawClient(mqtt_address, 4, timeout=10)
    assert isinstance(mqtt.connect("meanwhile"), ConnAck)
    mqtt.send(PingReq())
    assert isinstance(mqtt.expect(PingResp, timeout=10), PingResp)
    mqtt.close()
    authentication.release.set()
    outcome = amqp.recv(64)
    # sasl-outcome: a SASL frame whose performative is 0x44 with code 0 (ok)
    assert outcome[5:6] == bytes([FRAME_TYPE_SASL])
    assert bytes([SASL_OUTCOME]) in outcome and outcome.endswith(b"\x50\x00")
    amqp.close()
