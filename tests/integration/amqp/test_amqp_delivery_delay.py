"""x-opt-delivery-delay and x-opt-delivery-time as python-qpid-proton sends them (Qpid JMS's
delivery delay on the wire): the message reaches no consumer before its delivery time, whether
the consumer settles (acknowledged) or takes presettled transfers (at most once), on a topic,
a durable topic subscription or a queue, and reaches it once it is due.

"Not before" is a receive bounded well short of the delay; "arrives" is a generous bound."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from proton import Message, Timeout, symbol, timestamp
from proton.reactor import AtMostOnce, DurableSubscription
from proton.utils import BlockingConnection

from ..clients import unique

Connect = Callable[..., BlockingConnection]

DELAY_MS = 1500
NOT_BEFORE_S = 0.8
ARRIVES_WITHIN_S = 10.0


def delayed(body: str, *, absolute: bool = False) -> Message:
    if absolute:
        at = timestamp(int(time.time() * 1000) + DELAY_MS)
        return Message(body=body, annotations={symbol("x-opt-delivery-time"): at})
    return Message(body=body, annotations={symbol("x-opt-delivery-delay"): DELAY_MS})


def assert_delayed(receiver: Any, body: str, *, presettled: bool) -> None:
    with pytest.raises(Timeout):
        receiver.receive(timeout=NOT_BEFORE_S)
    message = receiver.receive(timeout=ARRIVES_WITHIN_S)
    if not presettled:
        receiver.accept()
    assert message.body == body


@pytest.mark.parametrize(
    ("node", "presettled", "durable"),
    [
        ("topic", False, False),
        ("topic", True, False),
        ("topic", False, True),
        ("topic", True, True),
        ("queue", False, False),
        ("queue", True, False),
    ],
    ids=[
        "topic",
        "topic-presettled",
        "durable",
        "durable-presettled",
        "queue",
        "queue-presettled",
    ],
)
def test_delivery_delay_holds_a_message_until_its_time(
    amqp: Connect, node: str, presettled: bool, durable: bool
) -> None:
    address = f"{node}://{unique('delay')}"
    connection = amqp(container_id=unique("delay-client")) if durable else amqp()
    options = [AtMostOnce()] if presettled else []
    if durable:
        options.append(DurableSubscription())
    receiver = connection.create_receiver(address, name=unique("sub"), options=options or None)
    amqp().create_sender(address).send(delayed("later"))
    assert_delayed(receiver, "later", presettled=presettled)


def test_an_absolute_delivery_time_holds_a_message_until_then(amqp: Connect) -> None:
    address = f"topic://{unique('delay-at')}"
    receiver = amqp().create_receiver(address, options=AtMostOnce())
    amqp().create_sender(address).send(delayed("later", absolute=True))
    assert_delayed(receiver, "later", presettled=True)
