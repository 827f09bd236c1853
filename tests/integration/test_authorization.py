"""Authorisation: configured allow/deny topic filters refuse subscriptions and publications,
with the reason codes each protocol version can express; anonymous clients can be refused.

MQTT 3.1.1 §3.9.3 (SUBACK 0x80), MQTT 5 §3.9.3 / §3.4.2.1 / §3.5.2.1 (reason 0x87).
"""

from __future__ import annotations

import pytest

from kittiwake.mqtt.packets import (
    PubAck,
    Publish,
    PubRec,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    Will,
)

from .clients import VERSIONS, MQTTv5, MQTTv311, unique


@pytest.fixture(scope="module")
def module_broker_config():
    return {
        "auth": {
            "publish_deny": ["secret/#", "locked/#"],
            "subscribe_deny": ["secret/#"],
        }
    }


@pytest.mark.parametrize(("version", "refusal"), [("v311", 0x80), ("v5", 0x87)])
def test_denied_subscription_is_refused_in_suback(address, paho, version, refusal):
    """A subscription matching subscribe_deny is refused: SUBACK 0x80 in 3.1.1 (the only
    failure code), 0x87 Not authorized in v5; the connection stays usable."""
    client = paho(address, protocol=VERSIONS[version])
    assert client.subscribe("secret/plans", 1) == [refusal]
    topic = unique("auth/allowed")
    assert client.subscribe(topic, 1) == [1]
    paho(address).publish(topic, b"fine", 1)
    assert client.get().payload == b"fine"


@pytest.mark.parametrize(("version", "refusal"), [(4, 0x80), (5, 0x87)])
def test_one_suback_grants_allowed_and_refuses_denied_filters(address, raw, version, refusal):
    """In one SUBSCRIBE, allowed filters are granted and denied ones refused, in request order
    (MQTT-3.8.4-6, MQTT-3.9.3-1)."""
    client = raw(address, version)
    client.connect(unique("auth-mixed"))
    client.send(Subscribe(9, [
        SubscriptionRequest("auth/a", 2),
        SubscriptionRequest("secret/x", 1),
        SubscriptionRequest("auth/b", 0),
    ]))
    suback = client.expect(SubAck)
    assert (suback.packet_id, suback.reason_codes) == (9, [2, refusal, 0])


@pytest.mark.parametrize("topic_filter", ["#", "+/plans", "+/+"])
def test_a_wildcard_over_a_denied_topic_is_granted_and_filtered(address, paho, topic_filter):
    """Tried as a new user would: a deny rule must not make wildcards unusable. A filter that
    reaches beyond the denied topics is granted; the denied ones never arrive, live or
    retained (DESIGN.md section 4, as Mosquitto and EMQX users expect)."""
    topic = "auth/plans"
    publisher = paho(address, protocol=MQTTv5)
    client = paho(address, protocol=MQTTv5)
    assert client.subscribe(topic_filter, 1) == [1]
    publisher.publish(topic, b"visible", 1)
    assert client.get().payload == b"visible"


@pytest.mark.parametrize("topic_filter", ["secret/+", "secret/#", "secret/plans"])
def test_a_filter_wholly_inside_a_deny_rule_is_refused(address, paho, topic_filter):
    client = paho(address, protocol=MQTTv5)
    assert client.subscribe(topic_filter, 0) == [0x87]


def test_denied_v5_publication_gets_not_authorized_and_is_not_delivered(address, paho, raw):
    """A v5 QoS 1 publication to a denied topic gets PUBACK 0x87, QoS 2 gets PUBREC 0x87, and
    the message reaches nobody (MQTT 5 §3.4.2.1, §3.5.2.1)."""
    sub = paho(address)
    sub.subscribe("locked/#", 2)
    pub = paho(address, protocol=MQTTv5)
    info = pub.publish("locked/door", b"open sesame", 1, wait=False)
    assert pub.publish_result(info) == 0x87
    client = raw(address, 5)
    client.connect(unique("auth-pub5"))
    client.send(Publish("locked/door", b"qos2", 2, packet_id=3))
    rec = client.expect(PubRec)
    assert (rec.packet_id, rec.reason_code) == (3, 0x87)
    client.send(Publish("locked/door", b"qos0", 0))
    sub.no_message(0.4)
    assert client.is_open(0.1)


