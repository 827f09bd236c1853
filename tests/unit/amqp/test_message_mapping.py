"""The AMQP JMS mapping, both ways, with proton-encoded messages as Qpid JMS sends them."""

from __future__ import annotations

import pytest
from proton import (
    Data,
    Described,
    byte,
    char,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
)
from proton import Message as ProtonMessage

from kittiwake.amqp.message_mapping import (
    JMS_DEST,
    JMS_MSG_TYPE,
    SECTIONS_KEY,
    Clocks,
    DestinationType,
    JMSMessageType,
    MappingError,
    from_amqp,
    split_sections,
    to_amqp,
)
from kittiwake.broker.message import Message as CoreMessage
from kittiwake.broker.message import MessageProperties, MQTT5Fields, PropertyType

CLOCKS = Clocks(now=1000.0, wall_ms=1_700_000_000_000)


def encode(message: ProtonMessage) -> bytes:
    return bytes(message.encode())


def jms(body: object, msg_type: JMSMessageType, **fields: object) -> ProtonMessage:
    message = ProtonMessage(body=body, **fields)  # type: ignore[arg-type]
    message.annotations = {JMS_MSG_TYPE: byte(msg_type), JMS_DEST: byte(DestinationType.QUEUE)}
    return message


def test_text_message_persistent_with_priority() -> None:
    sent = jms("hello", JMSMessageType.TEXT, durable=True, priority=7, address="orders")
    incoming = from_amqp(encode(sent), topic="orders", clocks=CLOCKS, origin="c1")
    message = incoming.message
    assert (message.payload, message.persistent, message.qos, message.priority) == (
        b"hello",
        True,
        2,
        7,
    )
    assert message.origin == "c1"
    assert incoming.to == "orders" and incoming.to_type is DestinationType.QUEUE
    assert incoming.durable


def test_non_persistent_is_never_stored() -> None:
    sent = jms("x", JMSMessageType.TEXT, durable=False)
    message = from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message
    assert not message.persistent and message.qos == 1


def test_bytes_message_data_section() -> None:
    sent = jms(b"\x00\x01\xff", JMSMessageType.BYTES, inferred=True)
    sent.content_type = "application/octet-stream"
    message = from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message
    assert message.payload == b"\x00\x01\xff"


def test_map_and_stream_bodies_keep_their_amqp_encoding() -> None:
    for body, kind, inferred in (
        ({"a": 1}, JMSMessageType.MAP, False),
        ([1, "two"], JMSMessageType.STREAM, True),
    ):
        sent = jms(body, kind, inferred=inferred)
        encoded = encode(sent)
        message = from_amqp(encoded, topic="t", clocks=CLOCKS, origin=None).message
        # The payload other protocols see is the body section's encoding...
        assert message.payload and message.payload in encoded
        # ...and an AMQP consumer gets the body exactly as sent.
        out = ProtonMessage()
        out.decode(to_amqp(message, durable=False, delivery_count=0, clocks=CLOCKS))
        assert out.body == body


def test_typed_application_properties_keep_their_types() -> None:
    sent = jms("x", JMSMessageType.TEXT)
    sent.properties = {
        "b": byte(-1),
        "s": short(300),
        "i": int32(70000),
        "l": 2**40,
        "f": float32(1.5),
        "d": 2.25,
        "t": True,
        "str": "text",
        "sym": symbol("abc"),
        "ub": ubyte(200),
        "ui": uint(4_000_000_000),
        "ch": char("z"),
        "bin": b"not a JMS type",
    }
    properties = from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message.properties
    assert properties is not None
    assert {name: (value, kind) for name, value, kind in properties.typed_items()} == {
        "b": (-1, PropertyType.BYTE),
        "s": (300, PropertyType.SHORT),
        "i": (70000, PropertyType.INT),
        "l": (2**40, PropertyType.LONG),
        "f": (1.5, PropertyType.FLOAT),
        "d": (2.25, PropertyType.DOUBLE),
        "t": (True, PropertyType.BOOLEAN),
        "str": ("text", PropertyType.STRING),
        "sym": ("abc", PropertyType.STRING),
        "ub": (200, PropertyType.SHORT),
        "ui": (4_000_000_000, PropertyType.LONG),
        "ch": ("z", PropertyType.STRING),
    }


