"""Round trips for every packet type in MQTT 3.1, 3.1.1 and 5.0, plus known wire bytes.

Known bytes come from the spec's examples and from paho-mqtt 2.2 (captured off a socketpair),
so the codec is checked against a third party, not only against itself.
"""

from __future__ import annotations

import pytest

from kittiwake.mqtt.codec import (
    DISCONNECT_PACKET,
    PINGREQ_PACKET,
    PINGRESP_PACKET,
    PacketDecoder,
    PacketTooLargeError,
    encode,
    encode_publish,
    encode_remaining_length,
    encode_suback_v3,
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
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
    Will,
)
from kittiwake.mqtt.properties import Properties, encode_properties
from kittiwake.mqtt.reason_codes import ConnectReturnCode, ReasonCode


def decoder(version: int) -> PacketDecoder:
    dec = PacketDecoder()
    dec.protocol_version = version
    return dec


def decode_all(data: bytes, version: int) -> list[Packet]:
    return decoder(version).feed(data)


def decode_bytewise(data: bytes, version: int) -> list[Packet]:
    dec = decoder(version)
    out: list[Packet] = []
    for i in range(len(data)):
        out.extend(dec.feed(data[i : i + 1]))
    return out


def samples(version: int) -> list[Packet]:
    """One or more packets of every type the version has, exercising every optional field."""
    v5 = version == 5

    def props(**kw: object) -> Properties:
        return Properties(**kw) if v5 else Properties()  # type: ignore[arg-type]

    will_props = props(
        will_delay_interval=30,
        payload_format_indicator=1,
        message_expiry_interval=3600,
        content_type="text/plain",
        response_topic="replies/x",
        correlation_data=b"\x00\x01corr",
        user_properties=[("w", "1"), ("w", "2")],
    )
    out: list[Packet] = [
        Connect("", version),
        Connect("client-1", version, clean_start=False, keepalive=0),
        Connect("ünïcødé-客户", version, keepalive=65535, username="user", password=b"\x00pw\xff"),
        Connect(
            "c",
            version,
            will=Will("last/will", b"gone", 2, True, will_props),
            username="u",
            password=b"",
            properties=props(
                session_expiry_interval=0xFFFFFFFF,
                receive_maximum=10,
                maximum_packet_size=1 << 20,
                topic_alias_maximum=5,
                request_response_information=1,
                request_problem_information=0,
                authentication_method="SCRAM-SHA-1",
                authentication_data=b"client-first",
                user_properties=[("a", "b"), ("a", "b"), ("", "")],
            ),
        ),
        Connect("w0", version, will=Will("t", b"", 0, False, props())),
        ConnAck(),
        ConnAck(version != 3, 0),
        ConnAck(False, ReasonCode.NOT_AUTHORIZED if v5 else ConnectReturnCode.NOT_AUTHORIZED),
        Publish("a/b", b"hello"),
        Publish("a/b", b"", 1, packet_id=1),
        Publish("a/b/c", b"x" * 200, 2, retain=True, dup=True, packet_id=65535),
        Publish("big", bytes(range(256)) * 80, 1, packet_id=7),  # 3-byte remaining length
        Publish("/leading/and/trailing/", b"\x00\xff", 0, retain=True),
        Publish("ünïcødé/トピック", b"payload"),
        PubAck(1),
        PubRec(2),
        PubRel(3),
        PubComp(65535),
        Subscribe(1, [SubscriptionRequest("a/+", 1)]),
        Subscribe(
            2,
            [
                SubscriptionRequest("a/#", 0),
                SubscriptionRequest("+/b", 2),
                SubscriptionRequest("$SYS/#", 1),
            ],
        ),
        SubAck(1, [0, 1, 2, 0x80]),
        Unsubscribe(3, ["a/+", "b/#"]),
        UnsubAck(3, [0, 0x11] if v5 else []),
        PingReq(),
        PingResp(),
        Disconnect(),
    ]
    if v5:
        reason = props(reason_string="because", user_properties=[("k", "v")])
        publish_props = props(
            payload_format_indicator=0,
            message_expiry_interval=0,
            content_type="application/json",
            response_topic="resp/topic",
            correlation_data=b"",
            subscription_identifiers=[1, 268_435_455, 128],
            topic_alias=1,
            user_properties=[("x", "y"), ("x", "z")],
        )
        out += [
            ConnAck(
                True,
                ReasonCode.SUCCESS,
                props(
                    session_expiry_interval=60,
                    receive_maximum=65535,
                    maximum_qos=1,
                    retain_available=0,
                    maximum_packet_size=268_435_460,
                    assigned_client_identifier="auto-123",
                    topic_alias_maximum=10,
                    reason_string="welcome",
                    user_properties=[("srv", "kittiwake")],
                    wildcard_subscription_available=1,
                    subscription_identifier_available=0,
                    shared_subscription_available=1,
                    server_keep_alive=30,
                    response_information="resp/",
                    server_reference="other.example:1883",
                    authentication_method="SCRAM-SHA-1",
                    authentication_data=b"server-final",
                ),
            ),
            ConnAck(False, ReasonCode.BAD_USER_NAME_OR_PASSWORD, reason),
            Publish("a/b", b"p", 1, packet_id=9, properties=publish_props),
            Publish("", b"aliased", 0, properties=props(topic_alias=65535)),
            PubAck(1, ReasonCode.NO_MATCHING_SUBSCRIBERS),
            PubAck(1, ReasonCode.SUCCESS, reason),
            PubRec(2, ReasonCode.QUOTA_EXCEEDED, reason),
            PubRel(3, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND),
            PubComp(4, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND, reason),
            Subscribe(
                5,
                [
                    SubscriptionRequest("a/+", 2, True, True, 2),
                    SubscriptionRequest("$share/g/x", 1, False, True, 1),
                    SubscriptionRequest("z", 0, True, False, 0),
                ],
                props(subscription_identifiers=[42], user_properties=[("s", "1")]),
            ),
            SubAck(5, [2, 1, ReasonCode.TOPIC_FILTER_INVALID], reason),
            Unsubscribe(6, ["a/+"], props(user_properties=[("u", "1")])),
            UnsubAck(6, [ReasonCode.NO_SUBSCRIPTION_EXISTED], reason),
            Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE),
            Disconnect(
                ReasonCode.SERVER_MOVED,
                props(
                    session_expiry_interval=10,
                    reason_string="moving",
                    server_reference="b.example",
                    user_properties=[("d", "1")],
                ),
            ),
            Auth(),
            Auth(ReasonCode.CONTINUE_AUTHENTICATION),
            Auth(
                ReasonCode.RE_AUTHENTICATE,
                props(
                    authentication_method="SCRAM-SHA-1",
                    authentication_data=b"\x01\x02",
                    reason_string="again",
                    user_properties=[("a", "1")],
                ),
            ),
        ]
    return out


