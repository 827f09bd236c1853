"""Drive :class:`~kittiwake.mqtt.connection.MQTTConnection` with bytes alone: no socket, no
server. A :class:`Wire` is one connection seen from its client: packets are encoded and fed to
the connection as a socket read would, and what the connection writes is decoded back.
"""

from __future__ import annotations

from kittiwake.broker.broker import Broker
from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.connection import MQTTConnection
from kittiwake.mqtt.errors import MQTTProtocolError
from kittiwake.mqtt.packets import ConnAck, Connect, Packet, Publish
from kittiwake.mqtt.properties import Properties


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

    def __init__(self, broker: Broker, version: int = 5) -> None:
        self.broker = broker
        self.version = version
        self.transport = FakeTransport()
        self.connection = MQTTConnection(broker, self.transport, "unit-test")
        self._inbound = PacketDecoder(broker.config.limits.max_packet_size)
        self._outbound = PacketDecoder()
        self._outbound.protocol_version = version
        self._read = 0
        # Outgoing topic aliases as a client keeps them (MQTT 5 §3.3.2.3.4).
        self.aliases: dict[int, str] = {}

    def send(self, packet: Packet) -> None:
        self.send_bytes(encode(packet, self.version))

    def send_bytes(self, data: bytes) -> None:
        """What the asyncio shell does with one socket read."""
        connection = self.connection
        try:
            for packet in self._inbound.feed(data):
                connection.handle(packet)
                if connection.closed:
                    break
        except MQTTProtocolError as error:
            connection.protocol_error(error, self._inbound.protocol_version)

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