def test_denied_v311_publication_is_acknowledged_and_silently_dropped(address, paho, raw):
    """3.1.1 has no negative PUBACK: a denied QoS 1 publication is acknowledged normally
    (PUBACK without reason code), the message is dropped, and the client stays connected."""
    sub = paho(address)
    sub.subscribe("locked/#", 1)
    client = raw(address, 4)
    client.connect(unique("auth-pub4"))
    client.send(Publish("locked/window", b"dropped", 1, packet_id=11))
    ack = client.expect(PubAck)
    assert (ack.packet_id, ack.reason_code) == (11, 0)
    sub.no_message(0.4)
    topic = unique("auth/after-denial")
    client.subscribe(topic, 1)
    client.publish(topic, b"allowed", 1)
    assert client.wait_for(Publish).payload == b"allowed"


def test_paho_v311_denied_publication_completes_without_error(address, paho):
    """A paho 3.1.1 publisher sees its denied QoS 2 publication complete normally."""
    sub = paho(address)
    sub.subscribe("locked/#", 2)
    pub = paho(address, protocol=MQTTv311)
    pub.publish("locked/vault", b"x", 2)
    sub.no_message(0.3)
    assert pub.client.is_connected()


@pytest.mark.parametrize(("version", "code"), [(4, 0x05), (5, 0x87)])
def test_will_on_a_denied_topic_is_refused_at_connect(address, raw, version, code):
    """A CONNECT whose will topic the client may not publish to is refused (3.1.1 CONNACK 0x05
    Not authorized, v5 0x87), so an unauthorised will can never be published."""
    client = raw(address, version)
    connack = client.connect(
        unique("auth-will"), will=Will("secret/will", b"x", 0), expect_success=False
    )
    assert connack.reason_code == code
    assert client.recv_until_closed() == []


@pytest.fixture
def closed_broker(broker):
    return broker(auth={"allow_anonymous": False, "publish_allow": ["open/#"]}).address


@pytest.mark.parametrize(("version", "code"), [(4, 0x05), (5, 0x87)])
def test_anonymous_clients_refused_when_not_allowed(closed_broker, raw, version, code):
    """With allow_anonymous = false a CONNECT without user name is refused (3.1.1 CONNACK 0x05,
    v5 0x87); one with a user name is accepted."""
    anonymous = raw(closed_broker, version)
    assert anonymous.connect(unique("anon"), expect_success=False).reason_code == code
    assert anonymous.recv_until_closed() == []
    named = raw(closed_broker, version)
    assert named.connect(unique("named"), username="alice").reason_code == 0


def test_publish_allow_list_limits_publications(closed_broker, paho):
    """With a publish_allow list, only matching topics are published; others are dropped
    (v5: PUBACK 0x87)."""
    sub = paho(closed_broker, protocol=MQTTv5, username="sub")
    sub.subscribe("#", 1)
    pub = paho(closed_broker, protocol=MQTTv5, username="pub")
    info = pub.publish("closed/topic", b"no", 1, wait=False)
    assert pub.publish_result(info) == 0x87
    pub.publish("open/topic", b"yes", 1)
    message = sub.get()
    assert (message.topic, message.payload) == ("open/topic", b"yes")
    sub.no_message(0.25)


def test_the_reported_case_one_deny_rule_and_wildcards(broker, paho, mosquitto_sub):
    """subscribe_deny = ["test/nosubscribe"]: '#' and '+/+' are granted (they were refused with
    0x87), and test/nosubscribe never reaches them, retained or live."""
    address = broker(auth={"subscribe_deny": ["test/nosubscribe"]})
    publisher = paho(address)
    publisher.publish("test/nosubscribe", b"retained secret", 1, retain=True)
    publisher.publish("test/open", b"retained open", 1, retain=True)
    everything = mosquitto_sub(address, ["#"], version="mqttv5", qos=1).wait_subscribed()
    pairs = paho(address, protocol=MQTTv5)
    assert pairs.subscribe("+/+", 1) == [1]
    assert pairs.get().payload == b"retained open"
    assert everything.get().payload == "retained open"
    publisher.publish("test/nosubscribe", b"live secret", 1)
    publisher.publish("test/open", b"live open", 1)
    assert pairs.get().payload == b"live open"
    assert everything.get().payload == "live open"
    pairs.no_message(0.3)
    everything.no_message(0.3)
    refused = paho(address, protocol=MQTTv5)
    assert refused.subscribe("test/nosubscribe", 1) == [0x87]