def test_ttl_and_absolute_expiry_become_clock_times() -> None:
    sent = jms("x", JMSMessageType.TEXT, ttl=30.0)
    message = from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message
    assert message.expiry == pytest.approx(CLOCKS.now + 30.0)
    sent = jms("x", JMSMessageType.TEXT)
    sent.expiry_time = (CLOCKS.wall_ms + 5_000) / 1000.0
    message = from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message
    assert message.expiry == pytest.approx(CLOCKS.now + 5.0)


def test_delivery_time_and_delay() -> None:
    sent = jms("x", JMSMessageType.TEXT)
    sent.annotations[symbol("x-opt-delivery-time")] = timestamp(CLOCKS.wall_ms + 2_000)
    message = from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message
    assert message.delivery_time == pytest.approx(CLOCKS.now + 2.0)
    sent = jms("x", JMSMessageType.TEXT)
    sent.annotations[symbol("x-opt-delivery-delay")] = 1500
    message = from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message
    assert message.delivery_time == pytest.approx(CLOCKS.now + 1.5)


def test_creation_time_is_the_timestamp() -> None:
    sent = jms("x", JMSMessageType.TEXT)
    sent.creation_time = 1_700_000_123.456
    message = from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message
    assert message.timestamp == 1_700_000_123_456


def test_retain_property() -> None:
    sent = jms("x", JMSMessageType.TEXT)
    sent.properties = {"JMS_IBM_Retain": int32(1)}
    assert from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message.retain


def test_amqp_to_amqp_keeps_the_message_and_gets_a_new_header() -> None:
    sent = jms("hello", JMSMessageType.TEXT, durable=True, priority=2, id="ID:1")
    sent.correlation_id = "corr"
    sent.subject = "type-a"
    sent.group_id = "group-1"
    sent.properties = {"k": int32(5)}
    message = from_amqp(encode(sent), topic="q", clocks=CLOCKS, origin=None).message
    out = ProtonMessage()
    out.decode(to_amqp(message, durable=True, delivery_count=3, clocks=CLOCKS))
    assert (out.body, out.id, out.correlation_id, out.subject, out.group_id) == (
        "hello",
        "ID:1",
        "corr",
        "type-a",
        "group-1",
    )
    assert (out.durable, out.priority, out.delivery_count) == (True, 2, 3)
    assert out.annotations[JMS_MSG_TYPE] == JMSMessageType.TEXT
    assert out.properties == {"k": 5} and isinstance(out.properties["k"], int32)


def test_mqtt_message_arrives_as_bytes_message() -> None:
    properties = MessageProperties()
    properties.set("n", 7, PropertyType.SHORT)
    message = CoreMessage(
        topic="sensors/1",
        payload=b"21.5",
        qos=1,
        properties=properties,
        mqtt5=MQTT5Fields(
            content_type="text/plain",
            response_topic="replies/1",
            correlation_data=b"c1",
            user_properties=[("unit", "C")],
        ),
        created=CLOCKS.now,
    )
    encoded = to_amqp(message, durable=True, delivery_count=0, clocks=CLOCKS)
    out = ProtonMessage()
    out.decode(encoded)
    assert bytes(out.body) == b"21.5"
    assert out.annotations[JMS_MSG_TYPE] == JMSMessageType.BYTES
    assert out.annotations[JMS_DEST] == DestinationType.TOPIC
    assert (out.address, out.reply_to, bytes(out.correlation_id)) == (
        "sensors/1",
        "replies/1",
        b"c1",
    )
    assert out.content_type == "text/plain"
    assert out.properties == {"unit": "C", "n": 7} and isinstance(out.properties["n"], short)
    assert out.durable
    assert out.creation_time == pytest.approx(CLOCKS.wall_ms / 1000.0)
    # Built once: a fan-out reuses the sections.
    assert message.encoded is not None and SECTIONS_KEY in message.encoded


def test_ttl_on_the_way_out_is_what_is_left() -> None:
    message = CoreMessage(topic="t", payload=b"", expiry=CLOCKS.now + 2.5)
    out = ProtonMessage()
    out.decode(to_amqp(message, durable=False, delivery_count=0, clocks=CLOCKS))
    assert out.ttl == pytest.approx(2.5)


def test_garbage_is_a_mapping_error() -> None:
    for garbage in (b"\x00Sp\xff", b"hello", b"\x00\xa3\x03abc\x45"):
        with pytest.raises(MappingError):
            from_amqp(garbage, topic="t", clocks=CLOCKS, origin=None)


