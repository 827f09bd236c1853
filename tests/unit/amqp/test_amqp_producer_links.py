"""Producer links, driven with bytes alone (a proton client engine, the broker's connection and
link layer, a memory store, no event loop).

A link with a fixed address keeps its topic's verdict (a valid topic name this user may
publish to) instead of judging it again on every transfer, and judges it again when the rules
are reloaded; what can change under the link (a temporary node deleted, a queue gone) is still
checked on every transfer. A read larger than the engine takes at once is pushed in parts."""

from __future__ import annotations

from typing import Any

import pytest
from engine_harness import WiredLinkLayer
from proton import Delivery, Message

from kittiwake.broker.authorization import Permissions
from kittiwake.config import AuthConfig


class Producer(WiredLinkLayer):
    """A broker with one AMQP connection's link layer, and a client sender on it."""

    def __init__(self) -> None:
        super().__init__()
        self.sender: Any = None
        self.sent = 0

    def attach(self, address: str) -> None:
        self.sender = self.session.sender(f"s-{address}")
        self.sender.target.address = address
        self.sender.open()
        self.client.pump()
        assert self.sender.remote_target.address == address, "the attach was refused"

    def send(self) -> Any:
        """One transfer; its outcome (the broker's remote state) once the bytes moved."""
        self.sent += 1
        delivery = self.sender.delivery(b"t%d" % self.sent)
        self.sender.send(Message(body=f"m{self.sent}", durable=False).encode())
        self.sender.advance()
        self.client.pump()
        return delivery.remote_state

    def reload(self, auth: AuthConfig) -> None:
        """New rules, as a SIGHUP gives them to the broker and to every AMQP connection."""
        self.layer.permissions_renewed(self.broker.replace_authorization(auth))


@pytest.fixture
def producer() -> Producer:
    return Producer()


def test_a_fixed_topic_is_judged_once(
    producer: Producer, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    may_publish = Permissions.may_publish

    def counting(self: Permissions, topic: str) -> bool:
        asked.append(topic)
        return may_publish(self, topic)

    monkeypatch.setattr(Permissions, "may_publish", counting)
    producer.attach("topic://verdicts/t")
    outcomes = [producer.send() for _ in range(5)]
    assert outcomes == [Delivery.ACCEPTED] * 5
    assert asked == ["verdicts/t"]


def test_reloaded_rules_judge_the_fixed_topic_again(producer: Producer) -> None:
    producer.attach("topic://verdicts/t")
    assert producer.send() == Delivery.ACCEPTED
    producer.reload(AuthConfig(publish_deny=("verdicts/#",)))
    assert producer.send() == Delivery.REJECTED
    assert producer.send() == Delivery.REJECTED
    producer.reload(AuthConfig())
    assert producer.send() == Delivery.ACCEPTED


def test_a_deleted_temporary_queue_refuses_the_next_transfer(producer: Producer) -> None:
    temporary = producer.temporaries.create(topic=False, owner="another connection")
    producer.attach(temporary.name)
    assert producer.send() == Delivery.ACCEPTED
    producer.temporaries.delete(temporary)
    assert producer.send() == Delivery.REJECTED


def test_a_deleted_temporary_topic_refuses_the_next_transfer(producer: Producer) -> None:
    temporary = producer.temporaries.create(topic=True, owner="another connection")
    producer.attach(f"topic://{temporary.name}")
    assert producer.send() == Delivery.ACCEPTED
    producer.temporaries.delete(temporary)
    assert producer.send() == Delivery.REJECTED


def test_a_read_larger_than_the_engine_takes_is_pushed_in_parts(producer: Producer) -> None:
    """Many transfers in one read, more bytes than the engine's input capacity: every one
    is taken and accepted, in order (the engine takes what fits, the rest follows)."""
    producer.attach("big")
    capacity = producer.server.transport.capacity()
    deliveries = []
    body = "x" * 2000
    count = 3 * capacity // len(body) + 1
    for n in range(count):
        delivery = producer.sender.delivery(b"b%d" % n)
        producer.sender.send(Message(body=body, durable=False).encode())
        producer.sender.advance()
        deliveries.append(delivery)
    data = b""
    while (pending := producer.client.transport.pending()) > 0:
        data += bytes(producer.client.transport.peek(pending))
        producer.client.transport.pop(pending)
    assert len(data) > capacity  # (the session window lets about two capacities out)
    producer.server.receive(data)
    assert not producer.server.closed
    producer.client.pump()
    assert [d.remote_state for d in deliveries] == [Delivery.ACCEPTED] * count
    queue = producer.queues.queue("big")
    assert queue.count == count
