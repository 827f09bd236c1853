"""Queue settings per name pattern (DESIGN.md section 5), over sockets with python-qpid-proton
and kittiwake.jms: queues that must be declared, and dead-letter queues and delivery attempts
chosen by the first pattern matching a queue's name."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection, LinkDetached

from kittiwake.jms import ConnectionFactory, InvalidDestinationException, Queue

from ..brokerproc import BrokerProcess
from .test_amqp_queues import modified_failed

QUEUES = {
    "auto_create": False,
    "declared": ["orders/eu"],
    "max_delivery_attempts": 5,
    "patterns": [
        {"match": "orders/#", "max_delivery_attempts": 2, "dead_letter_queue": "DLQ.{queue}"},
        {"match": "scratch/+", "auto_create": True},
        # Dead-letter queues are queues too: they must be creatable where they are needed.
        {"match": "DLQ.orders/#", "auto_create": True},
    ],
}


@pytest.fixture
def settled_broker(broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker(amqp=True, queues=QUEUES)


@pytest.fixture
def connect(settled_broker: BrokerProcess) -> Iterator[Callable[[], BlockingConnection]]:
    opened: list[BlockingConnection] = []

    def open_one() -> BlockingConnection:
        connection = BlockingConnection(settled_broker.amqp_url, timeout=10)
        opened.append(connection)
        return connection

    yield open_one
    for connection in opened:
        connection.close()


def test_only_declared_queues_and_matching_patterns_exist(
    connect: Callable[[], BlockingConnection], settled_broker: BrokerProcess
) -> None:
    connection = connect()
    connection.create_sender("orders/eu").send(Message(body="declared", durable=True))
    connection.create_sender("scratch/1").send(Message(body="created on first use"))
    for use in (connection.create_sender, connection.create_receiver):
        with pytest.raises(LinkDetached, match="not-found"):
            use("orders/us")  # matches orders/#, which keeps auto_create = false
    with pytest.raises(LinkDetached, match="not-found"):
        connect().create_sender("elsewhere")
    assert "does not exist" in settled_broker.log_text()
    # kittiwake.jms reports it as JMS does.
    with ConnectionFactory(settled_broker.amqp_url).create_connection() as jms:
        session = jms.create_session()
        with pytest.raises(InvalidDestinationException):
            session.create_producer(Queue("elsewhere"))
    receiver = connect().create_receiver("orders/eu")
    assert receiver.receive(timeout=5).body == "declared"
    receiver.accept()


def test_a_pattern_sets_delivery_attempts_and_the_dead_letter_queue(
    connect: Callable[[], BlockingConnection],
) -> None:
    connection = connect()
    connection.create_sender("orders/eu").send(Message(body="flaky", durable=True))
    receiver = connection.create_receiver("orders/eu")
    for attempt in range(2):  # orders/# allows 2, not [queues]' 5
        assert receiver.receive(timeout=5).delivery_count == attempt
        modified_failed(receiver)
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)
    dead = connection.create_receiver("DLQ.orders/eu")
    letter = dead.receive(timeout=5)
    dead.accept()
    assert letter.body == "flaky"
    assert letter.properties["KW_OriginalQueue"] == "orders/eu"
    assert letter.properties["KW_Reason"] == "maximum delivery attempts reached"
