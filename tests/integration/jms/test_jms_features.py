"""The JMS features of the seed list through kittiwake.jms, each shown working against the
broker over a socket: selectors, noLocal, transactions across a queue and a topic, temporary
destinations with request/reply, browsing, priority, delivery delay, time to live, the client
id registry, durable subscriptions, message types, JMSContext and the asyncio API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from kittiwake.jms import (
    NON_PERSISTENT,
    BytesMessage,
    Connection,
    ConnectionFactory,
    IllegalStateException,
    InvalidClientIDException,
    InvalidDestinationException,
    InvalidSelectorException,
    JMSException,
    MapMessage,
    Message,
    MessageFormatException,
    MessageNotWriteableException,
    ObjectMessage,
    Queue,
    StreamMessage,
    TextMessage,
    Topic,
    aio,
)

from ..clients import unique, wait_until
from .conftest import drain_queue, texts

Connect = Callable[..., Connection]


def test_topic_selector(connect: Connect) -> None:
    connection = connect()
    topic = Topic(unique("sensors") + "/temperature")
    session = connection.create_session()
    hot = session.create_consumer(topic, "celsius > 30 AND site = 'north'")
    assert hot.get_message_selector() == "celsius > 30 AND site = 'north'"
    producer = session.create_producer(topic)
    for celsius, site in ((20, "north"), (35, "north"), (40, "south"), (31, "north")):
        message = session.create_text_message(f"{celsius}@{site}")
        message.set_int_property("celsius", celsius)
        message.set_string_property("site", site)
        producer.send(message)
    assert texts([hot.receive(5), hot.receive(5)]) == ["35@north", "31@north"]  # type: ignore[list-item]
    assert hot.receive(0.2) is None


def test_invalid_selector_is_refused(connect: Connect) -> None:
    session = connect().create_session()
    with pytest.raises(InvalidSelectorException):
        session.create_consumer(Topic(unique("bad")), "celsius >>> 3")


def test_no_local(connect: Connect) -> None:
    mine = connect()
    theirs = connect()
    topic = Topic(unique("nolocal"))
    session = mine.create_session()
    consumer = session.create_consumer(topic, no_local=True)
    session.create_producer(topic).send(session.create_text_message("own"))
    other = theirs.create_session()
    other.create_producer(topic).send(other.create_text_message("foreign"))
    assert texts([consumer.receive(5)]) == ["foreign"]  # type: ignore[list-item]
    assert consumer.receive(0.2) is None


def test_transaction_across_a_queue_and_a_topic(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("tx-queue"))
    topic = Topic(unique("tx-topic"))
    watcher = connect().create_session()
    topic_consumer = watcher.create_consumer(topic)
    session = connection.create_session(True)
    producer = session.create_producer(None)
    producer.send(session.create_text_message("to-queue"), queue)
    producer.send(session.create_text_message("to-topic"), topic)
    assert topic_consumer.receive(0.3) is None  # nothing visible before commit
    session.rollback()
    producer.send(session.create_text_message("to-queue-2"), queue)
    producer.send(session.create_text_message("to-topic-2"), topic)
    session.commit()
    assert texts([topic_consumer.receive(5)]) == ["to-topic-2"]  # type: ignore[list-item]
    assert texts(drain_queue(connection, queue)) == ["to-queue-2"]


def test_temporary_queue_request_reply(connect: Connect) -> None:
    server_connection = connect()
    service = Queue(unique("service"))
    server = server_connection.create_session()
    requests = server.create_consumer(service)
    replies = server.create_producer(None)

    def answer(message: object) -> None:
        assert isinstance(message, TextMessage)
        reply = server.create_text_message((message.get_text() or "").upper())
        reply.set_jms_correlation_id(message.get_jms_message_id())
        assert message.get_jms_reply_to() is not None
        replies.send(reply, message.get_jms_reply_to())

    requests.set_message_listener(answer)
    client = connect().create_session()
    reply_queue = client.create_temporary_queue()
    request = client.create_text_message("ping")
    request.set_jms_reply_to(reply_queue)
    client.create_producer(service).send(request)
    replies_consumer = client.create_consumer(reply_queue)
    reply = replies_consumer.receive(5)
    assert reply is not None and reply.get_body() == "PING"
    assert reply.get_jms_correlation_id() == request.get_jms_message_id()
    replies_consumer.close()  # JMS refuses to delete it while a consumer uses it
    reply_queue.delete()
    with pytest.raises(InvalidDestinationException):
        client.create_producer(reply_queue)


def test_temporary_queue_dies_with_its_connection(connect: Connect) -> None:
    owner = connect()
    temporary = owner.create_session().create_temporary_queue()
    owner.close()
    with pytest.raises(InvalidDestinationException):
        connect().create_session().create_producer(temporary)


def test_browser_leaves_messages(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("browse"))
    session = connection.create_session()
    producer = session.create_producer(queue)
    for body, colour in (("a", "red"), ("b", "blue"), ("c", "red")):
        message = session.create_text_message(body)
        message.set_string_property("colour", colour)
        producer.send(message)
    assert texts(session.create_browser(queue).get_enumeration()) == ["a", "b", "c"]
    assert texts(session.create_browser(queue, "colour = 'red'").get_enumeration()) == ["a", "c"]
    assert texts(drain_queue(connection, queue)) == ["a", "b", "c"]


def test_priority_orders_a_queue(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("priority"))
    session = connection.create_session()
    producer = session.create_producer(queue)
    for body, priority in (("low", 1), ("normal", 4), ("high", 9)):
        producer.send(session.create_text_message(body), priority=priority)
    received = drain_queue(connection, queue)
    assert texts(received) == ["high", "normal", "low"]
    assert [m.get_jms_priority() for m in received] == [9, 4, 1]


def test_delivery_delay(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("delay"))
    session = connection.create_session()
    consumer = session.create_consumer(queue)
    producer = session.create_producer(queue)
    producer.set_delivery_delay(700)
    sent = time.time()
    producer.send(session.create_text_message("later"))
    assert consumer.receive_no_wait() is None
    message = consumer.receive(10)
    arrived = time.time()
    assert message is not None and message.get_body() == "later"
    # Never before its delivery time (the clock's resolution aside).
    assert arrived - sent >= 0.65
    assert message.get_jms_delivery_time() >= message.get_jms_timestamp() + 700


def test_time_to_live_expires_unconsumed_messages(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("ttl"))
    session = connection.create_session()
    producer = session.create_producer(queue)
    producer.send(session.create_text_message("short"), time_to_live=300)
    producer.send(session.create_text_message("long"))
    browser_session = connection.create_session()

    def only_long_left() -> bool:
        browser = browser_session.create_browser(queue)
        left = texts(browser.get_enumeration())
        browser.close()
        return left == ["long"]

    assert wait_until(only_long_left, 10, interval=0.1)
    received = drain_queue(connection, queue)
    assert texts(received) == ["long"] and received[0].get_jms_expiration() == 0
    # The expired one went to ExpiryQueue (DESIGN.md section 5), its original queue named.
    expired_consumer = connection.create_session().create_consumer(Queue("ExpiryQueue"))

    def ours() -> Message | None:
        message = expired_consumer.receive(0.5)
        if message is not None and message.get_string_property("KW_OriginalQueue") == queue.name:
            return message
        return None

    expired = wait_until(ours, 10, interval=0)
    assert expired is not None


def test_client_id_registry_refuses_a_second_connection(connect: Connect) -> None:
    client_id = unique("jms-client")
    first = connect(client_id=client_id)
    assert first.get_client_id() == client_id
    with pytest.raises(InvalidClientIDException):
        connect(client_id=client_id)
    first.close()
    assert connect(client_id=client_id).get_client_id() == client_id


def test_durable_subscription_keeps_messages_while_away(connect: Connect) -> None:
    client_id = unique("durable-client")
    topic = Topic(unique("durable"))
    connection = connect(client_id=client_id)
    session = connection.create_session()
    subscriber = session.create_durable_consumer(topic, "audit")
    subscriber.close()
    publisher = connect().create_session()
    publisher.create_producer(topic).send(publisher.create_text_message("while away"))
    again = session.create_durable_consumer(topic, "audit")
    assert texts([again.receive(5)]) == ["while away"]  # type: ignore[list-item]
    again.close()
    session.unsubscribe("audit")
    publisher.create_producer(topic).send(publisher.create_text_message("after unsubscribe"))
    fresh = session.create_durable_consumer(topic, "audit")
    assert fresh.receive(0.3) is None


@pytest.mark.parametrize("where", ["same session", "another session"])
def test_unsubscribing_a_durable_subscription_with_an_active_consumer_is_refused(
    connect: Connect, where: str
) -> None:
    """JMS: erroneous while a consumer is active; the broker refuses it too (a consumer on
    another session is not in the refusing session's own list), and the subscription goes
    on as it was."""
    topic = Topic(unique("unsubscribe-active"))
    connection = connect(client_id=unique("durable-client"))
    session = connection.create_session()
    active = session.create_durable_consumer(topic, "audit")
    unsubscriber = session if where == "same session" else connection.create_session()
    with pytest.raises(IllegalStateException, match="active consumer"):
        unsubscriber.unsubscribe("audit")
    publisher = connect().create_session()
    publisher.create_producer(topic).send(publisher.create_text_message("still subscribed"))
    assert texts([active.receive(5)]) == ["still subscribed"]  # type: ignore[list-item]
    active.close()
    publisher.create_producer(topic).send(publisher.create_text_message("while away"))
    again = session.create_durable_consumer(topic, "audit")
    assert texts([again.receive(5)]) == ["while away"]  # type: ignore[list-item]
    again.close()
    unsubscriber.unsubscribe("audit")  # with no active consumer: done


def test_unsubscribing_a_global_shared_durable_subscription_another_connection_uses_is_refused(
    connect: Connect,
) -> None:
    """Without a client id the subscription is global: the broker refuses the unsubscribe
    while another connection's consumer is active, and the subscription goes on."""
    topic, name = Topic(unique("unsubscribe-global")), unique("sub")
    active = connect().create_session().create_shared_durable_consumer(topic, name)
    unsubscriber = connect().create_session()
    with pytest.raises(IllegalStateException, match="active consumer"):
        unsubscriber.unsubscribe(name)
    publisher = connect().create_session()
    publisher.create_producer(topic).send(publisher.create_text_message("still subscribed"))
    assert texts([active.receive(5)]) == ["still subscribed"]  # type: ignore[list-item]
    active.close()
    unsubscriber.unsubscribe(name)


def test_a_refused_second_durable_consumer_leaves_the_first_one_working(
    connect: Connect,
) -> None:
    """The broker refuses a second consumer of the subscription (from another session of the
    same connection, so a link of the same name); the first one keeps receiving."""
    topic = Topic(unique("durable-twice"))
    connection = connect(client_id=unique("durable-client"))
    active = connection.create_session().create_durable_consumer(topic, "audit")
    with pytest.raises(JMSException, match="active consumer"):
        connection.create_session().create_durable_consumer(topic, "audit")
    publisher = connect().create_session()
    publisher.create_producer(topic).send(publisher.create_text_message("still subscribed"))
    assert texts([active.receive(5)]) == ["still subscribed"]  # type: ignore[list-item]


def test_message_types_round_trip(connect: Connect) -> None:
    connection = connect(allow_pickle=True)
    queue = Queue(unique("types"))
    session = connection.create_session()
    producer = session.create_producer(queue)
    text = session.create_text_message("text")
    text.set_byte_property("b", 7)
    text.set_double_property("d", 2.5)
    text.set_boolean_property("flag", True)
    data = session.create_bytes_message()
    data.write_int(42)
    data.write_utf("utf")
    mapping = session.create_map_message()
    mapping.set_int("count", 3)
    mapping.set_string("name", "kittiwake")
    stream = session.create_stream_message()
    stream.write_short(12)
    stream.write_string("34")
    stream.write_boolean(True)
    obj = session.create_object_message({"nested": [1, 2]})
    for message in (text, data, mapping, stream, obj):
        producer.send(message)
    consumer = session.create_consumer(queue)
    got_text, got_bytes, got_map, got_stream, got_obj = (consumer.receive(5) for _ in range(5))
    assert isinstance(got_text, TextMessage) and got_text.get_text() == "text"
    # The JMS conversion table: byte widens, double reads as string, string parses.
    assert got_text.get_long_property("b") == 7
    assert got_text.get_string_property("d") == "2.5"
    assert got_text.get_string_property("flag") == "true"
    with pytest.raises(MessageFormatException):
        got_text.get_int_property("d")
    with pytest.raises(MessageNotWriteableException):
        got_text.set_int_property("late", 1)
    with pytest.raises(MessageNotWriteableException):
        got_text.set_text("changed")
    assert isinstance(got_bytes, BytesMessage)
    assert got_bytes.read_int() == 42 and got_bytes.read_utf() == "utf"
    assert isinstance(got_map, MapMessage)
    assert got_map.get_long("count") == 3 and got_map.get_string("count") == "3"
    assert got_map.get_string("name") == "kittiwake"
    assert isinstance(got_stream, StreamMessage)
    assert got_stream.read_int() == 12
    assert got_stream.read_long() == 34  # a string item parses
    assert got_stream.read_string() == "true"
    assert isinstance(got_obj, ObjectMessage) and got_obj.get_object() == {"nested": [1, 2]}


def test_object_message_needs_the_pickle_opt_in(connect: Connect) -> None:
    queue = Queue(unique("pickle"))
    trusting = connect(allow_pickle=True).create_session()
    trusting.create_producer(queue).send(trusting.create_object_message([1, 2, 3]))
    careful = connect().create_session()
    message = careful.create_consumer(queue).receive(5)
    assert isinstance(message, ObjectMessage)
    with pytest.raises(MessageFormatException):
        message.get_object()
    with pytest.raises(MessageFormatException):
        careful.create_producer(queue).send(careful.create_object_message("x"))


def test_non_persistent_and_headers(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("headers"))
    session = connection.create_session()
    producer = session.create_producer(queue)
    producer.set_delivery_mode(NON_PERSISTENT)
    message = session.create_text_message("np")
    message.set_jms_type("greeting")
    message.set_string_property("JMSXGroupID", "g1")
    producer.send(message)
    received = drain_queue(connection, queue)[0]
    assert received.get_jms_delivery_mode() == NON_PERSISTENT
    assert received.get_jms_type() == "greeting"
    assert received.get_string_property("JMSXGroupID") == "g1"
    assert received.get_jms_destination() == queue
    assert received.get_jms_message_id() == message.get_jms_message_id()


def test_jms_context(jms_url: str) -> None:
    queue = Queue(unique("context"))
    with ConnectionFactory(jms_url).create_context() as context:
        context.create_producer().set_property("kind", "demo").send(queue, "simple")
        consumer = context.create_consumer(queue)
        assert consumer.receive_body(5) == "simple"


def test_jms_context_bodies_and_message_factories(jms_url: str) -> None:
    """send(destination, body) makes the JMS message type of its body; the context has every
    message factory a session has (JMS 2.0)."""
    queue = Queue(unique("context-bodies"))
    with ConnectionFactory(jms_url).create_context() as context:
        producer = context.create_producer().set_priority(7).set_property("n", 3)
        producer.send(queue, b"\x01\x02").send(queue, {"k": 1}).send(queue, None)
        stream = context.create_stream_message()
        stream.write_int(5)
        producer.send(queue, stream)
        consumer = context.create_consumer(queue)
        got = [consumer.receive(5) for _ in range(4)]
    assert [type(m).__name__ for m in got] == [
        "BytesMessage",
        "MapMessage",
        "Message",
        "StreamMessage",
    ]
    assert all(m is not None and m.get_long_property("n") == 3 for m in got)
    assert all(m is not None and m.get_jms_priority() == 7 for m in got)


def test_connection_refused_port_raises_jms_exception() -> None:
    from ..brokerproc import refusing_port

    with refusing_port() as port, pytest.raises(JMSException):
        ConnectionFactory(f"amqp://127.0.0.1:{port}", timeout=2).create_connection()


def test_asyncio_api(jms_url: str) -> None:
    queue = Queue(unique("asyncio"))

    async def scenario() -> list[str | None]:
        factory = aio.ConnectionFactory(jms_url)
        async with await factory.create_connection() as connection:
            session = await connection.create_session(True)
            producer = await session.create_producer(queue)
            async with session.transaction():
                for body in ("1", "2", "3"):
                    await producer.send(session.create_text_message(body))
            await connection.start()
            consumer = await session.create_consumer(queue)
            got: list[str | None] = []
            async with session.transaction():
                async for message in consumer:
                    got.append(message.get_body())
                    if len(got) == 3:
                        break
            return got

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == ["1", "2", "3"]


def test_poison_message_goes_to_the_dead_letter_queue(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("poison"))
    session = connection.create_session()
    consumer = session.create_consumer(queue)
    counts: list[int] = []

    def listener(message: Message) -> None:
        counts.append(message.delivery_count)
        raise RuntimeError("always fails")

    consumer.set_message_listener(listener)
    marker = session.create_text_message("poison")
    marker.set_string_property("poison_id", queue.name)
    session.create_producer(queue).send(marker)
    dead_session = connection.create_session()
    dead = dead_session.create_consumer(Queue("DLQ"), None)

    def dead_lettered() -> Message | None:
        message = dead.receive(0.5)
        if message is not None and message.get_string_property("poison_id") == queue.name:
            return message
        return None

    found = wait_until(dead_lettered, 15, interval=0)
    assert found is not None
    # The dead-lettered copy keeps its JMS type and body: a TextMessage with its text.
    assert isinstance(found, TextMessage)
    assert found.get_text() == "poison"
    # max_delivery_attempts is 5 for this broker: counts 1..5, then the DLQ.
    assert counts == [1, 2, 3, 4, 5]


def test_queue_consumer_selector(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("queue-selector"))
    session = connection.create_session()
    producer = session.create_producer(queue)
    for body, colour in (("a", "red"), ("b", "blue")):
        message = session.create_text_message(body)
        message.set_string_property("colour", colour)
        producer.send(message)
    blue = session.create_consumer(queue, "colour = 'blue'")
    assert texts([blue.receive(5)]) == ["b"]  # type: ignore[list-item]


def test_shared_subscription_splits_messages(connect: Connect) -> None:
    topic = Topic(unique("shared"))
    first = connect().create_session().create_shared_consumer(topic, "workers")
    second = connect().create_session().create_shared_consumer(topic, "workers")
    publisher = connect().create_session()
    producer = publisher.create_producer(topic)
    for body in ("1", "2"):
        producer.send(publisher.create_text_message(body))
    got = [m for m in (first.receive(2), second.receive(2)) if m is not None]
    got += [m for m in (first.receive(0.2), second.receive(0.2)) if m is not None]
    assert sorted(texts(got)) == ["1", "2"]  # type: ignore[type-var]


def test_message_that_expires_while_prefetched_is_not_delivered(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("expire-prefetched"))
    session = connection.create_session()
    consumer = session.create_consumer(queue)
    message = session.create_text_message("stale")
    session.create_producer(queue).send(message, time_to_live=400)
    assert wait_until(lambda: len(consumer.core.buffer) == 1, 5), "never prefetched"
    assert wait_until(lambda: time.time() * 1000 > message.get_jms_expiration() + 50, 5)
    assert consumer.receive(0.3) is None
    assert drain_queue(connection, queue) == []


def test_large_bytes_message_spans_frames(connect: Connect) -> None:
    connection = connect()
    queue = Queue(unique("large"))
    session = connection.create_session()
    payload = bytes(range(256)) * 2048  # 512 KiB: many AMQP frames
    message = session.create_bytes_message()
    message.write_bytes(payload)
    session.create_producer(queue).send(message)
    received = session.create_consumer(queue).receive(10)
    assert isinstance(received, BytesMessage) and received.read_bytes() == payload


def test_asyncio_listener(jms_url: str) -> None:
    topic = Topic(unique("async-listener"))

    async def scenario() -> list[tuple[str | None, int]]:
        factory = aio.ConnectionFactory(jms_url)
        async with await factory.create_connection() as connection:
            session = await connection.create_session()
            consumer = await session.create_consumer(topic)
            seen: list[tuple[str | None, int]] = []
            done = asyncio.Event()

            async def listener(message: Message) -> None:
                seen.append((message.get_body(), message.delivery_count))
                if len(seen) == 1:
                    raise RuntimeError("first attempt fails")
                done.set()

            consumer.set_message_listener(listener)
            await connection.start()
            producer = await session.create_producer(topic)
            await producer.send(session.create_text_message("event"))
            await asyncio.wait_for(done.wait(), 10)
            return seen

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == [("event", 1), ("event", 2)]