def _id(p: Packet) -> str:
    return type(p).__name__


@pytest.mark.parametrize("version", [3, 4, 5])
def test_every_packet_type_is_covered(version: int) -> None:
    types = {p.packet_type for p in samples(version)}
    expected = set(PacketType) if version == 5 else set(PacketType) - {PacketType.AUTH}
    assert types == expected


@pytest.mark.parametrize(
    ("version", "packet"),
    [(v, p) for v in (3, 4, 5) for p in samples(v)],
    ids=[f"v{v}-{i}-{_id(p)}" for v in (3, 4, 5) for i, p in enumerate(samples(v))],
)
def test_roundtrip(version: int, packet: Packet) -> None:
    data = encode(packet, version)
    assert decode_all(data, version) == [packet]
    assert decode_bytewise(data, version) == [packet]


@pytest.mark.parametrize("version", [3, 4, 5])
def test_stream_of_all_packets_in_one_feed_and_bytewise(version: int) -> None:
    packets = samples(version)
    stream = b"".join(encode(p, version) for p in packets)
    assert decode_all(stream, version) == packets
    assert decode_bytewise(stream, version) == packets


@pytest.mark.parametrize("version", [3, 4, 5])
def test_stream_split_at_every_offset(version: int) -> None:
    packets: list[Packet] = [
        Publish("a/b", b"x" * 130, 1, packet_id=1),
        PubAck(1),
        PingReq(),
        Subscribe(2, [SubscriptionRequest("a/#", 1)]),
    ]
    stream = b"".join(encode(p, version) for p in packets)
    for cut in range(len(stream) + 1):
        dec = decoder(version)
        assert dec.feed(stream[:cut]) + dec.feed(stream[cut:]) == packets, cut


def test_decoder_takes_version_from_connect() -> None:
    for version in (3, 4, 5):
        dec = PacketDecoder()
        assert dec.protocol_version == 4
        sub = Subscribe(1, [SubscriptionRequest("a", 1, no_local=version == 5)])
        data = encode(Connect("c", version), version) + encode(sub, version)
        packets = dec.feed(data)
        assert dec.protocol_version == version
        assert packets == [Connect("c", version), sub]


