"""A publisher's read is a run of plain QoS 1 PUBLISHes on one topic, which the server's decoder
(AckRunDecoder) gives as one PublishRun: it must hold exactly what the general path decodes,
in order, and anything the run cannot say (another topic, RETAIN, DUP, QoS 0 or 2, MQTT 5,
a bad packet) must come as itself, as before."""

from __future__ import annotations

import pytest

from kittiwake.mqtt.codec import AckRunDecoder, PacketDecoder, encode
from kittiwake.mqtt.errors import MQTTProtocolError
from kittiwake.mqtt.packets import PubAck, PubAckRun, Publish, PublishRun


def publishes(topic: str, ids: list[int]) -> list[Publish]:
    return [Publish(topic, b"m%d" % i, 1, False, False, i) for i in ids]


def wire(packets: list[Publish] | list[object], version: int = 4) -> bytes:
    return b"".join(encode(p, version) for p in packets)  # type: ignore[arg-type]


def flat(packets: list[object]) -> list[object]:
    """Runs opened into the packets they stand for (what the general decoder gives)."""
    out: list[object] = []
    for packet in packets:
        if isinstance(packet, PublishRun):
            out.extend(packet.publishes())
        elif isinstance(packet, PubAckRun):
            out.extend(PubAck(i) for i in packet.packet_ids)
        else:
            out.append(packet)
    return out


def test_a_run_of_publishes_on_one_topic_comes_as_one_packet() -> None:
    data = wire(publishes("a/b", [1, 2, 0xFFFF]))
    assert AckRunDecoder().feed(data) == [
        PublishRun("a/b", [1, 2, 0xFFFF], [b"m1", b"m2", b"m65535"])
    ]
    # Not the client's decoder, nor any other opted out of runs.
    assert PacketDecoder().feed(data) == publishes("a/b", [1, 2, 0xFFFF])


def test_a_lone_publish_comes_as_itself() -> None:
    data = wire(publishes("t", [1])) + encode(PubAck(4), 4) + wire(publishes("t", [2]))
    assert AckRunDecoder().feed(data) == [
        publishes("t", [1])[0],
        PubAckRun([4]),
        publishes("t", [2])[0],
    ]


def test_what_a_run_cannot_hold_ends_it_and_comes_as_itself() -> None:
    retained = Publish("t", b"r", 1, True, False, 7)
    duplicate = Publish("t", b"d", 1, False, True, 8)
    qos0 = Publish("t", b"z", 0, False, False, None)
    qos2 = Publish("t", b"e", 2, False, False, 9)
    other = publishes("u", [10, 11])
    packets: list[object] = [
        *publishes("t", [1, 2]),
        retained,
        *publishes("t", [3, 4]),
        duplicate,
        *publishes("t", [5]),
        qos0,
        qos2,
        *publishes("t", [6, 12]),
        *other,
        PubAck(1),
        *publishes("u", [13, 14]),
    ]
    decoded = AckRunDecoder().feed(wire(packets))
    assert flat(decoded) == packets
    assert [type(p) for p in decoded] == [
        PublishRun, Publish, PublishRun, Publish, Publish, Publish, Publish, PublishRun,
        PublishRun, PubAckRun, PublishRun,
    ]
    assert decoded[-3] == PublishRun("u", [10, 11], [b"m10", b"m11"])


def test_mqtt5_publishes_come_one_by_one() -> None:
    decoder = AckRunDecoder()
    decoder.protocol_version = 5
    packets = publishes("t", [1, 2, 3])
    assert decoder.feed(wire(packets, 5)) == packets


@pytest.mark.parametrize("cut", range(1, 3 * len(encode(publishes("t/x", [1])[0], 4))))
def test_a_run_split_across_reads_keeps_every_publish_in_order(cut: int) -> None:
    packets = publishes("t/x", [1, 2, 3])
    data = wire(packets)
    decoder = AckRunDecoder()
    decoded = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
    assert flat(decoded) == packets


def test_a_topic_that_repeats_only_in_part_is_not_joined() -> None:
    # Same length, different bytes; and a topic the remembered one is a prefix of.
    packets = publishes("t/a", [1, 2]) + publishes("t/b", [3]) + publishes("t/bb", [4, 5])
    decoded = AckRunDecoder().feed(wire(packets))
    assert flat(decoded) == packets
    assert decoded[1] == publishes("t/b", [3])[0]


def test_a_publisher_cycling_over_topics_gives_what_the_general_path_gives() -> None:
    # While it cycles the decoder remembers no topic, so nothing joins a run; once it settles
    # on one topic, that topic is remembered again (within 64 messages) and a run starts.
    packets = [p for i in range(200) for p in publishes(f"c/{i % 7}", [1 + i])]
    packets += publishes("c/9", list(range(201, 301)))
    decoded = AckRunDecoder().feed(wire(packets))
    assert flat(decoded) == packets
    last = decoded[-1]
    assert isinstance(last, PublishRun) and last.topic == "c/9"
    assert last.packet_ids[-1] == 300 and len(last.packet_ids) > 30


def test_a_bad_publish_after_a_run_is_refused_and_the_run_kept_for_acting_on() -> None:
    good = wire(publishes("t", [5, 6]))
    zero_id = b"\x32\x05\x00\x01t\x00\x00"  # the run's topic, packet identifier 0
    decoder = AckRunDecoder()
    with pytest.raises(MQTTProtocolError, match="packet identifier 0") as caught:
        decoder.feed(good + zero_id)
    assert caught.value.packets_before == [PublishRun("t", [5, 6], [b"m5", b"m6"])]


def test_a_publish_too_short_for_its_id_after_a_run_is_malformed() -> None:
    decoder = AckRunDecoder()
    with pytest.raises(MQTTProtocolError) as caught:
        decoder.feed(wire(publishes("t", [5, 6])) + b"\x32\x04\x00\x01t\x00")
    assert caught.value.packets_before == [PublishRun("t", [5, 6], [b"m5", b"m6"])]


def test_a_run_encodes_as_its_publishes() -> None:
    run = PublishRun("a", [1, 0x0203], [b"x", b""])
    assert encode(run, 4) == wire(run.publishes())
    assert AckRunDecoder().feed(encode(run, 4)) == [run]
