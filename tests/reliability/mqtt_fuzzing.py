"""Hypothesis strategies for hostile MQTT byte streams, and a runner that sends them to a real
broker over sockets and counts what the broker demonstrably handled.

A *script* is one connection: a valid CONNECT (or a mutated one, alone), then fuzzed frames,
each followed by a PINGREQ. The last frame is mutated at the byte level (bytes flipped,
truncated, extended, a new first byte, a broken Remaining Length, or noise); the ones before it
are well-formed packets with hostile values (invalid filters, unknown packet ids, stray
acknowledgements, odd properties), so one connection carries many inputs before the broker
ends it. The client half-closes after writing, so the broker always reads everything it was
sent and always ends the connection, and every PINGRESP it wrote proves the frame before it was
handled: the count of inputs is exact, never guessed.
"""

from __future__ import annotations

import random
import selectors
import socket
import time
from dataclasses import dataclass, field

from hypothesis import strategies as st

from kittiwake.mqtt.codec import PacketDecoder, encode, encode_remaining_length
from kittiwake.mqtt.errors import MQTTProtocolError
from kittiwake.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
    Will,
)
from kittiwake.mqtt.properties import Properties

PINGREQ = b"\xc0\x00"
# Topics of the well-behaved clients that watch the run: fuzzers never publish there.
PROTECTED_PREFIX = "fuzz-keep"

# Small alphabets so topics collide, wildcards land in odd places and levels come out empty.
_topic_chars = st.sampled_from(["a", "b", "/", "/", "+", "#", "$", "é", "\x01", "💥", " "])
# Now and then a huge one: one character repeated up to the 65,535-byte limit of a string, so
# whatever the broker derives from it (reason strings, log lines) is tested at the limit.
_huge = st.builds(
    lambda char, count, tail: char * count + tail,
    st.sampled_from(["a", "\x01", "é", "/"]),
    st.sampled_from([1_000, 16_400, 21_000, 32_000, 65_000]),
    st.sampled_from(["", "/+", "#", "/a"]),
).filter(lambda text: len(text.encode()) <= 65_535)
_short_topics = st.lists(_topic_chars, max_size=12).map("".join)
_topics = st.integers(0, 7).flatmap(lambda n: _huge if n == 0 else _short_topics)
_texts = st.text(st.sampled_from(["x", "y", "é", "\x7f", "\ufeff", " "]), max_size=8)
_ids = st.integers(1, 65535) | st.sampled_from([1, 2, 3])
_u32 = st.integers(0, 2**32 - 1) | st.sampled_from([0, 1, 60])


def _publish_topic(topic: str) -> str:
    return "x" + topic if topic.startswith(PROTECTED_PREFIX) else topic


@st.composite
def _properties(draw: st.DrawFn, kind: str) -> Properties:
    """A few properties, legal or not for ``kind``: the codec decides what is allowed."""
    props = Properties()
    for _ in range(draw(st.integers(0, 3))):
        choice = draw(
            st.sampled_from(
                [
                    "user",
                    "reason",
                    "expiry",
                    "alias",
                    "content",
                    "response",
                    "format",
                    "sub_id",
                    "receive",
                    "max_packet",
                    "alias_max",
                    "problem",
                    "response_info",
                ]
            )
        )
        if choice == "user":
            props.user_properties.append((draw(_texts), draw(_texts)))
        elif choice == "reason" and kind in ("ack", "disconnect"):
            props.reason_string = draw(_texts)
        elif choice == "expiry" and kind == "publish":
            props.message_expiry_interval = draw(_u32)
        elif choice == "expiry" and kind in ("connect", "disconnect"):
            props.session_expiry_interval = draw(st.sampled_from([0, 0, 1, 2**32 - 1]))
        elif choice == "alias" and kind == "publish":
            props.topic_alias = draw(st.integers(1, 64) | st.just(65))
        elif choice == "content" and kind == "publish":
            props.content_type = draw(_texts)
        elif choice == "response" and kind == "publish":
            props.response_topic = draw(_topics.filter(lambda t: "+" not in t and "#" not in t))
        elif choice == "format" and kind == "publish":
            props.payload_format_indicator = draw(st.integers(0, 1))
        elif choice == "sub_id" and kind == "subscribe":
            props.subscription_identifiers = [draw(st.integers(1, 268_435_455))]
        elif choice == "receive" and kind == "connect":
            props.receive_maximum = draw(st.integers(1, 65535))
        elif choice == "max_packet" and kind == "connect":
            props.maximum_packet_size = draw(st.sampled_from([1, 5, 20, 64, 128, 2**32 - 1]))
        elif choice == "alias_max" and kind == "connect":
            props.topic_alias_maximum = draw(st.integers(0, 10))
        elif choice == "problem" and kind == "connect":
            props.request_problem_information = draw(st.integers(0, 1))
        elif choice == "response_info" and kind == "connect":
            props.request_response_information = draw(st.integers(0, 1))
    return props


