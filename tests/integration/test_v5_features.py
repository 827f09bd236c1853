"""MQTT 5 features: topic aliases both ways, message expiry, subscription identifiers,
No Local, request/response properties, unsubscribe reason codes.

MQTT 5 §3.3.2.3 (PUBLISH properties), §3.8.2.1.2 (Subscription Identifier), §3.8.3.1
(No Local), §3.11.3 (UNSUBACK payload).
"""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.subscribeoptions import SubscribeOptions

from kittiwake.mqtt.packets import Disconnect, PubAck, Publish
from kittiwake.mqtt.properties import Properties

from .clients import MQTTv5, props, unique


def _session(expiry=300):
    return props(PacketTypes.CONNECT, SessionExpiryInterval=expiry)


# -- topic aliases -------------------------------------------------------------------------


def test_client_topic_alias_is_resolved_by_the_broker(address, paho):
    """A v5 publisher may set a Topic Alias with a topic and then publish with an empty topic
    and only the alias; subscribers receive both messages on the full topic (MQTT 5 §3.3.2.3.4)."""
    topic = unique("v5/alias-in")
    sub = paho(address)
    sub.subscribe(topic, 1)
    pub = paho(address, protocol=MQTTv5)
    assert pub.connack_properties.TopicAliasMaximum >= 1
    pub.publish(topic, b"with topic", 1, properties=props(PacketTypes.PUBLISH, TopicAlias=1))
    pub.publish("", b"alias only", 1, properties=props(PacketTypes.PUBLISH, TopicAlias=1))
    got = sub.get_many(2)
    assert [(m.topic, m.payload) for m in got] == [(topic, b"with topic"), (topic, b"alias only")]


def test_client_topic_alias_can_be_remapped(address, paho):
    """Sending an alias with a new topic name replaces the mapping (MQTT 5 §3.3.2.3.4)."""
    first, second = unique("v5/remap-a"), unique("v5/remap-b")
    sub = paho(address)
    sub.subscribe(first, 0)
    sub.subscribe(second, 0)
    pub = paho(address, protocol=MQTTv5)
    alias = props(PacketTypes.PUBLISH, TopicAlias=2)
    pub.publish(first, b"1", 1, properties=alias)
    pub.publish(second, b"2", 1, properties=alias)
    pub.publish("", b"3", 1, properties=alias)
    assert [(m.topic, m.payload) for m in sub.get_many(3)] == [
        (first, b"1"), (second, b"2"), (second, b"3"),
    ]


@pytest.mark.parametrize(
    ("alias", "topic", "reason"),
    [(65, "x/y", 0x94), (3, "", 0x82)],
    ids=["above-topic-alias-maximum", "unknown-alias"],
)
def test_invalid_client_topic_alias_disconnects(address, raw, alias, topic, reason):
    """An alias above the broker's Topic Alias Maximum is a Topic Alias Invalid error (0x94,
    MQTT-3.3.2-9, §3.3.2.3.4); an empty topic with an alias that has no mapping is a Protocol
    Error (0x82, §3.3.4). Either way the broker sends DISCONNECT and closes."""
    client = raw(address, 5)
    connack = client.connect(unique("bad-alias"))
    assert connack.properties.topic_alias_maximum == 64
    client.send(Publish(topic, b"x", 0, properties=Properties(topic_alias=alias)))
    packets = client.recv_until_closed()
    assert [type(p) for p in packets] == [Disconnect]
    assert packets[0].reason_code == reason


def test_broker_assigns_topic_aliases_when_the_client_allows_them(address, paho, raw):
    """A client announcing Topic Alias Maximum > 0 receives the first PUBLISH on a topic with
    the topic and an alias, and later ones with an empty topic and the same alias."""
    topic = unique("v5/alias-out")
    client = raw(address, 5)
    client.connect(unique("alias-out"), properties=Properties(topic_alias_maximum=5))
    client.subscribe(topic, 0)
    pub = paho(address)
    for payload in (b"1", b"2", b"3"):
        pub.publish(topic, payload, 0)
    first, second, third = (client.expect(Publish) for _ in range(3))
    assert first.topic == topic and first.properties.topic_alias is not None
    assert 1 <= first.properties.topic_alias <= 5
    for later in (second, third):
        assert later.topic == ""
        assert later.properties.topic_alias == first.properties.topic_alias
    assert [p.payload for p in (first, second, third)] == [b"1", b"2", b"3"]


