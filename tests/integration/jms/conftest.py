"""Fixtures for the kittiwake.jms scenarios: one broker process per module with AMQP and MQTT
listeners, and ``jms_url`` to reach it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kittiwake.jms import Connection, ConnectionFactory, Message, Queue

from ..brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def jms_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    sections: dict[str, Any] = {
        "store": {"backend": "memory"},
        "queues": {"max_delivery_attempts": 5},
    }
    process = BrokerProcess(tmp_path_factory.mktemp("jms-broker"), amqp=True, **sections)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def jms_url(jms_broker: BrokerProcess) -> str:
    assert jms_broker.alive(), f"the broker died:\n{jms_broker.log_text()[-5000:]}"
    return jms_broker.amqp_url


@pytest.fixture
def connect(jms_url: str) -> Iterator[Callable[..., Connection]]:
    """``connect(**factory_options)``: a started blocking Connection, closed after the test."""
    made: list[Connection] = []

    def make(start: bool = True, **options: Any) -> Connection:
        connection = ConnectionFactory(jms_url, **options).create_connection()
        made.append(connection)
        if start:
            connection.start()
        return connection

    yield make
    for connection in made:
        with contextlib.suppress(Exception):  # teardown must reach every connection
            connection.close()


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
