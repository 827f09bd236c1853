"""Sans-IO MQTT 3.1 / 3.1.1 / 5.0 codec: bytes to packet dataclasses and back, with validation.

It owns the wire format and nothing else: it never touches a socket, never awaits, and never
applies broker policy (authorisation, topic filter syntax, quotas belong to the session).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, Final

from kittiwake.mqtt.errors import (
    MalformedPacketError,
    MQTTProtocolError,
    PacketTooLargeError,
    UnsupportedProtocolVersionError,
    quoted,
)
from kittiwake.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    PubAck,
    PubAckRun,
    PubComp,
    Publish,
    PublishRun,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
    Will,
)
from kittiwake.mqtt.properties import (
    WILL_PROPERTIES,
    Properties,
    decode_properties,
    encode_binary,
    encode_properties,
    encode_string,
    encode_varint,
    read_binary,
    read_string,
)
from kittiwake.mqtt.reason_codes import ReasonCode

__all__ = [
    "DISCONNECT_PACKET",
    "MAX_PACKET_SIZE",
    "PINGREQ_PACKET",
    "PINGRESP_PACKET",
    "AckRunDecoder",
    "MQTTProtocolError",
    "MalformedPacketError",
    "PacketDecoder",
    "PacketTooLargeError",
    "UnsupportedProtocolVersionError",
    "encode",
    "encode_publish",
    "encode_remaining_length",
]

# The largest packet the wire format can express: 5 header bytes + 268,435,455.
MAX_PACKET_SIZE: Final = 268_435_460

# Packets whose bytes never vary, built once.
PINGREQ_PACKET: Final = b"\xc0\x00"
PINGRESP_PACKET: Final = b"\xd0\x00"
DISCONNECT_PACKET: Final = b"\xe0\x00"  # 3.x, and 5.0 "normal disconnection" without properties

_PROTOCOL_ERROR: Final = ReasonCode.PROTOCOL_ERROR
_SMALL_LENGTHS: Final = tuple(bytes((i,)) for i in range(128))

# Required low nibble of the first byte per packet type (spec 2.1.3); PUBLISH (3) is free-form.
# None marks type 0, which is reserved and never valid.
_FIXED_FLAGS: Final[tuple[int | None, ...]] = (
    None, 0, 0, -1, 0, 0, 0b0010, 0,  # 0 CONNECT CONNACK PUBLISH PUBACK PUBREC PUBREL PUBCOMP
    0b0010, 0, 0b0010, 0, 0, 0, 0, 0,  # SUBSCRIBE SUBACK UNSUBSCRIBE UNSUBACK PING* DISCONNECT AUTH
)  # fmt: skip


def encode_remaining_length(n: int) -> bytes:
    """The fixed header's Remaining Length varint; ValueError beyond 268,435,455."""
    if 0 <= n < 128:
        return _SMALL_LENGTHS[n]
    return encode_varint(n)


# ---------------------------------------------------------------------------------------------
# Decoding


def _minimal_header_size(length: int) -> int:
    """Bytes of a fixed header whose remaining length uses the fewest bytes (MQTT-1.5.5-1)."""
    return 2 if length < 128 else 3 if length < 16_384 else 4 if length < 2_097_152 else 5


