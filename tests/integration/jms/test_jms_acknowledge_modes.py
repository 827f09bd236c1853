"""Every acknowledgement mode of kittiwake.jms against the broker over a socket: what the
application sees, and what the broker still holds (redelivered, with which count) afterwards."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from kittiwake.jms import (
    AUTO_ACKNOWLEDGE,
    CLIENT_ACKNOWLEDGE,
    DUPS_OK_ACKNOWLEDGE,
    INDIVIDUAL_ACKNOWLEDGE,
    NO_ACKNOWLEDGE,
    NON_PERSISTENT,
    PRE_ACKNOWLEDGE,
    Connection,
    ConnectionFactory,
    Message,
    Queue,
    TextMessage,
    aio,
)

from ..brokerproc import BrokerProcess
from ..clients import unique, wait_until
from .conftest import drain_queue, texts

Connect = Callable[..., Connection]


def fill(connection: Connection, queue: Queue, *bodies: str) -> None:
    session = connection.create_session()
    producer = session.create_producer(queue)
    for body in bodies:
        producer.send(session.create_text_message(body))
    session.close()


def test_auto_acknowledge_receive_consumes(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("auto"))
    fill(connection, queue, "a", "b")
    session = connection.create_session(False, AUTO_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    first = consumer.receive(5)
    second = consumer.receive(5)
    assert isinstance(first, TextMessage) and first.get_text() == "a"
    assert second is not None and second.get_body() == "b"
    assert not first.get_jms_redelivered() and first.get_int_property("JMSXDeliveryCount") == 1
    session.close()
    assert drain_queue(connection, queue) == []


def test_auto_acknowledge_listener_that_raises_gets_the_message_again(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("auto-listener"))
    session = connection.create_session(False, AUTO_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    seen: list[tuple[str | None, bool, int, str]] = []
    done = threading.Event()

    def listener(message: Message) -> None:
        seen.append(
            (
                message.get_body(),
                message.get_jms_redelivered(),
                message.get_int_property("JMSXDeliveryCount"),
                threading.current_thread().name,
            )
        )
        if len(seen) == 1:
            raise RuntimeError("the application failed on its first try")
        done.set()

    consumer.set_message_listener(listener)
    fill(connection, queue, "work")
    assert done.wait(10), seen
    assert [s[:3] for s in seen] == [("work", False, 1), ("work", True, 2)]
    # JMS: a session's listener runs on a thread of its own, not the caller's or the I/O's.
    assert all(s[3].startswith("kittiwake-jms-listener") for s in seen)
    session.close()
    assert drain_queue(connection, queue) == []


def test_client_acknowledge_acknowledges_everything_delivered_so_far(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("client"))
    fill(connection, queue, "1", "2", "3")
    session = connection.create_session(False, CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    received = [consumer.receive(5) for _ in range(3)]
    assert texts([m for m in received if m]) == ["1", "2", "3"]
    assert received[1] is not None
    received[1].acknowledge()  # acknowledges 1, 2 and 3: all the session delivered
    session.close()
    assert drain_queue(connection, queue) == []


def test_client_acknowledge_unacknowledged_come_back_redelivered(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("client-unacked"))
    fill(connection, queue, "1", "2")
    session = connection.create_session(False, CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    assert texts([consumer.receive(5), consumer.receive(5)]) == ["1", "2"]  # type: ignore[list-item]
    session.recover()
    again = [consumer.receive(5), consumer.receive(5)]
    assert texts(again) == ["1", "2"]  # type: ignore[arg-type]
    assert [(m.get_jms_redelivered(), m.delivery_count) for m in again if m] == [
        (True, 2),
        (True, 2),
    ]
    session.close()  # never acknowledged: back on the queue
    left = drain_queue(connection, queue)
    assert texts(left) == ["1", "2"] and all(m.get_jms_redelivered() for m in left)


def test_individual_acknowledge_only_that_message(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("individual"))
    fill(connection, queue, "1", "2", "3")
    session = connection.create_session(False, INDIVIDUAL_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    received = [consumer.receive(5) for _ in range(3)]
    assert received[1] is not None
    received[1].acknowledge()
    session.close()
    left = drain_queue(connection, queue)
    assert texts(left) == ["1", "3"]
    assert all(m.get_jms_redelivered() for m in left)


def test_dups_ok_acknowledges_lazily_and_by_close(connect: Connect) -> None:
    connection = connect(prefetch=10)
    queue = Queue(unique("dups-ok"))
    bodies = [str(i) for i in range(12)]
    fill(connection, queue, *bodies)
    session = connection.create_session(False, DUPS_OK_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    assert texts([consumer.receive(5) for _ in bodies]) == bodies  # type: ignore[misc]
    session.close()  # the batch not yet sent goes out with the close
    assert drain_queue(connection, queue) == []


def test_session_transacted_commit_and_rollback(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("transacted"))
    fill(connection, queue, "1", "2")
    session = connection.create_session(True)
    consumer = session.create_consumer(queue)
    producer = session.create_producer(Queue(queue.name + ".out"))
    assert texts([consumer.receive(5), consumer.receive(5)]) == ["1", "2"]  # type: ignore[list-item]
    producer.send(session.create_text_message("derived"))
    session.rollback()  # the consumed come back counted, the send is dropped
    again = [consumer.receive(5), consumer.receive(5)]
    assert [(m.get_body(), m.get_jms_redelivered(), m.delivery_count) for m in again if m] == [
        ("1", True, 2),
        ("2", True, 2),
    ]
    observer = connect()
    assert drain_queue(observer, Queue(queue.name + ".out")) == []
    producer.send(session.create_text_message("derived"))
    session.commit()
    assert texts(drain_queue(observer, Queue(queue.name + ".out"))) == ["derived"]
    session.close()
    assert drain_queue(observer, queue) == []


def test_pre_acknowledge_listener_failure_loses_the_message(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("pre-ack"))
    session = connection.create_session(False, PRE_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    seen: list[str | None] = []
    done = threading.Event()

    def listener(message: Message) -> None:
        seen.append(message.get_body())
        done.set()
        raise RuntimeError("lost: it was acknowledged before this ran")

    consumer.set_message_listener(listener)
    fill(connection, queue, "once")
    assert done.wait(10)
    session.close()
    assert seen == ["once"]
    assert drain_queue(connection, queue) == []


def test_no_acknowledge_broker_forgets_once_sent(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("no-ack"))
    fill(connection, queue, "gone")
    session = connection.create_session(False, NO_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    message = consumer.receive(5)
    assert message is not None and message.get_body() == "gone"
    session.recover()  # nothing to recover: it was settled on sending
    session.close()
    assert drain_queue(connection, queue) == []


def test_disable_ack_fire_and_forget_both_ways(connect: Connect) -> None:
    connection = connect(disable_ack=True)
    queue = Queue(unique("disable-ack"))
    session = connection.create_session()
    producer = session.create_producer(queue)
    producer.set_delivery_mode(NON_PERSISTENT)
    consumer = session.create_consumer(queue)
    for body in ("x", "y"):
        producer.send(session.create_text_message(body))
    received = [consumer.receive(5), consumer.receive(5)]
    assert texts(received) == ["x", "y"]  # type: ignore[arg-type]
    session.close()
    assert drain_queue(connect(), queue) == []


def test_prefetch_zero_pulls_one_at_a_time(connect: Connect) -> None:
    connection = connect(prefetch=0)
    queue = Queue(unique("prefetch0"))
    session_a = connection.create_session()
    session_b = connection.create_session()
    a = session_a.create_consumer(queue)
    b = session_b.create_consumer(queue)
    assert a.receive_no_wait() is None  # drained: holds no credit afterwards
    fill(connection, queue, "1", "2")
    # With prefetch 0 neither consumer holds a message it has not asked for.
    assert texts([a.receive(5)]) == ["1"]  # type: ignore[list-item]
    assert texts([b.receive(5)]) == ["2"]  # type: ignore[list-item]
    assert a.receive(0.2) is None
    fill(connection, queue, "3")
    assert texts([b.receive(5)]) == ["3"]  # type: ignore[list-item]


def test_prefetch_bounds_unacknowledged_messages(connect: Connect) -> None:
    connection = connect(prefetch=2)
    queue = Queue(unique("prefetch2"))
    fill(connection, queue, "1", "2", "3", "4")
    session = connection.create_session(False, CLIENT_ACKNOWLEDGE)
    greedy = session.create_consumer(queue)
    held = [greedy.receive(5), greedy.receive(5)]
    assert texts(held) == ["1", "2"]  # type: ignore[arg-type]
    # Two unacknowledged: the first consumer gets no more credit, so another one gets the rest.
    other_session = connect(prefetch=2).create_session()
    other = other_session.create_consumer(queue)
    assert texts([other.receive(5), other.receive(5)]) == ["3", "4"]  # type: ignore[list-item]
    assert greedy.receive(0.2) is None


def test_a_closed_session_lets_go_of_the_deliveries_it_never_acknowledged(
    connect: Connect,
) -> None:
    """A received message keeps its delivery's C object (a reference the loop takes and
    lets go): closing the session with messages unacknowledged lets go of them all, and
    the broker has them again."""
    connection = connect()
    queue = Queue(unique("client-released"))
    fill(connection, queue, "1", "2", "3")
    session = connection.create_session(False, CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(queue)
    assert texts([consumer.receive(5), consumer.receive(5)]) == ["1", "2"]  # type: ignore[list-item]
    core = session.core
    held = list(core.unacked) + [r for c in core.consumers for r in c.buffer]
    assert len(held) >= 2 and all(received.delivery is not None for received in held)
    session.close()
    assert [received.delivery for received in held] == [None] * len(held)
    assert texts(drain_queue(connection, queue)) == ["1", "2", "3"]


def test_a_failing_connection_lets_go_of_deliveries_a_receive_takes_meanwhile(
    broker: Callable[..., BrokerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the connection dies, the loop lets go of every prefetched delivery, one C call
    each (each lets the application's thread run): a blocking receive() taking from the
    buffer meanwhile must not break the failure path, whose end tells the exception
    listener. The interleaving is forced: the first release runs a take from the buffer."""
    process = broker(amqp=True, store={"backend": "memory"})
    connection = ConnectionFactory(process.amqp_url, prefetch=100).create_connection()
    heard: list[Exception] = []
    connection.set_exception_listener(heard.append)
    connection.start()
    session = connection.create_session(False, CLIENT_ACKNOWLEDGE)
    queue = Queue(unique("failing"))
    producer = session.create_producer(queue)
    for n in range(20):
        producer.send(TextMessage(f"m{n}"))
    consumer = session.create_consumer(queue)
    core = session.core.consumers[0]
    assert wait_until(lambda: len(core.buffer) == 20, timeout=10), len(core.buffer)
    release = aio.release_delivery
    taken: list[object] = []

    def release_while_receiving(delivery: object) -> None:
        if not taken:
            # What a receive() on the application's thread does while the loop is in C.
            take = threading.Thread(target=lambda: taken.append(core.buffer.popleft()))
            take.start()
            take.join()
        release(delivery)

    monkeypatch.setattr(aio, "release_delivery", release_while_receiving)
    process.kill()
    assert wait_until(lambda: heard, timeout=10), "the exception listener was never told"
    assert taken
    del consumer
    connection.close()
