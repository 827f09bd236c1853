"""The link layer's answer to the engine's flow events, driven with bytes alone (a proton
client engine, the broker's connection and link layer, a memory store, no event loop).

The engine reports a flow event for a consumer link after every transfer the broker sends on
it, not only when the client changes the credit: the core already spent that credit, so such
an event must not schedule a pump (one a delivery, each finding nothing to do), while a real
credit change or a drain still must."""

from __future__ import annotations

from typing import Any

import pytest
from engine_harness import WiredLinkLayer
from proton import Delivery, Event, Message


class Wired(WiredLinkLayer):
    """A broker with one AMQP connection's link layer, and a client engine on it."""

    def receiver(self, address: str, credit: int) -> Any:
        receiver = self.session.receiver(f"r-{address}")
        receiver.source.address = address
        receiver.open()
        if credit:
            receiver.flow(credit)
        self.client.pump()
        return receiver

    def send(self, address: str, count: int) -> None:
        sender = self.session.sender(f"s-{address}")
        sender.target.address = address
        sender.open()
        self.client.pump()
        for n in range(count):
            delivery = sender.delivery(b"t%d" % n)
            sender.send(Message(body=f"m{n}", durable=False).encode())
            sender.advance()
            assert delivery is not None
        self.client.pump()

    def received(self) -> int:
        return sum(
            1
            for event in self.client.events
            if event.type is Event.DELIVERY and event.delivery is not None
            and event.delivery.link.is_receiver and not event.delivery.partial
        )


@pytest.fixture
def wired() -> Wired:
    return Wired()


def _count_pumps(monkeypatch: pytest.MonkeyPatch, wired: Wired) -> list[object]:
    """Record every pump the consumer links ask for (the core's and the queues')."""
    asked: list[object] = []
    broker_soon = wired.broker.pump_soon
    queues_soon = wired.queues.pump_soon

    def broker_pump_soon(target: Any) -> None:
        asked.append(target)
        broker_soon(target)

    def queues_pump_soon(queue: Any) -> None:
        asked.append(queue)
        queues_soon(queue)

    monkeypatch.setattr(wired.broker, "pump_soon", broker_pump_soon)
    monkeypatch.setattr(wired.queues, "pump_soon", queues_pump_soon)
    return asked


@pytest.mark.parametrize("address", ["topic://flow/t", "flowq"])
def test_a_transfer_sent_schedules_no_pump(
    monkeypatch: pytest.MonkeyPatch, wired: Wired, address: str
) -> None:
    wired.receiver(address, credit=50)
    asked = _count_pumps(monkeypatch, wired)
    links = list(wired.layer.consumers.values())
    flows: list[int] = []
    for link in links:
        original = link.flow

        def counted(original: Any = original) -> None:
            flows.append(1)
            original()

        monkeypatch.setattr(link, "flow", counted)
    wired.send(address, 20)
    assert wired.received() == 20
    assert [link.consumer.credit.available for link in links] == [30]
    # Each transfer sent raised a flow event on the broker's side; none changed the credit.
    assert flows == []
    # A queue's publication pumps its queue; the sends themselves asked for nothing more.
    assert len(asked) <= (20 if address == "flowq" else 0)


@pytest.mark.parametrize("address", ["topic://flow/c", "flowq2"])
def test_credit_given_later_still_delivers_what_waits(wired: Wired, address: str) -> None:
    receiver = wired.receiver(address, credit=2)
    wired.send(address, 5)
    assert wired.received() == 2
    receiver.flow(2)  # a real credit change: what waits goes out
    wired.client.pump()
    assert wired.received() == 4
    receiver.drain(5)  # a drain: the last one, then the credit is used up
    wired.client.pump()
    assert wired.received() == 5
    (link,) = wired.layer.consumers.values()
    assert link.link.credit == 0  # the broker used the drained credit up
    assert link.consumer is not None and link.consumer.credit.available == 0
    settled = [
        e.delivery for e in wired.client.events
        if e.type is Event.DELIVERY and e.delivery is not None and e.delivery.link.is_receiver
    ]
    for delivery in settled:
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
    wired.client.pump()
