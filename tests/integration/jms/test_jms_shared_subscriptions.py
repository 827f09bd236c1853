"""JMS 2.0 shared subscriptions through kittiwake.jms, the checks the core makes across
clients (JMS 2.0 section 8.3): while a shared subscription has consumers, one asking for
another topic or selector is refused (JMSException); a durable one nobody consumes from,
asked for with another topic or selector, is replaced (what it held is gone)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kittiwake.jms import Connection, JMSException, Session, Topic

from ..clients import unique
from .conftest import send

Connect = Callable[..., Connection]


@pytest.mark.parametrize("durable", [False, True], ids=["shared", "shared-durable"])
def test_a_second_consumer_must_ask_for_the_same_selector_and_topic(
    connect: Connect, durable: bool
) -> None:
    topic = Topic(unique("shared-check"))
    name = unique("sub")

    def consumer(session: Session, on: Topic, selector: str | None) -> object:
        if durable:
            return session.create_shared_durable_consumer(on, name, selector)
        return session.create_shared_consumer(on, name, selector)

    first = connect().create_session()
    consumer(first, topic, "n > 1")
    other = connect().create_session()
    with pytest.raises(JMSException, match="another topic, selector"):
        consumer(other, topic, "n > 2")
    with pytest.raises(JMSException, match="another topic, selector"):
        consumer(other, topic, None)
    with pytest.raises(JMSException, match="another topic, selector"):
        consumer(other, Topic(unique("elsewhere")), "n > 1")
    same = consumer(other, topic, "n > 1")  # the same definition joins
    assert same is not None
    if durable:
        for session in (first, other):
            session.close()
        connect().create_session().unsubscribe(name)


def test_recreating_an_unused_shared_durable_subscription_with_another_selector_replaces_it(
    connect: Connect,
) -> None:
    topic = Topic(unique("shared-replace"))
    name = unique("sub")
    session = connect().create_session()
    session.create_shared_durable_consumer(topic, name, "n > 1").close()
    publisher = connect().create_session()
    send(publisher, topic, 5)  # kept for the subscription while nobody consumes
    again = session.create_shared_durable_consumer(topic, name, "n > 1")
    got = again.receive(5)
    assert got is not None and got.get_body() == "5", "same definition: the same subscription"
    again.close()
    send(publisher, topic, 6)
    replaced = session.create_shared_durable_consumer(topic, name, "n > 3")
    assert replaced.receive(0.5) is None, "a new subscription: what the old one held is gone"
    send(publisher, topic, 2, 7)
    got = replaced.receive(5)
    assert got is not None and got.get_body() == "7"
    replaced.close()
    session.unsubscribe(name)