def test_a_string_field_that_is_not_utf8_is_a_mapping_error() -> None:
    """proton reads a message's fields only when asked: a `to` that is not UTF-8 must still be
    refused as this message's error (the link rejects the transfer), not escape as another
    exception that would end the sender's whole connection."""
    sent = jms("x", JMSMessageType.TEXT, durable=True)
    sent.address = "q/\u00ae"
    good = encode(sent)
    assert good.count("\u00ae".encode()) == 1
    bad = good.replace("\u00ae".encode(), b"\xaeA")  # same length, not UTF-8
    with pytest.raises(MappingError):
        from_amqp(bad, topic="t", clocks=CLOCKS, origin=None)


def test_split_sections_names_each_section() -> None:
    sent = jms("x", JMSMessageType.TEXT, durable=True)
    sent.properties = {"a": 1}
    codes = [code for code, _ in split_sections(encode(sent))]
    assert codes == [0x70, 0x72, 0x73, 0x74, 0x77]


def test_ulong_beyond_long_is_left_out() -> None:
    sent = jms("x", JMSMessageType.TEXT)
    sent.properties = {"big": ulong(2**64 - 1), "ok": 1}
    properties = from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message.properties
    assert properties is not None and dict(properties) == {"ok": 1}


def test_jms_ibm_retain_says_retained_or_live() -> None:
    sent = jms("r", JMSMessageType.TEXT)
    sent.properties = {"JMS_IBM_Retain": int32(1), "k": "v"}
    message = from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None).message
    assert message.retain
    for retained, expected in ((True, 1), (False, 0)):
        out = ProtonMessage()
        out.decode(
            to_amqp(message, durable=False, delivery_count=0, clocks=CLOCKS, retained=retained)
        )
        assert out.properties == {"JMS_IBM_Retain": expected, "k": "v"}
        assert out.body == "r"
    # An MQTT retained message without properties gains the section.
    mqtt = CoreMessage(topic="t", payload=b"x", retain=True, created=CLOCKS.now)
    out = ProtonMessage()
    out.decode(to_amqp(mqtt, durable=False, delivery_count=0, clocks=CLOCKS, retained=True))
    assert out.properties == {"JMS_IBM_Retain": 1} and bytes(out.body) == b"x"


def _restored(message: CoreMessage) -> ProtonMessage:
    """What a consumer gets once the message's encoding is gone (a restart reads it back
    from the store with its AMQP fields; a dead letter is a copy)."""
    message.encoded = None
    out = ProtonMessage()
    out.decode(to_amqp(message, durable=True, delivery_count=0, clocks=CLOCKS))
    return out


@pytest.mark.parametrize(
    ("body", "msg_type", "inferred"),
    [
        ("text", JMSMessageType.TEXT, False),
        ({"k": int32(1), "s": "v"}, JMSMessageType.MAP, False),
        ([1, "two"], JMSMessageType.STREAM, False),
        (b"value", JMSMessageType.BYTES, False),
        (b"data", JMSMessageType.BYTES, True),
        (None, JMSMessageType.MESSAGE, False),
    ],
)
def test_the_amqp_form_comes_back_without_its_encoding(
    body: object, msg_type: JMSMessageType, inferred: bool
) -> None:
    sent = jms(body, msg_type, inferred=inferred, id="ID:9", subject="kind")
    sent.properties = {"n": short(3)}
    message = from_amqp(encode(sent), topic="q", clocks=CLOCKS, origin=None).message
    out = _restored(message)
    got = bytes(out.body) if isinstance(out.body, memoryview) else out.body
    assert (got, out.inferred, out.id, out.subject) == (body, inferred, "ID:9", "kind")
    assert out.annotations[JMS_MSG_TYPE] == msg_type
    assert out.properties == {"n": 3} and isinstance(out.properties["n"], short)


def test_a_restored_message_gains_the_core_properties_and_loses_a_gone_expiry() -> None:
    sent = jms("late", JMSMessageType.TEXT, ttl=10)
    sent.expiry_time = (CLOCKS.wall_ms + 10_000) / 1000
    sent.properties = {"keep": ubyte(1)}
    message = from_amqp(encode(sent), topic="q", clocks=CLOCKS, origin=None).message
    assert message.properties is not None
    properties = MessageProperties(message.properties.typed_items())
    properties.set("KW_Reason", "expired")
    message.properties = properties
    message.expiry = None  # moved to the expiry queue: it no longer expires
    out = _restored(message)
    assert out.body == "late"
    assert out.properties == {"keep": 1, "KW_Reason": "expired"}
    assert isinstance(out.properties["keep"], ubyte), "an unchanged property keeps its type"
    assert not out.expiry_time and not out.ttl


