"""Local transactions through the AMQP coordinator, with python-qpid-proton's Container and
its transaction API: sends invisible until commit, atomic across destinations, rollback drops
sends and returns consumed messages with their count incremented."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proton import Message, Timeout
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

from ..clients import unique

Connect = Callable[..., BlockingConnection]


class TransactedClient(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """Runs one scripted transaction in a Container and records what happened.

    ``sends``: (address, body) sent in the transaction; ``consume``: (address, count) to
    receive and accept in it; then commit (or abort when ``abort``)."""

    def __init__(
        self,
        url: str,
        *,
        sends: list[tuple[str, str]] = (),  # type: ignore[assignment]
        consume: tuple[str, int] | None = None,
        abort: bool = False,
    ) -> None:
        super().__init__(auto_accept=False, prefetch=0)
        self.url = url
        self.to_send = list(sends)
        self.consume = consume
        self.abort = abort
        self.received: list[Any] = []
        self.outcome: str | None = None
        self.transaction: Any = None
        self.senders: dict[str, Any] = {}
        self.receiver: Any = None

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.connection = event.container.connect(self.url)
        for address, _ in self.to_send:
            if address not in self.senders:
                self.senders[address] = event.container.create_sender(self.connection, address)
        if self.consume is not None:
            self.receiver = event.container.create_receiver(self.connection, self.consume[0])
        event.container.declare_transaction(self.connection, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        for address, body in self.to_send:
            self.transaction.send(self.senders[address], Message(body=body, durable=True))
        if self.consume is not None:
            self.receiver.flow(self.consume[1])
        else:
            self._discharge()

    def on_message(self, event: Any) -> None:
        self.received.append((event.message.body, event.message.delivery_count))
        self.transaction.accept(event.delivery)
        if self.consume is not None and len(self.received) == self.consume[1]:
            self._discharge()

    def _discharge(self) -> None:
        if self.abort:
            self.transaction.abort()
        else:
            self.transaction.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.outcome = "committed"
        self.connection.close()

    def on_transaction_aborted(self, event: Any) -> None:
        self.outcome = "aborted"
        self.connection.close()

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.outcome = "commit failed"
        self.connection.close()

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.outcome = "declare failed"
        self.connection.close()


def run(client: TransactedClient) -> TransactedClient:
    container = Container(client)
    container.timeout = 10
    container.run()
    return client


def drain(connection: BlockingConnection, address: str, name: str) -> list[Any]:
    receiver = connection.create_receiver(address, credit=10, name=name)
    got = []
    while True:
        try:
            message = receiver.receive(timeout=0.5)
        except Timeout:
            return got
        got.append((message.body, message.delivery_count))
        receiver.accept()


def test_committed_sends_are_atomic_across_queues(amqp: Connect, amqp_url: str) -> None:
    first, second = unique("tx-a"), unique("tx-b")
    client = run(
        TransactedClient(amqp_url, sends=[(first, "one"), (second, "two"), (first, "three")])
    )
    assert client.outcome == "committed"
    connection = amqp()
    assert drain(connection, first, "a") == [("one", 0), ("three", 0)]
    assert drain(connection, second, "b") == [("two", 0)]


def test_aborted_sends_are_never_seen(amqp: Connect, amqp_url: str) -> None:
    queue = unique("tx-abort")
    client = run(TransactedClient(amqp_url, sends=[(queue, "never")], abort=True))
    assert client.outcome == "aborted"
    assert drain(amqp(), queue, "r") == []


def test_transacted_consume_commit_removes_rollback_redelivers(
    amqp: Connect, amqp_url: str
) -> None:
    queue = unique("tx-consume")
    producer = amqp().create_sender(queue)
    for body in ("m1", "m2"):
        producer.send(Message(body=body))
    rolled_back = run(TransactedClient(amqp_url, consume=(queue, 2), abort=True))
    assert rolled_back.outcome == "aborted"
    assert rolled_back.received == [("m1", 0), ("m2", 0)]
    committed = run(TransactedClient(amqp_url, consume=(queue, 2)))
    assert committed.outcome == "committed"
    # Rolled back: back on the queue, counted as delivered once.
    assert committed.received == [("m1", 1), ("m2", 1)]
    assert drain(amqp(), queue, "after") == []


def test_transacted_send_to_a_topic_reaches_subscribers_on_commit(
    amqp: Connect, amqp_url: str
) -> None:
    topic = unique("tx-topic") + "/t"
    subscriber = amqp().create_receiver(f"topic://{topic}", credit=5)
    client = run(TransactedClient(amqp_url, sends=[(f"topic://{topic}", "published")]))
    assert client.outcome == "committed"
    message = subscriber.receive(timeout=5)
    subscriber.accept()
    assert message.body == "published"