def test_connect_v3_uses_mqisdp() -> None:
    assert Connect("c", 3).protocol_name == "MQIsdp"
    assert Connect("c", 4).protocol_name == "MQTT"
    assert Connect("c", 5).protocol_name == "MQTT"


def test_large_publish_in_small_chunks() -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: 4-byte remaining length
    packet = Publish("bulk", payload, 1, packet_id=3)
    data = encode(packet)
    dec = decoder(4)
    out: list[Packet] = []
    for i in range(0, len(data), 65536):
        out += dec.feed(data[i : i + 65536])
    assert out == [packet]


def test_max_packet_size_boundary_is_inclusive() -> None:
    data = encode(Publish("t", b"x" * 10))
    dec = PacketDecoder(max_packet_size=len(data))
    assert len(dec.feed(data)) == 1
    with pytest.raises(PacketTooLargeError):
        PacketDecoder(max_packet_size=len(data) - 1).feed(data)


def test_partial_tail_is_kept() -> None:
    a, b = encode(PubAck(1)), encode(PubAck(2))
    dec = decoder(4)
    assert dec.feed(a + b[:1]) == [PubAck(1)]
    assert dec.feed(b"") == []
    assert dec.feed(b[1:3]) == []
    assert dec.feed(b[3:]) == [PubAck(2)]


# --------------------------------------------------------------------------------------------
# Known bytes


PAHO_CONNECT_311 = b"\x10\x10\x00\x04MQTT\x04\x02\x00<\x00\x04test"
PAHO_CONNECT_31 = b"\x10\x12\x00\x06MQIsdp\x03\x02\x00<\x00\x04test"
PAHO_CONNECT_5 = (
    b"\x10;\x00\x04MQTT\x05\xee\x00<\x0c\x11\x00\x00\x00\x1e&\x00\x01k\x00\x01v\x00\x04test"
    b"\x00\x00\nwill/topic\x00\x03bye\x00\x04user\x00\x04pass"
)
PAHO_PUBLISH_5 = (
    b"2&\x00\x03a/b\x00\x01\x19\x02\x00\x00\x00<\x03\x00\ntext/plain&\x00\x01a\x00\x01bhello"
)
PAHO_SUBSCRIBE_5 = b"\x82\x0f\x00\x01\x00\x00\x03a/+.\x00\x03b/#\x00"
PAHO_SUBSCRIBE_UNSUBSCRIBE_311 = (
    b"\x82\x0e\x00\x01\x00\x03a/+\x01\x00\x03b/#\x02\xa2\x07\x00\x02\x00\x03a/+"
)


def test_paho_connect_311() -> None:
    dec = PacketDecoder()
    expected = Connect("test", 4, "MQTT", True, 60)
    assert dec.feed(PAHO_CONNECT_311) == [expected]
    assert encode(expected) == PAHO_CONNECT_311


def test_paho_connect_31() -> None:
    dec = PacketDecoder()
    expected = Connect("test", 3, "MQIsdp", True, 60)
    assert dec.feed(PAHO_CONNECT_31) == [expected]
    assert dec.protocol_version == 3
    assert encode(expected) == PAHO_CONNECT_31


def test_paho_connect_5() -> None:
    expected = Connect(
        "test",
        5,
        "MQTT",
        True,
        60,
        Will("will/topic", b"bye", 1, True),
        "user",
        b"pass",
        Properties(session_expiry_interval=30, user_properties=[("k", "v")]),
    )
    dec = PacketDecoder()
    assert dec.feed(PAHO_CONNECT_5) == [expected]
    assert dec.protocol_version == 5
    assert encode(expected) == PAHO_CONNECT_5


def test_paho_publish_5() -> None:
    expected = Publish(
        "a/b",
        b"hello",
        1,
        packet_id=1,
        properties=Properties(
            message_expiry_interval=60, content_type="text/plain", user_properties=[("a", "b")]
        ),
    )
    assert decode_all(PAHO_PUBLISH_5, 5) == [expected]
    assert encode(expected, 5) == PAHO_PUBLISH_5


def test_paho_subscribe_5() -> None:
    expected = Subscribe(
        1, [SubscriptionRequest("a/+", 2, True, True, 2), SubscriptionRequest("b/#", 0)]
    )
    assert decode_all(PAHO_SUBSCRIBE_5, 5) == [expected]
    assert encode(expected, 5) == PAHO_SUBSCRIBE_5


