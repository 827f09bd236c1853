"""The decoder remembers the last PUBLISH topic it checked: a repeat is one comparison and the
same string; anything else is decoded and checked as if it had never seen a topic."""

from __future__ import annotations

import pytest

from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.errors import MalformedPacketError, MQTTProtocolError
from kittiwake.mqtt.packets import Publish
from kittiwake.mqtt.properties import Properties


def _publishes(decoder: PacketDecoder, data: bytes) -> list[Publish]:
    packets = decoder.feed(data)
    assert all(isinstance(p, Publish) for p in packets)
    return packets  # type: ignore[return-value]


def _frame(topic: str, payload: bytes = b"p", packet_id: int = 1, version: int = 4) -> bytes:
    return encode(Publish(topic, payload, 1, False, False, packet_id), version)


def test_a_repeated_topic_is_the_same_string() -> None:
    decoder = PacketDecoder()
    first, second = _publishes(decoder, _frame("a/b", b"1", 1) + _frame("a/b", b"2", 2))
    assert (first.topic, first.payload, first.packet_id) == ("a/b", b"1", 1)
    assert (second.topic, second.payload, second.packet_id) == ("a/b", b"2", 2)
    assert second.topic is first.topic


@pytest.mark.parametrize("version", [4, 5])
def test_topics_that_share_a_start_are_told_apart(version: int) -> None:
    """A longer or shorter topic has another length prefix; one of the same length, other
    bytes: each is decoded for what it is."""
    decoder = PacketDecoder()
    decoder.protocol_version = version
    topics = ["a/b", "a/bc", "a/b", "a/c", "b/c", "a/c"]
    data = b"".join(_frame(t, b"x%d" % i, i, version) for i, t in enumerate(topics, start=1))
    decoded = _publishes(decoder, data)
    assert [p.topic for p in decoded] == topics
    assert [p.payload for p in decoded] == [b"x%d" % i for i in range(1, len(topics) + 1)]


def test_a_repeat_split_across_reads_is_decoded_whole() -> None:
    """A PUBLISH completed by a later read (the decoder's buffered tail) is read as well."""
    decoder = PacketDecoder()
    frame = _frame("sensors/1", b"payload", 7)
    [first] = _publishes(decoder, frame)
    assert _publishes(decoder, frame[:5]) == []
    [second] = _publishes(decoder, frame[5:])
    assert (second.topic, second.payload, second.packet_id) == ("sensors/1", b"payload", 7)
    assert second.topic is first.topic


def test_a_wildcard_after_a_valid_topic_of_the_same_length_is_refused() -> None:
    decoder = PacketDecoder()
    _publishes(decoder, _frame("a/b"))
    bad = bytearray(_frame("a/b"))
    bad[bad.index(b"a/b") + 2] = ord("+")
    with pytest.raises(MQTTProtocolError, match="wildcard"):
        decoder.feed(bytes(bad))


def test_a_remembered_topic_that_runs_past_the_packet_is_malformed() -> None:
    """The bytes after the packet's end may repeat the topic (the next packet's); the topic
    of this one still ends inside it or it is malformed."""
    decoder = PacketDecoder()
    _publishes(decoder, _frame("abcd"))
    # Remaining length 4: the topic length (4) and two of its bytes, then a frame starting
    # with "cd" would complete the remembered topic.
    truncated = b"\x32\x04\x00\x04ab" + b"cd" + _frame("x")
    with pytest.raises(MalformedPacketError, match="past the end"):
        decoder.feed(truncated)


def test_a_long_topic_is_not_remembered() -> None:
    decoder = PacketDecoder()
    topic = "t" * 2000
    first, second = _publishes(decoder, _frame(topic, b"1", 1) + _frame(topic, b"2", 2))
    assert first.topic == second.topic == topic
    assert second.topic is not first.topic


