"""An in-process broker for tests and embedding (kittiwake.jms's ``vm://name``): a BrokerApp
with a memory store and no listeners, on its own daemon thread and event loop, reached
through in-memory pipes that carry AMQP bytes from the client's engine to the broker's AMQP
connection state machine, with no socket. Never used by ``kittiwake serve``.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

from kittiwake.amqp.server import AMQPServerProtocol
from kittiwake.app import BrokerApp
from kittiwake.config import Config, StoreConfig

# The brokers of this process, by vm:// name.
_brokers: dict[str, EmbeddedBroker] = {}
_brokers_lock = threading.Lock()


class MemoryTransport(asyncio.Transport):
    """One direction of an in-memory pipe: what is written here is handed to the peer
    protocol on the peer's loop (either side may run on another thread's loop)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        peer_loop: asyncio.AbstractEventLoop,
        peer: asyncio.Protocol,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._peer_loop = peer_loop
        self._peer = peer
        self._protocol: asyncio.BaseProtocol | None = None
        self._closing = False

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("vm", 0) if name == "peername" else default

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        self._call_peer(self._peer.data_received, bytes(data))

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        """Both ends see the pipe end, after what was written before."""
        if self._closing:
            return
        self._closing = True
        self._call_peer(self._peer_ended)
        if self._protocol is not None:
            self._loop.call_soon_threadsafe(self._protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def _peer_ended(self) -> None:
        self._peer.eof_received()
        self._peer.connection_lost(None)

    def _call_peer(self, function: Any, *args: Any) -> None:
        if not self._peer_loop.is_closed():
            self._peer_loop.call_soon_threadsafe(function, *args)


class EmbeddedBroker:
    """One in-process broker (memory store unless a config says otherwise)."""

    def __init__(self, name: str, config: Config | None = None) -> None:
        self.name = name
        config = config or Config(store=StoreConfig(backend="memory"))
        self.app = BrokerApp(replace(config, listeners=()))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name=f"kittiwake-vm-{name}", daemon=True
        )
        self.thread.start()
        # The host process's objects are not the broker's to freeze (gc.freeze in serve).
        start = self.app.start(freeze_gc=False)
        asyncio.run_coroutine_threadsafe(start, self.loop).result(timeout=30)

    async def open_pipe(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A client's streams to this broker, on the calling loop (what
        ``asyncio.open_connection`` gives for a socket)."""
        client_loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        client = asyncio.StreamReaderProtocol(reader)

        async def accept() -> AMQPServerProtocol:
            return self.app.amqp.accept_in_process(
                MemoryTransport(self.loop, client_loop, client)
            )

        server = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(accept(), self.loop))
        transport = MemoryTransport(client_loop, self.loop, server)
        transport.set_protocol(client)
        client.connection_made(transport)
        return reader, asyncio.StreamWriter(transport, client, reader, client_loop)

    def stop(self) -> None:
        with _brokers_lock:
            if _brokers.get(self.name) is self:
                del _brokers[self.name]
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self.app.stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def embedded_broker(name: str, config: Config | None = None) -> EmbeddedBroker:
    """The process's broker of that name, started on first use."""
    with _brokers_lock:
        broker = _brokers.get(name)
        if broker is None:
            broker = _brokers[name] = EmbeddedBroker(name, config)
        return broker
