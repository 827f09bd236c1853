"""The decoder hands back the whole frame of a forwardable QoS 0 PUBLISH (the fast path's input)."""

from __future__ import annotations

from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.packets import Publish


def _decode_one(data: bytes, version: int = 4) -> Publish:
    decoder = PacketDecoder()
    decoder.protocol_version = version
    [packet] = decoder.feed(data)
    assert isinstance(packet, Publish)
    return packet


def test_plain_qos0_publish_keeps_its_exact_frame() -> None:
    """A 3.1.1 QoS 0 PUBLISH without RETAIN is forwarded byte for byte."""
    frame = encode(Publish("a/b", b"x" * 300), 4)
    assert _decode_one(frame).raw == frame


def test_no_raw_frame_when_a_subscriber_would_need_other_bytes() -> None:
    """RETAIN, QoS > 0 and 5.0 frames differ from what a 3.x subscriber gets, so no raw."""
    assert _decode_one(encode(Publish("a", b"p", retain=True), 4)).raw is None
    assert _decode_one(encode(Publish("a", b"p", qos=1, packet_id=7), 4)).raw is None
    assert _decode_one(encode(Publish("a", b"p"), 5), version=5).raw is None


def test_non_minimal_remaining_length_is_not_forwarded() -> None:
    """MQTT-1.5.5-1: a padded remaining length must never be passed on to subscribers."""
    padded = b"\x30\x86\x00" + b"\x00\x01a" + b"pay"  # 6 encoded in two bytes
    packet = _decode_one(padded)
    assert packet.payload == b"pay"
    assert packet.raw is None


def test_raw_frame_is_excluded_from_equality() -> None:
    """Round-trip equality compares fields, not how the packet arrived."""
    frame = encode(Publish("t", b"v"), 4)
    assert _decode_one(frame) == Publish("t", b"v")