def test_broker_respects_the_client_topic_alias_maximum(address, paho, raw):
    """The broker never uses an alias above the client's Topic Alias Maximum (MQTT-3.3.2-11):
    with maximum 1 and two topics, one gets alias 1, the other always goes by name."""
    a, b = unique("v5/alias-max-a"), unique("v5/alias-max-b")
    client = raw(address, 5)
    client.connect(unique("alias-max"), properties=Properties(topic_alias_maximum=1))
    client.subscribe(a, 0)
    client.subscribe(b, 0)
    pub = paho(address)
    for topic in (a, b, a, b):
        pub.publish(topic, topic.encode(), 0)
    packets = [client.expect(Publish) for _ in range(4)]
    aliases = {p.properties.topic_alias for p in packets} - {None}
    assert aliases <= {1}
    for p in packets:  # every packet is resolvable: a topic, or an alias set earlier
        assert p.topic or p.properties.topic_alias == 1
    assert packets[0].topic == a and packets[0].properties.topic_alias == 1
    assert [p.topic for p in packets[1:]] == [b, "", b]


@pytest.mark.parametrize("qos", [0, 1])
def test_a_message_dropped_for_maximum_packet_size_sets_no_alias(address, raw, qos):
    """A 4 KiB message is dropped for a client with Maximum Packet Size 2048 (MQTT-3.1.2-25);
    the next message on that topic must carry the topic name, not an alias the client never
    received (MQTT.js closes on "Received unregistered Topic Alias")."""
    topic = unique("v5/alias-drop")
    client = raw(address, 5)
    client.connect(
        unique("alias-drop"),
        properties=Properties(topic_alias_maximum=10, maximum_packet_size=2048),
    )
    client.subscribe(topic, qos)
    pub = raw(address, 5)
    pub.connect(unique("alias-drop-pub"))
    for payload in (b"x" * 4096, b"after", b"again"):
        pub.publish(topic, payload, qos)
    first, second = client.expect(Publish), client.expect(Publish)
    assert first.payload == b"after", "the oversized message was sent"
    assert first.topic == topic, f"first PUBLISH on the topic without its name: {first!r}"
    assert second.payload == b"again"
    assert second.topic == topic or second.properties.topic_alias == first.properties.topic_alias
    if qos:
        client.send(PubAck(first.packet_id))
        client.send(PubAck(second.packet_id))
    client.no_packet(0.3)


def test_no_topic_alias_for_a_client_that_did_not_allow_them(address, paho, raw):
    """Without a Topic Alias Maximum from the client, the broker sends no aliases
    (MQTT-3.1.2-27: an absent maximum means 0)."""
    topic = unique("v5/no-alias")
    client = raw(address, 5)
    client.connect(unique("no-alias"))
    client.subscribe(topic, 0)
    pub = paho(address)
    pub.publish(topic, b"1", 0)
    pub.publish(topic, b"2", 0)
    for _ in range(2):
        packet = client.expect(Publish)
        assert packet.topic == topic and packet.properties.topic_alias is None


# -- message expiry ------------------------------------------------------------------------


def test_expired_message_is_not_delivered_to_a_returning_session(address, paho):
    """A message whose Message Expiry Interval passes while it waits for an offline session is
    discarded (MQTT-3.3.2-5); a message without expiry queued alongside still arrives."""
    topic = unique("v5/expiry")
    client_id = unique("expiry")
    sub = paho(address, client_id, protocol=MQTTv5, clean_start=False, properties=_session())
    sub.subscribe(topic, 1)
    sub.disconnect()
    pub = paho(address, protocol=MQTTv5)
    pub.publish(topic, b"short-lived", 1,
                properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
    pub.publish(topic, b"durable", 1)
    time.sleep(1.6)
    back = paho(address, client_id, protocol=MQTTv5, clean_start=False, properties=_session())
    assert back.session_present
    message = back.get()
    assert message.payload == b"durable"
    back.no_message(0.3)


def test_forwarded_message_expiry_is_reduced_by_the_time_spent_queued(address, paho):
    """The Message Expiry Interval sent to a subscriber is the publisher's value minus the time
    the message waited in the broker (MQTT-3.3.2-6)."""
    topic = unique("v5/expiry-left")
    client_id = unique("expiry-left")
    sub = paho(address, client_id, protocol=MQTTv5, clean_start=False, properties=_session())
    sub.subscribe(topic, 1)
    sub.disconnect()
    pub = paho(address, protocol=MQTTv5)
    ten_seconds = props(PacketTypes.PUBLISH, MessageExpiryInterval=10)
    pub.publish(topic, b"ageing", 1, properties=ten_seconds)
    time.sleep(1.2)
    back = paho(address, client_id, protocol=MQTTv5, clean_start=False, properties=_session())
    message = back.get()
    assert message.payload == b"ageing"
    remaining = message.properties.MessageExpiryInterval
    assert 1 <= remaining <= 9, f"expiry forwarded as {remaining}, published as 10 s 1.2 s ago"


def test_live_message_keeps_its_expiry_interval(address, paho):
    """A message forwarded at once carries (about) the interval it was published with, and a
    message published without expiry carries none."""
    topic = unique("v5/expiry-live")
    sub = paho(address, protocol=MQTTv5)
    sub.subscribe(topic, 1)
    pub = paho(address, protocol=MQTTv5)
    pub.publish(topic, b"e", 1, properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=60))
    pub.publish(topic, b"none", 1)
    with_expiry, without = sub.get_many(2)
    assert with_expiry.properties.MessageExpiryInterval in (59, 60)
    assert not hasattr(without.properties, "MessageExpiryInterval")


