"""Shared subscriptions ($share/{group}/{filter}): each message goes to exactly one member of
each group, spread over the members; ordinary subscriptions are unaffected.

MQTT 5 §4.8.2.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from kittiwake.mqtt.packets import (
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
)
from kittiwake.mqtt.properties import Properties

from .clients import VERSIONS, MQTTv5, MQTTv311, unique


def _members(paho, address, share, count, protocol=MQTTv5, qos=1):
    members = []
    for _ in range(count):
        member = paho(address, protocol=protocol)
        assert member.subscribe(share, qos) == [qos]
        members.append(member)
    return members


def _collect(members, expected_total, timeout=5.0):
    """Everything the members received until ``expected_total`` arrived (or timeout), then a
    short quiet period to catch duplicates."""
    deadline = time.monotonic() + timeout
    per_member = [[] for _ in members]
    while sum(map(len, per_member)) < expected_total and time.monotonic() < deadline:
        for i, member in enumerate(members):
            per_member[i].extend(m.payload for m in member.drain())
        time.sleep(0.01)
    time.sleep(0.25)
    for i, member in enumerate(members):
        per_member[i].extend(m.payload for m in member.drain())
    return per_member


@pytest.mark.parametrize("version", ["v311", "v5"])
def test_each_message_goes_to_exactly_one_member_and_all_members_get_some(
    address, paho, version
):
    """30 messages published to a group of 3 members: every message is received exactly once
    across the group, and the load is spread (every member gets at least one)."""
    topic = unique("share/spread")
    members = _members(paho, address, f"$share/g1/{topic}", 3, VERSIONS[version])
    pub = paho(address)
    payloads = [str(i).encode() for i in range(30)]
    for payload in payloads:
        pub.publish(topic, payload, 1)
    received = _collect(members, len(payloads))
    everything = [p for got in received for p in got]
    assert sorted(everything, key=int) == payloads, "each message exactly once in the group"
    assert all(received), f"messages not spread over the group: {[len(g) for g in received]}"


def test_every_group_and_every_plain_subscriber_gets_each_message(address, paho):
    """Two groups on the same filter each receive every message once; a non-shared subscriber
    on that filter receives every message too."""
    base = unique("share/groups")
    group_a = _members(paho, address, f"$share/a/{base}/#", 2)
    group_b = _members(paho, address, f"$share/b/{base}/+", 2)
    plain = paho(address, protocol=MQTTv5)
    plain.subscribe(f"{base}/#", 1)
    pub = paho(address)
    payloads = [str(i).encode() for i in range(10)]
    for payload in payloads:
        pub.publish(f"{base}/x", payload, 1)
    for group in (group_a, group_b):
        got = [p for member in _collect(group, 10) for p in member]
        assert sorted(got, key=int) == payloads
    assert [m.payload for m in plain.get_many(10)] == payloads
    plain.no_message(0.2)


def test_remaining_members_take_over_when_one_leaves(address, paho):
    """After a member unsubscribes, the others receive every message."""
    topic = unique("share/leave")
    first, second = _members(paho, address, f"$share/g/{topic}", 2)
    first.unsubscribe(f"$share/g/{topic}")
    pub = paho(address)
    for i in range(6):
        pub.publish(topic, str(i).encode(), 1)
    assert [m.payload for m in second.get_many(6)] == [str(i).encode() for i in range(6)]
    first.no_message(0.2)


def test_shared_subscription_gets_no_retained_messages(address, paho):
    """Retained messages are not sent when a shared subscription is made (MQTT 5 §4.8.2);
    live messages still are."""
    topic = unique("share/retained")
    pub = paho(address)
    pub.publish(topic, b"retained", 1, retain=True)
    (member,) = _members(paho, address, f"$share/g/{topic}", 1)
    member.no_message(0.3)
    pub.publish(topic, b"live", 1)
    assert member.get().payload == b"live"


def test_shared_subscription_delivery_respects_member_qos(address, paho):
    """A member's granted QoS caps the delivery as for any subscription."""
    topic = unique("share/qos")
    (member,) = _members(paho, address, f"$share/g/{topic}", 1, qos=0)
    paho(address).publish(topic, b"capped", 2)
    message = member.get()
    assert (message.payload, message.qos) == (b"capped", 0)


def test_no_local_on_a_shared_subscription_is_a_protocol_error(address, raw):
    """Setting No Local on a shared subscription is a Protocol Error (MQTT-3.8.3-4): the
    broker sends DISCONNECT 0x82 and closes."""
    client = raw(address, 5)
    client.connect(unique("share-nolocal"))
    client.send(Subscribe(1, [SubscriptionRequest("$share/g/x", 1, no_local=True)]))
    packets = client.recv_until_closed()
    assert [type(p) for p in packets] == [Disconnect]
    assert packets[0].reason_code == 0x82


@pytest.mark.parametrize(("version", "refusal"), [(4, 0x80), (5, 0x8F)])
@pytest.mark.parametrize(
    "share", ["$share/g", "$share/g/", "$share//t", "$share/g+/t", "$share/g#/t"]
)
def test_invalid_shared_subscription_filter_is_refused(address, raw, share, version, refusal):
    """A $share filter without a topic filter, or with an empty or wildcard share name, is
    refused in the SUBACK (3.1.1: 0x80; v5: 0x8F Topic Filter invalid, MQTT 5 §4.8.2) and the
    connection stays up. (paho will not even send most of these, so a raw client does.)"""
    client = raw(address, version)
    client.connect(unique("share-invalid"))
    topic = unique("share/after-refusal")
    client.send(Subscribe(5, [SubscriptionRequest(share, 1), SubscriptionRequest(topic, 1)]))
    suback = client.expect(SubAck)
    assert (suback.packet_id, suback.reason_codes) == (5, [refusal, 1])
    client.publish(topic, b"still connected", 1)
    assert client.wait_for(Publish).payload == b"still connected"


