"""A subscriber's read is a run of plain PUBACKs, which the decoder takes without its general
checks: they must come out exactly as the general path makes them, split reads and bad ids
included."""

from __future__ import annotations

import pytest

from kittiwake.mqtt.codec import AckRunDecoder, PacketDecoder, encode
from kittiwake.mqtt.errors import MQTTProtocolError
from kittiwake.mqtt.packets import PubAck, PubAckRun, Publish


def test_a_run_of_pubacks_with_a_publish_between() -> None:
    publish = Publish("t", b"p", 1, False, False, 9)
    data = encode(PubAck(1), 4) + encode(PubAck(0x1234), 4) + encode(publish, 4)
    data += encode(PubAck(0xFFFF), 4)
    assert PacketDecoder().feed(data) == [PubAck(1), PubAck(0x1234), publish, PubAck(0xFFFF)]


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 6, 7])
def test_pubacks_split_across_reads(cut: int) -> None:
    data = encode(PubAck(3), 4) + encode(PubAck(4), 4)
    decoder = PacketDecoder()
    packets = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
    assert packets == [PubAck(3), PubAck(4)]


def test_a_puback_with_packet_id_zero_is_refused_after_the_ones_before() -> None:
    decoder = PacketDecoder()
    with pytest.raises(MQTTProtocolError, match="packet identifier 0") as caught:
        decoder.feed(encode(PubAck(5), 4) + b"\x40\x02\x00\x00")
    assert caught.value.packets_before == [PubAck(5)]


def test_a_v5_puback_with_a_reason_code_takes_the_general_path() -> None:
    decoder = PacketDecoder()
    decoder.protocol_version = 5
    assert decoder.feed(b"\x40\x03\x00\x07\x10") == [PubAck(7, 0x10)]


# The server's decoder (AckRunDecoder) gives consecutive plain PUBACKs as one PubAckRun.


def test_ack_runs_give_one_run_per_stretch_of_plain_pubacks() -> None:
    publish = Publish("t", b"p", 1, False, False, 9)
    data = encode(PubAck(1), 4) + encode(PubAck(0x1234), 4) + encode(publish, 4)
    data += encode(PubAck(0xFFFF), 4) + encode(PubAck(2), 4)
    assert AckRunDecoder().feed(data) == [
        PubAckRun([1, 0x1234]),
        publish,
        PubAckRun([0xFFFF, 2]),
    ]


def test_a_v5_puback_with_a_reason_code_ends_a_run_and_comes_as_itself() -> None:
    decoder = AckRunDecoder()
    decoder.protocol_version = 5
    data = b"\x40\x02\x00\x01" + b"\x40\x03\x00\x07\x10" + b"\x40\x02\x00\x08"
    assert decoder.feed(data) == [PubAckRun([1]), PubAck(7, 0x10), PubAckRun([8])]


@pytest.mark.parametrize("cut", [1, 2, 3, 4, 5, 6, 7, 9, 11])
def test_a_run_split_across_reads_keeps_every_id_in_order(cut: int) -> None:
    data = b"".join(encode(PubAck(i), 4) for i in (3, 4, 5))
    decoder = AckRunDecoder()
    packets = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
    assert all(type(p) is PubAckRun for p in packets)
    assert [i for p in packets for i in p.packet_ids] == [3, 4, 5]  # type: ignore[union-attr]


def test_a_run_before_a_puback_with_packet_id_zero_is_kept_for_acting_on() -> None:
    decoder = AckRunDecoder()
    with pytest.raises(MQTTProtocolError, match="packet identifier 0") as caught:
        decoder.feed(encode(PubAck(5), 4) + encode(PubAck(6), 4) + b"\x40\x02\x00\x00")
    assert caught.value.packets_before == [PubAckRun([5, 6])]


def test_a_run_encodes_as_its_pubacks() -> None:
    assert encode(PubAckRun([1, 0x0203]), 4) == encode(PubAck(1), 4) + encode(PubAck(0x0203), 4)
    assert AckRunDecoder().feed(encode(PubAckRun([7, 8]), 5)) == [PubAckRun([7, 8])]