class PacketDecoder:
    """Turns a byte stream from one connection into packets, keeping any partial tail.

    ``protocol_version`` selects the dialect (3, 4 or 5). It is set from the level byte of each
    CONNECT as soon as the name and level check out, so a server decoding a malformed v5
    CONNECT already knows to answer in v5; a client-side decoder sets it by hand. After
    :meth:`feed` raises, the connection is dead and the decoder must not be used again.
    """

    __slots__ = ("_buf", "_last_topic", "max_packet_size", "protocol_version")

    # Consecutive plain PUBACKs come as one PubAckRun instead of a PubAck each (see
    # AckRunDecoder, the server's). A class attribute, not a slot: a slot would cost every
    # connection 16 bytes (its decoder grows past a size class).
    ack_runs: ClassVar[bool] = False

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE) -> None:
        self.max_packet_size = max_packet_size
        self.protocol_version = 4
        # The partial tail of the last read; None while there is none (an idle connection's
        # usual state), so it holds no buffer, nor a drained one's leftover capacity.
        self._buf: bytearray | None = None
        # The last PUBLISH topic decoded: its wire form (length and UTF-8) and the checked
        # string. A publisher repeats its topic, so the next one is one comparison, not a
        # decode and three scans, and is the same str (its hash computed once, for every
        # dict the topic is looked up in). None until the first PUBLISH. Remembered as
        # [wire form, string, topics decoded in a row before it, none the last one's], the
        # count zeroed by a repeat. While a publisher cycles over its topics (a gateway, a
        # replay), which would pay for remembering each only to compare it with the next:
        # [_CYCLING, "", topics still to decode before one is remembered again]. The count
        # has no slot of its own: an idle connection's decoder stays the size it was.
        self._last_topic: list[Any] | None = None

    def feed(self, data: bytes) -> list[Packet]:
        """Consume ``data`` and return every packet it completes, oldest first.

        Raises an :class:`MQTTProtocolError` for the first invalid packet, and
        :class:`PacketTooLargeError` as soon as an oversized fixed header is readable, without
        waiting for (or buffering) the body. The error's ``packets_before`` holds the packets
        of ``data`` decoded before it, which are still to be acted on.
        """
        buf = self._buf
        src: bytes | bytearray
        if buf is not None:
            buf += data
            src = buf
        else:
            src = data  # common case: no leftover, parse the caller's bytes in place
        n = len(src)
        pos = 0
        packets: list[Packet] = []
        mv = memoryview(src)
        max_size = self.max_packet_size
        # A plain PUBACK (what _ack_decoder makes of it) needs none of the checks below but
        # its packet id's: a subscriber's reads are runs of them.
        plain_acks = max_size >= 4
        ack_runs = self.ack_runs
        # The run the next plain PUBACK joins (ack_runs): the last packet, if it is one.
        run: list[int] | None = None
        # ack_runs, for PUBLISH: the last packet when it is a plain 3.x QoS 1 PUBLISH (first
        # byte 0x32) on the remembered topic, or a run of them, which the next such PUBLISH
        # on that topic joins; else None.
        joinable: Publish | PublishRun | None = None
        try:
            while n - pos >= 2:
                first = src[pos]
                length = src[pos + 1]
                if first == 0x40 and length == 2 and plain_acks and pos + 4 <= n:
                    packet_id = (src[pos + 2] << 8) | src[pos + 3]
                    if packet_id:
                        if not ack_runs:
                            packets.append(PubAck(packet_id, 0, _NO_PROPERTIES))
                        elif run is not None:
                            run.append(packet_id)
                        else:
                            run = [packet_id]
                            packets.append(PubAckRun(run))
                            joinable = None
                        pos += 4
                        continue
                run = None
                if length < 0x80:
                    body = pos + 2
                else:
                    header = _long_remaining_length(src, pos, n)
                    if header is None:
                        break
                    length, body = header
                end = body + length
                if end - pos > max_size:
                    raise PacketTooLargeError(
                        f"packet of {end - pos} bytes exceeds the maximum of {max_size}"
                    )
                if end > n:
                    break
                ptype = first >> 4
                flags = first & 0x0F
                if ptype != 3 and flags != _FIXED_FLAGS[ptype]:
                    _check_fixed_flags(ptype, flags, self.protocol_version)
                if ptype == 3:
                    if first == 0x32 and joinable is not None:
                        # The run's topic again (a publisher's flood): its id and payload
                        # join the run. Anything else about it is decoded as usual below.
                        last = self._last_topic
                        assert last is not None  # (a run's topic is the remembered one)
                        wire = last[0]
                        at = body + len(wire)
                        if at + 2 <= end and src.startswith(wire, body, end):
                            packet_id = (src[at] << 8) | src[at + 1]
                            if packet_id:
                                last[2] = 0  # a repeat (see _decode_topic)
                                payload = src[at + 2 : end]
                                if type(payload) is not bytes:
                                    payload = bytes(payload)
                                if type(joinable) is PublishRun:
                                    joinable.packet_ids.append(packet_id)
                                    joinable.payloads.append(payload)
                                else:
                                    assert type(joinable) is Publish
                                    joinable = PublishRun(
                                        joinable.topic,
                                        [joinable.packet_id, packet_id],  # type: ignore[list-item]
                                        [joinable.payload, payload],
                                    )
                                    packets[-1] = joinable
                                pos = end
                                continue
                    # The hot path: PUBLISH is read straight from the input by offsets.
                    publish = _decode_publish_at(self, flags, src, mv, body, end)
                    if first == 0x30:
                        if (
                            self.protocol_version != 5
                            # A one-byte length (the usual case) is minimal: no call to see it.
                            and (body - pos == 2 or body - pos == _minimal_header_size(length))
                        ):
                            raw = src[pos:end]  # _bytes_of, inlined: every QoS 0 publication's
                            publish.raw = raw if type(raw) is bytes else bytes(raw)
                        joinable = None
                    elif (
                        first == 0x32
                        and ack_runs
                        and self.protocol_version != 5
                        and (last := self._last_topic) is not None
                        and last[1] is publish.topic
                    ):
                        joinable = publish  # a run may start here
                    else:
                        joinable = None
                    packets.append(publish)
                else:
                    packets.append(_DECODERS[ptype](self, flags, mv[body:end]))
                    joinable = None
                pos = end
        except MQTTProtocolError as error:
            self._buf = None  # the connection is dead; drop the tail with the error
            error.packets_before = list(packets)
            raise
        except BaseException:
            self._buf = None
            raise
        finally:
            mv.release()  # the bytearray cannot be resized while a view of it is alive
        if src is buf:
            if pos == n:
                self._buf = None
            elif pos:
                del buf[:pos]
        elif pos < n:
            self._buf = bytearray(data[pos:])
        return packets


