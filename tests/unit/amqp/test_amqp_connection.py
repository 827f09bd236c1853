"""The AMQP connection state machine, fed bytes: headers, SASL, open/close, limits, and bad
input closing the connection with an AMQP error condition."""

from __future__ import annotations

import struct

from engine_harness import ClientEnd, raw_output, server_connection
from proton import SASL, Connection, Data, Event

from kittiwake.amqp.connection import Phase
from kittiwake.amqp.frames import AMQP_HEADER, SASL_HEADER, FrameGate, FramingError
from kittiwake.clock import ManualClock


def close_condition(output: bytes) -> tuple[str, str] | None:
    """The error condition of the last close frame in ``output``, decoded from the bytes."""
    position = 0
    found = None
    while position < len(output):
        if output[position : position + 4] == b"AMQP":
            position += 8
            continue
        size, offset = struct.unpack_from(">IB", output, position)
        body = output[position + offset * 4 : position + size]
        position += size
        if not body:
            continue
        data = Data()
        data.decode(body)
        performative = data.get_object()
        if performative.descriptor == 0x18:
            error = performative.value[0] if performative.value else None
            found = (str(error.value[0]), str(error.value[1])) if error is not None else None
    return found


def test_anonymous_sasl_then_open() -> None:
    server = server_connection()
    client = ClientEnd(server).open()
    assert server.phase is Phase.OPEN
    assert server.principal is not None and server.principal.mechanism == "ANONYMOUS"
    assert client.connection.state & Connection.REMOTE_ACTIVE
    assert client.connection.remote_container == "kittiwake"


def test_plain_credentials_are_accepted_until_users_exist() -> None:
    server = server_connection(allow_anonymous=False)
    client = ClientEnd(server, mechanisms="PLAIN", user="alice", password="secret").open()
    assert server.principal is not None
    assert (server.principal.mechanism, server.principal.username) == ("PLAIN", "alice")
    assert client.connection.state & Connection.REMOTE_ACTIVE


def test_the_credential_hook_decides_plain() -> None:
    server = server_connection()
    server._check = lambda user, password: password == "right"
    client = ClientEnd(server, mechanisms="PLAIN", user="bob", password="wrong").open()
    assert server.closed and server.principal is None
    assert client.transport.sasl().outcome == SASL.AUTH


def test_anonymous_refused_when_not_allowed() -> None:
    server = server_connection(allow_anonymous=False)
    client = ClientEnd(server, mechanisms="ANONYMOUS").open()
    assert server.closed
    assert not client.connection.state & Connection.REMOTE_ACTIVE


def test_no_sasl_is_allowed_only_for_anonymous_access() -> None:
    server = server_connection()
    client = ClientEnd(server, mechanisms=None).open()
    assert client.connection.state & Connection.REMOTE_ACTIVE

    refusing = server_connection(allow_anonymous=False)
    answer = raw_output(refusing, AMQP_HEADER)
    assert answer == SASL_HEADER
    assert refusing.closed


def test_unknown_protocol_header_gets_ours_and_a_close() -> None:
    server = server_connection()
    assert raw_output(server, b"GET / HTTP/1.1\r\n\r\n") == SASL_HEADER
    assert server.closed


def test_a_clean_close_from_the_client() -> None:
    server = server_connection()
    client = ClientEnd(server).open()
    client.connection.close()
    client.pump()
    assert client.connection.state & Connection.REMOTE_CLOSED
    assert server.closed and server.error is None


def test_an_undecodable_frame_closes_with_decode_error() -> None:
    server = server_connection()
    output = raw_output(server, AMQP_HEADER + b"\x00\x00\x00\x10\x02\x00\x00\x00garbageg")
    assert output.startswith(AMQP_HEADER)
    assert close_condition(output) == ("amqp:decode-error", "undecodable frame")
    assert server.closed


def test_an_oversized_frame_closes_with_framing_error() -> None:
    server = server_connection(max_frame_size=4096)
    client = ClientEnd(server, mechanisms=None).open()
    server.receive(struct.pack(">IBBH", 100_000, 2, 0, 0))
    output = server.data_to_send()
    condition = close_condition(output)
    assert condition is not None and condition[0] == "amqp:connection:framing-error"
    assert "100000" in condition[1]
    client.transport.push(output)
    assert client.connection.remote_condition is not None
    assert client.connection.remote_condition.name == "amqp:connection:framing-error"


def test_a_stream_ending_inside_a_frame_is_a_framing_error() -> None:
    server = server_connection()
    ClientEnd(server).open()
    server.receive(b"\x00\x00\x00\x40\x02\x00\x00\x00\x00S\x10")
    assert not server.closed
    server.end_of_stream()
    assert server.error == ("amqp:connection:framing-error", "the stream ended inside a frame")
    assert close_condition(server.data_to_send()) == server.error


