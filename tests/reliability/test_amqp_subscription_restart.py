"""A JMS durable subscription's queue rules survive a restart (DESIGN.md section 5, issue 11):
what it collected comes back in priority order, and its delivery attempts keep counting
toward max_delivery_attempts, after which the message is in the DLQ. Over AMQP with
python-qpid-proton, plain and shared durable subscriptions, stopped gracefully or killed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message, Timeout
from proton.reactor import DurableSubscription
from proton.utils import BlockingConnection, BlockingReceiver
from reliability_harness import BrokerCtl

from tests.integration.amqp.test_amqp_shared import shared
from tests.integration.clients import unique


def durable(connection: BlockingConnection, topic: str, credit: int = 10) -> BlockingReceiver:
    return connection.create_receiver(
        f"topic://{topic}", name="sub", credit=credit, options=DurableSubscription()
    )


def shared_durable(
    connection: BlockingConnection, topic: str, credit: int = 10
) -> BlockingReceiver:
    return shared(connection, topic, "workers", global_=False, durable=True, credit=credit)


SUBSCRIPTIONS: dict[str, Callable[..., BlockingReceiver]] = {
    "durable": durable,
    "shared durable": shared_durable,
}


def fail(receiver: BlockingReceiver) -> None:
    """Settle what was received as MODIFIED with delivery-failed (a JMS listener's failure)."""
    fetcher = receiver.fetcher
    assert fetcher is not None
    while fetcher.unsettled:
        delivery = fetcher.unsettled.popleft()
        delivery.local.failed = True
        delivery.update(Delivery.MODIFIED)
        delivery.settle()
    receiver.connection.wait(lambda: True, timeout=1)


def stop(ctl: BrokerCtl, how: str) -> None:
    if how == "kill9":
        ctl.kill9()
    else:
        assert ctl.terminate() == 0


@pytest.mark.parametrize("kind", list(SUBSCRIPTIONS))
@pytest.mark.parametrize("how", ["terminate", "kill9"])
def test_collected_messages_come_back_in_priority_order(
    tmp_path: Path, kind: str, how: str
) -> None:
    ctl = BrokerCtl(tmp_path / "b", amqp=True)
    subscribe = SUBSCRIPTIONS[kind]
    try:
        process = ctl.start()
        topic, client_id = unique("priority") + "/t", unique("jms-client")
        first = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
        subscribe(first, topic).link.detach()
        first.close()
        publisher = BlockingConnection(process.amqp_url, timeout=10)
        sender = publisher.create_sender(f"topic://{topic}")
        for body, priority in (("low", 1), ("high", 9), ("mid", 4), ("high2", 9)):
            sender.send(Message(body=body, priority=priority, durable=True))  # committed
        publisher.close()
        stop(ctl, how)
        process = ctl.start()
        again = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
        receiver = subscribe(again, topic)
        got: list[Any] = []
        for _ in range(4):
            got.append(receiver.receive(timeout=5).body)
            receiver.accept()
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.3)
        again.close()
        assert got == ["high", "high2", "mid", "low"]
    finally:
        ctl.shutdown()


@pytest.mark.parametrize("kind", list(SUBSCRIPTIONS))
def test_failed_attempts_count_across_a_restart_then_dead_letter(
    tmp_path: Path, kind: str
) -> None:
    ctl = BrokerCtl(tmp_path / "b", amqp=True, queues={"max_delivery_attempts": 3})
    subscribe = SUBSCRIPTIONS[kind]
    try:
        process = ctl.start()
        topic, client_id = unique("poison") + "/t", unique("jms-client")
        connection = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
        receiver = subscribe(connection, topic, credit=1)
        publisher = BlockingConnection(process.amqp_url, timeout=10)
        publisher.create_sender(f"topic://{topic}").send(
            Message(body="poison", durable=True, properties={"marker": client_id})
        )
        publisher.close()
        for attempt in range(2):
            assert receiver.receive(timeout=5).delivery_count == attempt
            fail(receiver)
        receiver.link.detach()
        connection.close()
        stop(ctl, "terminate")
        process = ctl.start()
        connection = BlockingConnection(process.amqp_url, timeout=10, container_id=client_id)
        receiver = subscribe(connection, topic, credit=1)
        assert receiver.receive(timeout=5).delivery_count == 2  # the third attempt
        fail(receiver)
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.3)
        dead = connection.create_receiver("DLQ")
        letter = dead.receive(timeout=5)
        dead.accept()
        assert letter.properties["marker"] == client_id
        assert letter.properties["KW_Reason"] == "maximum delivery attempts reached"
        assert letter.properties["KW_OriginalDestination"] == f"topic://{topic}"
        assert letter.properties["JMSXDeliveryCount"] == 3
        connection.close()
    finally:
        ctl.shutdown()
