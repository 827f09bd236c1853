"""Authorisation: broker-wide allow/deny lists and per user/group/client ACL rules for publish
and subscribe; deny always wins; a subscription is refused only when it lies wholly inside a
deny rule (or outside every allow rule), and the rest is filtered at delivery."""

from __future__ import annotations

import pytest

from kittiwake.broker.authorization import Authorizer
from kittiwake.broker.broker import SubscribeRefusal
from kittiwake.broker.message import Message
from kittiwake.config import ACLRule, AuthConfig, GroupConfig, config_from_dict


def auth(**lists) -> Authorizer:
    return Authorizer(AuthConfig(**{k: tuple(v) for k, v in lists.items()}))


def anyone(**lists):
    """The permissions of an anonymous client under the broker-wide lists."""
    return auth(**lists).permissions(None, "client")


def test_empty_lists_allow_everything() -> None:
    """With no rules every topic may be published to and every filter subscribed."""
    a = auth()
    assert a.may_publish("any/topic")
    assert a.may_subscribe("#")


@pytest.mark.parametrize(
    ("topic", "allowed"),
    [
        ("sensors/1/temp", True),
        ("sensors/2/humidity", True),
        ("sensors/1/secret", False),  # denied although the allow list covers it
        ("admin/reset", False),  # not on the allow list
        ("sensors", True),  # "sensors/#" covers its parent level
    ],
)
def test_publish_allow_and_deny(topic: str, allowed: bool) -> None:
    """Publishing: a topic must match an allow rule and no deny rule; deny wins."""
    a = auth(publish_allow=["sensors/#"], publish_deny=["+/+/secret"])
    assert a.may_publish(topic) is allowed
    assert a.may_publish(topic) is allowed  # the cached answer is the same


def test_publish_deny_only() -> None:
    """A deny list alone refuses its topics and allows the rest."""
    a = auth(publish_deny=["private/#"])
    assert not a.may_publish("private")
    assert not a.may_publish("private/x")
    assert a.may_publish("public/x")


@pytest.mark.parametrize(
    ("topic_filter", "granted"),
    [
        ("a/secret", False),  # wholly inside the deny rule
        ("a/#", True),  # broader: granted, a/secret filtered at delivery
        ("+/secret", True),
        ("#", True),
        ("+/+", True),
        ("a/+", True),
        ("b/#", True),
        ("a/secret/more", True),
    ],
)
def test_a_subscription_is_refused_only_wholly_inside_a_deny_rule(
    topic_filter: str, granted: bool
) -> None:
    """Tried as a new user would: one deny rule must not make '#' or '+/+' unusable."""
    assert anyone(subscribe_deny=["a/secret"]).may_subscribe(topic_filter) is granted


def test_a_wildcard_deny_rule_refuses_the_filters_inside_it() -> None:
    permissions = anyone(subscribe_deny=["private/#"])
    assert not permissions.may_subscribe("private")
    assert not permissions.may_subscribe("private/+/x")
    assert not permissions.may_subscribe("private/#")
    assert permissions.may_subscribe("+/x")  # filtered: private/x never delivered
    assert permissions.may_subscribe("public/#")


@pytest.mark.parametrize(
    ("topic_filter", "granted"),
    [
        ("home/kitchen", True),
        ("home/+", True),
        ("home/#", True),
        ("home", True),
        ("#", True),  # reaches beyond home/: granted, the rest filtered
        ("+/kitchen", True),
        ("office/x", False),  # wholly outside every allow rule
        ("office/#", False),
    ],
)
def test_with_an_allow_list_a_filter_must_reach_some_allowed_topic(
    topic_filter: str, granted: bool
) -> None:
    assert anyone(subscribe_allow=["home/#"]).may_subscribe(topic_filter) is granted


@pytest.mark.parametrize(
    ("topic", "readable"),
    [
        ("home/kitchen/light", True),
        ("home/kitchen/camera", False),
        ("home", True),
        ("office/x", False),
        ("$SYS/broker/uptime", False),  # '#' never matches '$' topics
    ],
)
def test_delivery_reads_only_allowed_and_not_denied_topics(topic: str, readable: bool) -> None:
    permissions = anyone(subscribe_allow=["home/#"], subscribe_deny=["home/+/camera"])
    assert permissions.may_read(topic) is readable
    assert permissions.may_read(topic) is readable  # cached answer, same


