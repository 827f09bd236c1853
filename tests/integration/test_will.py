"""Will messages: published when a connection ends abnormally, not on a clean DISCONNECT, and
in MQTT 5 after the Will Delay Interval or at session end, whichever comes first.

MQTT 3.1.1 §3.1.2.5, MQTT 5 §3.1.2.5 and §3.1.3.2.2 (Will Delay Interval).
"""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

from kittiwake.mqtt.packets import Disconnect, Will
from kittiwake.mqtt.properties import Properties

from .clients import VERSIONS, MQTTv5, props, unique


def _watch(paho, address, topic):
    watcher = paho(address, protocol=MQTTv5)
    watcher.subscribe(topic, 2)
    return watcher


def _session(expiry):
    return props(PacketTypes.CONNECT, SessionExpiryInterval=expiry)


@pytest.mark.parametrize("will_qos", [0, 1, 2])
@pytest.mark.parametrize("version", ["v311", "v5"])
def test_will_published_when_connection_drops_without_disconnect(
    address, paho, version, will_qos
):
    """Closing the network connection without DISCONNECT makes the broker publish the will,
    with its topic, payload and QoS (MQTT-3.1.2-8)."""
    topic = unique("will/abnormal")
    watcher = _watch(paho, address, topic)
    client = paho(address, protocol=VERSIONS[version], will=(topic, b"gone", will_qos, False))
    client.kill()
    message = watcher.get()
    assert (message.topic, message.payload, message.qos, message.retain) == (
        topic, b"gone", will_qos, False,
    )
    watcher.no_message(0.25)


@pytest.mark.parametrize("version", ["v311", "v5"])
def test_no_will_after_clean_disconnect(address, paho, version):
    """A normal DISCONNECT discards the will (MQTT-3.1.2-10 / MQTT-3.14.4-3)."""
    topic = unique("will/clean")
    watcher = _watch(paho, address, topic)
    client = paho(address, protocol=VERSIONS[version], will=(topic, b"unwanted", 1, False))
    client.disconnect()
    watcher.no_message(0.6)


def test_retained_will_is_kept_for_later_subscribers(address, paho):
    """A will with Will Retain set is published as a retained message (MQTT-3.1.2-17)."""
    topic = unique("will/retained")
    client = paho(address, will=(topic, b"offline", 1, True))
    client.kill()
    time_limit = time.monotonic() + 3
    while True:  # the will is published asynchronously; subscribe until it is there
        late = paho(address)
        late.subscribe(topic, 1)
        try:
            message = late.get(0.3)
            break
        except AssertionError:
            late.disconnect()
            assert time.monotonic() < time_limit, "retained will never appeared"
    assert (message.payload, message.retain) == (b"offline", True)


def test_disconnect_with_will_message_reason_publishes_will(address, paho):
    """A v5 DISCONNECT with reason 0x04 (Disconnect with Will Message) publishes the will."""
    topic = unique("will/reason4")
    watcher = _watch(paho, address, topic)
    client = paho(address, protocol=MQTTv5, will=(topic, b"asked for", 1, False))
    client.disconnect(reasoncode=PahoReasonCode(PacketTypes.DISCONNECT, identifier=0x04))
    message = watcher.get()
    assert message.payload == b"asked for"


def test_will_properties_are_forwarded(address, paho):
    """The will's v5 properties (content type, user properties, response topic, correlation
    data) travel with it (MQTT 5 §3.1.3.2 Will Properties)."""
    topic = unique("will/props")
    watcher = _watch(paho, address, topic)
    will_props = props(
        PacketTypes.WILLMESSAGE, ContentType="text/plain", ResponseTopic="reply/here",
        CorrelationData=b"\x01\x02", UserProperty=[("k", "v")],
    )
    client = paho(
        address, protocol=MQTTv5, will=(topic, b"bye", 1, False), will_properties=will_props
    )
    client.kill()
    message = watcher.get()
    p = message.properties
    assert (p.ContentType, p.ResponseTopic, p.CorrelationData) == (
        "text/plain", "reply/here", b"\x01\x02",
    )
    assert p.UserProperty == [("k", "v")]


