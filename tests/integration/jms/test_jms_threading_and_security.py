"""JMS's threading rules and security errors through kittiwake.jms: close() from another
thread waits for a running listener, close() from the listener itself is refused, stop()
holds deliveries back, a CompletionListener hears about an asynchronous send; a broker that
refuses anonymous clients or a denied topic answers with JMSSecurityException."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kittiwake.jms import (
    NON_PERSISTENT,
    Connection,
    ConnectionFactory,
    IllegalStateException,
    JMSException,
    JMSSecurityException,
    Message,
    Queue,
    Topic,
)

from ..brokerproc import BrokerProcess
from ..clients import unique
from .conftest import drain_queue

Connect = Callable[..., Connection]


def test_close_from_another_thread_waits_for_the_running_listener(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("listener-close"))
    session = connection.create_session()
    consumer = session.create_consumer(queue)
    entered = threading.Event()
    release = threading.Event()
    finished: list[str] = []

    def listener(message: Message) -> None:
        entered.set()
        assert release.wait(10)
        finished.append(str(message.get_body()))

    consumer.set_message_listener(listener)
    sender = connection.create_session()
    sender.create_producer(queue).send(sender.create_text_message("slow"))
    assert entered.wait(10)
    closer = threading.Thread(target=session.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() returned while the listener was still running"
    release.set()
    closer.join(10)
    assert not closer.is_alive() and finished == ["slow"]
    # AUTO_ACKNOWLEDGE: the listener returned before the close, so it was acknowledged.
    assert drain_queue(connection, queue) == []


def test_closing_the_session_from_its_own_listener_is_refused(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("listener-self-close"))
    session = connection.create_session()
    outcome: list[BaseException] = []
    done = threading.Event()

    def listener(message: Message) -> None:
        try:
            session.close()
        except BaseException as exc:  # recorded for the assertion below
            outcome.append(exc)
        done.set()

    session.create_consumer(queue).set_message_listener(listener)
    sender = connection.create_session()
    sender.create_producer(queue).send(sender.create_text_message("x"))
    assert done.wait(10)
    assert len(outcome) == 1 and isinstance(outcome[0], IllegalStateException)


def test_receive_on_a_consumer_with_a_listener_is_refused(connect: Connect) -> None:
    consumer = connect().create_session().create_consumer(Queue(unique("both")))
    consumer.set_message_listener(lambda message: None)
    with pytest.raises(IllegalStateException):
        consumer.receive_no_wait()


def test_stopped_connection_delivers_nothing_until_started(connect: Connect) -> None:
    connection = connect(start=False)
    queue = Queue(unique("stopped"))
    session = connection.create_session()
    consumer = session.create_consumer(queue)
    session.create_producer(queue).send(session.create_text_message("wait"))
    assert consumer.receive(0.3) is None
    connection.start()
    message = consumer.receive(5)
    assert message is not None and message.get_body() == "wait"


def test_completion_listener_hears_about_an_asynchronous_send(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("completion"))
    session = connection.create_session()
    producer = session.create_producer(queue)
    done = threading.Event()
    results: list[tuple[str | None, JMSException | None]] = []

    def completed(message: Message, error: JMSException | None) -> None:
        results.append((message.get_body(), error))
        done.set()

    producer.send(session.create_text_message("async"), completion_listener=completed)
    assert done.wait(10)
    assert results == [("async", None)]
    assert [m.get_body() for m in drain_queue(connection, queue)] == ["async"]


@pytest.fixture(scope="module")
def guarded_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        Path(tmp_path_factory.mktemp("jms-guarded")),
        amqp=True,
        store={"backend": "memory"},
        auth={"allow_anonymous": False, "publish_deny": ["secret/#"]},
    )
    process.start()
    yield process
    process.stop()


def test_anonymous_connection_refused_with_a_security_exception(
    guarded_broker: BrokerProcess,
) -> None:
    with pytest.raises(JMSSecurityException):
        ConnectionFactory(guarded_broker.amqp_url, timeout=3).create_connection()
    # With credentials (any, while no users are configured) it is let in.
    factory = ConnectionFactory(guarded_broker.amqp_url, username="app", password="secret")
    factory.create_connection().close()


def test_denied_topic_refused_with_a_security_exception(jms_url: str, tmp_path: Path) -> None:
    broker = BrokerProcess(
        tmp_path / "deny",
        amqp=True,
        store={"backend": "memory"},
        auth={"publish_deny": ["secret/#"]},
    ).start()
    try:
        connection = ConnectionFactory(broker.amqp_url).create_connection()
        try:
            session = connection.create_session()
            producer = session.create_producer(None)
            message = session.create_text_message("classified")
            with pytest.raises(JMSSecurityException):
                producer.send(message, Topic("secret/plans"), delivery_mode=NON_PERSISTENT)
                producer.send(message, Topic("secret/plans"))
        finally:
            connection.close()
    finally:
        broker.stop()


def test_close_from_another_thread_ends_a_blocked_receive(connect: Connect) -> None:
    connection = connect()
    consumer = connection.create_session().create_consumer(Queue(unique("blocked")))
    results: list[object] = []
    receiver = threading.Thread(target=lambda: results.append(consumer.receive()))
    receiver.start()
    receiver.join(0.2)
    assert receiver.is_alive()
    connection.close()
    receiver.join(10)
    assert not receiver.is_alive() and results == [None]  # JMS: receive() returns null


def test_stop_waits_for_a_running_listener(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("stop-waits"))
    session = connection.create_session()
    entered = threading.Event()
    release = threading.Event()
    finished: list[str] = []

    def listener(message: Message) -> None:
        entered.set()
        assert release.wait(10)
        finished.append("done")

    session.create_consumer(queue).set_message_listener(listener)
    sender = connection.create_session()
    sender.create_producer(queue).send(sender.create_text_message("x"))
    assert entered.wait(10)
    stopper = threading.Thread(target=connection.stop)
    stopper.start()
    stopper.join(0.3)
    assert stopper.is_alive(), "stop() returned while the listener was still running"
    release.set()
    stopper.join(10)
    assert not stopper.is_alive() and finished == ["done"]