def test_reading_is_unrestricted_without_rules() -> None:
    permissions = anyone()
    assert not permissions.restricts_reading
    assert permissions.may_read("anything/at/all") and permissions.may_subscribe("#")


def test_strict_checks_for_receivers_that_cannot_be_filtered() -> None:
    """A shared group's queue and a journal reader get no per-message filter: their filter must
    lie wholly inside what may be read (the old rule, kept where it is needed)."""
    a = auth(subscribe_allow=["home/#"], subscribe_deny=["home/+/camera"])
    assert a.may_subscribe("home/kitchen/light")
    assert not a.may_subscribe("home/#")
    assert not a.may_subscribe("#")
    assert not a.may_subscribe("home/+/+")


def test_publish_and_subscribe_lists_are_independent() -> None:
    """Publish rules do not affect subscriptions and vice versa."""
    permissions = anyone(publish_deny=["t"], subscribe_deny=["u"])
    assert permissions.may_subscribe("t") and not permissions.may_subscribe("u")
    assert permissions.may_publish("u") and not permissions.may_publish("t")


# -- ACL rules: per user, group and client id ----------------------------------------------


def acl_authorizer() -> Authorizer:
    return Authorizer(
        AuthConfig(
            groups=(GroupConfig("operators", ("olga",)),),
            acl=(
                ACLRule(users=("alice",), publish=("alice/#",), subscribe=("shared/#",)),
                ACLRule(groups=("operators",), subscribe=("#",), deny_subscribe=("hr/#",)),
                ACLRule(clients=("sensor-7",), publish=("sensors/%c/#",)),
                ACLRule(publish=("devices/%u/%c/#",), subscribe=("devices/%u/#",)),
            ),
        )
    )


def test_acl_rules_apply_to_the_users_groups_and_clients_they_name() -> None:
    a = acl_authorizer()
    alice = a.permissions("alice", "laptop")
    assert alice.may_publish("alice/notes") and not alice.may_publish("bob/notes")
    assert alice.may_subscribe("shared/x") and not alice.may_subscribe("hr/salaries")
    olga = a.permissions("olga", "console")
    assert olga.may_subscribe("#") and olga.may_read("plant/line1")
    assert not olga.may_read("hr/salaries") and not olga.may_subscribe("hr/#")
    sensor = a.permissions(None, "sensor-7")
    assert sensor.may_publish("sensors/sensor-7/temp")
    assert not sensor.may_publish("sensors/sensor-8/temp")


def test_substitution_of_user_and_client_id() -> None:
    a = acl_authorizer()
    bob = a.permissions("bob", "phone")
    assert bob.may_publish("devices/bob/phone/status")
    assert not bob.may_publish("devices/bob/tablet/status")
    assert bob.may_read("devices/bob/tablet/status")
    assert not bob.may_read("devices/carol/x")
    # An anonymous client has no %u: rules that need one grant it nothing.
    anonymous = a.permissions(None, "phone")
    assert not anonymous.may_publish("devices//phone/x")
    # A name that would add levels or wildcards is never substituted.
    assert not a.permissions("a/b", "c").may_read("devices/a/b/x")
    assert not a.permissions("+", "c").may_read("devices/x/y")


def test_default_deny_once_acl_rules_exist() -> None:
    a = acl_authorizer()
    nobody = a.permissions("zed", "z")
    assert not nobody.may_publish("anything")
    assert not nobody.may_subscribe("plant/#")
    assert not nobody.may_read("plant/line1")
    # '#' reaches the one thing the catch-all rule grants zed, and only that arrives.
    assert nobody.may_subscribe("#") and nobody.may_read("devices/zed/thing")


def test_acl_rules_are_read_from_toml_tables() -> None:
    config = config_from_dict(
        {
            "auth": {
                "groups": [{"name": "ops", "users": ["olga"]}],
                "acl": [{"groups": ["ops"], "subscribe": ["#"], "deny_subscribe": ["hr/#"]}],
            }
        }
    )
    assert Authorizer(config.auth).permissions("olga", "c").may_read("plant/x")


