"""Bad input over a real socket: each closes its own connection with an AMQP error condition
and harms nobody else (a healthy client on the same broker keeps working)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest
from proton import Data, Delivery, Message
from proton.utils import BlockingConnection

from ..brokerproc import BrokerProcess

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


def read_all(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the broker writes until it closes the connection."""
    sock.settimeout(timeout)
    chunks = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def close_error(output: bytes) -> str | None:
    """The condition name in the close frame the broker sent, if any."""
    assert output.startswith(AMQP_HEADER), output[:16]
    position = 8
    while position < len(output):
        size, offset = struct.unpack_from(">IB", output, position)
        body = output[position + offset * 4 : position + size]
        position += size
        if not body:
            continue
        data = Data()
        data.decode(body)
        performative = data.get_object()
        if performative.descriptor == 0x18 and performative.value:
            return str(performative.value[0].value[0])
    return None


def raw_connection(amqp_broker: BrokerProcess) -> socket.socket:
    return socket.create_connection((amqp_broker.host, amqp_broker.amqp_port), timeout=10)


def assert_alive(connection: BlockingConnection) -> None:
    """The connection still works: a round trip through the broker (a link attach)."""
    connection.create_sender("malformed/bystander").close()


@pytest.fixture
def bystander(amqp_url: str) -> Iterator[BlockingConnection]:
    connection = BlockingConnection(amqp_url, timeout=10)
    yield connection
    connection.close()


def test_garbage_after_the_header(
    amqp_broker: BrokerProcess, bystander: BlockingConnection
) -> None:
    with raw_connection(amqp_broker) as sock:
        sock.sendall(AMQP_HEADER + b"\x00\x00\x00\x10\x02\x00\x00\x00garbageg")
        output = read_all(sock)
    assert close_error(output) == "amqp:decode-error"
    assert_alive(bystander)


def test_oversized_frame(amqp_broker: BrokerProcess, bystander: BlockingConnection) -> None:
    with raw_connection(amqp_broker) as sock:
        sock.sendall(AMQP_HEADER + struct.pack(">IBBH", 0x7FFFFFFF, 2, 0, 0))
        output = read_all(sock)
    assert close_error(output) == "amqp:connection:framing-error"
    assert_alive(bystander)


def test_truncated_frame_then_end_of_stream(
    amqp_broker: BrokerProcess, bystander: BlockingConnection
) -> None:
    with raw_connection(amqp_broker) as sock:
        sock.sendall(AMQP_HEADER + b"\x00\x00\x00\x40\x02\x00\x00\x00\x00S\x10")
        sock.shutdown(socket.SHUT_WR)
        output = read_all(sock)
    assert close_error(output) == "amqp:connection:framing-error"
    assert_alive(bystander)


def test_random_bytes_instead_of_a_header(amqp_broker: BrokerProcess) -> None:
    with raw_connection(amqp_broker) as sock:
        sock.sendall(bytes(range(256)))
        output = read_all(sock)
    assert output == SASL_HEADER


def test_broker_survives_many_bad_connections(
    amqp_broker: BrokerProcess, bystander: BlockingConnection
) -> None:
    payloads = [
        AMQP_HEADER + b"\xff" * 64,
        SASL_HEADER + b"\x00\x00\x00\x08\x02\x01\x00\x00",
        SASL_HEADER + b"\x00\x00\x10\x00\x02\x01\x00\x00",
        AMQP_HEADER + b"\x00\x00\x00\x0c\x01\x00\x00\x00\x00S\x10E",
        b"AMQP\x00\x01",
    ]
    for payload in payloads:
        with raw_connection(amqp_broker) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            read_all(sock)
    assert amqp_broker.alive()
    assert_alive(bystander)


def test_a_message_that_does_not_decode_is_rejected_alone(amqp_url: str) -> None:
    """A transfer whose message is malformed (a `to` that is not UTF-8) is rejected with
    amqp:decode-error; the sender's connection and link go on (the next message is accepted)."""
    message = Message(body="x", address="malformed/\u00ae", durable=True)
    bad = message.encode().replace("\u00ae".encode(), b"\xaeA")  # same length, not UTF-8
    connection = BlockingConnection(amqp_url, timeout=10)
    try:
        sender = connection.create_sender("malformed/q")
        link = sender.link
        delivery = link.delivery(b"bad")
        link.send(bad)
        link.advance()
        connection.wait(lambda: delivery.remote_state != 0, msg="no outcome for the transfer")
        assert delivery.remote_state == Delivery.REJECTED
        condition = delivery.remote.condition
        assert condition is not None and condition.name == "amqp:decode-error"
        sender.send(Message(body="fine", durable=True))  # raises unless accepted
    finally:
        connection.close()
