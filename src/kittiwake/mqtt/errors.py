"""The exceptions the MQTT codec raises when a peer's bytes break the protocol.

Each carries the reason code the server answers with; raising one never closes anything itself.
"""

from __future__ import annotations

from typing import Any

from kittiwake.mqtt.reason_codes import ReasonCode

# Error messages quote what a peer sent; a 64 KiB topic must not drown (or outgrow) the sentence.
_QUOTED_CHARS = 80


def quoted(text: str) -> str:
    """``text`` quoted for an error message: its repr, cut after a few dozen characters."""
    if len(text) > _QUOTED_CHARS:
        return repr(text[:_QUOTED_CHARS]) + "..."
    return repr(text)


class MQTTProtocolError(Exception):
    """The peer broke the protocol; the connection must end.

    ``reason_code`` is what a v5 server puts in its CONNACK or DISCONNECT before closing (a
    3.1/3.1.1 server just closes); ``str(e)`` is a message for the log.
    """

    reason_code: ReasonCode
    # Set by PacketDecoder.feed: the packets of the same input that came before the bad one,
    # which the connection must still act on, in order, before it answers the error.
    packets_before: list[Any]

    def __init__(self, reason_code: int, message: str = "") -> None:
        self.reason_code = ReasonCode(reason_code)
        self.packets_before = []
        super().__init__(message or self.reason_code.name)

    @property
    def message(self) -> str:
        """The human-readable text, the same as ``str(self)``."""
        return str(self)


class MalformedPacketError(MQTTProtocolError):
    """The bytes cannot be parsed as the packet they claim to be (reason 0x81)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(ReasonCode.MALFORMED_PACKET, message)


class PacketTooLargeError(MQTTProtocolError):
    """The fixed header declares more bytes than the receiver accepts (reason 0x95).

    Raised before the body arrives, so a peer cannot make us buffer a huge packet.
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(ReasonCode.PACKET_TOO_LARGE, message)


class UnsupportedProtocolVersionError(MQTTProtocolError):
    """A CONNECT asked for a protocol level we do not speak (reason 0x84).

    ``protocol_version`` is the level byte received, so the server can answer a 3.x-looking
    client with the 3.1.1 CONNACK return code 0x01 and a v5 one with reason code 0x84.
    """

    protocol_version: int

    def __init__(self, protocol_version: int, message: str = "") -> None:
        self.protocol_version = protocol_version
        super().__init__(
            ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
            message or f"unsupported protocol level {protocol_version}",
        )