def test_very_long_topics_are_answered_but_not_cached() -> None:
    permissions = anyone(subscribe_deny=["secret/#"])
    assert permissions.may_read("x/" + "y" * 5000)
    assert not permissions.may_read("secret/" + "z" * 5000)
    assert permissions._read_cache == {}
    assert permissions.may_read("short")
    assert list(permissions._read_cache) == ["short"]


def test_publish_verdicts_are_shared_by_every_principal_without_acl_rules() -> None:
    """A fleet's publishers share one cache of verdicts: a topic checked for one connection is
    not checked again for the next (and a reload's new rules start with none)."""
    a = auth(publish_deny=["secret/#"])
    first, second = a.permissions(None, "c1"), a.permissions("u", "c2")
    assert first is second
    first.remember_publish_verdict("secret/x", first.may_publish("secret/x"))
    assert second.publish_verdicts == {"secret/x": False}
    a.replace_config(AuthConfig(publish_deny=("secret/#",)))
    assert a.permissions(None, "c1").publish_verdicts == {}


def test_publish_verdicts_are_bounded_and_skip_very_long_topics() -> None:
    """A principal of its own (ACL rules: one connection's) keeps the smaller bound; a full
    cache is cleared, and a topic too long to remember is answered, not kept."""
    config = config_from_dict({"auth": {"acl": [{"users": ["u"], "publish": ["#"]}]}})
    permissions = Authorizer(config.auth).permissions("u", "c")
    permissions.remember_publish_verdict("t/" + "y" * 5000, True)
    assert permissions.publish_verdicts == {}
    topics = [f"t/{i}" for i in range(5000)]
    for topic in topics:
        permissions.remember_publish_verdict(topic, True)
    kept = permissions.publish_verdicts
    assert 0 < len(kept) < len(topics)
    assert list(kept) == topics[-len(kept) :]


# -- through the broker ----------------------------------------------------------------------


def test_a_broad_subscription_is_granted_and_denied_topics_are_filtered(make_harness) -> None:
    """The reported case: subscribe_deny = ["test/nosubscribe"] refused '#' and '+/+'. Now
    they are granted, and the denied topic never arrives, retained messages included."""
    h = make_harness(auth={"subscribe_deny": ["test/nosubscribe"]})
    h.publish("test/nosubscribe", b"retained secret", 1, retain=True)
    h.publish("test/open", b"retained open", 1, retain=True)
    session, consumer, _ = h.connect("c")
    assert h.try_subscribe(session, "test/nosubscribe") is SubscribeRefusal.NOT_AUTHORIZED
    assert h.try_subscribe(session, "+/+") is not SubscribeRefusal.NOT_AUTHORIZED
    h.subscribe(session, "#", 1)
    h.publish("test/nosubscribe", b"live secret", 1)
    h.publish("test/open", b"live open", 1)
    h.broker.pump(session)
    assert sorted(consumer.payloads) == [b"live open", b"retained open"]


def test_broker_checks_the_filter_inside_a_shared_subscription(make_harness) -> None:
    """A shared group cannot be filtered per member: its filter must be wholly readable."""
    h = make_harness(auth={"subscribe_deny": ["a/secret"]})
    session, _, _ = h.connect("c")
    assert h.try_subscribe(session, "$share/g/a/#") is SubscribeRefusal.NOT_AUTHORIZED
    assert h.try_subscribe(session, "$share/g/a/public") is not SubscribeRefusal.NOT_AUTHORIZED


def test_unauthorised_will_is_not_published(make_harness) -> None:
    """A will to a topic the publish rules deny is dropped."""
    h = make_harness(auth={"publish_deny": ["wills/#"]})
    watch, consumer, _ = h.connect("watch")
    h.subscribe(watch, "#")
    session, _, _ = h.connect("c", will=Message("wills/c", b"gone"))
    h.broker.disconnect(session, publish_will=True)
    assert consumer.deliveries == []


def test_queue_rules_per_action_with_substitution_and_deny() -> None:
    authorizer = Authorizer(
        AuthConfig(
            acl=(
                ACLRule(users=("alice",), send=("orders", "inbox/#"), receive=("inbox/%u",),
                        browse=("#",), deny_browse=("payroll",)),
                ACLRule(send=("public",)),
            )
        )
    )
    alice = authorizer.permissions("alice", "c1")
    assert alice.may_send("orders") and alice.may_send("inbox/bob") and alice.may_send("public")
    assert not alice.may_send("payroll")
    assert alice.may_receive("inbox/alice") and not alice.may_receive("inbox/bob")
    assert alice.may_browse("orders") and not alice.may_browse("payroll")
    anonymous = authorizer.permissions(None, "c2")
    assert anonymous.may_send("public")
    assert not anonymous.may_receive("inbox/alice") and not anonymous.may_browse("orders")