def test_v311_and_v5_members_share_one_group(address, paho):
    """Members of either protocol version can be in the same group."""
    topic = unique("share/mixed")
    old = paho(address, protocol=MQTTv311)
    new = paho(address, protocol=MQTTv5)
    old.subscribe(f"$share/mixed/{topic}", 1)
    new.subscribe(f"$share/mixed/{topic}", options=SubscribeOptions(qos=1))
    pub = paho(address)
    for i in range(10):
        pub.publish(topic, str(i).encode(), 1)
    got = _collect([old, new], 10)
    assert sorted((p for g in got for p in g), key=int) == [str(i).encode() for i in range(10)]
    assert all(got)


# -- members pull by credit --------------------------------------------------------------------


def _raw_member(raw, address, share, *, receive_maximum, qos=1, client_id=None, clean=True):
    """A v5 raw member that acknowledges nothing unless told, with a small Receive Maximum."""
    member = raw(address, 5)
    member.connect(
        client_id or unique("member"),
        clean_start=clean,
        properties=Properties(
            receive_maximum=receive_maximum, session_expiry_interval=0 if clean else 300
        ),
    )
    assert member.subscribe(share, qos).reason_codes == [qos]
    return member


def test_a_member_that_stops_acknowledging_gets_nothing_new_while_another_has_credit(
    address, raw
):
    """A shared group pulls by credit: once the stuck member's Receive Maximum (2) is full of
    unacknowledged messages, every later message goes to the member that keeps acknowledging,
    instead of piling up behind the stuck one."""
    topic = unique("share/credit")
    share = f"$share/credit/{topic}"
    stuck = _raw_member(raw, address, share, receive_maximum=2)
    busy = _raw_member(raw, address, share, receive_maximum=2)
    pub = raw(address, 4)
    pub.connect(unique("pub"))
    sent = [b"%d" % i for i in range(12)]
    busy_got: list[bytes] = []
    for payload in sent:
        pub.publish(topic, payload, 1)
    stuck_got = []
    deadline = time.monotonic() + 10
    while len(busy_got) + len(stuck_got) < len(sent) and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            packet = busy.expect(Publish, timeout=0.05)
            busy_got.append(packet.payload)
            busy.send(PubAck(packet.packet_id))
        with contextlib.suppress(TimeoutError):
            stuck_got.append(stuck.expect(Publish, timeout=0.05).payload)
    assert len(stuck_got) == 2, f"the stuck member got more than its window: {stuck_got}"
    assert sorted(busy_got + stuck_got, key=int) == sent, "each message exactly once"
    stuck.no_packet(0.3)


def test_a_member_that_disconnects_gives_its_unacknowledged_qos1_messages_to_the_group(
    address, raw
):
    """The messages a member received and never acknowledged go to the other member when it
    disconnects, marked as redeliveries (DUP=1): nothing is lost with the member."""
    topic = unique("share/leave-unacked")
    share = f"$share/leave/{topic}"
    leaving = _raw_member(raw, address, share, receive_maximum=10)
    pub = raw(address, 4)
    pub.connect(unique("pub"))
    for i in range(3):
        pub.publish(topic, b"%d" % i, 1)
    held = [leaving.expect(Publish) for _ in range(3)]
    assert [p.payload for p in held] == [b"0", b"1", b"2"]
    staying = _raw_member(raw, address, share, receive_maximum=10)
    staying.no_packet(0.3)  # the group's messages are the leaving member's until it leaves
    leaving.close()  # gone without acknowledging
    back = [staying.expect(Publish, timeout=5.0) for _ in range(3)]
    assert [(p.payload, p.qos, p.dup) for p in back] == [
        (b"0", 1, True), (b"1", 1, True), (b"2", 1, True)
    ]
    for packet in back:
        staying.send(PubAck(packet.packet_id))
    staying.no_packet(0.3)


def test_an_exactly_once_message_stays_with_the_member_it_was_sent_to(address, raw):
    """QoS 2 is not handed to another member when the chosen one disconnects (MQTT-4.8.2-4):
    it is completed with that member when it reconnects, with DUP=1 and its packet id."""
    topic = unique("share/qos2")
    share = f"$share/q2/{topic}"
    client_id = unique("member-q2")
    first = _raw_member(
        raw, address, share, receive_maximum=10, qos=2, client_id=client_id, clean=False
    )
    pub = raw(address, 4)
    pub.connect(unique("pub"))
    pub.send(Publish(topic, b"once", 2, False, False, 1))
    pub.expect(PubRec)
    pub.send(PubRel(1))
    pub.expect(PubComp)
    original = first.expect(Publish)
    other = _raw_member(raw, address, share, receive_maximum=10, qos=2)
    first.close()  # no PUBREC
    other.no_packet(0.5)
    again = raw(address, 5)
    assert again.connect(
        client_id, clean_start=False, properties=Properties(session_expiry_interval=300)
    ).session_present
    resent = again.expect(Publish)
    assert (resent.payload, resent.qos, resent.dup, resent.packet_id) == (
        b"once", 2, True, original.packet_id
    )
