"""A subscriber's read is a run of plain PUBACKs, which the decoder takes without its general
checks: they must come out exactly as the general path makes them, split reads and bad ids
included."""

from __future__ import annotations

import pytest

from kittiwake.mqtt.codec import PacketDecoder, encode
from kittiwake.mqtt.errors import MQTTProtocolError
from kittiwake.mqtt.packets import PubAck, Publish


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