def _sections_by_proton(encoded: bytes) -> list[tuple[object, bytes]]:
    """The sections as proton's own decoder sees them: (descriptor, bytes)."""
    from proton import Data, Described

    out: list[tuple[object, bytes]] = []
    position = 0
    while position < len(encoded):
        data = Data()
        size = data.decode(encoded[position:])
        data.rewind()
        data.next()
        described = data.get_object()
        assert isinstance(described, Described)
        out.append((described.descriptor, encoded[position : position + size]))
        position += size
    return out


def test_split_sections_agrees_with_proton_on_every_width() -> None:
    """One-byte and four-byte sizes (values past 255 bytes), every section, maps, lists,
    arrays and described values inside them: the same boundaries and codes as proton."""
    from proton import Array, Data

    big = jms("y" * 300, JMSMessageType.TEXT, durable=True, priority=5, ttl=3.0, id="m1")
    big.properties = {"a": 1, "s": "z" * 400, "f": float32(1.5), "c": char("c")}
    big.instructions = {symbol("x-opt-d"): 7}
    big.footer = {symbol("sig"): b"\x00" * 20}
    small = jms(b"\x01\x02", JMSMessageType.BYTES, inferred=True)
    listed = ProtonMessage(body=[1, "two", [3, None], {"k": ulong(5)}], inferred=True)
    arrayed = ProtonMessage(body=Array(Data.NULL, Data.INT, 1, 2, 3))
    for message in (big, small, listed, arrayed, ProtonMessage()):
        encoded = encode(message)
        ours = split_sections(encoded)
        theirs = _sections_by_proton(encoded)
        assert [s for _, s in ours] == [s for _, s in theirs]
        assert [code for code, _ in ours] == [int(d) for d, _ in theirs]  # type: ignore[call-overload]
        assert b"".join(s for _, s in ours) == encoded


def test_split_sections_reads_symbolic_descriptors() -> None:
    from proton import Data, Described

    data = Data()
    data.put_object(Described(symbol("amqp:data:binary"), b"payload"))
    data.put_object(Described(symbol("amqp:application-properties:map"), {"k": "v"}))
    encoded = bytes(data.encode())
    assert [code for code, _ in split_sections(encoded)] == [0x75, 0x74]


def test_split_sections_refuses_cut_off_and_unknown_input() -> None:
    encoded = encode(jms("hello", JMSMessageType.TEXT, durable=True))
    for cut in range(1, len(encoded)):
        if any(b"".join(s for _, s in split_sections(encoded)[:k]) == encoded[:cut]
               for k in range(1, 6)):
            continue  # a whole number of sections is a valid (shorter) message
        with pytest.raises(MappingError):
            split_sections(encoded[:cut])
    for garbage in (b"\x00\x53\x70\xff", b"\x00\x53\x99\x45", b"\x00\xa3\x03abc\x45",
                    b"\x00\x53\x77\x01", b"\x45"):
        with pytest.raises(MappingError):
            split_sections(garbage)


def test_every_delivery_gets_its_own_header_fields() -> None:
    """Headers are encoded once per (durable, priority, count) and reused: each delivery still
    reads back its own durability, priority and delivery count, with or without a ttl."""
    for durable in (False, True):
        for priority in (0, 4, 9):
            for count in (0, 1, 15, 16, 300):
                for expiry in (None, CLOCKS.now + 2.0):
                    message = CoreMessage(topic="t", payload=b"p", priority=priority,
                                          expiry=expiry)
                    for _ in range(2):  # the second one comes from the cache
                        out = ProtonMessage()
                        out.decode(to_amqp(message, durable=durable, delivery_count=count,
                                           clocks=CLOCKS))
                        assert (out.durable, out.priority, out.delivery_count) == (
                            durable, priority, count)
                        assert out.ttl == (pytest.approx(2.0) if expiry else 0)