def test_a_publisher_cycling_over_topics_stops_being_compared_and_settles_back() -> None:
    """A gateway or a replay publishes each topic once in turn: remembering every one only to
    compare it with the next costs more than the decode it never saves, so after a few in a
    row the decoder stops; a publisher that settles on one topic is remembered again within
    64 messages, and every topic is decoded right throughout."""
    decoder = PacketDecoder()
    cycling = [f"s/{i}/v" for i in range(10)]
    decoded = _publishes(decoder, b"".join(_frame(t) for t in cycling))
    assert [p.topic for p in decoded] == cycling
    assert decoder._last_topic is not None
    assert decoder._last_topic[1] == ""  # no topic remembered: a count of topics to go
    settled = _publishes(decoder, b"".join(_frame("s/9/w", b"%d" % i) for i in range(65)))
    assert [p.topic for p in settled] == ["s/9/w"] * 65
    assert settled[-1].topic is settled[-2].topic  # remembered: the same string
    # After a repeat the next change is remembered at once, as before.
    a, b, c = _publishes(decoder, _frame("x/1") + _frame("x/1") + _frame("x/2") + _frame("x/2"))[1:]
    assert (a.topic, b.topic, c.topic) == ("x/1", "x/2", "x/2")
    assert c.topic is b.topic


@pytest.mark.parametrize("version", [4, 5])
def test_an_empty_topic_while_cycling_is_decoded_as_ever(version: int) -> None:
    """A cycling decoder decodes an empty topic as any other: 3.x still refuses an empty
    topic, 5.0 still takes it with an alias."""
    decoder = PacketDecoder()
    decoder.protocol_version = version
    _publishes(decoder, b"".join(_frame(f"s/{i}", b"p", 1, version) for i in range(10)))
    aliased = Publish("", b"p", 1, False, False, 2, Properties(topic_alias=5))
    if version == 4:
        with pytest.raises(MalformedPacketError, match="empty topic"):
            decoder.feed(encode(Publish("", b"p", 1, False, False, 2), 4))
        return
    [decoded] = _publishes(decoder, encode(aliased, 5))
    assert (decoded.topic, decoded.properties.topic_alias, decoded.payload) == ("", 5, b"p")
    [after] = _publishes(decoder, _frame("s/x", b"q", 3, 5))
    assert (after.topic, after.payload) == ("s/x", b"q")


def _cycling_decoder(version: int) -> PacketDecoder:
    decoder = PacketDecoder()
    decoder.protocol_version = version
    _publishes(decoder, b"".join(_frame(f"s/{i}", b"p", 1, version) for i in range(10)))
    assert decoder._last_topic is not None and decoder._last_topic[1] == ""  # cycling
    return decoder


def _with_topic_bytes(topic: bytes, version: int) -> bytes:
    """A QoS 1 PUBLISH whose topic is ``topic`` as given (no encoder check)."""
    frame = bytearray(_frame("t" * len(topic), b"p", 1, version))
    at = frame.index(b"t" * len(topic))
    frame[at : at + len(topic)] = topic
    return bytes(frame)


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize(
    ("topic", "error", "match"),
    [
        (b"s/+/v", MQTTProtocolError, "wildcard"),
        (b"s/#", MQTTProtocolError, "wildcard"),
        (b"s/\x00/v", MalformedPacketError, "U\\+0000"),
        (b"s/\xff/v", MalformedPacketError, "not valid UTF-8"),
    ],
)
def test_a_bad_topic_while_cycling_is_refused_as_by_a_fresh_decoder(
    version: int, topic: bytes, error: type[Exception], match: str
) -> None:
    """The cycling decoder's own decode path checks what _decode_topic checks, with the same
    errors, and a bad topic does not count as one decoded."""
    data = _with_topic_bytes(topic, version)
    fresh = PacketDecoder()
    fresh.protocol_version = version
    with pytest.raises(error, match=match):
        fresh.feed(data)
    decoder = _cycling_decoder(version)
    assert decoder._last_topic is not None
    countdown = decoder._last_topic[2]
    with pytest.raises(error, match=match):
        decoder.feed(data)
    assert decoder._last_topic[2] == countdown


@pytest.mark.parametrize("version", [4, 5])
def test_a_topic_running_past_the_packet_while_cycling_is_malformed(version: int) -> None:
    decoder = _cycling_decoder(version)
    # Remaining length 4: a topic length of 9 and two of its bytes, then another frame.
    truncated = b"\x32\x04\x00\x09ab" + _frame("s/1234567", b"p", 1, version)
    with pytest.raises(MalformedPacketError, match="past the end"):
        decoder.feed(truncated)
    short = _cycling_decoder(version)
    with pytest.raises(MalformedPacketError, match="too short"):
        short.feed(b"\x30\x01\x00" + _frame("s/1", b"p", 1, version))
