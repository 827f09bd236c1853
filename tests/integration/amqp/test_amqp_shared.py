"""JMS 2.0 shared subscriptions over AMQP, attached as Qpid JMS attaches them (source
capabilities ``shared`` and, without a client id, ``global``; link names ``name|volatileN``,
``name|global-volatileN``, ``name``/``name|N`` and ``name|global``/``name|globalN``): one
subscription, many consumers, each message to one of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import Data, Message, Timeout, symbol
from proton.reactor import DurableSubscription, ReceiverOption
from proton.utils import BlockingConnection, BlockingReceiver

from ..clients import unique

Connect = Callable[..., BlockingConnection]


class Capabilities(ReceiverOption):
    """Source capabilities on the attach (what Qpid JMS puts there for a shared consumer)."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def apply(self, receiver: Any) -> None:
        data = receiver.source.capabilities
        data.put_array(False, Data.SYMBOL)
        data.enter()
        for name in self.names:
            data.put_symbol(symbol(name))
        data.exit()


def shared(
    connection: BlockingConnection,
    topic: str,
    link_name: str,
    *,
    global_: bool,
    durable: bool = False,
    credit: int = 10,
) -> BlockingReceiver:
    options: list[Any] = [Capabilities("topic", "shared", *(["global"] if global_ else []))]
    if durable:
        options.append(DurableSubscription())
    return connection.create_receiver(
        f"topic://{topic}", name=link_name, credit=credit, options=options
    )


def take(receiver: BlockingReceiver, *, limit: int = 100) -> list[Any]:
    """Everything the receiver gets until it stays quiet, accepted."""
    got = []
    for _ in range(limit):
        try:
            message = receiver.receive(timeout=0.5)
        except Timeout:
            break
        receiver.accept()
        got.append(message.body)
    return got


def test_a_global_shared_subscription_gives_each_message_to_one_consumer(amqp: Connect) -> None:
    topic = unique("shared") + "/t"
    first = shared(amqp(), topic, "work|global-volatile1", global_=True, credit=3)
    second = shared(amqp(), topic, "work|global-volatile2", global_=True, credit=3)
    sender = amqp().create_sender(f"topic://{topic}")
    for n in range(6):
        sender.send(Message(body=n))
    got_first, got_second = take(first), take(second)
    assert sorted(got_first + got_second) == list(range(6)), "each message once"
    assert got_first and got_second, "both consumers share the work"


def test_a_shared_subscription_of_one_client_id(amqp: Connect) -> None:
    """With a client id, the name is scoped by it: another client id's subscription of the
    same name is another subscription, which gets its own copy."""
    topic = unique("shared") + "/t"
    mine = amqp(container_id=unique("client-a"))
    first = shared(mine, topic, "work|volatile1", global_=False, credit=2)
    second = shared(mine, topic, "work|volatile2", global_=False, credit=2)
    theirs = shared(amqp(container_id=unique("client-b")), topic, "work|volatile1", global_=False)
    sender = amqp().create_sender(f"topic://{topic}")
    for n in range(4):
        sender.send(Message(body=n))
    assert sorted(take(first) + take(second)) == [0, 1, 2, 3]
    assert take(theirs) == [0, 1, 2, 3]


def test_a_shared_volatile_subscription_ends_with_its_last_consumer(amqp: Connect) -> None:
    topic = unique("shared") + "/t"
    connection = amqp()
    first = shared(connection, topic, "gone|global-volatile1", global_=True)
    first.close()
    sender = amqp().create_sender(f"topic://{topic}")
    sender.send(Message(body="nobody"))
    again = shared(connection, topic, "gone|global-volatile2", global_=True)
    sender.send(Message(body="after"))
    assert take(again) == ["after"]


def test_unsettled_messages_go_to_the_other_consumer(amqp: Connect) -> None:
    topic = unique("shared") + "/t"
    leaving_connection = amqp()
    leaving = shared(leaving_connection, topic, "w|global-volatile1", global_=True, credit=1)
    staying = shared(amqp(), topic, "w|global-volatile2", global_=True, credit=0)
    amqp().create_sender(f"topic://{topic}").send(Message(body="held"))
    assert leaving.receive(timeout=5).body == "held"  # never settled
    leaving_connection.close()
    message = staying.receive(timeout=5)
    assert (message.body, message.delivery_count) == ("held", 1)
    staying.accept()


def test_a_shared_durable_subscription_collects_while_nobody_consumes(amqp: Connect) -> None:
    topic = unique("shared") + "/t"
    one, two = amqp(), amqp()
    shared(one, topic, "keep|global", global_=True, durable=True)
    shared(two, topic, "keep|global2", global_=True, durable=True)
    one.close()  # connection drops detach: the subscription stays
    two.close()
    amqp().create_sender(f"topic://{topic}").send(Message(body="kept", durable=True))
    back = shared(amqp(), topic, "keep|global", global_=True, durable=True)
    assert take(back) == ["kept"]


def test_a_shared_durable_subscription_with_a_client_id(amqp: Connect) -> None:
    topic = unique("shared") + "/t"
    client_id = unique("client")
    connection = amqp(container_id=client_id)
    first = shared(connection, topic, "orders", global_=False, durable=True, credit=2)
    second = shared(connection, topic, "orders|2", global_=False, durable=True, credit=2)
    sender = amqp().create_sender(f"topic://{topic}")
    for n in range(4):
        sender.send(Message(body=n, durable=True))
    assert sorted(take(first) + take(second)) == [0, 1, 2, 3]


@pytest.mark.parametrize("durable", [False, True])
def test_a_shared_subscription_with_a_selector(amqp: Connect, durable: bool) -> None:
    from proton.reactor import Selector

    topic = unique("shared") + "/t"
    connection = amqp()
    options: list[Any] = [Capabilities("topic", "shared", "global"), Selector("n > 1")]
    if durable:
        options.append(DurableSubscription())
    name = "sel|global" if durable else "sel|global-volatile1"
    receiver = connection.create_receiver(
        f"topic://{topic}", name=name, credit=10, options=options
    )
    sender = amqp().create_sender(f"topic://{topic}")
    for n in range(4):
        sender.send(Message(body=n, properties={"n": n}))
    assert take(receiver) == [2, 3]


def test_unsubscribing_a_shared_durable_subscription(amqp: Connect) -> None:
    """Qpid JMS unsubscribes by attaching the first link name with no source and closing it;
    refused while a consumer is active."""
    from proton.utils import LinkDetached

    topic = unique("shared") + "/t"
    consumer_connection = amqp()
    shared(consumer_connection, topic, "bye|global", global_=True, durable=True)
    with pytest.raises(LinkDetached, match="resource-locked"):
        amqp().create_receiver(None, name="bye|global")
    consumer_connection.close()
    lookup = amqp().create_receiver(None, name="bye|global")
    lookup.close()  # a close, not a detach: the subscription ends
    amqp().create_sender(f"topic://{topic}").send(Message(body="unseen", durable=True))
    again = shared(amqp(), topic, "bye|global", global_=True, durable=True)
    assert take(again) == []
