"""Where an AUTO_ACKNOWLEDGE receive() does its work: a prefetched message is taken, settled
and its acknowledgement written on the receiving thread itself, under the lock the
connection's I/O thread holds whenever its loop runs (so never while the loop touches the
engine), without waking that thread; and the threading rules still hold around it (close()
from another thread while a thread receives)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from kittiwake.jms import (
    AUTO_ACKNOWLEDGE,
    Connection,
    JMSException,
    Message,
    Queue,
)
from kittiwake.jms.aio import Received

from ..clients import unique, wait_until
from .conftest import drain_queue, texts

Connect = Callable[..., Connection]


def fill(connection: Connection, queue: Queue, count: int) -> None:
    session = connection.create_session()
    producer = session.create_producer(queue)
    for n in range(count):
        producer.send(session.create_text_message(str(n)))
    session.close()


def test_an_auto_acknowledge_receive_settles_on_the_receiving_thread(connect: Connect) -> None:
    connection = connect(prefetch=10)
    queue = Queue(unique("receive-here"))
    fill(connection, queue, 3)
    session = connection.create_session(False, AUTO_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    core = consumer.core
    assert wait_until(lambda: len(core.buffer) == 3, timeout=10), len(core.buffer)
    hand_over_now = session.core._hand_over_now
    threads: list[tuple[int, bool]] = []
    lock = getattr(connection.io, "lock", None)

    def spy(received: Received) -> None:
        threads.append((threading.get_ident(), lock is not None and lock.locked()))
        hand_over_now(received)

    session.core._hand_over_now = spy  # type: ignore[method-assign]
    received: list[Message | None] = []
    idents: list[int] = []

    def receive_here() -> None:  # not the main thread: see the next test
        idents.append(threading.get_ident())
        received.extend(consumer.receive(5) for _ in range(3))

    receiver = threading.Thread(target=receive_here)
    receiver.start()
    receiver.join(30)
    assert texts(received) == ["0", "1", "2"]  # type: ignore[arg-type]
    # There, under the loop's lock: not a call onto the I/O thread and a wait for it.
    assert threads == [(idents[0], True)] * 3
    assert drain_queue(connect(), queue) == []  # acknowledged


def test_the_main_threads_receive_hands_its_acknowledgement_to_the_io_thread(
    connect: Connect,
) -> None:
    """Python runs signal handlers on the main thread between any two bytecodes: a handler's
    JMS call (close() on SIGTERM) inside the locked region would wait for the loop, which
    waits for the lock. So the main thread's receive() settles on the I/O thread."""
    assert threading.current_thread() is threading.main_thread()
    connection = connect(prefetch=10)
    queue = Queue(unique("receive-main"))
    fill(connection, queue, 2)
    session = connection.create_session(False, AUTO_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    assert wait_until(lambda: len(consumer.core.buffer) == 2, timeout=10)
    hand_over_now = session.core._hand_over_now
    threads: list[int] = []

    def spy(received: Received) -> None:
        threads.append(threading.get_ident())
        hand_over_now(received)

    session.core._hand_over_now = spy  # type: ignore[method-assign]
    received = [consumer.receive(5) for _ in range(2)]
    assert texts(received) == ["0", "1"]  # type: ignore[arg-type]
    assert threads == [connection.io.thread.ident] * 2
    assert drain_queue(connect(), queue) == []  # acknowledged


def test_a_receive_waits_while_the_loop_runs(connect: Connect) -> None:
    """The loop holds the lock while it runs: a receive() of a prefetched message touches
    the engine only once the loop is back waiting for I/O."""
    connection = connect(prefetch=10)
    queue = Queue(unique("receive-waits"))
    fill(connection, queue, 1)
    consumer = connection.create_session(False, AUTO_ACKNOWLEDGE).create_consumer(queue)
    assert wait_until(lambda: len(consumer.core.buffer) == 1, timeout=10)
    running = threading.Event()
    release = threading.Event()

    def busy() -> None:
        running.set()
        release.wait(10)

    connection.io.loop.call_soon_threadsafe(busy)
    assert running.wait(10)
    got: list[Message | None] = []
    receiver = threading.Thread(target=lambda: got.append(consumer.receive(5)))
    receiver.start()
    receiver.join(0.3)
    assert receiver.is_alive(), "receive() touched the engine while the loop was running"
    release.set()
    receiver.join(10)
    assert not receiver.is_alive() and texts(got) == ["0"]  # type: ignore[arg-type]
    assert drain_queue(connect(), queue) == []


def test_close_from_another_thread_while_a_thread_receives_prefetched_messages(
    connect: Connect,
) -> None:
    """A thread takes prefetched messages as fast as it can while another closes the
    connection: the receiver ends (None, or the closed connection's exception), nothing
    hangs, and no message is lost. Only the message in flight at the close may come back
    (AUTO acknowledges as receive() returns; one returned while the connection closed may
    not have been written)."""
    count = 300
    queue = Queue(unique("close-while-receiving"))
    fill(connect(), queue, count)
    connection = connect(prefetch=count)
    consumer = connection.create_session(False, AUTO_ACKNOWLEDGE).create_consumer(queue)
    assert wait_until(lambda: len(consumer.core.buffer) == count, timeout=10)
    got: list[str] = []
    ended: list[str] = []

    def receive_all() -> None:
        try:
            while (message := consumer.receive(5)) is not None:
                got.append(str(message.get_body()))
            ended.append("None")
        except (JMSException, RuntimeError) as exc:
            ended.append(type(exc).__name__)

    receiver = threading.Thread(target=receive_all)
    receiver.start()
    assert wait_until(lambda: len(got) >= 10, timeout=10)
    connection.close()
    receiver.join(10)
    assert not receiver.is_alive() and len(ended) == 1
    left = [str(body) for body in texts(drain_queue(connect(), queue))]
    assert sorted(set(got) | set(left), key=int) == [str(n) for n in range(count)]
    assert len(set(got) & set(left)) <= 1
    assert len(got) == len(set(got))
