"""Drive :class:`~kittiwake.amqp.connection.AMQPConnection` with bytes alone: a
python-qpid-proton client engine on one side, the broker's connection on the other, and the
test moving the bytes between them. No socket, no event loop."""

from __future__ import annotations

from proton import Collector, Connection, Event, Transport

from kittiwake.amqp.connection import AMQPConnection, LinkHandler
from kittiwake.amqp.links import LinkLayer, link_layer_factory
from kittiwake.broker.broker import Broker
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.broker.store import MemoryStore
from kittiwake.broker.temporary_destinations import TemporaryDestinations
from kittiwake.clock import ManualClock
from kittiwake.config import AMQPConfig, Config


class ClientEnd:
    """A client engine wired to a broker-side connection."""

    def __init__(
        self,
        server: AMQPConnection,
        *,
        mechanisms: str | None = "ANONYMOUS",
        user: str | None = None,
        password: str | None = None,
        container: str = "client-1",
    ) -> None:
        self.server = server
        self.transport = Transport()
        if mechanisms is not None:
            sasl = self.transport.sasl()
            sasl.allowed_mechs(mechanisms)
            sasl.allow_insecure_mechs = True
        self.connection = Connection()
        self.connection.container = container
        if user is not None:
            self.connection.user = user
        if password is not None:
            self.connection.password = password
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.events: list[Event] = []

    def pump(self, rounds: int = 20) -> None:
        """Move bytes both ways until neither side has anything to say."""
        for _ in range(rounds):
            moved = False
            pending = self.transport.pending()
            if pending < 0 and not self.server.closed:
                self.server.end_of_stream()  # the client closed its side of the socket
            if pending > 0:
                data = bytes(self.transport.peek(pending))
                self.transport.pop(pending)
                self.server.receive(data)
                moved = True
            out = self.server.data_to_send()
            if out and self.transport.capacity() > 0:
                self.transport.push(out)
                moved = True
            while self.collector.peek() is not None:
                event = self.collector.peek()
                assert event is not None
                self.events.append(event)
                self.collector.pop()
            if not moved:
                return

    def open(self) -> ClientEnd:
        self.connection.open()
        self.pump()
        return self


def server_connection(
    *, allow_anonymous: bool = True, handler: LinkHandler | None = None, **limits: object
) -> AMQPConnection:
    config = AMQPConfig(**limits)  # type: ignore[arg-type]
    return AMQPConnection(
        config, ManualClock(), allow_anonymous=allow_anonymous, handler=handler, peer="test"
    )


def raw_output(server: AMQPConnection, data: bytes) -> bytes:
    """What the broker answers to ``data`` sent as the first bytes of a connection."""
    server.receive(data)
    return server.data_to_send()


class WiredLinkLayer:
    """A broker with one AMQP connection's link layer, and an open client session on it."""

    def __init__(self) -> None:
        config = Config()
        self.broker = Broker(config, store=MemoryStore(), clock=ManualClock())
        self.queues = QueueDestinations(self.broker)
        self.temporaries = TemporaryDestinations(self.queues)
        make = link_layer_factory(self.broker, self.queues, self.temporaries)
        self.server = AMQPConnection(
            config.amqp, self.broker.clock, allow_anonymous=True, peer="test"
        )
        self.layer: LinkLayer = make(self.server)
        self.server.handler = self.layer
        self.client = ClientEnd(self.server, mechanisms=None).open()
        self.session = self.client.connection.session()
        self.session.open()
        self.client.pump()
