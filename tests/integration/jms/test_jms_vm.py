"""``vm://name``: kittiwake.jms against a broker in this process (kittiwake.embedded), started
on first use and shared by every connection of that name, through in-memory pipes (the AMQP
engine on both sides, no socket)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kittiwake.embedded import embedded_broker
from kittiwake.jms import (
    CLIENT_ACKNOWLEDGE,
    ConnectionFactory,
    InvalidClientIDException,
    Queue,
    Topic,
    aio,
)

from ..clients import unique


@pytest.fixture
def vm_name() -> Iterator[str]:
    name = unique("embedded")
    yield name
    embedded_broker(name).stop()


def test_send_and_receive_in_process(vm_name: str) -> None:
    queue = Queue(unique("q"))
    factory = ConnectionFactory(f"vm://{vm_name}")
    with factory.create_connection() as producing:
        session = producing.create_session()
        session.create_producer(queue).send(session.create_text_message("in process"))
    # Another connection to the same name reaches the same broker (the message waited there).
    with factory.create_connection() as consuming:
        consuming.start()
        session = consuming.create_session(False, CLIENT_ACKNOWLEDGE)
        message = session.create_consumer(queue).receive(5)
        assert message is not None and message.get_body() == "in process"
        message.acknowledge()


def test_the_broker_keeps_its_rules_in_process(vm_name: str) -> None:
    """Selectors, topics and the client-id registry are the broker's, not the transport's."""
    factory = ConnectionFactory(f"vm://{vm_name}", client_id="only-one")
    with factory.create_connection() as connection:
        with pytest.raises(InvalidClientIDException):
            factory.create_connection()
        connection.start()
        session = connection.create_session()
        topic = Topic(unique("t"))
        consumer = session.create_consumer(topic, "n > 1")
        producer = session.create_producer(topic)
        for n in (1, 2):
            message = session.create_text_message(str(n))
            message.set_int_property("n", n)
            producer.send(message)
        got = consumer.receive(5)
        assert got is not None and got.get_body() == "2"
        assert consumer.receive(0.2) is None


def test_asyncio_in_process(vm_name: str) -> None:
    queue = Queue(unique("q"))

    async def scenario() -> str | None:
        factory = aio.ConnectionFactory(f"vm://{vm_name}")
        async with await factory.create_connection() as connection:
            session = await connection.create_session(transacted=True)
            async with session.transaction():
                producer = await session.create_producer(queue)
                await producer.send(session.create_text_message("committed"))
            await connection.start()
            consumer = await session.create_consumer(queue)
            message = await consumer.receive(5)
            await session.commit()
            return None if message is None else message.get_body()  # type: ignore[return-value]

    assert asyncio.run(scenario()) == "committed"


def test_a_name_is_needed() -> None:
    from kittiwake.jms import JMSException

    with pytest.raises(JMSException, match="vm://name"):
        ConnectionFactory("vm://")
