"""Drive :class:`~kittiwake.mqtt.connection.MQTTConnection` with bytes alone: no socket, no
server, no event loop. A :class:`Wire` is one connection seen from its client: packets are
encoded and fed to the connection as a socket read would, and what the connection writes is
decoded back.

What the asyncio shell injects is the test's to give: ``call_soon`` (by default it runs at once;
a :class:`LaterTurns` holds the callbacks until the test runs them) and the login's ``verify``
(see :class:`PendingCheck`). Only a commit the test holds open (:class:`ControlledStore`) needs a
loop, because the core's completion is an asyncio future.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kittiwake.broker.broker import Broker
from kittiwake.broker.store import MemoryStore
from kittiwake.mqtt.codec import AckRunDecoder, PacketDecoder, encode
from kittiwake.mqtt.connection import CallSoon, MQTTConnection
from kittiwake.mqtt.login import Login, Verdict
from kittiwake.mqtt.packets import ConnAck, Connect, Packet, Publish
from kittiwake.mqtt.properties import Properties
from kittiwake.mqtt.server import handle_input


class ControlledStore(MemoryStore):
    """A memory store whose commits the test controls.

    Idle, every commit is immediate (None), as with nothing to write. Between :meth:`hold` and
    :meth:`resolve` (or :meth:`fail`) every commit() returns the same pending future, as a
    store busy with a batch does; afterwards it is idle again.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pending: asyncio.Future[None] | None = None

    def hold(self) -> asyncio.Future[None]:
        assert self.pending is None, "already held"
        self.pending = asyncio.get_running_loop().create_future()
        return self.pending

    def commit(self) -> asyncio.Future[None] | None:  # type: ignore[override]
        return self.pending

    def resolve(self) -> None:
        """The held batch is durable; its callbacks run on the loop's next turn."""
        assert self.pending is not None
        self.pending.set_result(None)
        self.pending = None

    def fail(self) -> None:
        assert self.pending is not None
        self.pending.set_exception(OSError("disk full"))
        self.pending = None


async def turns(count: int = 5) -> None:
    """Let the loop run ``count`` turns: callbacks of resolved futures, scheduled pumps."""
    for _ in range(count):
        await asyncio.sleep(0)


class LaterTurns:
    """A ``call_soon`` with the loop's turns in the test's hands: callbacks wait in order until
    :meth:`run` (what one loop turn would run)."""

    def __init__(self) -> None:
        self.waiting: list[Callable[[], None]] = []

    def __call__(self, callback: Callable[[], None]) -> None:
        self.waiting.append(callback)

    def run(self) -> int:
        """Run what waits now (not what those callbacks defer); returns how many ran."""
        ready, self.waiting = self.waiting, []
        for callback in ready:
            callback()
        return len(ready)


class PendingCheck:
    """A password check the test answers: what the shell's worker thread would return, as a
    loop-free stand-in for its future (the connection's ``PendingVerdict``)."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[Any], object]] = []
        self._verdict: Verdict | None = None
        self._error: Exception | None = None
        self.done = False

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None:
        assert not self.done, "registered after the verdict"
        self._callbacks.append(fn)

    def result(self) -> Verdict:
        assert self.done, "read before the verdict"
        if self._error is not None:
            raise self._error
        assert self._verdict is not None
        return self._verdict

    def answer(self, verdict: Verdict) -> None:
        self._verdict = verdict
        self._finish()

    def fail(self, error: Exception) -> None:
        self._error = error
        self._finish()

    def _finish(self) -> None:
        assert not self.done, "answered twice"
        self.done = True
        for callback in self._callbacks:
            callback(self)


class FakeTransport:
    """The byte pipe of :class:`MQTTConnection`, recording every write."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.backlog = 0

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written += data

    def close(self) -> None:
        self.closed = True

    def write_backlog(self) -> int:
        return self.backlog


class Wire:
    """One client's end of an MQTTConnection on ``broker``."""

    def __init__(
        self,
        broker: Broker,
        version: int = 5,
        *,
        login: Login | None = None,
        call_soon: CallSoon | None = None,
    ) -> None:
        self.broker = broker
        self.version = version
        self.transport = FakeTransport()
        self.connection = MQTTConnection(
            broker, self.transport, "unit-test", login, call_soon=call_soon
        )
        # As the server decodes (runs of plain PUBACKs as one PubAckRun).
        self._inbound = AckRunDecoder(broker.config.limits.max_packet_size)
        self._outbound = PacketDecoder()
        self._outbound.protocol_version = version
        self._read = 0
        # Outgoing topic aliases as a client keeps them (MQTT 5 §3.3.2.3.4).
        self.aliases: dict[int, str] = {}

    def send(self, packet: Packet) -> None:
        self.send_bytes(encode(packet, self.version))

    def send_bytes(self, data: bytes) -> None:
        """What the asyncio shell does with one socket read."""
        handle_input(self.connection, self._inbound, data, contain_bugs=False)

    def received(self) -> list[Packet]:
        """Every packet written since the last call, oldest first."""
        data = bytes(self.transport.written[self._read :])
        self._read = len(self.transport.written)
        return self._outbound.feed(data)

    def connect(self, client_id: str, **fields: object) -> ConnAck:
        properties = fields.pop("properties", None) or Properties()
        self.send(
            Connect(client_id, protocol_version=self.version, properties=properties, **fields)  # type: ignore[arg-type]
        )
        packets = self.received()
        assert packets and isinstance(packets[0], ConnAck), packets
        return packets[0]

    def topic_of(self, publish: Publish) -> str:
        """The topic a client resolves for ``publish``, failing as MQTT.js does ("Received
        unregistered Topic Alias") when the alias was never set."""
        alias = publish.properties.topic_alias
        if alias is None:
            return publish.topic
        if publish.topic:
            self.aliases[alias] = publish.topic
            return publish.topic
        assert alias in self.aliases, f"unregistered topic alias {alias} in {publish!r}"
        return self.aliases[alias]