def test_will_delay_postpones_the_will(address, paho):
    """With a Will Delay Interval, the will is published only once the delay has passed
    (MQTT-3.1.3-9), here 1.5 s after an abnormal disconnection, session expiry 30 s."""
    topic = unique("will/delay")
    watcher = _watch(paho, address, topic)
    client = paho(
        address, protocol=MQTTv5, clean_start=False, properties=_session(30),
        will=(topic, b"late", 1, False),
        will_properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=2),
    )
    client.kill()
    start = time.monotonic()
    watcher.no_message(1.5)
    message = watcher.get(2.5)
    elapsed = time.monotonic() - start
    assert message.payload == b"late"
    assert 1.5 <= elapsed <= 3.5, f"will after {elapsed:.2f}s, delay was 2 s"


@pytest.mark.parametrize("clean_start", [False, True], ids=["resume", "clean-start"])
def test_new_connection_within_will_delay_deletes_the_will(address, paho, clean_start):
    """A new network connection for the client id before the Will Delay Interval has passed
    means the will is never published, whether it resumes the session or starts a new one
    (MQTT 5 §3.1.2.5: "...unless ... a new Network Connection for the ClientID is opened
    before the Will Delay Interval has passed"; MQTT-3.1.3-9)."""
    topic = unique("will/cancel")
    client_id = unique("will-cancel")
    watcher = _watch(paho, address, topic)
    client = paho(
        address, client_id, protocol=MQTTv5, clean_start=False, properties=_session(30),
        will=(topic, b"never", 1, False),
        will_properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=1),
    )
    client.kill()
    again = paho(
        address, client_id, protocol=MQTTv5, clean_start=clean_start, properties=_session(30)
    )
    assert again.session_present is not clean_start
    watcher.no_message(1.6)


def test_will_published_at_session_end_when_expiry_is_shorter_than_delay(address, paho):
    """The will is published when the session ends if that comes before the will delay
    (MQTT 5 §3.1.2.5): session expiry 1 s, will delay 60 s → will after about 1 s."""
    topic = unique("will/expiry-first")
    watcher = _watch(paho, address, topic)
    client = paho(
        address, protocol=MQTTv5, clean_start=False, properties=_session(1),
        will=(topic, b"session over", 1, False),
        will_properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=60),
    )
    client.kill()
    start = time.monotonic()
    message = watcher.get(3.5)
    elapsed = time.monotonic() - start
    assert message.payload == b"session over"
    assert 0.8 <= elapsed <= 3.0, f"will after {elapsed:.2f}s; session expiry was 1 s"


def test_will_with_delay_but_no_session_expiry_is_published_at_once(address, paho):
    """Session Expiry 0 ends the session with the connection, so a delayed will goes out
    immediately (the session end comes first)."""
    topic = unique("will/no-expiry")
    watcher = _watch(paho, address, topic)
    client = paho(
        address, protocol=MQTTv5, will=(topic, b"now", 1, False),
        will_properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=60),
    )
    client.kill()
    assert watcher.get(1.0).payload == b"now"


def test_session_takeover_publishes_will_of_old_connection(address, paho):
    """When a second connection takes over a client id, the old connection is closed and its
    will (no delay) is published (MQTT-3.1.4-3)."""
    topic = unique("will/takeover")
    client_id = unique("will-takeover")
    watcher = _watch(paho, address, topic)
    old = paho(address, client_id, protocol=MQTTv5, will=(topic, b"taken over", 1, False))
    paho(address, client_id, protocol=MQTTv5)
    assert old.wait_disconnected().reason_code == 0x8E
    assert watcher.get(1.5).payload == b"taken over"


def test_invalid_disconnect_does_not_discard_the_will(address, paho, raw):
    """A v5 DISCONNECT that sets a Session Expiry Interval when CONNECT had none is a Protocol
    Error, not a valid DISCONNECT (MQTT-3.14.2-2): the broker answers DISCONNECT 0x82 and,
    since the connection did not end normally, publishes the will."""
    topic = unique("will/bad-disconnect")
    watcher = _watch(paho, address, topic)
    client = raw(address, 5)
    client.connect(unique("bad-disconnect"), will=Will(topic, b"not a clean goodbye", 1))
    client.send(Disconnect(0, Properties(session_expiry_interval=60)))
    packets = client.recv_until_closed()
    assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, 0x82)]
    assert watcher.get().payload == b"not a clean goodbye"
