"""A durable subscription's selector and noLocal, through kittiwake.jms over a socket, where
they differ from a plain subscription's: the subscription outlives its consumers' connections,
so noLocal is about the client identifier (JMS 2.0: messages published by any connection with
the subscription's client identifier are not added to it), and what the selector refuses is
never kept for a consumer to come."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kittiwake.jms import Connection, ConnectionFactory, Topic

from ..brokerproc import BrokerProcess, closing_all, live_amqp_url
from ..clients import unique
from .conftest import received, send

Connect = Callable[..., Connection]


def test_no_local_leaves_out_what_its_client_id_published_on_an_earlier_connection(
    connect: Connect,
) -> None:
    topic = Topic(unique("durable-nolocal"))
    client_id = unique("durable-client")
    first = connect(client_id=client_id)
    session = first.create_session()
    session.create_durable_consumer(topic, "audit", None, no_local=True).close()
    send(session, topic, 1)  # its own client id's, while no consumer is attached
    first.close()
    send(connect().create_session(), topic, 2)  # another client's
    again = connect(client_id=client_id)
    session = again.create_session()
    send(session, topic, 3)  # its own again, on the new connection
    consumer = session.create_durable_consumer(topic, "audit", None, no_local=True)
    send(connect().create_session(), topic, 4)
    assert received(consumer) == ["2", "4"]
    consumer.close()
    session.unsubscribe("audit")


@pytest.fixture
def small_queues(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker whose subscription queues hold 3 messages (refusing new ones past that)."""
    process = BrokerProcess(
        tmp_path / "broker",
        amqp=True,
        store={"backend": "memory"},
        limits={"max_queued_messages": 3, "queue_full_policy": "reject_new"},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.mark.parametrize("shared", [False, True], ids=["unshared", "shared"])
def test_what_the_selector_refuses_is_not_kept_while_nobody_consumes(
    small_queues: BrokerProcess, shared: bool
) -> None:
    """Were refused messages queued for the absent consumer, they would fill the queue's
    three places and the selected message after them would be refused (reject_new)."""
    url = live_amqp_url(small_queues)
    with closing_all(
        lambda **options: ConnectionFactory(url, **options).create_connection()
    ) as connect:
        topic = Topic(unique("durable-selector"))
        subscriber = connect(client_id=unique("durable-client"))
        subscriber.start()
        session = subscriber.create_session()
        create = session.create_shared_durable_consumer if shared else (
            session.create_durable_consumer
        )
        create(topic, "audit", "n > 1").close()
        send(connect().create_session(), topic, 0, 1, 0, 1, 0, 7)
        consumer = create(topic, "audit", "n > 1")
        assert received(consumer) == ["7"]
        consumer.close()
        session.unsubscribe("audit")