@st.composite
def connects(draw: st.DrawFn, version: int) -> Connect:
    will = None
    if draw(st.integers(0, 4)) == 0:
        will = Will(
            _publish_topic(draw(_topics).replace("+", "p").replace("#", "h")) or "w",
            draw(st.binary(max_size=8)),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(_properties("will")) if version == 5 else Properties(),
        )
    username = draw(st.none() | _texts)
    client_id = "fz-" + draw(_texts) if draw(st.integers(0, 3)) else ""
    if draw(st.integers(0, 7)) == 0:
        client_id = "c" * draw(st.sampled_from([100, 65_527, 65_535]))
    return Connect(
        client_id,
        version,
        clean_start=True,  # fuzzers leave no sessions behind
        keepalive=draw(st.sampled_from([0, 5, 30, 60, 60, 60, 61])),
        will=will,
        username=username,
        password=draw(st.none() | st.binary(max_size=8)) if username is not None else None,
        properties=draw(_connect_properties()) if version == 5 else Properties(),
    )


@st.composite
def _connect_properties(draw: st.DrawFn) -> Properties:
    props = draw(_properties("connect"))
    if draw(st.booleans()):  # the broker derives its Response Information from the client id
        props.request_response_information = 1
    return props


@st.composite
def hostile_packets(draw: st.DrawFn, version: int) -> Packet:
    """A well-formed client packet with odd values; the broker may still end the connection."""
    v5 = version == 5
    kind = draw(
        st.sampled_from(
            ["publish"] * 4
            + ["subscribe"] * 3
            + ["unsubscribe", "puback", "pubrec", "pubrel", "pubcomp"]
        )
    )
    if kind == "publish":
        qos = draw(st.integers(0, 2))
        props = draw(_properties("publish")) if v5 else Properties()
        topic = _publish_topic(draw(_topics))
        if draw(st.integers(0, 3)):  # now and then a wildcard, which ends the connection
            topic = topic.replace("+", "p").replace("#", "h")
        if not topic and not (v5 and props.topic_alias):
            topic = "t"
        return Publish(
            topic,
            draw(st.binary(max_size=32)),
            qos,
            draw(st.integers(0, 7)) == 0,  # retain now and then
            draw(st.booleans()) if qos else False,
            draw(_ids) if qos else None,
            props,
        )
    if kind == "subscribe":
        requests = [
            SubscriptionRequest(
                draw(_topics),
                draw(st.integers(0, 2)),
                draw(st.booleans()) if v5 else False,
                draw(st.booleans()) if v5 else False,
                draw(st.integers(0, 2)) if v5 else 0,
            )
            for _ in range(draw(st.integers(1, 3)))
        ]
        props = draw(_properties("subscribe")) if v5 else Properties()
        return Subscribe(draw(_ids), requests, props)
    if kind == "unsubscribe":
        filters = [draw(_topics) for _ in range(draw(st.integers(1, 3)))]
        return Unsubscribe(draw(_ids), filters, Properties())
    if kind in ("puback", "pubrec", "pubrel", "pubcomp"):
        cls = {"puback": PubAck, "pubrec": PubRec, "pubrel": PubRel, "pubcomp": PubComp}[kind]
        if v5:
            code = draw(st.sampled_from([0, 0x10, 0x80, 0x92]))
            return cls(draw(_ids), code, draw(_properties("ack")))
        return cls(draw(_ids))
    raise AssertionError(kind)


@st.composite
def connection_enders(draw: st.DrawFn, version: int) -> Packet:
    """Packets that end a connection even well-formed; mutated, they are the last frame."""
    kind = draw(st.sampled_from(["connect", "connack", "auth", "disconnect"]))
    if kind == "connect":
        return draw(connects(version))
    if kind == "connack":
        return ConnAck(False, 0)
    if kind == "auth" and version == 5:
        return Auth(0x18)
    if version == 5:
        return Disconnect(draw(st.sampled_from([0, 4, 0x80])), draw(_properties("disconnect")))
    return Disconnect()


