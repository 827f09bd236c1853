"""The packet identifiers of one connection's outgoing QoS 1/2 PUBLISHes, mapped to the core's
deliveries. MQTT ids are 16-bit and never 0; the core's delivery ids are plain ints, so the
mapping lives here, in the front end, and never in the broker.
"""

from __future__ import annotations

from kittiwake.broker.consumers import Delivery

# Packet identifiers run 1..65535 (MQTT-2.3.1-1: never 0).
MAX_PACKET_ID = 0xFFFF


class OutgoingPacketIds:
    """Packet id -> delivery for the deliveries in flight on this connection.

    A delivery keeps its id in ``delivery.tag``: a resend after reconnecting (or after a
    restart, the store keeps the tag) goes out under the same id, as MQTT-4.4.0-1 requires.
    """

    __slots__ = ("_by_id", "_last")

    def __init__(self) -> None:
        self._by_id: dict[int, Delivery] = {}
        self._last = 0

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, packet_id: int) -> bool:
        return packet_id in self._by_id

    def assign(self, delivery: Delivery) -> int:
        """The delivery's packet id: its own if it has one, else the next id not in use.

        The in-flight window (at most 65535) guarantees a free id exists.
        """
        by_id = self._by_id
        packet_id = delivery.tag
        if packet_id:
            by_id[packet_id] = delivery
            return packet_id
        candidate = self._last
        while True:
            candidate = candidate + 1 if candidate < MAX_PACKET_ID else 1
            if candidate not in by_id:
                break
        self._last = candidate
        delivery.tag = candidate
        by_id[candidate] = delivery
        return candidate

    def get(self, packet_id: int) -> Delivery | None:
        return self._by_id.get(packet_id)

    def pop(self, packet_id: int) -> Delivery | None:
        """Forget the id (its exchange is over) and return its delivery."""
        return self._by_id.pop(packet_id, None)