def test_retained_message_expires(address, paho):
    """A retained message is no longer sent to new subscribers once its expiry passed."""
    topic = unique("v5/retained-expiry")
    pub = paho(address, protocol=MQTTv5)
    pub.publish(topic, b"brief", 1, retain=True,
                properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
    early = paho(address, protocol=MQTTv5)
    early.subscribe(topic, 1)
    message = early.get()
    assert message.payload == b"brief" and message.retain
    assert message.properties.MessageExpiryInterval in (0, 1)
    time.sleep(1.3)
    late = paho(address, protocol=MQTTv5)
    late.subscribe(topic, 1)
    late.no_message(0.3)


# -- subscription identifiers, No Local ------------------------------------------------------


def test_one_message_carries_every_matching_subscription_identifier(address, paho):
    """Overlapping subscriptions with identifiers 1 and 2 give one PUBLISH carrying both
    identifiers (MQTT-3.3.4-3, MQTT-3.3.4-4); a message matching only one carries only that id."""
    base = unique("v5/subid")
    sub = paho(address, protocol=MQTTv5)
    sub.subscribe(f"{base}/#", 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=1))
    sub.subscribe(f"{base}/+/x", 1,
                  properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=2))
    pub = paho(address)
    pub.publish(f"{base}/a/x", b"both", 1)
    message = sub.get()
    assert message.payload == b"both"
    assert sorted(message.properties.SubscriptionIdentifier) == [1, 2]
    sub.no_message(0.25)
    pub.publish(f"{base}/a/y", b"one", 1)
    message = sub.get()
    assert message.properties.SubscriptionIdentifier == [1]


def test_retained_message_carries_the_new_subscription_identifier(address, paho):
    """A retained message sent because of a subscription carries that subscription's id."""
    topic = unique("v5/subid-retained")
    paho(address).publish(topic, b"r", 1, retain=True)
    sub = paho(address, protocol=MQTTv5)
    sub.subscribe(topic, 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=77))
    message = sub.get()
    assert message.retain and message.properties.SubscriptionIdentifier == [77]


def test_no_local_suppresses_own_publications(address, paho):
    """With No Local, a client does not receive what it published itself, but still receives
    other clients' messages on the same topic (MQTT-3.8.3-3)."""
    topic = unique("v5/nolocal")
    me = paho(address, protocol=MQTTv5)
    me.subscribe(topic, options=SubscribeOptions(qos=1, noLocal=True))
    me.publish(topic, b"mine", 1)
    me.no_message(0.4)
    paho(address).publish(topic, b"theirs", 1)
    assert me.get().payload == b"theirs"


def test_without_no_local_a_client_receives_its_own_publications(address, paho):
    """The default (No Local 0) delivers a client's own messages back to it."""
    topic = unique("v5/local")
    me = paho(address, protocol=MQTTv5)
    me.subscribe(topic, 1)
    me.publish(topic, b"echo", 1)
    assert me.get().payload == b"echo"


# -- properties, acknowledgements ----------------------------------------------------------------


def test_application_properties_are_forwarded_unchanged(address, paho):
    """User properties (order and repeats kept), content type, response topic, correlation
    data and payload format indicator reach the subscriber unaltered (MQTT-3.3.2-4, -15 to -20)."""
    topic = unique("v5/props")
    sub = paho(address, protocol=MQTTv5)
    sub.subscribe(topic, 1)
    pub = paho(address, protocol=MQTTv5)
    user = [("b", "1"), ("a", "2"), ("b", "3")]
    pub.publish(topic, "text ✓", 1, properties=props(
        PacketTypes.PUBLISH, UserProperty=user, ContentType="text/plain; charset=utf-8",
        ResponseTopic="reply/to/me", CorrelationData=b"\x00corr", PayloadFormatIndicator=1,
    ))
    message = sub.get()
    p = message.properties
    assert message.payload == "text ✓".encode()
    assert p.UserProperty == user
    assert (p.ContentType, p.ResponseTopic, p.CorrelationData, p.PayloadFormatIndicator) == (
        "text/plain; charset=utf-8", "reply/to/me", b"\x00corr", 1,
    )