def _reframe(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_remaining_length(len(body)) + body


def _split(frame: bytes) -> tuple[int, bytes]:
    """First byte and body of a frame we encoded ourselves."""
    pos = 1
    while frame[pos] & 0x80:
        pos += 1
    return frame[0], frame[pos + 1 :]


def mutate(rng: random.Random, frame: bytes) -> bytes:
    """``frame`` broken at the byte level (it may come out valid, which is fine)."""
    first, body = _split(frame)
    how = rng.choice(["flip", "flip", "flip", "truncate", "extend", "first", "header", "noise"])
    if how == "flip" and body:
        mutated = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(body))] = rng.randrange(256)
        return _reframe(first, bytes(mutated))
    if how == "truncate" and body:
        return _reframe(first, body[: rng.randrange(len(body))])
    if how == "extend":
        return _reframe(first, body + rng.randbytes(rng.randint(1, 8)))
    if how == "first":
        return _reframe(rng.randrange(256), body)
    if how == "header":
        return rng.choice(
            [
                bytes((first,)) + b"\xff\xff\xff\xff\x7f" + body,  # a 5-byte Remaining Length
                bytes((first,)) + b"\x80\x80\x80\x00",  # zero, not minimally encoded
                bytes((first,)) + encode_remaining_length(len(body) + 40) + body,  # cut short
                bytes((first,)) + b"\xff\xff\xff\x7f",  # 256 MiB announced
            ]
        )
    return rng.randbytes(rng.randint(1, 40))


@dataclass
class Script:
    """One connection's bytes: CONNECT, then fuzzed frames each followed by a PINGREQ."""

    version: int
    connect: bytes
    frames: list[bytes]

    def wire(self) -> bytes:
        return self.connect + b"".join(frame + PINGREQ for frame in self.frames)


@dataclass
class Template:
    """What Hypothesis draws: a dialect, a CONNECT, hostile packets, and a seed from which
    :meth:`scripts` derives many connections (shuffled frames, a different mutation each), so
    the run gets Hypothesis's variety at the speed of plain byte mutation."""

    version: int
    connect: bytes
    frames: list[bytes]
    bases: list[bytes]
    seed: int

    def scripts(self, count: int) -> list[Script]:
        rng = random.Random(self.seed)
        out = []
        for _ in range(count):
            if rng.randrange(10) == 0:
                # A mutated CONNECT is a whole script: the broker answers it or closes.
                out.append(Script(self.version, b"", [mutate(rng, self.connect)]))
                continue
            frames = rng.sample(self.frames, rng.randint(len(self.frames) // 2, len(self.frames)))
            frames.append(mutate(rng, rng.choice(self.bases)))
            out.append(Script(self.version, self.connect, frames))
        return out


@st.composite
def templates(draw: st.DrawFn) -> Template:
    version = draw(st.sampled_from([3, 4, 5, 5, 5, 5]))
    hostile = draw(st.lists(hostile_packets(version), min_size=8, max_size=30))
    others = draw(st.lists(connection_enders(version), min_size=1, max_size=4))
    frames = [encode(p, version) for p in hostile]
    return Template(
        version,
        encode(draw(connects(version)), version),
        frames,
        frames + [encode(p, version) for p in others],
        draw(st.integers(0, 2**32)),
    )


@dataclass
class Outcome:
    """What one script did: inputs the broker handled, and everything it answered."""

    handled: int
    answers: list[Packet] = field(default_factory=list)


class BrokerAnswerError(AssertionError):
    """The broker wrote bytes a client cannot decode, or never ended the connection."""


def run_script(address: tuple[str, int], script: Script, timeout: float = 10.0) -> Outcome:
    """Send ``script``, half-close, read every answer until the broker ends the connection."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = script.wire()
        received = bytearray()
        sock.setblocking(False)
        deadline = time.monotonic() + timeout
        sent = 0
        write_open = True
        with selectors.DefaultSelector() as selector:
            selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BrokerAnswerError(
                        f"the broker kept the connection open for {timeout}s after the client "
                        f"half-closed; input {data[:200].hex()}"
                    )
                events = selector.select(remaining)
                for _key, mask in events:
                    if mask & selectors.EVENT_WRITE and write_open:
                        try:
                            sent += sock.send(data[sent : sent + 65536])
                        except (BrokenPipeError, ConnectionResetError):
                            write_open = False  # the broker ended it before reading it all
                        if sent >= len(data) and write_open:
                            sock.shutdown(socket.SHUT_WR)
                            write_open = False
                        if not write_open:
                            selector.modify(sock, selectors.EVENT_READ)
                    if mask & selectors.EVENT_READ:
                        try:
                            chunk = sock.recv(65536)
                        except ConnectionResetError:
                            chunk = b""
                        if not chunk:
                            return _outcome(script, bytes(received))
                        received += chunk
    finally:
        sock.close()


def _outcome(script: Script, received: bytes) -> Outcome:
    decoder = PacketDecoder()
    decoder.protocol_version = script.version
    try:
        answers = decoder.feed(received)
    except MQTTProtocolError as exc:
        raise BrokerAnswerError(
            f"the broker's answer does not decode ({exc}): {received[:200].hex()} for input "
            f"{script.wire()[:200].hex()}"
        ) from None
    pongs = sum(1 for p in answers if isinstance(p, PingResp))
    frames = len(script.frames)
    # Each PINGRESP follows a handled frame; the frame after the last one ended the connection.
    handled = min(pongs, frames) + (1 if pongs < frames else 0)
    return Outcome(handled, answers)
