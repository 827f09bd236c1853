"""Fits the packets the broker writes on its own account (CONNACK, acknowledgements, SUBACK,
UNSUBACK, DISCONNECT) to the wire's length limits and to the client's Maximum Packet Size.

It decides only how much optional text an answer carries, never what the answer is; a message's
own properties (PUBLISH) are the publisher's and are never touched here.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Final

from kittiwake.mqtt.codec import encode
from kittiwake.mqtt.packets import ConnAck, Disconnect, Packet, Publish

# A reason string is a sentence for a person reading a log; nothing needs more.
MAX_REASON_STRING_BYTES: Final = 256
# All user properties of one answer together (the broker writes none of its own today).
MAX_USER_PROPERTY_BYTES: Final = 4096
# Response Information is a topic prefix a client builds its response topics on.
MAX_RESPONSE_INFORMATION_BYTES: Final = 128
_RESPONSE_PREFIX: Final = "response/"
_ELLIPSIS: Final = "..."


def bounded_text(text: str, limit: int = MAX_REASON_STRING_BYTES) -> str:
    """``text`` as a valid MQTT UTF-8 string of at most ``limit`` bytes, cut at a character
    boundary and marked as cut; U+0000 and lone surrogates (never legal on the wire) replaced."""
    raw = text.replace("\x00", "\ufffd").encode("utf-8", "replace")
    if len(raw) <= limit:
        return raw.decode("utf-8")
    return raw[: limit - len(_ELLIPSIS)].decode("utf-8", "ignore") + _ELLIPSIS


def response_information(client_id: str) -> str:
    """The Response Information for ``client_id`` (MQTT 5 §3.2.2.3.15): the same for the same
    id on every connection, short, and a usable topic prefix whatever the id holds.

    A short id that is a plain topic level is used as it is (readable: ``response/sensor-1``);
    any other id (long, or holding '/', '+', '#' or characters that need care) is replaced by a
    digest of it, so the answer is bounded and never a filter.
    """
    raw = client_id.encode("utf-8", "surrogatepass")
    if (
        raw
        and len(raw) <= MAX_RESPONSE_INFORMATION_BYTES - len(_RESPONSE_PREFIX) - 1
        and client_id.isprintable()
        and not client_id.startswith("~")
        and not any(c in client_id for c in "/+#")
    ):
        return _RESPONSE_PREFIX + client_id
    # "~" cannot start a plain id above, so a digest never equals another client's plain form.
    return f"{_RESPONSE_PREFIX}~{hashlib.sha256(raw).hexdigest()[:32]}"


def encode_answer(
    packet: Packet, version: int, max_packet_size: int, problem_information: bool = True
) -> bytes:
    """Encode a packet the broker writes on its own account.

    Reason strings and user properties are bounded, dropped on every packet but CONNACK and
    DISCONNECT when the client asked for no problem information (MQTT-3.1.2-29), and dropped
    entirely when the packet would exceed the client's Maximum Packet Size (MQTT-3.1.2-25).
    A CONNACK that still does not fit loses its Response Information, which is optional.
    """
    props = getattr(packet, "properties", None) if version == 5 else None
    if props is None or isinstance(packet, Publish):
        return encode(packet, version)
    if props.reason_string is not None or props.user_properties:
        props = packet.properties = copy.copy(props)  # type: ignore[union-attr]
        if not problem_information and not isinstance(packet, (ConnAck, Disconnect)):
            props.reason_string = None
            props.user_properties = []
        else:
            if props.reason_string is not None:
                props.reason_string = bounded_text(props.reason_string)
            props.user_properties = _bounded_pairs(props.user_properties)
    data = encode(packet, version)
    if len(data) <= max_packet_size:
        return data
    if props.reason_string is not None or props.user_properties:
        props = packet.properties = copy.copy(props)  # type: ignore[union-attr]
        props.reason_string = None
        props.user_properties = []
        data = encode(packet, version)
    if len(data) > max_packet_size and isinstance(packet, ConnAck) and props.response_information:
        props = packet.properties = copy.copy(props)
        props.response_information = None
        data = encode(packet, version)
    return data


def _bounded_pairs(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The leading user properties that fit :data:`MAX_USER_PROPERTY_BYTES` together."""
    kept: list[tuple[str, str]] = []
    total = 0
    for key, value in pairs:
        key, value = bounded_text(key, 1024), bounded_text(value, 1024)
        total += 4 + len(key.encode()) + len(value.encode())
        if total > MAX_USER_PROPERTY_BYTES:
            break
        kept.append((key, value))
    return kept