def test_without_acl_rules_every_queue_is_open() -> None:
    permissions = Authorizer(AuthConfig(publish_deny=("secret/#",))).permissions("bob", "c")
    assert permissions.may_send("any") and permissions.may_receive("any")
    assert permissions.may_browse("secret/queue")  # topic lists do not apply to queues


def test_queue_rules_are_validated_as_filters() -> None:
    with pytest.raises(Exception, match="send"):
        config_from_dict({"auth": {"acl": [{"send": ["bad/#/x"]}]}})


# -- reloaded rules (SIGHUP) -----------------------------------------------------------------


def test_a_reload_gives_each_principal_its_new_rules(make_harness) -> None:
    """Made while no ACL rule existed (one set of rules shared by everyone), permissions are
    renewed by principal: the session's become its user's new rules, and a front end asking
    for the same principal gets the very object its session holds (a connection and its
    session keep sharing one)."""
    h = make_harness()
    session, _, _ = h.connect("c1")
    session.principal = "alice"
    session.permissions = h.broker.authorizer.permissions("alice", "c1")
    assert session.permissions.may_publish("devices/bob/x")
    renew = h.broker.replace_authorization(AuthConfig(acl=(ACLRule(publish=("devices/%u/#",)),)))
    alice = session.permissions
    assert not alice.may_publish("devices/bob/x")
    assert alice.may_publish("devices/alice/x")
    assert renew("alice", "c1") is alice
    assert renew("bob", "c2").may_publish("devices/bob/x")


def test_reloaded_rules_filter_wildcards_and_keep_subscriptions(make_harness) -> None:
    """A route plan worked out under the old rules does not serve the new ones; a
    subscription wholly inside a newly denied area stays (Mosquitto's behaviour) and gets
    nothing until the rules allow it again."""
    h = make_harness()
    session, consumer, _ = h.connect("c")
    h.subscribe(session, "a/#", 1)
    h.subscribe(session, "a/secret", 1)
    h.publish("a/secret", b"before", 1)
    h.broker.pump(session)
    assert consumer.payloads == [b"before"]
    h.broker.replace_authorization(AuthConfig(subscribe_deny=("a/secret",)))
    h.publish("a/secret", b"denied", 1)
    h.publish("a/open", b"open", 1)
    h.broker.pump(session)
    assert consumer.payloads == [b"before", b"open"]
    assert "a/secret" in session.subscriptions
    assert h.try_subscribe(session, "a/secret") is SubscribeRefusal.NOT_AUTHORIZED
    h.broker.replace_authorization(AuthConfig())
    h.publish("a/secret", b"allowed again", 1)
    h.broker.pump(session)
    assert consumer.payloads == [b"before", b"open", b"allowed again"]


def test_a_shared_subscription_no_longer_wholly_readable_is_removed(make_harness) -> None:
    """A group's queue cannot be filtered per member: the member leaves its group."""
    h = make_harness()
    session, _, _ = h.connect("c")
    h.subscribe(session, "$share/g/a/#", 1)
    h.subscribe(session, "$share/g/b/#", 1)
    h.broker.replace_authorization(AuthConfig(subscribe_deny=("a/secret",)))
    assert set(session.subscriptions) == {"$share/g/b/#"}
    assert set(session.members) == {"$share/g/b/#"}


def test_monitors_may_read_and_only_admins_may_act() -> None:
    authorizer = Authorizer(
        AuthConfig(
            groups=(GroupConfig(name="ops", users=("olga",)),),
            admins=("ops",),
            monitors=("mona", "watchers"),
        )
    )
    assert authorizer.may_administer("olga") and authorizer.may_monitor("olga")
    assert authorizer.may_monitor("mona") and not authorizer.may_administer("mona")
    assert not authorizer.may_monitor("eve") and not authorizer.may_monitor(None)
    assert Authorizer(AuthConfig()).may_administer(None)  # nothing configured: open