def test_request_response_round_trip(address, paho):
    """A responder can answer on the Response Topic with the Correlation Data it received."""
    requests, replies = unique("v5/req"), unique("v5/rep")
    responder = paho(address, protocol=MQTTv5)
    responder.subscribe(requests, 1)
    requester = paho(address, protocol=MQTTv5)
    requester.subscribe(replies, 1)
    requester.publish(requests, b"ping?", 1, properties=props(
        PacketTypes.PUBLISH, ResponseTopic=replies, CorrelationData=b"42"))
    request = responder.get()
    responder.publish(request.properties.ResponseTopic, b"pong!", 1, properties=props(
        PacketTypes.PUBLISH, CorrelationData=request.properties.CorrelationData))
    reply = requester.get()
    assert (reply.payload, reply.properties.CorrelationData) == (b"pong!", b"42")


def test_response_information_only_when_requested(address, raw):
    """A client that sets Request Response Information = 1 gets a Response Information string
    in CONNACK, usable as a response-topic prefix; one that does not ask gets none
    (MQTT 5 §3.1.2.11.7, §3.2.2.3.15)."""
    asking = raw(address, 5)
    connack = asking.connect(unique("rri"), properties=Properties(request_response_information=1))
    info = connack.properties.response_information
    assert info, connack
    assert "+" not in info and "#" not in info
    silent = raw(address, 5)
    assert silent.connect(unique("no-rri")).properties.response_information is None


def test_unsuback_reason_codes(address, paho):
    """UNSUBACK says Success (0x00) for a subscription that existed and No subscription existed
    (0x11) otherwise (MQTT 5 §3.11.3)."""
    topic = unique("v5/unsub")
    client = paho(address, protocol=MQTTv5)
    client.subscribe(topic, 1)
    assert client.unsubscribe(topic) == [0x00]
    assert client.unsubscribe(topic) == [0x11]
    paho(address).publish(topic, b"after unsubscribe", 1)
    client.no_message(0.3)


def test_redelivery_after_reconnect_does_not_rely_on_old_topic_aliases(address, paho, raw):
    """Topic aliases live only as long as the network connection (MQTT-3.3.2-7): a QoS 1
    message that was sent with an alias only (empty topic) and not acknowledged is resent on
    the next connection with its topic name, never with an empty topic."""
    topic = unique("v5/alias-resume")
    client_id = unique("alias-resume")
    session = Properties(session_expiry_interval=60, topic_alias_maximum=10)
    client = raw(address, 5)
    client.connect(client_id, clean_start=False, properties=session)
    client.subscribe(topic, 1)
    pub = paho(address)
    pub.publish(topic, b"first", 1)
    pub.publish(topic, b"second", 1)
    first, second = client.expect(Publish), client.expect(Publish)
    assert first.topic == topic and second.topic == ""  # the alias is in use
    client.send(PubAck(first.packet_id))
    client.disconnect()

    client = raw(address, 5)
    assert client.connect(client_id, clean_start=False, properties=session).session_present
    resent = client.expect(Publish)
    assert (resent.payload, resent.dup, resent.packet_id) == (b"second", True, second.packet_id)
    assert resent.topic == topic, "an alias from the previous connection is meaningless now"


def test_subscription_identifier_survives_session_resumption(address, paho):
    """A persistent session's subscription keeps its identifier: messages queued while the
    client was away, and live ones after it returns, carry it."""
    topic = unique("v5/subid-resume")
    client_id = unique("subid-resume")
    sub = paho(address, client_id, protocol=MQTTv5, clean_start=False, properties=_session())
    sub.subscribe(topic, 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=9))
    sub.disconnect()
    pub = paho(address)
    pub.publish(topic, b"queued", 1)
    back = paho(address, client_id, protocol=MQTTv5, clean_start=False, properties=_session())
    queued = back.get()
    assert (queued.payload, queued.properties.SubscriptionIdentifier) == (b"queued", [9])
    pub.publish(topic, b"live", 1)
    assert back.get().properties.SubscriptionIdentifier == [9]
