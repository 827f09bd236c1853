"""A JMS durable subscription keeps its selector and noLocal across a broker restart (JMS: they
are part of the subscription), through kittiwake.jms over a socket. After the restart a
consumer asking for another selector or noLocal replaces the subscription (an unsubscribe and a
new one): what it collected before the stop, and after the restart before the consumer came
back, is gone. Before, the definition was kept in memory only, so the first consumer after a
restart redefined the subscription and was sent what the old one had collected."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability_harness import BrokerCtl

from kittiwake.jms import Connection, ConnectionFactory, MessageConsumer, Queue, Session, Topic
from tests.integration.clients import unique


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[BrokerCtl]:
    broker = BrokerCtl(tmp_path / "b", amqp=True)
    try:
        yield broker
    finally:
        broker.shutdown()


def connect(ctl: BrokerCtl, client_id: str | None = None) -> Connection:
    assert ctl.proc is not None
    connection = ConnectionFactory(ctl.proc.amqp_url, client_id=client_id).create_connection()
    connection.start()
    return connection


def send(ctl: BrokerCtl, topic: Topic, *numbers: int) -> None:
    """PERSISTENT sends, each answered once stored (nobody consumes the subscription now) or
    accepted: so they, and every earlier change, are committed."""
    connection = connect(ctl)
    try:
        session = connection.create_session()
        producer = session.create_producer(topic)
        for n in numbers:
            message = session.create_text_message(str(n))
            message.set_int_property("n", n)
            producer.send(message)
    finally:
        connection.close()


def committed(ctl: BrokerCtl) -> None:
    """Returns once everything the broker did so far is on disk: a PERSISTENT send to a queue
    nobody consumes is answered once its commit is, and a commit holds every earlier change
    (store/sqlite.py). Without it a kill -9 soon after the subscription was made can come
    before its definition is written (seen with nothing sent before the stop: the broker
    came back with no subscription at all)."""
    connection = connect(ctl)
    try:
        session = connection.create_session()
        session.create_producer(Queue(unique("committed"))).send(session.create_message())
    finally:
        connection.close()


def received_through(consumer: MessageConsumer, last: str) -> list[str]:
    """Every body the consumer gets, in order, up to and including ``last`` (a message sent
    after everything else: whatever comes before it was there to be sent)."""
    bodies: list[str] = []
    while not bodies or bodies[-1] != last:
        message = consumer.receive(10)
        assert message is not None, f"nothing after {bodies}"
        bodies.append(str(message.get_body()))
    return bodies


def subscribe(
    session: Session, topic: Topic, shared: bool, selector: str | None, no_local: bool = False
) -> MessageConsumer:
    if shared:
        return session.create_shared_durable_consumer(topic, "audit", selector)
    return session.create_durable_consumer(topic, "audit", selector, no_local=no_local)


def stop(ctl: BrokerCtl, how: str) -> None:
    if how == "kill9":
        ctl.kill9()
    else:
        assert ctl.terminate() == 0


def restart_between(
    ctl: BrokerCtl,
    how: str,
    shared: bool,
    before: tuple[str | None, bool],
    after: tuple[str | None, bool],
    sent_before: tuple[int, ...],
    sent_between: tuple[int, ...],
    sent_after: tuple[int, ...],
) -> list[str]:
    """Make the subscription as ``before`` (selector, noLocal) and leave it; ``sent_before``
    from another connection; stop the broker ``how`` and start it; ``sent_between``; a
    consumer asks for the subscription as ``after``; ``sent_after``: what that consumer gets
    through the last of ``sent_after``."""
    topic = Topic(unique("definition") + "/t")
    client_id = unique("durable-client")
    ctl.start()
    connection = connect(ctl, client_id)
    subscribe(connection.create_session(), topic, shared, *before).close()
    connection.close()
    send(ctl, topic, *sent_before)
    committed(ctl)
    stop(ctl, how)
    ctl.start()
    send(ctl, topic, *sent_between)
    connection = connect(ctl, client_id)
    session = connection.create_session()
    consumer = subscribe(session, topic, shared, *after)
    send(ctl, topic, *sent_after)
    try:
        return received_through(consumer, str(sent_after[-1]))
    finally:
        consumer.close()
        session.unsubscribe("audit")
        connection.close()


@pytest.mark.parametrize(
    ("shared", "how"), [(False, "terminate"), (False, "kill9"), (True, "terminate")]
)
def test_another_selector_after_a_restart_replaces_it(
    ctl: BrokerCtl, shared: bool, how: str
) -> None:
    # 0 was collected before the stop and 1 after the restart, both by the old subscription
    # ("n > 1" refuses them, the new "n < 3" would select them): gone with it.
    got = restart_between(
        ctl, how, shared, ("n > 1", False), ("n < 3", False), (0,), (1,), (5, 2)
    )
    assert got == ["2"]


def test_the_same_selector_after_a_restart_resumes_it(ctl: BrokerCtl) -> None:
    got = restart_between(
        ctl, "kill9", False, ("n > 1", False), (" n > 1", False), (0, 5), (1, 6), (7,)
    )
    assert got == ["5", "6", "7"]


def test_dropping_no_local_after_a_restart_replaces_it(ctl: BrokerCtl) -> None:
    # Made with noLocal; after the restart asked for without it: a new subscription, so what
    # the old one collected (1 before the stop, 2 after the restart) is gone.
    got = restart_between(ctl, "terminate", False, (None, True), (None, False), (1,), (2,), (3,))
    assert got == ["3"]


def test_the_selector_applies_where_messages_are_routed_after_a_restart(tmp_path: Path) -> None:
    """The recovered selector refuses messages as they are routed, before any consumer is
    back: with room for 3 in the subscription's queue, were the five refused ones kept, they
    would fill it and the selected 7 behind them would be refused."""
    ctl = BrokerCtl(tmp_path / "b", amqp=True, limits={"max_queued_messages": 3})
    try:
        got = restart_between(
            ctl, "kill9", False, ("n > 1", False), ("n > 1", False), (), (0, 1, 0, 1, 0, 7), (8,)
        )
    finally:
        ctl.shutdown()
    assert got == ["7", "8"]