def test_repeated_header_and_annotations_map_each_message_as_if_first() -> None:
    """The header and annotations decoded once and kept by their bytes (message_mapping's
    section cache): each message still maps by its own sections."""
    first = jms("a", JMSMessageType.TEXT, durable=True, priority=7, ttl=30.0)
    first.annotations[symbol("x-opt-delivery-delay")] = 1500
    same_head = jms("b", JMSMessageType.TEXT, durable=True, priority=7, ttl=30.0)
    same_head.annotations[symbol("x-opt-delivery-delay")] = 1500
    other = jms("c", JMSMessageType.TEXT, durable=False)
    other.annotations = {JMS_MSG_TYPE: byte(JMSMessageType.TEXT), JMS_DEST: byte(1)}
    mapped = [
        from_amqp(encode(sent), topic="t", clocks=CLOCKS, origin=None)
        for sent in (first, same_head, other, first)
    ]
    for incoming, payload in zip(mapped, (b"a", b"b", b"c", b"a"), strict=True):
        assert incoming.message.payload == payload
    for incoming in (mapped[0], mapped[1], mapped[3]):
        message = incoming.message
        assert (message.persistent, message.priority) == (True, 7)
        assert message.expiry == pytest.approx(CLOCKS.now + 30.0)
        assert message.delivery_time == pytest.approx(CLOCKS.now + 1.5)
        assert incoming.to_type is DestinationType.QUEUE
    message = mapped[2].message
    assert (message.persistent, message.priority, message.expiry) == (False, 4, None)
    assert message.delivery_time is None and mapped[2].to_type is DestinationType.TOPIC


def test_a_header_whose_size_disagrees_with_its_items_is_refused_each_time() -> None:
    """A section whose list size and items disagree is not kept: the message is decoded the
    slow way (and refused) every time it comes."""
    good = encode(jms("x", JMSMessageType.TEXT, durable=True))
    assert good[:7] == b"\x00\x53\x70\xc0\x02\x01\x41"  # header: list8 of size 2, one item
    bad = b"\x00\x53\x70\xc0\x03\x01\x41" + good[7:]  # size 3: one byte too many
    for _ in range(2):
        with pytest.raises(MappingError):
            from_amqp(bad, topic="t", clocks=CLOCKS, origin=None)
    assert from_amqp(good, topic="t", clocks=CLOCKS, origin=None).message.persistent


@pytest.mark.parametrize("header_first", [True, False])
def test_what_a_message_keeps_is_every_section_but_header_and_delivery_annotations(
    header_first: bool,
) -> None:
    """Kept as received: the sections after the header and delivery annotations, a footer
    included; in the spec's order or not (a header after the properties)."""
    sent = jms("x", JMSMessageType.TEXT, durable=True, priority=6)
    sent.instructions = {symbol("x-opt-hop"): 1}  # delivery annotations
    footer = Data()
    footer.put_object(Described(ulong(0x78), {symbol("x-opt-check"): "ok"}))
    sections = split_sections(encode(sent) + bytes(footer.encode()))
    assert [code for code, _ in sections][:2] == [0x70, 0x71]
    if not header_first:
        sections = sections[1:3] + sections[:1] + sections[3:]
    encoded = b"".join(section for _, section in sections)
    message = from_amqp(encoded, topic="t", clocks=CLOCKS, origin=None).message
    assert message.persistent and message.priority == 6
    assert message.encoded == {
        SECTIONS_KEY: b"".join(s for code, s in sections if code not in (0x70, 0x71))
    }
    assert message.amqp is not None
    assert message.amqp.head == b"".join(s for code, s in sections if code in (0x72, 0x73, 0x74))
    assert message.amqp.footer == b"".join(s for code, s in sections if code == 0x78)
    assert message.amqp.footer


def test_clocks_given_as_a_function_are_read_only_when_a_delivery_needs_them() -> None:
    """A front end passes a function reading the clocks: called for a ttl or for sections
    not built yet, not for the usual delivery (the same bytes either way)."""
    reads: list[Clocks] = []

    def clocks() -> Clocks:
        reads.append(CLOCKS)
        return CLOCKS

    plain = CoreMessage(topic="t", payload=b"p", priority=3)
    first = to_amqp(plain, durable=True, delivery_count=1, clocks=clocks)
    assert len(reads) == 1  # the sections are built once, with the clocks
    again = to_amqp(plain, durable=True, delivery_count=1, clocks=clocks)
    assert again == first and len(reads) == 1
    expiring = CoreMessage(topic="t", payload=b"p", expiry=CLOCKS.now + 2.5)
    given = to_amqp(expiring, durable=False, delivery_count=0, clocks=CLOCKS)
    assert to_amqp(expiring, durable=False, delivery_count=0, clocks=clocks) == given
    assert len(reads) == 2
    out = ProtonMessage()
    out.decode(given)
    assert out.ttl == pytest.approx(2.5)
