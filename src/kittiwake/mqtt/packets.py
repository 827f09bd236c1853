"""MQTT control packets as plain dataclasses, one per packet type, for 3.1, 3.1.1 and 5.0.

Data only: no encoding, no validation, no I/O. The codec turns these into bytes and back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, TypeAlias

from kittiwake.mqtt.properties import Properties


class PacketType(IntEnum):
    """The control packet type in the high nibble of the first byte (spec 2.1.2)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


@dataclass(slots=True)
class Will:
    """The message a CONNECT asks the server to publish if the connection dies uncleanly."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Connect:
    """CONNECT. ``protocol_version`` is the level byte: 3 (3.1), 4 (3.1.1) or 5 (5.0).

    Level 3 goes with the name "MQIsdp"; when a level-3 Connect is built with the default name
    it is corrected here, so ``Connect("id", protocol_version=3)`` round-trips.
    """

    packet_type: ClassVar[PacketType] = PacketType.CONNECT
    client_id: str
    protocol_version: int = 4
    protocol_name: str = "MQTT"
    clean_start: bool = True
    keepalive: int = 60
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = field(default_factory=Properties)

    def __post_init__(self) -> None:
        if self.protocol_version == 3 and self.protocol_name == "MQTT":
            self.protocol_name = "MQIsdp"


@dataclass(slots=True)
class ConnAck:
    """CONNACK. ``reason_code`` is a ConnectReturnCode in 3.x and a ReasonCode in 5.0."""

    packet_type: ClassVar[PacketType] = PacketType.CONNACK
    session_present: bool = False
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Publish:
    """PUBLISH. ``packet_id`` is None exactly when ``qos`` is 0.

    In 5.0 ``topic`` may be "" when ``properties.topic_alias`` names an established alias.
    """

    packet_type: ClassVar[PacketType] = PacketType.PUBLISH
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=Properties)
    # Set by the decoder on a minimally encoded 3.x QoS 0 PUBLISH without RETAIN or DUP: the
    # whole frame, which is then exactly what every 3.x subscriber must receive.
    raw: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class PublishRun:
    """Consecutive plain QoS 1 PUBLISHes of one read on one topic, as one packet: 3.x, no
    RETAIN, no DUP (first byte 0x32), so each differs from the others only in its packet id
    and payload.

    Not a packet type of its own on the wire: the server's decoder (``codec.AckRunDecoder``)
    gives a publisher's run, which floods one topic, as one object holding their ids and
    payloads instead of a :class:`Publish` each, so the connection checks the topic once for
    the run; encoding one gives the PUBLISHes back. ``publishes()`` gives them one by one.
    """

    packet_type: ClassVar[PacketType] = PacketType.PUBLISH
    topic: str
    packet_ids: list[int]
    payloads: list[bytes]

    def publishes(self) -> list[Publish]:
        """The run's PUBLISHes, each as the decoder would give it alone."""
        topic = self.topic
        return [
            Publish(topic, payload, 1, False, False, packet_id)
            for packet_id, payload in zip(self.packet_ids, self.payloads, strict=True)
        ]


@dataclass(slots=True)
class PubAck:
    """PUBACK: QoS 1 delivery acknowledged."""

    packet_type: ClassVar[PacketType] = PacketType.PUBACK
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubAckRun:
    """Consecutive plain PUBACKs (reason 0, no properties) of one read, as one packet.

    Not a packet type of its own on the wire: the server's decoder
    (``codec.AckRunDecoder``) gives a subscriber's run of
    acknowledgements, one per delivery, as one object holding their ids instead of a
    :class:`PubAck` each; encoding one gives the PUBACKs back.
    """

    packet_type: ClassVar[PacketType] = PacketType.PUBACK
    packet_ids: list[int]


@dataclass(slots=True)
class PubRec:
    """PUBREC: first QoS 2 acknowledgement (message received)."""

    packet_type: ClassVar[PacketType] = PacketType.PUBREC
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubRel:
    """PUBREL: the QoS 2 sender releases the packet identifier."""

    packet_type: ClassVar[PacketType] = PacketType.PUBREL
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubComp:
    """PUBCOMP: QoS 2 exchange complete."""

    packet_type: ClassVar[PacketType] = PacketType.PUBCOMP
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class SubscriptionRequest:
    """One topic filter in a SUBSCRIBE; the last three options exist on the wire only in 5.0."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    """SUBSCRIBE: at least one subscription request."""

    packet_type: ClassVar[PacketType] = PacketType.SUBSCRIBE
    packet_id: int
    subscriptions: list[SubscriptionRequest]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class SubAck:
    """SUBACK: one reason (3.x: return) code per subscription request, in request order."""

    packet_type: ClassVar[PacketType] = PacketType.SUBACK
    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Unsubscribe:
    """UNSUBSCRIBE: at least one topic filter."""

    packet_type: ClassVar[PacketType] = PacketType.UNSUBSCRIBE
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class UnsubAck:
    """UNSUBACK. Only 5.0 carries reason codes; in 3.x ``reason_codes`` is always empty."""

    packet_type: ClassVar[PacketType] = PacketType.UNSUBACK
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PingReq:
    """PINGREQ: keep-alive probe from the client."""

    packet_type: ClassVar[PacketType] = PacketType.PINGREQ


@dataclass(slots=True)
class PingResp:
    """PINGRESP: the server's answer to PINGREQ."""

    packet_type: ClassVar[PacketType] = PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    """DISCONNECT. Reason code and properties exist on the wire only in 5.0."""

    packet_type: ClassVar[PacketType] = PacketType.DISCONNECT
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Auth:
    """AUTH (5.0 only): one step of an enhanced authentication exchange."""

    packet_type: ClassVar[PacketType] = PacketType.AUTH
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


Packet: TypeAlias = (
    Connect
    | ConnAck
    | Publish
    | PublishRun
    | PubAck
    | PubAckRun
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
