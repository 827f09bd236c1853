"""Assembles a running broker from a config: core, listeners, timers, shutdown.

The only place that knows every part; tests embed it to run a real broker on a free port.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from kittiwake.broker.broker import Broker
from kittiwake.broker.sys_topics import SysPublisher
from kittiwake.clock import Clock
from kittiwake.config import Config
from kittiwake.mqtt.server import MQTTServer

log = logging.getLogger(__name__)


class BrokerApp:
    """A broker with its listeners; ``start`` binds, ``stop`` closes everything."""

    def __init__(self, config: Config, *, clock: Clock | None = None) -> None:
        self.config = config
        self.broker = Broker(config, clock=clock)
        self.mqtt = MQTTServer(self.broker)
        self.sys = SysPublisher(self.broker, config.sys.interval)
        self.addresses: list[tuple[str, int]] = []
        self._cancel_ticks: Callable[[], None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._cancel_ticks = self.broker.schedule_ticks(loop)
        for listener in self.config.listeners:
            self.addresses.append(await self.mqtt.listen(listener.host, listener.port))
        self.sys.start()
        log.info("kittiwake %s ready", self.broker.version)

    async def stop(self) -> None:
        log.info("kittiwake stopping")
        self.sys.stop()
        if self._cancel_ticks is not None:
            self._cancel_ticks()
        await self.mqtt.close()
        self.broker.store.close()


async def serve(config: Config) -> None:
    """Run until SIGINT or SIGTERM."""
    app = BrokerApp(config)
    await app.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await app.stop()
