"""Temporary queues and topics through kittiwake.jms with JMS's lifetime: they belong to the
connection that created them (not the session), ``delete()`` is refused while one of its
consumers uses them, sending to a deleted one fails (InvalidDestinationException), and only
the creating connection deletes one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from kittiwake.jms import (
    Connection,
    IllegalStateException,
    InvalidDestinationException,
    TemporaryQueue,
    TemporaryTopic,
    aio,
)

Connect = Callable[..., Connection]


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_delete_is_refused_while_a_consumer_uses_it(connect: Connect, kind: str) -> None:
    session = connect().create_session()
    temporary: TemporaryQueue | TemporaryTopic = (
        session.create_temporary_queue() if kind == "queue" else session.create_temporary_topic()
    )
    consumer = session.create_consumer(temporary)
    with pytest.raises(IllegalStateException, match="has a consumer"):
        temporary.delete()
    session.create_producer(temporary).send(session.create_text_message("still here"))
    got = consumer.receive(5)
    assert got is not None and got.get_body() == "still here"
    consumer.close()
    temporary.delete()
    temporary.delete()  # deleting it again does nothing
    with pytest.raises(InvalidDestinationException):
        session.create_producer(temporary)
    with pytest.raises(InvalidDestinationException):
        session.create_consumer(temporary)


def test_it_belongs_to_the_connection_not_the_session(connect: Connect) -> None:
    connection = connect()
    making = connection.create_session()
    temporary = making.create_temporary_queue()
    making.close()
    session = connection.create_session()
    session.create_producer(temporary).send(session.create_text_message("after close"))
    got = session.create_consumer(temporary).receive(5)
    assert got is not None and got.get_body() == "after close"


def test_only_its_connection_deletes_it(connect: Connect) -> None:
    owner = connect()
    owning = owner.create_session()
    temporary = owning.create_temporary_queue()
    request = owning.create_text_message("reply here")
    request.set_jms_reply_to(temporary)
    other = connect().create_session()
    queue = other.create_queue(f"requests-{id(request)}")
    owning.create_producer(queue).send(request)
    received = other.create_consumer(queue).receive(5)
    assert received is not None
    reply_to = received.get_jms_reply_to()
    assert isinstance(reply_to, TemporaryQueue) and reply_to == temporary
    with pytest.raises(IllegalStateException, match="only the connection"):
        reply_to.delete()
    owner.close()
    with pytest.raises(IllegalStateException, match="closed"):
        temporary.delete()


def test_asyncio_delete(jms_url: str) -> None:
    async def scenario() -> None:
        async with await aio.ConnectionFactory(jms_url).create_connection() as connection:
            session = await connection.create_session()
            temporary = await session.create_temporary_topic()
            consumer = await session.create_consumer(temporary)
            with pytest.raises(IllegalStateException):
                await temporary.delete_async()
            with pytest.raises(IllegalStateException, match="delete_async"):
                temporary.delete()  # the blocking call is the blocking API's
            await consumer.close()
            await temporary.delete_async()
            with pytest.raises(InvalidDestinationException):
                await session.create_producer(temporary)

    asyncio.run(scenario())
