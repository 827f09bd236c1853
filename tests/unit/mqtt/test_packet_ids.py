"""Outgoing packet identifiers: the MQTT front end's 16-bit ids for the core's deliveries
(MQTT-2.3.1-1: never 0; an id in flight is never reused; a resend keeps its id)."""

from __future__ import annotations

from kittiwake.broker.consumers import Consumer, Delivery
from kittiwake.broker.message import Message
from kittiwake.broker.queues import QueuedMessage
from kittiwake.mqtt.packet_ids import MAX_PACKET_ID, OutgoingPacketIds


def delivery(core_id: int) -> Delivery:
    return Delivery(core_id, QueuedMessage.of(Message("t", b""), 1), Consumer(None, window=1))


def test_ids_start_at_one_and_increase() -> None:
    ids = OutgoingPacketIds()
    assert [ids.assign(delivery(n)) for n in range(3)] == [1, 2, 3]


def test_a_delivery_keeps_its_id() -> None:
    """A resend (after reconnecting, or after a restart: the store keeps the tag) goes out
    under the id it had, and registers it on the new connection."""
    first = OutgoingPacketIds()
    d = delivery(7)
    packet_id = first.assign(d)
    assert d.tag == packet_id
    again = OutgoingPacketIds()
    assert again.assign(d) == packet_id
    assert again.get(packet_id) is d


def test_ids_wrap_and_skip_those_in_flight() -> None:
    """After 65535 the ids wrap to 1, skipping ids still in flight; 0 is never used."""
    ids = OutgoingPacketIds()
    held = {}
    for n in range(MAX_PACKET_ID):
        d = delivery(n)
        packet_id = ids.assign(d)
        if packet_id in (1, 2, MAX_PACKET_ID):
            held[packet_id] = d
        else:
            assert ids.pop(packet_id) is d
    assert len(ids) == 3
    assert ids.assign(delivery(-1)) == 3
    assert 0 not in ids


def test_core_ids_beyond_16_bits_map_to_valid_packet_ids() -> None:
    ids = OutgoingPacketIds()
    big = delivery(10**9)
    packet_id = ids.assign(big)
    assert 1 <= packet_id <= MAX_PACKET_ID
    assert ids.pop(packet_id) is big and ids.pop(packet_id, None) is None