class AckRunDecoder(PacketDecoder):
    """The server's decoder: a read's consecutive plain PUBACKs (a subscriber's reads are
    runs of them, one per delivery) come as one :class:`PubAckRun` of their ids, not a
    :class:`PubAck` object each."""

    __slots__ = ()

    ack_runs = True


def _long_remaining_length(src: bytes | bytearray, pos: int, n: int) -> tuple[int, int] | None:
    """Remaining Length of 2-4 bytes at ``src[pos + 1:]``: (length, body offset), or None if
    the header is still incomplete. A fifth continuation byte is Malformed (spec 1.5.5)."""
    value = 0
    shift = 0
    i = pos + 1
    while i < n:
        byte = src[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        if i - pos > 4:
            raise MalformedPacketError("remaining length longer than 4 bytes")
        shift += 7
    return None


def _check_fixed_flags(ptype: int, flags: int, version: int) -> None:
    if ptype == 0:
        raise MalformedPacketError("reserved packet type 0")
    # MQTT 3.1 let PUBREL, SUBSCRIBE and UNSUBSCRIBE be retried with the DUP bit set.
    if version == 3 and flags == 0b1010 and _FIXED_FLAGS[ptype] == 0b0010:
        return
    raise MalformedPacketError(f"reserved flags 0b{flags:04b} invalid for {PacketType(ptype).name}")


def _malformed_trailing(name: str) -> MalformedPacketError:
    return MalformedPacketError(f"unexpected bytes after the end of {name}")


def _packet_id(body: memoryview, pos: int, end: int, name: str) -> int:
    if pos + 2 > end:
        raise MalformedPacketError(f"{name} too short for a packet identifier")
    packet_id = (body[pos] << 8) | body[pos + 1]
    if not packet_id:
        # Malformed in 3.1.1, Protocol Error in 5.0; PROTOCOL_ERROR for both keeps one rule.
        raise MQTTProtocolError(_PROTOCOL_ERROR, f"{name} with packet identifier 0")
    return packet_id


def _check_topic_name(topic: str, what: str) -> None:
    if "+" in topic or "#" in topic:
        raise MQTTProtocolError(
            ReasonCode.TOPIC_NAME_INVALID, f"{what} {quoted(topic)} has a wildcard"
        )


def _decode_reserved(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    raise MalformedPacketError("reserved packet type 0")  # unreachable: caught by the flags check


def _decode_connect(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    end = len(body)
    name, pos = read_string(body, 0, end)
    if pos >= end:
        raise MalformedPacketError("CONNECT ends before the protocol level")
    level = body[pos]
    pos += 1
    if name == "MQTT":
        if level != 4 and level != 5:
            raise UnsupportedProtocolVersionError(level)
    elif name == "MQIsdp":
        if level != 3:
            raise UnsupportedProtocolVersionError(level)
    else:
        # 3.1.1 and 5.0 (3.1.2.1): an unknown name is not MQTT at all; the server just closes.
        raise MalformedPacketError(f"unknown protocol name {quoted(name)}")
    dec.protocol_version = level
    if pos + 3 > end:
        raise MalformedPacketError("CONNECT ends inside its variable header")
    cflags = body[pos]
    keepalive = (body[pos + 1] << 8) | body[pos + 2]
    pos += 3
    if cflags & 0x01:
        raise MalformedPacketError("CONNECT reserved flag is set")
    will_flag = cflags & 0x04
    will_qos = (cflags >> 3) & 0x03
    will_retain = bool(cflags & 0x20)
    if will_flag:
        if will_qos == 3:
            raise MalformedPacketError("CONNECT will QoS 3")
    elif will_qos or will_retain:
        raise MalformedPacketError("CONNECT will QoS/retain set without the will flag")
    has_password = cflags & 0x40
    has_username = cflags & 0x80
    if has_password and not has_username and level < 5:
        raise MalformedPacketError("CONNECT password flag without user name flag")
    if level == 5:
        props, pos = decode_properties(body, pos, PacketType.CONNECT)
    else:
        props = Properties()
    client_id, pos = read_string(body, pos, end)
    will = None
    if will_flag:
        if level == 5:
            will_props, pos = decode_properties(body, pos, WILL_PROPERTIES)
        else:
            will_props = Properties()
        will_topic, pos = read_string(body, pos, end)
        if not will_topic:
            raise MQTTProtocolError(ReasonCode.TOPIC_NAME_INVALID, "empty will topic")
        _check_topic_name(will_topic, "will topic")
        will_payload, pos = read_binary(body, pos, end)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = None
    password = None
    if has_username:
        username, pos = read_string(body, pos, end)
    if has_password:
        password, pos = read_binary(body, pos, end)
    if pos != end:
        raise _malformed_trailing("CONNECT")
    return Connect(
        client_id,
        level,
        name,
        bool(cflags & 0x02),
        keepalive,
        will,
        username,
        password,
        props,
    )


def _decode_connack(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    end = len(body)
    if end < 2:
        raise MalformedPacketError("CONNACK too short")
    version = dec.protocol_version
    ack_flags = body[0]
    if version == 3:
        session_present = False  # 3.1: the first byte is unused
    else:
        if ack_flags & 0xFE:
            raise MalformedPacketError("CONNACK reserved acknowledge flags set")
        session_present = bool(ack_flags)
    pos = 2
    # A v5 client may meet a 3.1.1 server refusing it with a 2-byte CONNACK; accept that.
    if version == 5 and end > 2:
        props, pos = decode_properties(body, 2, PacketType.CONNACK)
    else:
        props = Properties()
    if pos != end:
        raise _malformed_trailing("CONNACK")
    return ConnAck(session_present, body[1], props)


# A longer topic is not remembered as the decoder's last (see PacketDecoder._last_topic): an
# idle publisher of huge topics keeps no copy of one (as the broker's per-topic caches).
_REMEMBERED_TOPIC_BYTES: Final = 1026
# After this many PUBLISH topics in a row that were not the last one's, a decoder remembers
# only every _REMEMBER_EVERY-th: a publisher that settles on one topic again is found within
# that many messages, and one cycling over many pays for neither copy nor comparison.
_REMEMBER_STREAK: Final = 4
_REMEMBER_EVERY: Final = 64
# What a cycling decoder remembers instead of a topic's wire form: a marker, never compared
# with a topic (_decode_publish_at tests for it first). The wire form of the empty topic, so
# that a comparison would still be what decoding makes of it.
_CYCLING: Final = b"\x00\x00"


# Every 3.1/3.1.1 PUBLISH, SUBSCRIBE and UNSUBSCRIBE shares this one empty object instead of
# allocating its own; decoded packets are read, never modified, by the server.
_NO_PROPERTIES = Properties()


def _bytes_of(src: bytes | bytearray, start: int, end: int) -> bytes:
    piece = src[start:end]
    return piece if type(piece) is bytes else bytes(piece)


def _decoded_by_feed(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    """PUBLISH's place in the table: feed() decodes it by offsets (:func:`_decode_publish_at`)."""
    raise AssertionError("PUBLISH never goes through the decoder table")


def _decode_publish_at(
    dec: PacketDecoder,
    flags: int,
    src: bytes | bytearray,
    view: memoryview,
    start: int,
    end: int,
) -> Publish:
    """Decode the PUBLISH whose body is ``src[start:end]`` (``view`` is a view of ``src``)."""
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacketError("PUBLISH with QoS 3")
    dup = (flags & 0x08) != 0  # not bool(): a comparison costs no call
    version = dec.protocol_version
    if dup and not qos and version != 3:
        raise MalformedPacketError("PUBLISH with DUP set at QoS 0 (MQTT-3.3.1-2)")
    last = dec._last_topic
    if last is None:
        topic, pos = _decode_topic(dec, src, start, end)
    elif last[0] is _CYCLING:
        # A publisher cycling over its topics (see _decode_topic), its usual case written out:
        # the topic decoded and checked, not remembered, no call. Anything unusual (a
        # malformed topic, the countdown's end) takes the call.
        countdown = last[2]
        pos = start + 2 + ((src[start] << 8) | src[start + 1]) if end - start >= 2 else end + 1
        if countdown and pos <= end:
            try:
                # decode() without its argument: strict UTF-8 all the same, without the
                # encoding name's lookup (about a twentieth of a cycling publisher's decode).
                topic = src[start + 2 : pos].decode()
            except UnicodeDecodeError:
                raise MalformedPacketError("PUBLISH topic is not valid UTF-8") from None
            if "\x00" in topic or "+" in topic or "#" in topic:
                topic, pos = _decode_topic(dec, src, start, end)  # raises what is wrong
            last[2] = countdown - 1
        else:
            topic, pos = _decode_topic(dec, src, start, end)
    else:
        wire = last[0]
        pos = start + len(wire)
        # A slice compared, not src.startswith(wire, start, end): that method parses its
        # arguments from a tuple (about 1,300 instructions a call, callgrind), the slice and
        # comparison cost about a third of it. The bound keeps the topic inside the packet.
        if pos <= end and src[start:pos] == wire:
            # The topic of the last PUBLISH, checked then (the checks depend on its bytes
            # alone).
            topic = last[1]
            last[2] = 0
        else:
            topic, pos = _decode_topic(dec, src, start, end)
    packet_id = None
    if qos:
        if pos + 2 > end:
            raise MalformedPacketError("PUBLISH too short for a packet identifier")
        packet_id = (src[pos] << 8) | src[pos + 1]
        if not packet_id:
            raise MQTTProtocolError(_PROTOCOL_ERROR, "PUBLISH with packet identifier 0")
        pos += 2
    if version == 5:
        if pos < end and not src[pos]:
            props = Properties()
            pos += 1
        else:
            # Properties are read from a view ending at the packet's end, as they require.
            props, offset = decode_properties(view[start:end], pos - start, PacketType.PUBLISH)
            pos = start + offset
        if not topic and props.topic_alias is None:
            raise MQTTProtocolError(_PROTOCOL_ERROR, "PUBLISH with empty topic and no alias")
    else:
        if not topic:
            raise MalformedPacketError("PUBLISH with empty topic")
        props = _NO_PROPERTIES
    payload = src[pos:end]  # _bytes_of, inlined: every publication's path
    if type(payload) is not bytes:
        payload = bytes(payload)
    return Publish(topic, payload, qos, (flags & 0x01) != 0, dup, packet_id, props)


def _decode_topic(
    dec: PacketDecoder, src: bytes | bytearray, start: int, end: int
) -> tuple[str, int]:
    """The topic of the PUBLISH whose body starts at ``start``, checked, and the offset after
    it; remembered as the decoder's last topic."""
    if end - start < 2:
        raise MalformedPacketError("PUBLISH too short for a topic")
    pos = start + 2 + ((src[start] << 8) | src[start + 1])
    if pos > end:
        raise MalformedPacketError("PUBLISH topic runs past the end of the packet")
    try:
        topic = src[start + 2 : pos].decode()  # UTF-8, strict (see _decode_publish_at)
    except UnicodeDecodeError:
        raise MalformedPacketError("PUBLISH topic is not valid UTF-8") from None
    if "\x00" in topic:
        raise MalformedPacketError("PUBLISH topic contains U+0000")
    if "+" in topic or "#" in topic:
        raise MQTTProtocolError(
            ReasonCode.TOPIC_NAME_INVALID, f"topic {quoted(topic)} has a wildcard"
        )
    last = dec._last_topic
    if last is None:
        misses = 0
    elif last[0] is _CYCLING:
        countdown = last[2]
        if countdown:
            last[2] = countdown - 1  # cycling: not remembered
            return topic, pos
        misses = _REMEMBER_STREAK - 1  # one remembered: if the next differs, cycling again
    else:
        misses = last[2] + 1
    if misses >= _REMEMBER_STREAK:
        dec._last_topic = [_CYCLING, "", _REMEMBER_EVERY - 1]
    elif pos - start <= _REMEMBERED_TOPIC_BYTES:
        wire = src[start:pos]
        dec._last_topic = [wire if type(wire) is bytes else bytes(wire), topic, misses]
    return topic, pos


def _ack_decoder(
    cls: type[PubAck] | type[PubRec] | type[PubRel] | type[PubComp],
) -> Callable[[PacketDecoder, int, memoryview], Packet]:
    ptype = cls.packet_type
    name = ptype.name

    def decode(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
        end = len(body)
        packet_id = _packet_id(body, 0, end, name)
        if end == 2:
            return cls(packet_id, 0, _NO_PROPERTIES)
        if dec.protocol_version != 5:
            raise _malformed_trailing(name)
        # 5.0: remaining length 3 carries a reason code only; 4+ adds properties.
        if end == 3:
            return cls(packet_id, body[2], _NO_PROPERTIES)
        props, pos = decode_properties(body, 3, ptype)
        if pos != end:
            raise _malformed_trailing(name)
        return cls(packet_id, body[2], props)

    return decode


def _decode_subscribe(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    end = len(body)
    packet_id = _packet_id(body, 0, end, "SUBSCRIBE")
    v5 = dec.protocol_version == 5
    if v5:
        props, pos = decode_properties(body, 2, PacketType.SUBSCRIBE)
    else:
        props, pos = _NO_PROPERTIES, 2
    subscriptions = []
    if not v5:
        # 3.1/3.1.1 (a fleet subscribes filter after filter): read_string's checks written
        # out, no call and no tuple per filter, read from a copy of the body as bytes (one
        # copy a packet): a bytes slice decodes in half the time of str() of a view's slice.
        data = bytes(body)
        while pos < end:
            if pos + 2 > end:
                raise MalformedPacketError("string length runs past the end of the packet")
            stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
            if stop >= end:
                if stop > end:
                    raise MalformedPacketError("string runs past the end of the packet")
                raise MalformedPacketError("SUBSCRIBE topic filter without subscription options")
            try:
                topic_filter = data[pos + 2 : stop].decode()  # UTF-8, strict
            except UnicodeDecodeError:
                raise MalformedPacketError("string is not valid UTF-8") from None
            if "\x00" in topic_filter:
                raise MalformedPacketError("string contains U+0000")
            options = data[stop]
            if options & 0xFC or options == 3:
                raise MalformedPacketError(f"SUBSCRIBE invalid requested QoS byte 0x{options:02X}")
            subscriptions.append(SubscriptionRequest(topic_filter, options))
            pos = stop + 1
    while pos < end:  # 5.0
        topic_filter, pos = read_string(body, pos, end)
        if pos >= end:
            raise MalformedPacketError("SUBSCRIBE topic filter without subscription options")
        options = body[pos]
        pos += 1
        if options & 0xC0:
            raise MalformedPacketError("SUBSCRIBE reserved option bits set (MQTT-3.8.3-5)")
        qos = options & 0x03
        if qos == 3:
            raise MQTTProtocolError(_PROTOCOL_ERROR, "SUBSCRIBE maximum QoS 3")
        retain_handling = (options >> 4) & 0x03
        if retain_handling == 3:
            raise MQTTProtocolError(_PROTOCOL_ERROR, "SUBSCRIBE retain handling 3")
        subscriptions.append(
            SubscriptionRequest(
                topic_filter, qos, bool(options & 0x04), bool(options & 0x08), retain_handling
            )
        )
    if not subscriptions:
        raise MQTTProtocolError(_PROTOCOL_ERROR, "SUBSCRIBE without topic filters")
    return Subscribe(packet_id, subscriptions, props)


def _decode_suback(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    end = len(body)
    packet_id = _packet_id(body, 0, end, "SUBACK")
    if dec.protocol_version == 5:
        props, pos = decode_properties(body, 2, PacketType.SUBACK)
    else:
        props, pos = Properties(), 2
    if pos >= end:
        raise MQTTProtocolError(_PROTOCOL_ERROR, "SUBACK without reason codes")
    return SubAck(packet_id, list(body[pos:]), props)


def _decode_unsubscribe(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    end = len(body)
    packet_id = _packet_id(body, 0, end, "UNSUBSCRIBE")
    if dec.protocol_version == 5:
        props, pos = decode_properties(body, 2, PacketType.UNSUBSCRIBE)
    else:
        props, pos = _NO_PROPERTIES, 2
    topic_filters = []
    while pos < end:
        topic_filter, pos = read_string(body, pos, end)
        topic_filters.append(topic_filter)
    if not topic_filters:
        raise MQTTProtocolError(_PROTOCOL_ERROR, "UNSUBSCRIBE without topic filters")
    return Unsubscribe(packet_id, topic_filters, props)


def _decode_unsuback(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    end = len(body)
    packet_id = _packet_id(body, 0, end, "UNSUBACK")
    if dec.protocol_version != 5:
        if end != 2:
            raise _malformed_trailing("UNSUBACK")
        return UnsubAck(packet_id)
    props, pos = decode_properties(body, 2, PacketType.UNSUBACK)
    if pos >= end:
        raise MQTTProtocolError(_PROTOCOL_ERROR, "UNSUBACK without reason codes")
    return UnsubAck(packet_id, list(body[pos:]), props)


def _decode_pingreq(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    if len(body):
        raise _malformed_trailing("PINGREQ")
    return PingReq()


def _decode_pingresp(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    if len(body):
        raise _malformed_trailing("PINGRESP")
    return PingResp()


def _decode_disconnect(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    end = len(body)
    if not end:
        return Disconnect()
    if dec.protocol_version != 5:
        raise _malformed_trailing("DISCONNECT")
    if end == 1:
        return Disconnect(body[0])
    props, pos = decode_properties(body, 1, PacketType.DISCONNECT)
    if pos != end:
        raise _malformed_trailing("DISCONNECT")
    return Disconnect(body[0], props)


def _decode_auth(dec: PacketDecoder, flags: int, body: memoryview) -> Packet:
    if dec.protocol_version != 5:
        raise MalformedPacketError("AUTH before MQTT 5")
    end = len(body)
    if not end:
        return Auth()
    if end == 1:
        return Auth(body[0])
    props, pos = decode_properties(body, 1, PacketType.AUTH)
    if pos != end:
        raise _malformed_trailing("AUTH")
    return Auth(body[0], props)


_DECODERS: Final[tuple[Callable[[PacketDecoder, int, memoryview], Packet], ...]] = (
    _decode_reserved,
    _decode_connect,
    _decode_connack,
    _decoded_by_feed,
    _ack_decoder(PubAck),
    _ack_decoder(PubRec),
    _ack_decoder(PubRel),
    _ack_decoder(PubComp),
    _decode_subscribe,
    _decode_suback,
    _decode_unsubscribe,
    _decode_unsuback,
    _decode_pingreq,
    _decode_pingresp,
    _decode_disconnect,
    _decode_auth,
)


# ---------------------------------------------------------------------------------------------
# Encoding. The encoder trusts its caller (our own broker) and validates only what would
# otherwise produce bytes that do not mean what the packet says; it raises ValueError for that.


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_remaining_length(len(body)) + body


def encode_publish(
    topic: bytes,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: bytes | None,
) -> bytes:
    """Encode a PUBLISH from pre-encoded parts: the broker's fan-out hot path.

    ``topic`` is the UTF-8 topic, ``properties`` a block from :func:`encode_properties` for a
    5.0 receiver or None for 3.x (no property block at all).
    """
    first = 0x30 | (qos << 1)
    if retain:
        first |= 0x01
    if dup:
        first |= 0x08
    topic_len = len(topic)
    if topic_len > 0xFFFF:
        raise ValueError("topic longer than 65,535 bytes")
    if qos:
        if packet_id is None:
            raise ValueError(f"QoS {qos} PUBLISH needs a packet identifier")
        head = bytes((topic_len >> 8, topic_len & 0xFF)) + topic + packet_id.to_bytes(2, "big")
    else:
        head = bytes((topic_len >> 8, topic_len & 0xFF)) + topic
    if properties is not None:
        head += properties
    remaining = len(head) + len(payload)
    if remaining < 128:
        return bytes((first, remaining)) + head + payload
    return b"".join((bytes((first,)), encode_varint(remaining), head, payload))


def encode_publish_head(topic: bytes, payload_size: int, qos: int, retain: bool) -> bytes:
    """The start of a 3.x PUBLISH, up to where its packet id (QoS 1/2) or payload (QoS 0)
    goes: what every subscriber of one message shares, so fan-out encodes it once and only
    splices in each packet id and the payload."""
    topic_len = len(topic)
    if topic_len > 0xFFFF:
        raise ValueError("topic longer than 65,535 bytes")
    first = 0x31 | (qos << 1) if retain else 0x30 | (qos << 1)
    remaining = 2 + topic_len + payload_size + (2 if qos else 0)
    if remaining < 128:
        return bytes((first, remaining, topic_len >> 8, topic_len & 0xFF)) + topic
    return b"".join(
        (bytes((first,)), encode_varint(remaining), topic_len.to_bytes(2, "big"), topic)
    )


def _encode_connect(p: Connect, version: int) -> bytes:
    # The CONNECT chooses the dialect, so its own protocol_version wins over the argument.
    level = p.protocol_version
    v5 = level == 5
    cflags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        cflags |= 0x04 | (will.qos << 3)
        if will.retain:
            cflags |= 0x20
    if p.password is not None:
        cflags |= 0x40
    if p.username is not None:
        cflags |= 0x80
    parts = [
        encode_string(p.protocol_name),
        bytes((level, cflags)),
        p.keepalive.to_bytes(2, "big"),
    ]
    if v5:
        parts.append(encode_properties(p.properties, PacketType.CONNECT))
    parts.append(encode_string(p.client_id))
    if will is not None:
        if v5:
            parts.append(encode_properties(will.properties, WILL_PROPERTIES))
        parts.append(encode_string(will.topic))
        parts.append(encode_binary(will.payload))
    if p.username is not None:
        parts.append(encode_string(p.username))
    if p.password is not None:
        parts.append(encode_binary(p.password))
    return _frame(0x10, b"".join(parts))


def _encode_connack(p: ConnAck, version: int) -> bytes:
    if version == 5:
        body = bytes((1 if p.session_present else 0, p.reason_code))
        return _frame(0x20, body + encode_properties(p.properties, PacketType.CONNACK))
    ack_flags = 1 if p.session_present and version != 3 else 0
    return bytes((0x20, 2, ack_flags, p.reason_code))


def _encode_publish(p: Publish, version: int) -> bytes:
    return encode_publish(
        p.topic.encode("utf-8"),
        p.payload,
        p.qos,
        p.retain,
        p.dup,
        p.packet_id,
        encode_properties(p.properties, PacketType.PUBLISH) if version == 5 else None,
    )


def encode_ack(first_byte: int, packet_id: int) -> bytes:
    """A successful PUBACK/PUBREC/PUBREL/PUBCOMP in its 4-byte form (every version accepts it).

    ``first_byte`` is 0x40 (PUBACK), 0x50 (PUBREC), 0x62 (PUBREL) or 0x70 (PUBCOMP).
    """
    return _ACK_FRAME(first_byte, 2, packet_id)


# encode_ack's bytes: one precompiled pack (every QoS 1 publication's PUBACK) is about half
# the cost of building them from a tuple of four ints.
_ACK_FRAME: Final = struct.Struct(">BBH").pack
# encode_ack(0x40, packet_id) as a partial of the pack: no Python frame per QoS 1 publication.
encode_puback: Final[Callable[[int], bytes]] = partial(_ACK_FRAME, 0x40, 2)


def _encode_ack(p: PubAck | PubRec | PubRel | PubComp, version: int) -> bytes:
    first = (p.packet_type << 4) | _ACK_FLAGS[p.packet_type]
    pid = p.packet_id
    if version == 5:
        props = encode_properties(p.properties, p.packet_type)
        if props != b"\x00":
            return _frame(first, bytes((pid >> 8, pid & 0xFF, p.reason_code)) + props)
        if p.reason_code:
            return bytes((first, 3, pid >> 8, pid & 0xFF, p.reason_code))
    return bytes((first, 2, pid >> 8, pid & 0xFF))


def _encode_ack_run(p: PubAckRun, version: int) -> bytes:
    """The run's PUBACKs, in order (what a decoder with ack_runs reads back as one run)."""
    return b"".join(map(encode_puback, p.packet_ids))


def _encode_publish_run(p: PublishRun, version: int) -> bytes:
    """The run's PUBLISHes, in order (what a decoder with ack_runs reads back as one run)."""
    return b"".join(_encode_publish(publish, version) for publish in p.publishes())


_ACK_FLAGS: Final = {
    PacketType.PUBACK: 0,
    PacketType.PUBREC: 0,
    PacketType.PUBREL: 0b0010,
    PacketType.PUBCOMP: 0,
}


def _encode_subscribe(p: Subscribe, version: int) -> bytes:
    parts = [p.packet_id.to_bytes(2, "big")]
    v5 = version == 5
    if v5:
        parts.append(encode_properties(p.properties, PacketType.SUBSCRIBE))
    for sub in p.subscriptions:
        parts.append(encode_string(sub.topic_filter))
        options = sub.qos
        if v5:
            options |= sub.retain_handling << 4
            if sub.no_local:
                options |= 0x04
            if sub.retain_as_published:
                options |= 0x08
        parts.append(bytes((options,)))
    return _frame(0x82, b"".join(parts))


def encode_suback_v3(packet_id: int, return_codes: list[int]) -> bytes:
    """A 3.1/3.1.1 SUBACK (no properties) without a packet object: a fleet subscribing a
    filter per SUBSCRIBE gets one per filter."""
    if len(return_codes) < 126:  # the remaining length fits its one-byte form
        return bytes((0x90, 2 + len(return_codes), packet_id >> 8, packet_id & 0xFF, *return_codes))
    return _frame(0x90, packet_id.to_bytes(2, "big") + bytes(return_codes))


def _encode_suback(p: SubAck, version: int) -> bytes:
    body = p.packet_id.to_bytes(2, "big")
    if version == 5:
        body += encode_properties(p.properties, PacketType.SUBACK)
    return _frame(0x90, body + bytes(p.reason_codes))


def _encode_unsubscribe(p: Unsubscribe, version: int) -> bytes:
    parts = [p.packet_id.to_bytes(2, "big")]
    if version == 5:
        parts.append(encode_properties(p.properties, PacketType.UNSUBSCRIBE))
    parts.extend(encode_string(f) for f in p.topic_filters)
    return _frame(0xA2, b"".join(parts))


def _encode_unsuback(p: UnsubAck, version: int) -> bytes:
    pid = p.packet_id
    if version != 5:
        return bytes((0xB0, 2, pid >> 8, pid & 0xFF))
    props = encode_properties(p.properties, PacketType.UNSUBACK)
    return _frame(0xB0, bytes((pid >> 8, pid & 0xFF)) + props + bytes(p.reason_codes))


def _encode_pingreq(p: PingReq, version: int) -> bytes:
    return PINGREQ_PACKET


def _encode_pingresp(p: PingResp, version: int) -> bytes:
    return PINGRESP_PACKET


def _encode_reason_only(first: int, reason_code: int, properties: Properties) -> bytes:
    """DISCONNECT / AUTH in 5.0: omit what the spec lets us omit (reason 0, no properties)."""
    props = encode_properties(properties, first >> 4)
    if props != b"\x00":
        return _frame(first, bytes((reason_code,)) + props)
    if reason_code:
        return bytes((first, 1, reason_code))
    return bytes((first, 0))


def _encode_disconnect(p: Disconnect, version: int) -> bytes:
    if version != 5:
        return DISCONNECT_PACKET
    return _encode_reason_only(0xE0, p.reason_code, p.properties)


def _encode_auth(p: Auth, version: int) -> bytes:
    if version != 5:
        raise ValueError("AUTH exists only in MQTT 5")
    return _encode_reason_only(0xF0, p.reason_code, p.properties)


_ENCODERS: Final[dict[type, Callable[[Any, int], bytes]]] = {
    Connect: _encode_connect,
    ConnAck: _encode_connack,
    Publish: _encode_publish,
    PublishRun: _encode_publish_run,
    PubAck: _encode_ack,
    PubAckRun: _encode_ack_run,
    PubRec: _encode_ack,
    PubRel: _encode_ack,
    PubComp: _encode_ack,
    Subscribe: _encode_subscribe,
    SubAck: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    UnsubAck: _encode_unsuback,
    PingReq: _encode_pingreq,
    PingResp: _encode_pingresp,
    Disconnect: _encode_disconnect,
    Auth: _encode_auth,
}


def encode(packet: Packet, protocol_version: int = 4) -> bytes:
    """Encode ``packet`` for a peer speaking ``protocol_version`` (3, 4 or 5).

    Fields the dialect cannot carry (properties before 5.0, v5 subscription options) are
    dropped. A Connect is always encoded at its own ``protocol_version``.
    """
    return _ENCODERS[type(packet)](packet, protocol_version)