def test_frame_gate_checks_headers_across_reads() -> None:
    gate = FrameGate(1024)
    frame = struct.pack(">IBBH", 12, 2, 0, 0) + b"abcd"
    for byte in frame + frame[:3]:
        gate.check(bytes([byte]))
    assert gate.mid_frame
    gate.check(frame[3:])
    assert not gate.mid_frame
    for bad in (
        struct.pack(">IBBH", 4, 2, 0, 0),
        struct.pack(">IBBH", 12, 1, 0, 0),
        struct.pack(">IBBH", 12, 2, 1, 0),
        struct.pack(">IBBH", 2048, 2, 0, 0),
    ):
        try:
            FrameGate(1024).check(bad)
        except FramingError:
            continue
        raise AssertionError(f"accepted {bad!r}")


def test_sessions_are_limited_by_channel_max() -> None:
    server = server_connection(max_sessions=2)
    client = ClientEnd(server).open()
    # Advertised as channel-max, which clients (proton among them) keep to by themselves.
    assert client.transport.remote_channel_max == 1
    sessions = [client.connection.session() for _ in range(2)]
    for session in sessions:
        session.open()
    client.pump()
    assert all(s.state & s.REMOTE_ACTIVE for s in sessions)


def test_links_beyond_the_limit_are_refused_without_a_handler_attaching_none() -> None:
    server = server_connection(max_links_per_session=1)
    client = ClientEnd(server).open()
    session = client.connection.session()
    session.open()
    first = session.sender("one")
    first.target.address = "q"
    first.open()
    client.pump()
    # No link layer: refused as not implemented, and the limit counts it no more.
    assert first.remote_condition is not None
    assert first.remote_condition.name == "amqp:not-implemented"
    second = session.sender("two")
    second.target.address = "q"
    second.open()
    client.pump()
    assert second.remote_condition is not None
    assert second.remote_condition.name == "amqp:not-implemented"
    assert not server.closed


def test_idle_timeout_closes_a_silent_peer() -> None:
    server = server_connection(idle_timeout=2.0)
    ClientEnd(server).open()
    clock = server.clock
    assert isinstance(clock, ManualClock)
    server.tick()
    clock.advance(5.0)
    server.tick()
    output = server.data_to_send()
    assert server.closed
    condition = close_condition(output)
    assert condition is not None and condition[0] == "amqp:resource-limit-exceeded"


def test_events_reach_the_client() -> None:
    server = server_connection()
    client = ClientEnd(server).open()
    assert any(e.type is Event.CONNECTION_REMOTE_OPEN for e in client.events)


class _Opened:
    """A link layer that only records the container id of the open (as the real one reads)."""

    def __init__(self) -> None:
        self.containers: list[str] = []

    def connection_opened(self, container: str, desired: frozenset[str]) -> str | None:
        self.containers.append(container)
        return None

    def link_opened(self, link: object) -> None: ...

    def link_flow(self, link: object) -> None: ...

    def link_closed(self, link: object, *, closed: bool) -> None: ...

    def delivery_updated(self, delivery: object) -> None: ...

    def connection_ended(self) -> None: ...


def test_an_open_whose_container_id_is_not_utf8_is_a_decode_error(caplog) -> None:
    """A fuzzing find: proton's binding raised UnicodeDecodeError reading the container id, and
    the connection was dropped as an internal error with a traceback in the log."""
    handler = _Opened()
    server = server_connection(handler=handler)  # type: ignore[arg-type]
    client = ClientEnd(server, container="client-\u00e9")
    client.connection.open()
    replaced = False
    with caplog.at_level("ERROR"):
        for _ in range(20):  # move bytes both ways, breaking the container id on its way
            pending = client.transport.pending()
            if pending > 0:
                data = bytes(client.transport.peek(pending))
                client.transport.pop(pending)
                broken = data.replace("client-\u00e9".encode(), b"client-\x83\x83")
                replaced = replaced or broken != data
                server.receive(broken)
            out = server.data_to_send()
            if out and client.transport.capacity() > 0:
                client.transport.push(out)
            if server.closed or (pending <= 0 and not out):
                break
    assert replaced
    assert server.error is not None and server.error[0] == "amqp:decode-error"
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert handler.containers == []


def test_input_as_any_buffer_is_taken_as_bytes_are() -> None:
    """A read may come as a bytearray or a view (an in-memory transport, a shell that
    slices): the engine gets it the same, not only bytes objects."""
    for kind in (bytearray, memoryview):
        server = server_connection()
        client = ClientEnd(server, mechanisms=None)
        client.connection.open()
        session = client.connection.session()
        session.open()
        pending = client.transport.pending()
        data = bytes(client.transport.peek(pending))
        client.transport.pop(pending)
        server.receive(kind(data))  # type: ignore[arg-type]
        assert not server.closed, server.error
        client.transport.push(server.data_to_send())
        client.pump()
        assert server.phase is Phase.OPEN
        assert client.connection.state & Connection.REMOTE_ACTIVE
        assert session.state & session.REMOTE_ACTIVE
