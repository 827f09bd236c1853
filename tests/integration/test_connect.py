"""Connecting: client identifiers, protocol versions, keepalive policy and the limits a v5
CONNACK announces.

MQTT 3.1.1 §3.1, §3.2; MQTT 5 §3.1.2.10, §3.1.3.1, §3.2.2.3.
"""

from __future__ import annotations

import paho.mqtt.client as mqtt
import pytest

from kittiwake.mqtt.packets import Publish
from kittiwake.mqtt.properties import Properties

from .clients import MQTTv5, unique


@pytest.fixture(scope="module")
def module_broker_config():
    return {
        "sessions": {"max_keepalive": 10, "max_session_expiry": 100},
        "limits": {"receive_maximum": 50, "max_packet_size": 100_000, "topic_alias_maximum": 7},
    }


def test_v5_empty_client_id_gets_an_assigned_identifier(address, paho):
    """A v5 client connecting with an empty client id is given one in the CONNACK's Assigned
    Client Identifier, unique per connection (MQTT-3.2.2-16)."""
    first = paho(address, "", protocol=MQTTv5)
    second = paho(address, "", protocol=MQTTv5)
    a = first.connack_properties.AssignedClientIdentifier
    b = second.connack_properties.AssignedClientIdentifier
    assert a and b and a != b
    topic = unique("connect/assigned")
    first.subscribe(topic, 1)
    second.publish(topic, b"both work", 1)
    assert first.get().payload == b"both work"


def test_v311_empty_client_id_with_clean_session_is_accepted(address, raw):
    """3.1.1 allows a zero-length client id with Clean Session 1 (MQTT-3.1.3-6/-7)."""
    client = raw(address, 4)
    connack = client.connect("", clean_start=True)
    assert (connack.reason_code, connack.session_present) == (0, False)
    topic = unique("connect/anon")
    client.subscribe(topic, 1)
    client.publish(topic, b"ok", 1)
    assert client.wait_for(Publish).payload == b"ok"


def test_v311_empty_client_id_without_clean_session_is_refused(address, raw):
    """A zero-length client id with Clean Session 0 gets CONNACK 0x02 (Identifier rejected)
    and the connection is closed (MQTT-3.1.3-8)."""
    client = raw(address, 4)
    connack = client.connect("", clean_start=False, expect_success=False)
    assert (connack.reason_code, connack.session_present) == (0x02, False)
    assert client.recv_until_closed() == []


def test_mqtt_31_client_works_end_to_end(address, paho):
    """An MQTT 3.1 (MQIsdp, level 3) paho client can connect, subscribe and publish."""
    topic = unique("connect/v31")
    old = paho(address, protocol=mqtt.MQTTv31)
    assert old.subscribe(topic, 2) == [2]
    paho(address).publish(topic, b"from 3.1.1", 1)
    message = old.get()
    assert (message.payload, message.qos) == (b"from 3.1.1", 1)
    modern = paho(address, protocol=MQTTv5)
    modern.subscribe(topic, 1)
    old.publish(topic, b"from 3.1", 1)
    assert modern.get().payload == b"from 3.1"


@pytest.mark.parametrize(("asked", "announced"), [(0, 10), (30, 10), (5, None), (10, None)])
def test_v5_keepalive_is_capped_with_server_keep_alive(address, raw, asked, announced):
    """A v5 client asking for no keepalive (0) or more than sessions.max_keepalive is told the
    Server Keep Alive it must use (MQTT-3.2.2-21); smaller values are accepted as they are."""
    client = raw(address, 5)
    connack = client.connect(unique("ka5"), keepalive=asked)
    assert connack.properties.server_keep_alive == announced


def test_v311_keepalive_above_the_maximum_is_refused(address, raw):
    """3.1.1 cannot announce a different keepalive, so a client asking for more than
    sessions.max_keepalive is refused with CONNACK 0x02, as mosquitto does."""
    client = raw(address, 4)
    connack = client.connect(unique("ka4"), keepalive=30, expect_success=False)
    assert connack.reason_code == 0x02
    assert client.recv_until_closed() == []
    ok = raw(address, 4)
    assert ok.connect(unique("ka4-ok"), keepalive=10).reason_code == 0


def test_v5_connack_announces_the_configured_limits(address, raw):
    """The v5 CONNACK tells the client the broker's Receive Maximum, Maximum Packet Size and
    Topic Alias Maximum as configured (MQTT 5 §3.2.2.3)."""
    client = raw(address, 5)
    p = client.connect(unique("limits")).properties
    assert (p.receive_maximum, p.maximum_packet_size, p.topic_alias_maximum) == (50, 100_000, 7)


def test_v5_session_expiry_above_the_maximum_is_capped_and_announced(address, raw):
    """A Session Expiry Interval above sessions.max_session_expiry is reduced, and the CONNACK
    carries the value in force (MQTT 5 §3.2.2.3.2)."""
    client = raw(address, 5)
    connack = client.connect(
        unique("expiry-cap"), clean_start=False,
        properties=Properties(session_expiry_interval=1000),
    )
    assert connack.properties.session_expiry_interval == 100
    fine = raw(address, 5)
    connack = fine.connect(
        unique("expiry-ok"), clean_start=False, properties=Properties(session_expiry_interval=50)
    )
    assert connack.properties.session_expiry_interval is None


def test_paho_sees_server_keep_alive(address, paho):
    """paho v5 receives the Server Keep Alive property when it asks for too long a keepalive."""
    client = paho(address, protocol=MQTTv5, keepalive=60)
    assert client.connack_properties.ServerKeepAlive == 10


def test_connack_is_the_first_packet_and_only_once(address, raw):
    """The first packet the broker sends on a connection is a single CONNACK (MQTT-3.2.0-1)."""
    client = raw(address, 5)
    client.connect(unique("connack-once"), properties=Properties(session_expiry_interval=0))
    client.no_packet(0.3)


def test_broker_shutdown_tells_v5_clients_and_exits_cleanly(broker, raw, paho):
    """On SIGTERM the broker sends v5 clients DISCONNECT 0x8B (Server shutting down), closes
    3.1.1 clients, and exits with status 0."""
    process = broker()
    v5 = raw(process.address, 5)
    v5.connect(unique("shutdown5"))
    v311 = raw(process.address, 4)
    v311.connect(unique("shutdown4"))
    paho_v5 = paho(process.address, protocol=MQTTv5)
    process.stop()
    assert process.proc.returncode == 0, process.log_text()[-3000:]
    packets = v5.recv_until_closed()
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x8B)]
    assert v311.recv_until_closed() == []
    assert paho_v5.wait_disconnected().reason_code == 0x8B
