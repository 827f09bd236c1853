"""Topic subscriptions through kittiwake.jms have a JMS queue's redelivery rules: a listener
that always fails gets a message max_delivery_attempts times (5 for this broker), then it is in
the DLQ with the reason; an expired message goes to ExpiryQueue; an offline durable subscriber
gets what waited in priority order."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kittiwake.jms import Connection, Message, Queue, Session, Topic

from ..clients import unique, wait_until
from .conftest import texts

Connect = Callable[..., Connection]

MAX_ATTEMPTS = 5  # the module broker's max_delivery_attempts (conftest.py)


def find(connection: Connection, queue: str, marker: str) -> Message | None:
    """The message carrying string property ``marker`` = ``marker`` on ``queue`` (shared by
    every test; other messages are consumed on the way), within a bounded wait."""
    consumer = connection.create_session().create_consumer(Queue(queue))

    def ours() -> Message | None:
        message = consumer.receive(0.5)
        if message is not None and message.get_string_property("marker") == marker:
            return message
        return None

    found: Message | None = wait_until(ours, 15, interval=0)
    consumer.close()
    return found


SUBSCRIBE: dict[str, Callable[[Session, Topic], object]] = {
    "plain": lambda session, topic: session.create_consumer(topic),
    "durable": lambda session, topic: session.create_durable_consumer(topic, "poisoned"),
    "shared": lambda session, topic: session.create_shared_consumer(topic, "poisoned"),
    "shared durable": lambda session, topic: session.create_shared_durable_consumer(
        topic, "poisoned"
    ),
}


@pytest.mark.parametrize("kind", list(SUBSCRIBE))
def test_a_listener_that_always_fails_dead_letters_the_message(
    connect: Connect, kind: str
) -> None:
    topic, marker = Topic(unique("poison")), unique("marker")
    connection = connect(client_id=unique("jms-client"))
    session = connection.create_session()
    consumer = SUBSCRIBE[kind](session, topic)
    counts: list[int] = []

    def listener(message: Message) -> None:
        counts.append(message.delivery_count)
        raise RuntimeError("always fails")

    consumer.set_message_listener(listener)  # type: ignore[attr-defined]
    publisher = connect().create_session()
    poison = publisher.create_text_message("poison")
    poison.set_string_property("marker", marker)
    publisher.create_producer(topic).send(poison)
    letter = find(connect(), "DLQ", marker)
    assert letter is not None
    body = letter.get_body()
    assert (body if isinstance(body, str) else bytes(body).decode()) == "poison"
    assert letter.get_string_property("KW_Reason") == "maximum delivery attempts reached"
    assert letter.get_string_property("KW_OriginalDestination") == f"topic://{topic.name}"
    # Counted 1..5, then the DLQ: the sixth attempt never came.
    assert counts == list(range(1, MAX_ATTEMPTS + 1))


def test_an_expired_message_of_a_durable_subscription_goes_to_the_expiry_queue(
    connect: Connect,
) -> None:
    topic, marker, client_id = Topic(unique("ttl")), unique("marker"), unique("jms-client")
    session = connect(client_id=client_id).create_session()
    session.create_durable_consumer(topic, "audit").close()
    publisher = connect().create_session()
    short = publisher.create_text_message("short")
    short.set_string_property("marker", marker)
    publisher.create_producer(topic).send(short, time_to_live=200)
    expires = time.time() + 0.2
    assert wait_until(lambda: time.time() > expires + 0.1, 5)
    again = session.create_durable_consumer(topic, "audit")
    assert again.receive(0.3) is None
    moved = find(connect(), "ExpiryQueue", marker)
    assert moved is not None
    assert moved.get_string_property("KW_Reason") == "expired"
    assert moved.get_string_property("KW_OriginalDestination") == f"topic://{topic.name}"


def test_an_offline_durable_subscriber_gets_priority_order(connect: Connect) -> None:
    topic, client_id = Topic(unique("priority")), unique("jms-client")
    session = connect(client_id=client_id).create_session()
    session.create_durable_consumer(topic, "audit").close()
    publisher = connect().create_session()
    producer = publisher.create_producer(topic)
    for body, priority in (("low", 1), ("high", 9), ("mid", 4)):
        producer.send(publisher.create_text_message(body), priority=priority)
    again = session.create_durable_consumer(topic, "audit")
    received = [again.receive(5) for _ in range(3)]
    assert texts([m for m in received if m is not None]) == ["high", "mid", "low"]
