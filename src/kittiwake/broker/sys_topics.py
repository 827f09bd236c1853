"""Broker statistics published as retained, nonpersistent messages under $SYS/broker/.

'$' topics are invisible to '#' and '+/...' filters (topic rules), so only clients that ask
for $SYS see them.
"""

from __future__ import annotations

import asyncio
import logging

from kittiwake.broker.broker import Broker
from kittiwake.broker.message import Message

log = logging.getLogger(__name__)


def sys_values(broker: Broker) -> dict[str, str]:
    """The current figures, by topic; published as text, as mosquitto does."""
    stats = broker.stats
    uptime = int(broker.clock.now() - broker.started_at)
    return {
        "$SYS/broker/version": f"kittiwake {broker.version}",
        "$SYS/broker/uptime": f"{uptime} seconds",
        "$SYS/broker/clients/connected": str(stats.clients_connected),
        "$SYS/broker/clients/total": str(len(broker.sessions)),
        "$SYS/broker/messages/received": str(stats.messages_received),
        "$SYS/broker/messages/sent": str(stats.messages_sent),
        "$SYS/broker/messages/dropped": str(stats.messages_dropped),
        "$SYS/broker/bytes/received": str(stats.bytes_received),
        "$SYS/broker/bytes/sent": str(stats.bytes_sent),
        "$SYS/broker/subscriptions/count": str(broker.subscription_count),
        "$SYS/broker/retained messages/count": str(len(broker.retained)),
    }


def publish_sys(broker: Broker) -> None:
    """Publish every figure that changed since the last time."""
    for topic, value in sys_values(broker).items():
        payload = value.encode()
        current = broker.retained.get(topic)
        if current is not None and current.payload == payload:
            continue
        broker.publish(Message(topic=topic, payload=payload, qos=0, retain=True))
        # $SYS publications are the broker talking, not traffic: keep them out of the counts.
        broker.stats.messages_received -= 1


class SysPublisher:
    """Publishes $SYS at the configured interval on the running loop."""

    def __init__(self, broker: Broker, interval: float) -> None:
        self.broker = broker
        self.interval = interval
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self.interval <= 0:
            return
        self._run()

    def _run(self) -> None:
        try:
            publish_sys(self.broker)
        except Exception:
            log.exception("publishing $SYS failed")
        self._handle = asyncio.get_running_loop().call_later(self.interval, self._run)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
