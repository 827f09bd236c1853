"""SIGHUP re-reads the authorisation rules of the configuration file (ACL rules, groups, the
broker-wide lists, admins and monitors) and applies them to clients already connected, who
stay connected: their next publish, subscribe and delivery follow the new rules. A file that
cannot be used keeps the old rules. Subscriptions are kept, as Mosquitto keeps them, and
filtered at delivery.

Without a password file a user name is taken on trust, which is all these rules need.
"""

from __future__ import annotations

import signal

from .brokerproc import BrokerProcess
from .clients import MQTTv5, unique, wait_until

RELOADED = "authorisation rules reloaded"


def sighup(process: BrokerProcess, log_line: str, times: int) -> None:
    """Send SIGHUP and wait until the broker has logged ``log_line`` ``times`` times."""
    assert process.proc is not None
    process.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: process.log_text().count(log_line) >= times, 10), (
        process.log_text()[-2000:]
    )


def rules(*, alice_denied: list[str], bob_denied: list[str]) -> dict:
    return {
        "acl": [
            {"users": ["alice"], "subscribe": ["plant/#"], "deny_subscribe": alice_denied},
            {"users": ["bob"], "publish": ["plant/#"], "deny_publish": bob_denied},
        ]
    }


def test_sighup_applies_new_acl_rules_to_connected_clients(broker, paho):
    """alice's wildcard stops receiving a newly denied area (a route plan and a read verdict
    cached before the reload must not serve it), her subscription wholly inside it is kept
    but gets nothing, a new subscription there is refused; bob's publication to a topic he
    used before and may no longer publish to is refused (his cached verdict is gone). A
    second reload gives everything back, without anyone subscribing again."""
    process = broker(auth=rules(alice_denied=[], bob_denied=[]))
    alice = paho(process, protocol=MQTTv5, connect=False)
    alice.connect(username="alice")
    bob = paho(process, protocol=MQTTv5, connect=False)
    bob.connect(username="bob")
    assert alice.subscribe("plant/#", 1) == [1]
    assert alice.subscribe("plant/secret/valve", 1) == [1]
    for topic in ("plant/secret/valve", "plant/open/a", "plant/stop/x"):
        assert bob.publish_result(bob.publish(topic, b"before", 1, wait=False)) == 0
        assert alice.get().topic == topic

    process.rewrite_config(
        auth=rules(alice_denied=["plant/secret/#"], bob_denied=["plant/stop/#"])
    )
    sighup(process, RELOADED, 1)

    assert bob.publish_result(bob.publish("plant/secret/valve", b"after", 1, wait=False)) == 0
    assert bob.publish_result(bob.publish("plant/open/a", b"after", 1, wait=False)) == 0
    # Delivered in order: the denied one would have come first.
    got = alice.get()
    assert (got.topic, got.payload) == ("plant/open/a", b"after")
    refused = bob.publish("plant/stop/x", b"after", 1, wait=False)
    assert bob.publish_result(refused) == 0x87
    assert alice.subscribe("plant/secret/other", 1) == [0x87]
    assert alice.client.is_connected() and bob.client.is_connected()

    process.rewrite_config(auth=rules(alice_denied=[], bob_denied=[]))
    sighup(process, RELOADED, 2)
    assert bob.publish_result(bob.publish("plant/stop/x", b"again", 1, wait=False)) == 0
    assert alice.get().topic == "plant/stop/x"
    assert bob.publish_result(bob.publish("plant/secret/valve", b"again", 1, wait=False)) == 0
    got = alice.get()
    assert (got.topic, got.payload) == ("plant/secret/valve", b"again")
    alice.no_message(0.2)  # one copy for her two overlapping subscriptions
    log = process.log_text()
    assert "publish to 'plant/stop/x' not authorised" in log


def test_acl_rules_added_to_a_broker_without_any(broker, paho):
    """Connected before any ACL rule existed (everyone shared the broker-wide rules): after
    the reload each client is held to the rules for its own user."""
    process = broker(auth={})
    carol = paho(process, protocol=MQTTv5, connect=False)
    carol.connect(username="carol")
    dave = paho(process, protocol=MQTTv5, connect=False)
    dave.connect(username="dave")
    topic = unique("fleet/dave")
    assert carol.subscribe("fleet/#", 1) == [1]
    process.rewrite_config(
        auth={
            "acl": [
                {"users": ["carol"], "subscribe": ["fleet/#"]},
                {"users": ["dave"], "publish": ["fleet/%u/#"]},
            ]
        }
    )
    sighup(process, RELOADED, 1)
    assert dave.publish_result(dave.publish(f"{topic}/x", b"not his", 1, wait=False)) == 0x87
    assert dave.publish_result(dave.publish("fleet/dave/x", b"his", 1, wait=False)) == 0
    got = carol.get()
    assert (got.topic, got.payload) == ("fleet/dave/x", b"his")
    assert carol.publish_result(carol.publish("fleet/carol", b"x", 1, wait=False)) == 0x87


def test_an_invalid_file_on_sighup_keeps_the_rules(broker, paho):
    """Not TOML, or an invalid rule: logged, and the running rules stay as they were."""
    process = broker(auth=rules(alice_denied=[], bob_denied=["plant/stop/#"]))
    bob = paho(process, protocol=MQTTv5, connect=False)
    bob.connect(username="bob")
    process.config_path.write_text("[auth\nacl = ", encoding="utf-8")
    sighup(process, "rules not reloaded", 1)
    process.rewrite_config(auth={"acl": [{"users": ["bob"], "publish": ["plant/#/bad"]}]})
    sighup(process, "rules not reloaded", 2)
    assert "not valid TOML" in process.log_text()
    assert bob.publish_result(bob.publish("plant/stop/x", b"x", 1, wait=False)) == 0x87
    assert bob.publish_result(bob.publish("plant/go/x", b"x", 1, wait=False)) == 0
    assert bob.client.is_connected() and process.alive()


def test_settings_a_reload_cannot_apply_are_named_in_the_log(broker):
    process = broker(auth={}, limits={"max_queued_messages": 100})
    process.rewrite_config(limits={"max_queued_messages": 200})
    sighup(process, RELOADED, 1)
    assert "limits.max_queued_messages changed in" in process.log_text()