def test_paho_subscribe_unsubscribe_311() -> None:
    expected: list[Packet] = [
        Subscribe(1, [SubscriptionRequest("a/+", 1), SubscriptionRequest("b/#", 2)]),
        Unsubscribe(2, ["a/+"]),
    ]
    assert decode_all(PAHO_SUBSCRIBE_UNSUBSCRIBE_311, 4) == expected
    assert b"".join(encode(p) for p in expected) == PAHO_SUBSCRIBE_UNSUBSCRIBE_311


@pytest.mark.parametrize(
    ("packet", "version", "data"),
    [
        (ConnAck(), 4, b"\x20\x02\x00\x00"),
        (ConnAck(True, 0), 4, b"\x20\x02\x01\x00"),
        (ConnAck(False, ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION), 4, b"\x20\x02\x00\x01"),
        (ConnAck(True, 0), 3, b"\x20\x02\x00\x00"),  # 3.1 has no session present flag
        (ConnAck(), 5, b"\x20\x03\x00\x00\x00"),
        (ConnAck(True, ReasonCode.SUCCESS), 5, b"\x20\x03\x01\x00\x00"),
        (PingReq(), 4, b"\xc0\x00"),
        (PingResp(), 5, b"\xd0\x00"),
        (Disconnect(), 4, b"\xe0\x00"),
        (Disconnect(), 5, b"\xe0\x00"),
        (Disconnect(ReasonCode.SERVER_SHUTTING_DOWN), 5, b"\xe0\x01\x8b"),
        (Auth(), 5, b"\xf0\x00"),
        (PubAck(1), 4, b"\x40\x02\x00\x01"),
        (PubAck(1), 5, b"\x40\x02\x00\x01"),
        (PubAck(1, ReasonCode.NO_MATCHING_SUBSCRIBERS), 5, b"\x40\x03\x00\x01\x10"),
        (PubAck(1, 0, Properties(reason_string="r")), 5, b"\x40\x08\x00\x01\x00\x04\x1f\x00\x01r"),
        (PubAck(1, ReasonCode.NO_MATCHING_SUBSCRIBERS), 4, b"\x40\x02\x00\x01"),  # dropped
        (PubRec(0x1234), 4, b"\x50\x02\x12\x34"),
        (PubRel(0x1234), 4, b"\x62\x02\x12\x34"),
        (PubComp(0x1234), 4, b"\x70\x02\x12\x34"),
        (SubAck(1, [0, 1, 2, 0x80]), 4, b"\x90\x06\x00\x01\x00\x01\x02\x80"),
        (SubAck(1, [1]), 5, b"\x90\x04\x00\x01\x00\x01"),
        (UnsubAck(9), 4, b"\xb0\x02\x00\x09"),
        (UnsubAck(9, [0]), 5, b"\xb0\x04\x00\x09\x00\x00"),
        (Publish("a/b", b"hi"), 4, b"\x30\x07\x00\x03a/bhi"),
        (Publish("a/b", b"hi", 1, True, True, 10), 4, b"\x3b\x09\x00\x03a/b\x00\x0ahi"),
        (Publish("a/b", b"hi", 2, packet_id=10), 5, b"\x34\x0a\x00\x03a/b\x00\x0a\x00hi"),
        (Unsubscribe(1, ["a"]), 4, b"\xa2\x05\x00\x01\x00\x01a"),
    ],
)
def test_known_bytes(packet: Packet, version: int, data: bytes) -> None:
    assert encode(packet, version) == data
    decoded = decode_all(data, version)
    if (isinstance(packet, ConnAck) and version == 3) or (
        isinstance(packet, PubAck) and version < 5
    ):
        return  # fields the dialect cannot carry were dropped on purpose
    assert decoded == [packet]


def test_constant_packets() -> None:
    assert PINGREQ_PACKET == b"\xc0\x00" == encode(PingReq())
    assert PINGRESP_PACKET == b"\xd0\x00" == encode(PingResp())
    assert DISCONNECT_PACKET == b"\xe0\x00" == encode(Disconnect())


@pytest.mark.parametrize(
    ("n", "data"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ],
)
def test_remaining_length_spec_table(n: int, data: bytes) -> None:
    # MQTT 5.0 table 1-1 / 3.1.1 table 2.4.
    assert encode_remaining_length(n) == data


