"""Fixtures for the kittiwake.jms scenarios: one broker process per module with AMQP and MQTT
listeners, and ``jms_url`` to reach it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kittiwake.jms import (
    Connection,
    ConnectionFactory,
    Message,
    MessageConsumer,
    Queue,
    Session,
    Topic,
)

from ..brokerproc import BrokerProcess, amqp_module_broker, closing_all, live_amqp_url


@pytest.fixture(scope="module")
def jms_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with amqp_module_broker(
        tmp_path_factory.mktemp("jms-broker"), max_delivery_attempts=5
    ) as process:
        yield process


@pytest.fixture
def jms_url(jms_broker: BrokerProcess) -> str:
    return live_amqp_url(jms_broker)


@pytest.fixture
def connect(jms_url: str) -> Iterator[Callable[..., Connection]]:
    """``connect(**factory_options)``: a started blocking Connection, closed after the test."""

    def make(start: bool = True, **options: Any) -> Connection:
        connection = ConnectionFactory(jms_url, **options).create_connection()
        if start:
            connection.start()
        return connection

    with closing_all(make) as tracked:
        yield tracked


def drain_queue(connection: Connection, queue: Queue) -> list[Message]:
    """Everything left on ``queue`` (consumed), to check what an earlier step left behind."""
    session = connection.create_session()
    consumer = session.create_consumer(queue)
    left: list[Message] = []
    while (message := consumer.receive_no_wait()) is not None:
        left.append(message)
    session.close()
    return left


def texts(messages: list[Message]) -> list[str | None]:
    return [m.get_body() for m in messages]


def send(session: Session, topic: Topic, *numbers: int) -> None:
    """Text messages ``str(n)`` with an int property ``n`` (what the selectors test)."""
    producer = session.create_producer(topic)
    for n in numbers:
        message = session.create_text_message(str(n))
        message.set_int_property("n", n)
        producer.send(message)


def received(consumer: MessageConsumer, quiet: float = 0.5) -> list[str]:
    """Everything the consumer gets until nothing more comes for ``quiet`` seconds (the first
    message may take longer: it has 5 seconds)."""
    bodies: list[str] = []
    timeout = 5.0
    for _ in range(100):
        message = consumer.receive(timeout)
        if message is None:
            return bodies
        bodies.append(str(message.get_body()))
        timeout = quiet
    return bodies
