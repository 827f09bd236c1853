"""The packet identifiers of one connection's outgoing QoS 1/2 PUBLISHes, mapped to the core's
deliveries. MQTT ids are 16-bit and never 0; the core's delivery ids are plain ints, so the
mapping lives here, in the front end, and never in the broker.
"""

from __future__ import annotations

from kittiwake.broker.consumers import Delivery

# Packet identifiers run 1..65535 (MQTT-2.3.1-1: never 0).
MAX_PACKET_ID = 0xFFFF


class OutgoingPacketIds(dict[int, Delivery]):
    """Packet id -> delivery for the deliveries in flight on this connection.

    A delivery keeps its id in ``delivery.tag``: a resend after reconnecting (or after a
    restart, the store keeps the tag) goes out under the same id, as MQTT-4.4.0-1 requires.
    A dict itself, so looking an acknowledgement up (``get``/``pop``) costs no Python call.
    """

    __slots__ = ("last",)

    def __init__(self) -> None:
        super().__init__()
        # The id handed out last; the next search starts after it.
        self.last = 0

    def assign(self, delivery: Delivery) -> int:
        """The delivery's packet id: its own if it has one, else the next id not in use.

        The in-flight window (at most 65535) guarantees a free id exists.
        """
        packet_id = delivery.tag
        if packet_id:
            self[packet_id] = delivery
            return packet_id
        candidate = self.last
        while True:
            candidate = candidate + 1 if candidate < MAX_PACKET_ID else 1
            if candidate not in self:
                break
        self.last = candidate
        delivery.tag = candidate
        self[candidate] = delivery
        return candidate
