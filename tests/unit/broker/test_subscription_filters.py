"""Selectors and noLocal where a subscription's own queue hands entries to its consumer."""

from __future__ import annotations

from kittiwake.broker.consumers import Consumer, Delivery
from kittiwake.broker.message import Message, MessageProperties
from kittiwake.broker.queues import Queue, QueuedMessage, Removal
from kittiwake.broker.subscription_filters import EntrySubject, FilteringReceiver
from kittiwake.selector import compile_selector


class Recorder:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.deliveries: list[Delivery] = []

    def deliver(self, delivery: Delivery) -> None:
        self.sent.append(delivery.entry.message.payload)
        self.deliveries.append(delivery)

    def deliver_settled(self, entry: QueuedMessage) -> None:
        self.sent.append(entry.message.payload)


def entry(
    payload: bytes, qos: int = 1, origin: str | None = None, **props: object
) -> QueuedMessage:
    message = Message(
        "t",
        payload,
        qos=qos,
        origin=origin,
        properties=MessageProperties.of(props) if props else None,  # type: ignore[arg-type]
    )
    return QueuedMessage.of(message, 2)


def setup(**filters: object) -> tuple[Queue, Consumer, Recorder, list[Removal]]:
    removed: list[Removal] = []
    queue = Queue(
        "sub",
        max_messages=100,
        max_bytes=10_000,
        on_removed=lambda _q, _e, reason: removed.append(reason),
    )
    recorder = Recorder()
    consumer = Consumer(FilteringReceiver(recorder, **filters), credit=2)  # type: ignore[arg-type]
    queue.attach(consumer)
    return queue, consumer, recorder, removed


def test_refused_entries_are_accepted_unseen_and_give_their_credit_back() -> None:
    queue, consumer, recorder, removed = setup(selector=compile_selector("size > 2"))
    for payload, size in ((b"a", 1), (b"b", 5), (b"c", 0), (b"d", 7), (b"e", 9)):
        queue.push(entry(payload, size=size))
    queue.dispatch(0.0)
    # Two credits: spent on the two matching entries only; the refused ones are gone.
    assert recorder.sent == [b"b", b"d"]
    # The refused ones left the queue settled; only the two sent are in flight.
    assert queue.in_flight == 2 and len(consumer.unsettled) == 2
    assert removed == []  # nothing expired, discarded or dead-lettered
    assert consumer.credit.available == 0
    assert len(queue) == 1  # "e" waits for credit


def test_no_local_refuses_own_messages_but_not_retained_ones() -> None:
    queue, _consumer, recorder, _removed = setup(no_local_origin="me")
    own_retained = entry(b"retained", origin="me")
    own_retained.retain = True
    queue.push(entry(b"own", origin="me"))
    queue.push(own_retained)
    queue.push(entry(b"other", origin="you"))
    queue.dispatch(0.0)
    assert recorder.sent == [b"retained", b"other"]


def test_at_most_once_entries_are_filtered_too() -> None:
    _queue, consumer, recorder, _removed = setup(selector=compile_selector("k = 1"))
    receiver = consumer.receiver
    assert receiver is not None
    receiver.deliver_settled(entry(b"no", qos=0, k=2))
    receiver.deliver_settled(entry(b"yes", qos=0, k=1))
    assert recorder.sent == [b"yes"]


def test_entry_subject_headers() -> None:
    queued = entry(b"x")
    queued.message.priority = 8
    queued.message.persistent = True
    queued.message.timestamp = 1234
    queued.delivery_count = 2
    subject = EntrySubject(queued, lambda message: {"JMSType": "t1"})
    assert subject.get_header("JMSPriority") == 8
    assert subject.get_header("JMSDeliveryMode") == "PERSISTENT"
    assert subject.get_header("JMSTimestamp") == 1234
    assert subject.get_header("JMSXDeliveryCount") == 3
    assert subject.get_header("JMSType") == "t1"
    assert subject.get_header("JMSCorrelationID") is None
    assert EntrySubject(queued, None).get_header("JMSType") is None