def test_remaining_length_out_of_range() -> None:
    with pytest.raises(ValueError):
        encode_remaining_length(268_435_456)
    with pytest.raises(ValueError):
        encode_remaining_length(-1)


@pytest.mark.parametrize("version", [3, 4, 5])
def test_encode_publish_matches_encode(version: int) -> None:
    props = Properties(user_properties=[("a", "b")], subscription_identifiers=[3])
    for packet in [
        Publish("t/ü", b"x" * 300, 2, True, True, 77, props),
        Publish("t", b"", 0, False, False, None, props),
    ]:
        block = encode_properties(packet.properties, PacketType.PUBLISH) if version == 5 else None
        fast = encode_publish(
            packet.topic.encode(),
            packet.payload,
            packet.qos,
            packet.retain,
            packet.dup,
            packet.packet_id,
            block,
        )
        assert fast == encode(packet, version)


def test_encode_publish_needs_packet_id_above_qos_0() -> None:
    with pytest.raises(ValueError):
        encode_publish(b"t", b"", 1, False, False, None, None)


def test_auth_cannot_be_encoded_before_v5() -> None:
    with pytest.raises(ValueError):
        encode(Auth(), 4)


def test_v5_fields_are_dropped_for_v3_v4() -> None:
    sub = Subscribe(
        1, [SubscriptionRequest("a", 1, True, True, 2)], Properties(user_properties=[("a", "b")])
    )
    assert decode_all(encode(sub, 4), 4) == [Subscribe(1, [SubscriptionRequest("a", 1)])]
    pub = Publish("a", b"", properties=Properties(content_type="x"))
    assert decode_all(encode(pub, 4), 4) == [Publish("a", b"")]


def test_v5_client_accepts_two_byte_connack_from_311_server() -> None:
    # A 3.1.1-only server refuses a v5 CONNECT with a 3.1.1 CONNACK (return code 1).
    assert decode_all(b"\x20\x02\x00\x01", 5) == [ConnAck(False, 1)]


def test_v3_pubrel_subscribe_unsubscribe_may_carry_dup() -> None:
    # MQTT 3.1 retried these with DUP set; 3.1.1 made the flags fixed.
    stream = b"\x6a\x02\x00\x01" + b"\x8a\x06\x00\x01\x00\x01a\x00" + b"\xaa\x05\x00\x01\x00\x01a"
    assert decode_all(stream, 3) == [
        PubRel(1),
        Subscribe(1, [SubscriptionRequest("a")]),
        Unsubscribe(1, ["a"]),
    ]


def test_v3_publish_qos0_dup_is_tolerated() -> None:
    assert decode_all(b"\x38\x03\x00\x01a", 3) == [Publish("a", dup=True)]


def test_properties_repr_shows_only_set_fields() -> None:
    assert repr(Properties()) == "Properties()"
    assert repr(Properties(topic_alias=3, user_properties=[("a", "b")])) == (
        "Properties(topic_alias=3, user_properties=[('a', 'b')])"
    )


@pytest.mark.parametrize("version", [3, 4, 5])
def test_every_packet_type_with_multibyte_remaining_length(version: int) -> None:
    # Regression: v5 acks once wrote remaining length as one byte, wrong from 128 up.
    big = "x" * 300
    for packet in samples(version):
        props = getattr(packet, "properties", None)
        if props is not None and version == 5:
            props.user_properties.append((big, big))
        elif isinstance(packet, Subscribe):
            packet.subscriptions.append(SubscriptionRequest(big))
        elif isinstance(packet, Unsubscribe):
            packet.topic_filters.append(big)
        elif isinstance(packet, Connect):
            packet.client_id = big
        elif isinstance(packet, Publish):
            packet.payload = big.encode()
        elif isinstance(packet, SubAck):
            packet.reason_codes = [0] * 300
        else:
            continue  # nothing variable to grow in this dialect (acks, pings, v3/v4 DISCONNECT)
        data = encode(packet, version)
        assert len(data) > 130, packet
        assert decode_all(data, version) == [packet]


@pytest.mark.parametrize("count", [1, 4, 125, 126, 300])
def test_the_v3_suback_shortcut_encodes_what_the_packet_encoder_does(count: int) -> None:
    codes = [(i % 3) if i % 7 else 0x80 for i in range(count)]
    for packet_id in (1, 0x1234, 0xFFFF):
        expected = encode(SubAck(packet_id, codes), 4)
        assert encode_suback_v3(packet_id, codes) == expected
