"""Just enough MQTT 3.1.1 to drive a broker: pre-encoded packets and a framing scanner.

Every packet the load generator sends is built here once, before the clock starts; the hot
loops only slice and stamp pre-built ``bytearray``s. Deliberately independent of kittiwake's
codec so the same bytes go to every broker.
"""

from __future__ import annotations

import struct

PAYLOAD_SIZE = 64
# Payload layout: 8-byte big-endian send time (time.monotonic_ns(), one clock for all local
# processes; 0 = not stamped), then filler up to PAYLOAD_SIZE.
TS = struct.Struct(">q")

CONNECT = 0x10
CONNACK = 0x20
PUBLISH = 0x30
PUBACK = 0x40
SUBSCRIBE = 0x80
SUBACK = 0x90
PINGREQ_BYTES = b"\xc0\x00"
PINGRESP = 0xD0
DISCONNECT_BYTES = b"\xe0\x00"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def utf8(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">H", len(raw)) + raw


def packet(first_byte: int, body: bytes) -> bytes:
    return bytes([first_byte]) + varint(len(body)) + body


def connect(client_id: str, *, keepalive: int = 60, clean: bool = True) -> bytes:
    flags = 0x02 if clean else 0x00
    body = utf8("MQTT") + bytes([4, flags]) + struct.pack(">H", keepalive) + utf8(client_id)
    return packet(CONNECT, body)


def subscribe(packet_id: int, topic_filter: str, qos: int) -> bytes:
    body = struct.pack(">H", packet_id) + utf8(topic_filter) + bytes([qos])
    return packet(SUBSCRIBE | 0x02, body)


def publish(topic: str, payload: bytes, qos: int, packet_id: int = 0, *,
            retain: bool = False) -> bytes:
    body = utf8(topic) + (struct.pack(">H", packet_id) if qos else b"") + payload
    return packet(PUBLISH | (qos << 1) | int(retain), body)


def subscribe_many(packet_id: int, topic_filters: list[str], qos: int) -> bytes:
    body = struct.pack(">H", packet_id) + b"".join(utf8(f) + bytes([qos]) for f in topic_filters)
    return packet(SUBSCRIBE | 0x02, body)


# A fleet (issue 17): subscriber connections of FLEET_FILTERS_PER_CONN filters each, half exact
# `s/<i>/v`, half `s/<i>/+`, and publications cycling over topics that each match one filter.
# Device numbers are zero-padded so every topic has one length (PublishRun needs fixed frames).
FLEET_FILTERS_PER_CONN = 5000


def fleet_filter(i: int, filters: int) -> str:
    return f"s/{i:07d}/v" if i < filters // 2 else f"s/{i:07d}/+"


def fleet_topic_indices(filters: int, topics: int) -> list[int]:
    """The filters the distinct topics match, spread over both halves."""
    step = max(1, filters // topics)
    return [i * step for i in range(min(topics, filters))]


def fleet_topic(i: int, filters: int) -> str:
    return f"s/{i:07d}/v" if i < filters // 2 else f"s/{i:07d}/w"


def puback(packet_id: int) -> bytes:
    return b"\x40\x02" + struct.pack(">H", packet_id)


def filler_payload() -> bytes:
    return bytes(8) + bytes((i * 7 + 3) & 0xFF for i in range(PAYLOAD_SIZE - 8))


class PublishRun:
    """``count`` PUBLISH frames of one topic laid end to end in one buffer.

    Every frame has the same length (fixed topic, fixed payload, 2-byte packet id at QoS 1),
    so message ``i`` starts at ``i * frame_len`` and a contiguous range of messages is a
    contiguous byte range: sending a window is one ``sock.send`` of a memoryview slice.
    Packet ids cycle 1..65535 (far larger than any in-flight window).
    """

    def __init__(self, topic: str, qos: int, count: int, topics: list[str] | None = None) -> None:
        """``topics``: cycle over these (all of one length) instead of ``topic``."""
        payload = filler_payload()
        first = publish(topic, payload, qos, 1)
        self.frame_len = len(first)
        self.ts_offset = self.frame_len - PAYLOAD_SIZE  # where the timestamp sits in a frame
        self.count = count
        if topics:
            frames = [publish(t, payload, qos, 1) for t in topics]
            if {len(f) for f in frames} != {self.frame_len}:
                raise ValueError("every topic of a run must have the topic's length")
            whole = b"".join(frames[i % len(frames)] for i in range(count))
        else:
            whole = first * count
        if qos == 0:
            self.buf = bytearray(whole)
        else:
            pid_offset = self.ts_offset - 2
            buf = bytearray(whole)
            pack = struct.Struct(">H").pack_into
            for i in range(count):
                pack(buf, i * self.frame_len + pid_offset, i % 65535 + 1)
            self.buf = buf
        self.view = memoryview(self.buf)

    def stamp(self, start: int, end: int, now_ns: int) -> None:
        """Write ``now_ns`` into the payload of messages [start, end)."""
        pack = TS.pack_into
        buf = self.buf
        flen = self.frame_len
        for off in range(start * flen + self.ts_offset, end * flen + self.ts_offset, flen):
            pack(buf, off, now_ns)


def read_connack(data: bytes) -> int:
    """Return code of a CONNACK at the start of ``data``; -1 if it is not one."""
    if len(data) >= 4 and data[0] == CONNACK:
        return data[3]
    return -1
