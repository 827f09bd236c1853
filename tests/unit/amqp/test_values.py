"""kittiwake.amqp.values against python-qpid-proton's own decoder: the same values, of the
same types, for every type it reads; Unsupported (never a wrong value) for the rest and for
cut-off or malformed input; and the message mapping gives the same core message whichever
decoder read the sections."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from proton import (
    Array,
    Data,
    Described,
    Message,
    byte,
    char,
    decimal64,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)

from kittiwake.amqp import message_mapping
from kittiwake.amqp.message_mapping import Clocks, from_amqp
from kittiwake.amqp.values import Unsupported, decode, decode_described


def encoded(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def proton_value(raw: bytes) -> Any:
    data = Data()
    data.decode(raw)
    data.rewind()
    data.next()
    return _plain(data.get_object())


def _plain(value: Any) -> Any:
    """proton hands binaries out as memoryviews; compared as bytes."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            any(same(k, k2) and same(v, b[k2]) for k2 in b) for k, v in a.items()
        )
    if isinstance(a, float) and a != a:
        return b != b
    return bool(a == b)


def random_scalar(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(20 if depth < 3 else 18)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return ubyte(rng.randrange(256))
    if kind == 3:
        return byte(rng.randrange(-128, 128))
    if kind == 4:
        return ushort(rng.randrange(1 << 16))
    if kind == 5:
        return short(rng.randrange(-(1 << 15), 1 << 15))
    if kind == 6:
        return uint(rng.choice([0, rng.randrange(256), rng.randrange(1 << 32)]))
    if kind == 7:
        return int32(rng.choice([0, rng.randrange(-128, 128), rng.randrange(-(1 << 31), 1 << 31)]))
    if kind == 8:
        return ulong(rng.choice([0, rng.randrange(256), rng.randrange(1 << 64)]))
    if kind == 9:
        return rng.choice([0, rng.randrange(-128, 128), rng.randrange(-(1 << 63), 1 << 63)])
    if kind == 10:
        return float32(rng.choice([0.5, -2.25, 1e10]))
    if kind == 11:
        return rng.uniform(-1e300, 1e300)
    if kind == 12:
        return char(chr(rng.choice([0x41, 0xE9, 0x1F600])))
    if kind == 13:
        return timestamp(rng.randrange(-(1 << 40), 1 << 42))
    if kind == 14:
        return uuid.UUID(int=rng.getrandbits(128))
    if kind == 15:
        return bytes(rng.randrange(256) for _ in range(rng.choice([0, 3, 300])))
    if kind == 16:
        return "".join(rng.choice("aé€😀z") for _ in range(rng.choice([0, 5, 200])))
    if kind == 17:
        return symbol("".join(rng.choice("abc-:") for _ in range(rng.choice([1, 20, 300]))))
    if kind == 18:
        return [random_scalar(rng, depth + 1) for _ in range(rng.choice([0, 2, 40]))]
    return {
        symbol(f"k{i}") if rng.random() < 0.5 else f"s{i}": random_scalar(rng, depth + 1)
        for i in range(rng.choice([0, 3, 30]))
    }


def test_every_type_it_reads_decodes_as_proton_does() -> None:
    rng = random.Random(12)
    for _ in range(3000):
        value = random_scalar(rng)
        raw = encoded(value)
        got, end = decode(raw, 0)
        assert end == len(raw)
        assert same(got, proton_value(raw)), (value, got)


@pytest.mark.parametrize(
    "value",
    [
        Array(Data.NULL, Data.INT, 1, 2, 3),
        Described(symbol("x"), 1),
        decimal64(5),
        [1, Described(ulong(7), "x")],
    ],
)
def test_what_it_does_not_read_is_unsupported(value: Any) -> None:
    with pytest.raises(Unsupported):
        decode(encoded(value), 0)


def test_cut_off_or_malformed_input_is_unsupported_never_a_value() -> None:
    rng = random.Random(5)
    for _ in range(500):
        raw = encoded(random_scalar(rng))
        for cut in range(1, len(raw)):
            try:
                _, end = decode(raw[:cut], 0)
            except Unsupported:
                continue
            # A prefix that is itself a whole value (a list of lists cut between items
            # cannot be: sizes disagree) ends where it says.
            assert end <= cut
    for bad in (b"\xa1\x02\xff\xfe", b"\xc1\x03\x01\x40", b"\xc0\x05\x03\x40", b"\x01"):
        with pytest.raises(Unsupported):
            decode(bad, 0)
    nested = b"\x40"
    for _ in range(2000):  # a peer's deep nesting: refused before any recursion limit
        nested = b"\xd0" + (len(nested) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x01" + nested
    with pytest.raises(Unsupported):
        decode(nested, 0)


def test_a_section_is_its_descriptor_and_value() -> None:
    raw = encoded(Described(ulong(0x73), ["id", None, "q"]))
    assert decode_described(raw) == (0x73, ["id", None, "q"])
    with pytest.raises(Unsupported):
        decode_described(encoded(Described(symbol("amqp:properties:list"), [])))
    with pytest.raises(Unsupported):
        decode_described(raw + b"\x40")


def messages() -> list[Message]:
    out = [
        Message(body="x" * 100),
        Message(body="x", durable=True, priority=7, ttl=2.5),
        Message(body=b"\x00\x01", address="queue://a", group_id="g", creation_time=1.7e9),
        Message(body={"a": 1, "b": [1, 2]}, properties={"p": int32(5), "q": "s", "r": ubyte(3)}),
        Message(body=None, annotations={symbol("x-opt-jms-dest"): byte(1)}),
        Message(body=symbol("sym"), expiry_time=1.9e9, properties={"JMS_IBM_Retain": int32(1)}),
        Message(body=[1, "two"], inferred=True),
        Message(body=b"data", inferred=True, instructions={symbol("d"): 1}),
        Message(body="t", annotations={symbol("x-opt-delivery-delay"): 5000}),
        Message(body="t", properties={"f": float32(1.5), "c": char("c"), "t": timestamp(9)}),
        # Every properties field set (those the mapping skips, of every kind: a uuid, a
        # ulong, a binary, symbols), a body that is not ASCII.
        Message(
            body="\u00e9t\u00e9 \u2603",
            id=uuid.UUID(int=7),
            user_id=b"user",
            address="queue://b",
            subject="s",
            reply_to="r",
            correlation_id=ulong(1 << 40),
            content_type="text/plain",
            content_encoding="utf-8",
            expiry_time=1.9e9,
            creation_time=1.7e9,
            group_id="g",
            group_sequence=3,
            reply_to_group_id="rg",
        ),
        Message(body="y" * 300, id="ID:1", correlation_id=b"c" * 300),  # str32, vbin32
    ]
    return out


@pytest.mark.parametrize("index", range(len(messages())))
def test_the_mapping_is_the_same_through_either_decoder(
    index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = bytes(messages()[index].encode())
    clocks = Clocks(now=100.0, wall_ms=1_800_000_000_000)
    fast = from_amqp(raw, topic="t", clocks=clocks, origin="o")

    def unsupported(sections: Any) -> Any:
        raise Unsupported("forced")

    monkeypatch.setattr(message_mapping, "_scan_fast", unsupported)
    two_pass = from_amqp(raw, topic="t", clocks=clocks, origin="o")
    monkeypatch.setattr(message_mapping, "_read_fast", unsupported)
    slow = from_amqp(raw, topic="t", clocks=clocks, origin="o")
    assert_same_mapping(fast, slow)
    assert_same_mapping(two_pass, slow)


def assert_same_mapping(fast: Any, slow: Any) -> None:
    assert fast.to == slow.to
    assert fast.to_type == slow.to_type
    assert fast.durable == slow.durable
    a, b = fast.message, slow.message
    for field in (
        "topic",
        "payload",
        "qos",
        "retain",
        "persistent",
        "priority",
        "delivery_time",
        "timestamp",
        "group_id",
        "encoded",
        "amqp",
    ):
        assert getattr(a, field) == getattr(b, field), field
    assert a.expiry == pytest.approx(b.expiry) if b.expiry is not None else a.expiry is None
    assert typed(a.properties) == typed(b.properties)


def typed(properties: Any) -> dict[str, Any] | None:
    if properties is None:
        return None
    return {name: (value, kind) for name, value, kind in properties.typed_items()}


def test_a_mutated_message_is_mapped_or_refused_as_undecodable_never_an_internal_error() -> None:
    """Bytes a peer got wrong come out of from_amqp as a core message or as MappingError (the
    transfer is rejected); a UnicodeDecodeError closes the connection as a decode error. Any
    other exception would close it as an internal error, with a traceback in the log."""
    rng = random.Random(17)
    clocks = Clocks(now=100.0, wall_ms=1_800_000_000_000)
    originals = [bytes(m.encode()) for m in messages()]
    refused = 0
    for _ in range(6000):
        raw = bytearray(rng.choice(originals))
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        try:
            from_amqp(bytes(raw), topic="t", clocks=clocks, origin="o")
        except (message_mapping.MappingError, UnicodeDecodeError):
            refused += 1
    assert refused, "the mutations reached the refusals"


@pytest.mark.parametrize(
    "raw",
    [
        b"\x73\xff\xff\xff\xff",  # a char past what chr() takes at all
        b"\x73\x00\x11\x00\x00",  # a char past 0x10FFFF
    ],
)
def test_a_char_that_is_no_code_point_is_unsupported(raw: bytes) -> None:
    with pytest.raises(Unsupported):
        decode(raw, 0)


def test_annotations_sent_as_a_list_are_refused_as_undecodable() -> None:
    raw = bytes(Message(body="x", annotations={symbol("a"): 1}).encode())
    # The message-annotations section (descriptor 0x72) with its map code (0xd1) turned into
    # a list's (0xd0): proton reads it, as a list.
    at = raw.index(b"\x00\x53\x72") + 3
    assert raw[at] in (0xC1, 0xD1)
    bad = raw[:at] + bytes([0xC0 if raw[at] == 0xC1 else 0xD0]) + raw[at + 1 :]
    clocks = Clocks(now=100.0, wall_ms=1_800_000_000_000)
    with pytest.raises(message_mapping.MappingError):
        from_amqp(bad, topic="t", clocks=clocks, origin="o")
