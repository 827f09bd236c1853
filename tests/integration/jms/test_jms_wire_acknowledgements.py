"""What kittiwake.jms writes to acknowledge, read off the wire (proton's frame trace of the
client's own connection): AUTO_ACKNOWLEDGE's settled disposition is written
before receive() returns (by the receiving thread, or by the loop when that thread cannot),
one per message (what its promise costs the broker: a read per
message); DUPS_OK_ACKNOWLEDGE writes one frame covering a range of messages."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from proton import Transport

from kittiwake.jms import (
    AUTO_ACKNOWLEDGE,
    CLIENT_ACKNOWLEDGE,
    DUPS_OK_ACKNOWLEDGE,
    Connection,
    MessageConsumer,
    Queue,
    TextMessage,
)
from kittiwake.jms.aio import AcknowledgeMode

from ..clients import unique
from .conftest import drain_queue

Connect = Callable[..., Connection]

# An outgoing settled accepted disposition as proton's frame trace prints it.
DISPOSITION = re.compile(
    r"-> @disposition\(21\) \[role=true, first=(0x[0-9a-f]+)(?:, last=(0x[0-9a-f]+))?, "
    r"settled=true, state=@accepted"
)


class Wire:
    """The dispositions this process wrote so far, as (first, last) delivery ids.

    Read only while the connection's loop writes nothing that matters: pytest's capfd
    loses a line written to fd 2 between its read and its truncate, so a frame the loop
    writes while the test polls can vanish (see ``written_by_now``)."""

    def __init__(self, capfd: pytest.CaptureFixture[str]) -> None:
        self.capfd = capfd
        self.seen: list[tuple[int, int]] = []

    def dispositions(self) -> list[tuple[int, int]]:
        for match in DISPOSITION.finditer(self.capfd.readouterr().err):
            first = int(match.group(1), 16)
            self.seen.append((first, int(match.group(2) or match.group(1), 16)))
        return self.seen


def fill(connection: Connection, queue: Queue, count: int) -> None:
    session = connection.create_session()
    producer = session.create_producer(queue)
    for i in range(count):
        producer.send(session.create_text_message(str(i)))
    session.close()


def traced_consumer(
    connect: Connect, mode: AcknowledgeMode, queue: Queue
) -> tuple[Connection, MessageConsumer]:
    """A consumer (prefetch 10) on a connection of its own whose frames proton traces."""
    connection = connect(prefetch=10)
    engine = connection.core.engine
    connection.io.call(lambda: engine.transport.trace(Transport.TRACE_FRM))
    return connection, connection.create_session(False, mode).create_consumer(queue)


def written_by_now(connection: Connection) -> None:
    """Returns once the connection's loop has run what the caller's thread handed it so far
    (receive()'s posted hand-overs run in the order they were scheduled, before this), so
    the frames they write are traced before the test reads them."""
    connection.io.call_soon(lambda: None)


def test_auto_acknowledge_writes_each_disposition_before_receive_returns(
    connect: Connect, capfd: pytest.CaptureFixture[str]
) -> None:
    queue = Queue(unique("wire-auto"))
    fill(connect(), queue, 5)
    _, consumer = traced_consumer(connect, AUTO_ACKNOWLEDGE, queue)
    wire = Wire(capfd)
    wire.dispositions()  # the handshake's frames
    wire.seen.clear()
    for i in range(5):
        message = consumer.receive(5)
        assert isinstance(message, TextMessage) and message.get_text() == str(i)
        # On the wire as receive() returns: this message's own, one frame each.
        assert len(wire.dispositions()) == i + 1
        first, last = wire.seen[-1]
        assert first == last == wire.seen[0][0] + i
    assert drain_queue(connect(), queue) == []


def test_auto_acknowledge_the_loop_writes_is_written_before_receive_returns_too(
    connect: Connect, capfd: pytest.CaptureFixture[str]
) -> None:
    """Where receive() cannot write its acknowledgement to the socket itself (vm://'s pipes,
    or bytes queued ahead of it in the loop's transport), the loop writes it, waited for."""
    queue = Queue(unique("wire-auto-loop"))
    fill(connect(), queue, 3)
    connection, consumer = traced_consumer(connect, AUTO_ACKNOWLEDGE, queue)
    engine = connection.core.engine
    connection.io.call(lambda: setattr(engine, "_fd", None))  # no socket of its own: as vm://
    wire = Wire(capfd)
    wire.dispositions()
    wire.seen.clear()
    for i in range(3):
        message = consumer.receive(5)
        assert isinstance(message, TextMessage) and message.get_text() == str(i)
        assert len(wire.dispositions()) == i + 1
    assert drain_queue(connect(), queue) == []


def test_dups_ok_acknowledges_a_range_in_one_frame(
    connect: Connect, capfd: pytest.CaptureFixture[str]
) -> None:
    queue = Queue(unique("wire-dups-ok"))
    fill(connect(), queue, 5)
    connection, consumer = traced_consumer(connect, DUPS_OK_ACKNOWLEDGE, queue)
    wire = Wire(capfd)
    wire.dispositions()
    wire.seen.clear()
    # prefetch 10: the batch goes out at half of it, after the fifth receive().
    received = [consumer.receive(5) for _ in range(5)]
    assert [m.get_body() if m else None for m in received] == [str(i) for i in range(5)]
    # The batch is written by the loop after the fifth receive() returned: read once it has.
    written_by_now(connection)
    assert len(wire.dispositions()) == 1
    first, last = wire.seen[0]
    assert last - first == 4
    assert drain_queue(connect(), queue) == []


def test_client_acknowledge_settles_what_the_session_consumed_in_one_frame(
    connect: Connect, capfd: pytest.CaptureFixture[str]
) -> None:
    queue = Queue(unique("wire-client"))
    fill(connect(), queue, 5)
    _, consumer = traced_consumer(connect, CLIENT_ACKNOWLEDGE, queue)
    wire = Wire(capfd)
    wire.dispositions()
    wire.seen.clear()
    received = [consumer.receive(5) for _ in range(5)]
    assert [m.get_body() if m else None for m in received] == [str(i) for i in range(5)]
    assert wire.dispositions() == []  # nothing acknowledged yet
    last_message = received[-1]
    assert last_message is not None
    last_message.acknowledge()  # returns once written
    assert len(wire.dispositions()) == 1
    first, last = wire.seen[0]
    assert last - first == 4
    assert drain_queue(connect(), queue) == []
