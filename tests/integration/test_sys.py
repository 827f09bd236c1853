"""$SYS statistics: published under $SYS/broker/ every sys.interval seconds, invisible to
'#' and '+' filters, off when the interval is 0.

MQTT 5 §4.7.2 (topics beginning with $).
"""

from __future__ import annotations

import time

import pytest

import kittiwake

from .clients import MQTTv5, unique

INTERVAL = 0.5
EXPECTED_TOPICS = {
    "$SYS/broker/version",
    "$SYS/broker/uptime",
    "$SYS/broker/clients/connected",
    "$SYS/broker/messages/received",
    "$SYS/broker/messages/sent",
    "$SYS/broker/subscriptions/count",
}


@pytest.fixture(scope="module")
def module_broker_config():
    return {"sys": {"interval": INTERVAL}}


class SysWatcher:
    """Keeps the latest value of every $SYS/broker topic a subscriber has seen."""

    def __init__(self, client) -> None:
        self.client = client
        self.values: dict[str, str] = {}
        self.retained: set[str] = set()
        client.subscribe("$SYS/broker/#", 0)

    def poll(self) -> dict[str, str]:
        for message in self.client.drain():
            self.values[message.topic] = message.payload.decode()
            if message.retain:
                self.retained.add(message.topic)
        return self.values

    def wait_for(self, predicate, timeout: float = 3.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            values = self.poll()
            if predicate(values):
                return values
            if time.monotonic() > deadline:
                raise AssertionError(f"$SYS never satisfied the condition; last values {values}")
            time.sleep(0.05)

    def number(self, topic: str) -> int:
        return int(self.poll()[topic].split()[0])


def test_broker_statistics_are_published_under_sys(address, paho):
    """Version, uptime, connected clients, messages received/sent and subscription count are
    published as $SYS/broker/... topics; the version names this Kittiwake release."""
    watcher = SysWatcher(paho(address))
    values = watcher.wait_for(lambda v: v.keys() >= EXPECTED_TOPICS)
    assert kittiwake.__version__ in values["$SYS/broker/version"]
    assert "kittiwake" in values["$SYS/broker/version"].lower()
    for topic in EXPECTED_TOPICS - {"$SYS/broker/version"}:
        assert values[topic].split()[0].isdigit(), (topic, values[topic])


def test_sys_values_are_retained_for_new_subscribers(address, paho):
    """A client subscribing to $SYS gets the current values at once, as retained messages, without
    waiting for the next interval."""
    time.sleep(INTERVAL * 1.5)  # at least one publication happened
    client = paho(address)
    client.subscribe("$SYS/broker/version", 0)
    message = client.get(timeout=INTERVAL / 2)
    assert message.retain and kittiwake.__version__ in message.payload.decode()


def test_sys_figures_follow_broker_activity(address, paho):
    """Connected clients, messages received/sent and the subscription count change with what
    clients do, and are republished within an interval or two."""
    watcher = SysWatcher(paho(address))
    watcher.wait_for(lambda v: v.keys() >= EXPECTED_TOPICS)
    time.sleep(INTERVAL * 1.5)  # retained values may predate us; let a fresh round arrive
    connected = watcher.number("$SYS/broker/clients/connected")
    subscriptions = watcher.number("$SYS/broker/subscriptions/count")
    received = watcher.number("$SYS/broker/messages/received")
    sent = watcher.number("$SYS/broker/messages/sent")

    topic = unique("sys/activity")
    extra = [paho(address), paho(address, protocol=MQTTv5)]
    for client in extra:
        client.subscribe(topic, 1)
    for i in range(3):
        extra[0].publish(topic, str(i).encode(), 1)

    def moved(values: dict[str, str]) -> bool:
        n = {t: int(values[t].split()[0]) for t in EXPECTED_TOPICS - {"$SYS/broker/version"}}
        return (
            n["$SYS/broker/clients/connected"] >= connected + 2
            and n["$SYS/broker/subscriptions/count"] >= subscriptions + 2
            and n["$SYS/broker/messages/received"] >= received + 3
            and n["$SYS/broker/messages/sent"] >= sent + 6
        )

    watcher.wait_for(moved, timeout=4 * INTERVAL + 1)
    for client in extra:
        client.disconnect()
    watcher.wait_for(
        lambda v: int(v["$SYS/broker/clients/connected"]) == connected,
        timeout=4 * INTERVAL + 1,
    )


def test_uptime_grows(address, paho):
    """$SYS/broker/uptime counts seconds since the broker started."""
    watcher = SysWatcher(paho(address))
    watcher.wait_for(lambda v: "$SYS/broker/uptime" in v)
    first = watcher.number("$SYS/broker/uptime")
    watcher.wait_for(
        lambda v: int(v["$SYS/broker/uptime"].split()[0]) > first, timeout=2.5
    )


def test_wildcard_subscriptions_do_not_receive_sys_topics(address, paho):
    """'#' and '+/...' filters never match topics starting with '$' (MQTT-4.7.2-1): over
    several $SYS intervals they receive ordinary messages only."""
    hash_client = paho(address)
    hash_client.subscribe("#", 0)
    plus_client = paho(address, protocol=MQTTv5)
    plus_client.subscribe("+/broker/#", 0)
    plus_client.subscribe("+/broker/version", 0)
    time.sleep(INTERVAL * 3)
    topic = unique("sys/visible")
    paho(address).publish(topic, b"ordinary", 0)
    time.sleep(0.2)
    seen_hash = [m.topic for m in hash_client.drain()]
    seen_plus = [m.topic for m in plus_client.drain()]
    assert not [t for t in seen_hash if t.startswith("$")], seen_hash
    assert topic in seen_hash, "the '#' subscription works for ordinary topics"
    assert seen_plus == []


def test_sys_disabled_with_interval_zero(broker, paho):
    """sys.interval = 0 turns $SYS publication off."""
    address = broker(sys={"interval": 0})
    client = paho(address.address)
    client.subscribe("$SYS/#", 0)
    client.no_message(1.0)


def test_clients_cannot_overwrite_sys_topics(address, paho):
    """$SYS/broker/... is the broker's own voice: a client publishing (even retained) to a
    $SYS topic must not change what $SYS subscribers see. (MQTT 5 §4.7.2: "The Server SHOULD
    prevent Clients from using such Topic Names to exchange messages with other Clients.")"""
    watcher = paho(address)
    watcher.subscribe("$SYS/broker/version", 0)
    genuine = watcher.get().payload
    spoofer = paho(address, protocol=MQTTv5)
    spoofer.publish("$SYS/broker/version", b"kittiwake 6.6.6 (spoofed)", 1, retain=True, wait=False)
    spoofer.publish("$SYS/broker/clients/connected", b"0", 0, retain=True, wait=False)
    time.sleep(0.3)
    assert [m.payload for m in watcher.drain()] == [], "a client's message reached $SYS readers"
    late = paho(address)
    late.subscribe("$SYS/broker/version", 0)
    assert late.get().payload == genuine
