"""Every encoder that can fail on a length fails cleanly (ValueError, the caller's bug) exactly
when the wire cannot carry the value, and round-trips whenever it can; the answer encoder never
fails on a length at all. Sizes are drawn around each limit, not only far below it.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kittiwake.mqtt.answers import MAX_REASON_STRING_BYTES, encode_answer
from kittiwake.mqtt.codec import PacketDecoder, encode, encode_publish
from kittiwake.mqtt.packets import ConnAck, Disconnect, PubAck, SubAck, UnsubAck
from kittiwake.mqtt.properties import (
    VARINT_MAX,
    Properties,
    decode_varint,
    encode_binary,
    encode_string,
    encode_varint,
    read_binary,
    read_string,
)

_SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# One character of each UTF-8 width, repeated to land near the 65,535-byte limit.
_long_text = st.builds(
    lambda char, count: char * count,
    st.sampled_from(["a", "\x01", "é", "€", "💥"]),
    st.integers(0, 70_000),
)


@given(_long_text)
@_SLOW
def test_encode_string_fails_exactly_past_65535_bytes(text: str) -> None:
    size = len(text.encode())
    if size > 0xFFFF:
        with pytest.raises(ValueError):
            encode_string(text)
        return
    data = encode_string(text)
    assert read_string(data, 0, len(data)) == (text, len(data))


@given(st.integers(0, 70_000))
@_SLOW
def test_encode_binary_fails_exactly_past_65535_bytes(size: int) -> None:
    blob = b"\xff" * size
    if size > 0xFFFF:
        with pytest.raises(ValueError):
            encode_binary(blob)
        return
    data = encode_binary(blob)
    assert read_binary(data, 0, len(data)) == (blob, len(data))


@given(st.integers(-5, 5) | st.integers(VARINT_MAX - 5, VARINT_MAX + 5) | st.integers(0, 1 << 29))
def test_encode_varint_fails_exactly_outside_its_range(n: int) -> None:
    if not 0 <= n <= VARINT_MAX:
        with pytest.raises(ValueError):
            encode_varint(n)
        return
    data = encode_varint(n)
    assert decode_varint(data, 0, len(data)) == (n, len(data))


@given(st.integers(65_530, 65_540), st.integers(0, 2), st.sampled_from([None, b"\x00"]))
def test_encode_publish_fails_exactly_for_a_topic_past_65535_bytes(
    size: int, qos: int, properties: bytes | None
) -> None:
    topic = b"t" * size
    if size > 0xFFFF:
        with pytest.raises(ValueError):
            encode_publish(topic, b"p", qos, False, False, 1 if qos else None, properties)
        return
    data = encode_publish(topic, b"p", qos, False, False, 1 if qos else None, properties)
    decoder = PacketDecoder()
    decoder.protocol_version = 5 if properties is not None else 4
    (packet,) = decoder.feed(data)
    assert packet.topic.encode() == topic  # type: ignore[union-attr]


_answers = st.sampled_from(["connack", "disconnect", "puback", "suback", "unsuback"])


@given(
    _answers,
    _long_text,
    st.lists(st.tuples(_long_text, _long_text), max_size=3),
    st.sampled_from([5, 16, 64, 300, 5_000, 268_435_460]),
    st.booleans(),
)
@_SLOW
def test_answers_never_fail_on_a_length_and_respect_the_client_limit(
    kind: str,
    reason: str,
    pairs: list[tuple[str, str]],
    limit: int,
    problem_information: bool,
) -> None:
    def make(props: Properties) -> ConnAck | Disconnect | PubAck | SubAck | UnsubAck:
        return {
            "connack": lambda: ConnAck(False, 0x87, props),
            "disconnect": lambda: Disconnect(0x81, props),
            "puback": lambda: PubAck(1, 0x87, props),
            "suback": lambda: SubAck(1, [0x80], props),
            "unsuback": lambda: UnsubAck(1, [0x11], props),
        }[kind]()

    packet = make(Properties(reason_string=reason, user_properties=pairs))
    data = encode_answer(packet, 5, limit, problem_information)
    # Only the optional text can go; a limit below the bare packet is the caller's to handle.
    bare = encode(make(Properties()), 5)
    assert len(data) <= max(limit, len(bare))
    decoder = PacketDecoder()
    decoder.protocol_version = 5
    (back,) = decoder.feed(data)
    assert type(back) is type(packet)
    got = back.properties  # type: ignore[attr-defined]
    if got.reason_string is not None:
        assert len(got.reason_string.encode()) <= MAX_REASON_STRING_BYTES
        assert reason.startswith(got.reason_string.removesuffix("...").replace("\ufffd", "\x00"))
    assert sum(4 + len(k.encode()) + len(v.encode()) for k, v in got.user_properties) <= 4096
