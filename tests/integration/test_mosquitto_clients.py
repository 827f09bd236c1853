"""The broker with the mosquitto command-line clients (Debian mosquitto-clients), a second,
independent MQTT implementation next to paho: QoS levels, retained messages, persistent
sessions, wills, v5 properties and $SYS, in MQTT 3.1.1 and 5.0."""

from __future__ import annotations

import time

import pytest

import kittiwake

from .clients import MQTTv5, mosquitto_pub, unique

VERSIONS = ["mqttv311", "mqttv5"]


@pytest.fixture(scope="module")
def module_broker_config():
    return {"sys": {"interval": 0.5}}


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("version", VERSIONS)
def test_mosquitto_pub_to_mosquitto_sub(address, mosquitto_sub, version, qos):
    """mosquitto_pub → broker → mosquitto_sub at each QoS: payload, topic and QoS intact."""
    topic = unique("mosq/qos")
    sub = mosquitto_sub(address, [topic], version=version, qos=qos).wait_subscribed()
    mosquitto_pub(address, topic, "hello from mosquitto", version=version, qos=qos)
    message = sub.get()
    assert (message.topic, message.payload, message.qos, message.retain) == (
        topic, "hello from mosquitto", qos, False,
    )
    sub.no_message(0.2)


@pytest.mark.parametrize("version", VERSIONS)
def test_mosquitto_and_paho_interoperate(address, paho, mosquitto_sub, version):
    """Messages flow between the two client libraries in both directions."""
    topic = unique("mosq/interop")
    paho_sub = paho(address, protocol=MQTTv5)
    paho_sub.subscribe(topic, 2)
    mosq = mosquitto_sub(address, [topic], version=version, qos=2).wait_subscribed()
    mosquitto_pub(address, topic, "from mosquitto", version=version, qos=2)
    assert paho_sub.get().payload == b"from mosquitto"
    assert mosq.get().payload == "from mosquitto"
    paho(address).publish(topic, b"from paho", 1)
    message = mosq.get()
    assert (message.payload, message.qos) == ("from paho", 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_set_replace_and_clear_with_mosquitto(address, mosquitto_sub, version):
    """mosquitto_pub -r stores a retained message (a later mosquitto_sub sees RETAIN=1), a newer
    one replaces it, and -r -n (zero-length) clears it while still reaching live subscribers."""
    topic = unique("mosq/retained")
    mosquitto_pub(address, topic, "old", version=version, qos=1, retain=True)
    mosquitto_pub(address, topic, "new", version=version, qos=1, retain=True)
    sub = mosquitto_sub(address, [topic], version=version, qos=1).wait_subscribed()
    message = sub.get()
    assert (message.payload, message.retain) == ("new", True)
    sub.no_message(0.2)
    mosquitto_pub(address, topic, None, version=version, qos=1, retain=True)
    cleared = sub.get()
    assert (cleared.payload, cleared.retain) == ("", False)
    late = mosquitto_sub(address, [topic], version=version, qos=1).wait_subscribed()
    late.no_message(0.4)


@pytest.mark.parametrize("version", VERSIONS)
def test_persistent_mosquitto_sub_gets_messages_sent_while_it_was_away(
    address, mosquitto_sub, version
):
    """mosquitto_sub -c (clean session off) gets the QoS 1/2 messages published while it was
    disconnected when it comes back with the same client id.

    (SIGTERM is not used to stop mosquitto_sub: 2.0.11 disconnects from inside its signal
    handler and now and then hangs doing so.)"""
    topic = unique("mosq/persistent")
    client_id = unique("mosq-persistent")
    first = mosquitto_sub(
        address, [topic], version=version, qos=2, client_id=client_id, extra=["-c", "-C", "1"]
    ).wait_subscribed()
    mosquitto_pub(address, topic, "before leaving", version=version, qos=1)
    assert first.get().payload == "before leaving"
    assert first.wait_exit(5) == 0  # -C 1: a normal DISCONNECT after one message
    mosquitto_pub(address, topic, "while away 1", version=version, qos=1)
    mosquitto_pub(address, topic, "while away 2", version=version, qos=2)
    back = mosquitto_sub(
        address, [topic], version=version, qos=2, client_id=client_id, extra=["-c"]
    )
    got = sorted([back.get().payload, back.get().payload])
    assert got == ["while away 1", "while away 2"]
    back.wait_for_event("received CONNACK (0)")


@pytest.mark.parametrize("version", VERSIONS)
def test_will_of_killed_mosquitto_sub_is_published(address, paho, mosquitto_sub, version):
    """A mosquitto_sub killed with SIGKILL (no DISCONNECT) has its will published; one that
    exits normally (-C 1: after one message) sends DISCONNECT and its will is discarded."""
    killed_topic, clean_topic = unique("mosq/will-killed"), unique("mosq/will-clean")
    watcher = paho(address)
    watcher.subscribe(killed_topic, 1)
    watcher.subscribe(clean_topic, 1)
    killed = mosquitto_sub(address, [unique("mosq/x")], version=version, extra=[
        "--will-topic", killed_topic, "--will-payload", "killed", "--will-qos", "1",
    ]).wait_subscribed()
    trigger = unique("mosq/one-message")
    clean = mosquitto_sub(address, [trigger], version=version, extra=[
        "-C", "1", "--will-topic", clean_topic, "--will-payload", "clean", "--will-qos", "1",
    ]).wait_subscribed()
    mosquitto_pub(address, trigger, "bye", version=version)
    assert clean.wait_exit(5) == 0
    killed.kill()
    message = watcher.get()
    assert (message.topic, message.payload) == (killed_topic, b"killed")
    watcher.no_message(0.3)


def test_v5_properties_through_mosquitto(address, mosquitto_sub):
    """User properties and the message expiry interval set with mosquitto_pub -D reach a v5
    mosquitto_sub; subscription identifiers set with mosquitto_sub -D come back."""
    topic = unique("mosq/props")
    sub = mosquitto_sub(address, [topic], version="mqttv5", qos=1, extra=[
        "-D", "subscribe", "subscription-identifier", "42",
    ]).wait_subscribed()
    mosquitto_pub(address, topic, "with properties", version="mqttv5", qos=1, extra=[
        "-D", "publish", "user-property", "colour", "blue",
        "-D", "publish", "message-expiry-interval", "30",
    ])
    message = sub.get()
    assert message.payload == "with properties"
    assert message.user_properties == "colour:blue"
    assert message.expiry in ("29", "30")
    assert message.subscription_ids == "42"


@pytest.mark.parametrize("version", VERSIONS)
def test_line_mode_stream_arrives_complete_and_in_order(address, mosquitto_sub, version):
    """200 lines sent by one mosquitto_pub -l at QoS 1 arrive complete and in order."""
    topic = unique("mosq/lines")
    sub = mosquitto_sub(address, [topic], version=version, qos=1).wait_subscribed()
    lines = [f"line {i}" for i in range(200)]
    mosquitto_pub(address, topic, None, version=version, qos=1, extra=["-l"],
                  stdin="\n".join(lines) + "\n")
    assert [sub.get().payload for _ in lines] == lines
    sub.no_message(0.2)


def test_large_payload_through_mosquitto(address, mosquitto_sub, tmp_path):
    """A 200 kB payload from a file (mosquitto_pub -f) arrives intact."""
    topic = unique("mosq/large")
    payload = "".join(chr(ord("a") + i % 26) for i in range(200_000))
    path = tmp_path / "payload.txt"
    path.write_text(payload)
    sub = mosquitto_sub(address, [topic], version="mqttv5", qos=1).wait_subscribed()
    mosquitto_pub(address, topic, None, version="mqttv5", qos=1, extra=["-f", str(path)])
    assert sub.get().payload == payload


@pytest.mark.parametrize("version", VERSIONS)
def test_mosquitto_sub_reads_sys_version(address, mosquitto_sub, version):
    """mosquitto_sub can read $SYS/broker/version, and '#' does not show $SYS topics."""
    sub = mosquitto_sub(address, ["$SYS/broker/version"], version=version).wait_subscribed()
    message = sub.get(2.0)
    assert kittiwake.__version__ in message.payload and message.retain
    everything = mosquitto_sub(address, ["#"], version=version).wait_subscribed()
    marker = unique("mosq/marker")
    mosquitto_pub(address, marker, "visible", version=version)
    seen = everything.get(2.0)
    assert seen.topic == marker
    everything.no_message(1.1)  # two $SYS intervals pass with nothing for '#'


def test_mosquitto_shared_subscription(address, mosquitto_sub):
    """Two mosquitto_sub processes in one $share group split the messages, none twice."""
    topic = unique("mosq/share")
    subs = [
        mosquitto_sub(address, [f"$share/grp/{topic}"], version="mqttv5", qos=1).wait_subscribed()
        for _ in range(2)
    ]
    lines = [str(i) for i in range(20)]
    mosquitto_pub(address, topic, None, version="mqttv5", qos=1, extra=["-l"],
                  stdin="\n".join(lines) + "\n")
    deadline = time.monotonic() + 5
    got: list[list[str]] = [[], []]
    while sum(map(len, got)) < 20 and time.monotonic() < deadline:
        for i, sub in enumerate(subs):
            while not sub.messages.empty():
                got[i].append(sub.messages.get_nowait().payload)
        time.sleep(0.02)
    time.sleep(0.2)
    for i, sub in enumerate(subs):
        while not sub.messages.empty():
            got[i].append(sub.messages.get_nowait().payload)
    assert sorted(got[0] + got[1], key=int) == lines
    assert got[0] and got[1]
