"""Asking for an unshared durable subscription again, through kittiwake.jms over a socket: with
the same topic, selector and noLocal it is resumed with what it collected; with another
selector or noLocal it is replaced, as JMS requires (an unsubscribe and a new subscription):
what the old one collected is gone and the new definition applies."""

from __future__ import annotations

from collections.abc import Callable

from kittiwake.jms import Connection, Session, Topic

from ..clients import unique
from .conftest import received, send

Connect = Callable[..., Connection]


def subscriber(connect: Connect) -> Session:
    return connect(client_id=unique("durable-client")).create_session()


def test_the_same_selector_resumes_it_with_what_it_collected(connect: Connect) -> None:
    topic = Topic(unique("redefine"))
    session = subscriber(connect)
    session.create_durable_consumer(topic, "audit", "n > 1").close()
    send(connect().create_session(), topic, 0, 5)
    again = session.create_durable_consumer(topic, "audit", " n > 1 ")
    assert received(again) == ["5"]
    again.close()
    session.unsubscribe("audit")


def test_another_selector_replaces_it(connect: Connect) -> None:
    topic = Topic(unique("redefine"))
    session = subscriber(connect)
    session.create_durable_consumer(topic, "audit", "n > 1").close()
    publisher = connect().create_session()
    send(publisher, topic, 0, 5)  # collected by the old subscription ("0" not selected by it)
    replaced = session.create_durable_consumer(topic, "audit", "n < 3")
    assert replaced.receive(0.5) is None, "a new subscription: what the old one held is gone"
    send(publisher, topic, 1, 4)
    assert received(replaced) == ["1"], "the new selector applies"
    replaced.close()
    session.unsubscribe("audit")


def test_dropping_the_selector_replaces_it(connect: Connect) -> None:
    topic = Topic(unique("redefine"))
    session = subscriber(connect)
    session.create_durable_consumer(topic, "audit", "n > 1").close()
    publisher = connect().create_session()
    send(publisher, topic, 5)
    replaced = session.create_durable_consumer(topic, "audit")
    assert replaced.receive(0.5) is None
    send(publisher, topic, 0)
    assert received(replaced) == ["0"]
    replaced.close()
    session.unsubscribe("audit")


def test_another_no_local_replaces_it(connect: Connect) -> None:
    topic = Topic(unique("redefine"))
    connection = connect(client_id=unique("durable-client"))
    session = connection.create_session()
    session.create_durable_consumer(topic, "audit").close()
    other = connect().create_session()
    send(other, topic, 1)
    replaced = session.create_durable_consumer(topic, "audit", None, no_local=True)
    assert replaced.receive(0.5) is None, "a new subscription: what the old one held is gone"
    send(connection.create_session(), topic, 2)  # its own connection's: not for it now
    send(other, topic, 3)
    assert received(replaced) == ["3"], "noLocal applies"
    replaced.close()
    session.unsubscribe("audit")


def test_the_same_no_local_resumes_it(connect: Connect) -> None:
    topic = Topic(unique("redefine"))
    session = subscriber(connect)
    session.create_durable_consumer(topic, "audit", None, no_local=True).close()
    send(connect().create_session(), topic, 1)
    again = session.create_durable_consumer(topic, "audit", None, no_local=True)
    assert received(again) == ["1"]
    again.close()
    session.unsubscribe("audit")
