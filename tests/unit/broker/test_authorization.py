"""The authorisation hook: topic allow/deny lists for publish and subscribe; deny always wins."""

from __future__ import annotations

import pytest

from kittiwake.broker.authorization import Authorizer
from kittiwake.broker.broker import SubscribeRefusal
from kittiwake.broker.message import Message
from kittiwake.config import AuthConfig


def auth(**lists) -> Authorizer:
    return Authorizer(AuthConfig(**{k: tuple(v) for k, v in lists.items()}))


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
    ("topic_filter", "allowed"),
    [
        ("a/public", True),
        ("a/secret", False),
        ("a/#", False),  # would receive a/secret
        ("+/secret", False),  # would receive a/secret
        ("#", False),
        ("a/+", False),
        ("+/+", False),
        ("b/#", True),  # cannot match a/secret
        ("a/secret/more", True),  # a different, deeper topic
        ("+/public", True),
        ("a/+/x", True),
    ],
)
def test_subscribe_filter_overlapping_a_deny_rule_is_refused(
    topic_filter: str, allowed: bool
) -> None:
    """A subscription is refused when any topic it could match is denied (deny wins)."""
    assert auth(subscribe_deny=["a/secret"]).may_subscribe(topic_filter) is allowed


@pytest.mark.parametrize(
    ("topic_filter", "allowed"),
    [
        ("home/kitchen", True),
        ("home/+", True),
        ("home/#", True),
        ("home", True),
        ("#", False),  # reaches beyond home/
        ("+/kitchen", False),  # could match office/kitchen
        ("office/x", False),
    ],
)
def test_subscribe_allow_must_cover_the_whole_filter(topic_filter: str, allowed: bool) -> None:
    """With an allow list, a filter is accepted only if every topic it matches is allowed."""
    assert auth(subscribe_allow=["home/#"]).may_subscribe(topic_filter) is allowed


def test_subscribe_deny_wins_over_allow() -> None:
    """A filter inside the allow list is still refused when it overlaps a deny rule."""
    a = auth(subscribe_allow=["home/#"], subscribe_deny=["home/+/camera"])
    assert a.may_subscribe("home/kitchen/light")
    assert not a.may_subscribe("home/kitchen/camera")
    assert not a.may_subscribe("home/#")
    assert not a.may_subscribe("home/+/+")


def test_subscribe_deny_with_wildcard_rule() -> None:
    """A wildcard deny rule refuses every filter that shares a topic with it."""
    a = auth(subscribe_deny=["private/#"])
    assert not a.may_subscribe("private")
    assert not a.may_subscribe("private/+/x")
    assert not a.may_subscribe("+/x")
    assert a.may_subscribe("public/#")


def test_publish_and_subscribe_lists_are_independent() -> None:
    """Publish rules do not affect subscriptions and vice versa."""
    a = auth(publish_deny=["t"], subscribe_deny=["u"])
    assert a.may_subscribe("t") and not a.may_subscribe("u")
    assert a.may_publish("u") and not a.may_publish("t")


# -- through the broker ----------------------------------------------------------------------


def test_broker_refuses_unauthorised_subscription(make_harness) -> None:
    """The broker answers NOT_AUTHORIZED and adds no subscription."""
    h = make_harness(auth={"subscribe_deny": ["a/secret"]})
    session, _, _ = h.connect("c")
    assert h.try_subscribe(session, "a/#") is SubscribeRefusal.NOT_AUTHORIZED
    assert h.try_subscribe(session, "+/secret") is SubscribeRefusal.NOT_AUTHORIZED
    assert session.subscriptions == {}
    assert h.try_subscribe(session, "a/public") is not SubscribeRefusal.NOT_AUTHORIZED


def test_broker_checks_the_filter_inside_a_shared_subscription(make_harness) -> None:
    """A $share prefix does not hide the filter from the deny rules."""
    h = make_harness(auth={"subscribe_deny": ["a/secret"]})
    session, _, _ = h.connect("c")
    assert h.try_subscribe(session, "$share/g/a/#") is SubscribeRefusal.NOT_AUTHORIZED


def test_unauthorised_will_is_not_published(make_harness) -> None:
    """A will to a topic the publish rules deny is dropped."""
    h = make_harness(auth={"publish_deny": ["wills/#"]})
    watch, consumer, _ = h.connect("watch")
    h.subscribe(watch, "#")
    session, _, _ = h.connect("c", will=Message("wills/c", b"gone"))
    h.broker.disconnect(session, publish_will=True)
    assert consumer.deliveries == []


def test_very_long_topics_are_answered_but_not_cached() -> None:
    a = auth(publish_deny=["secret/#"])
    long_topic = "x/" + "y" * 5000
    assert a.may_publish(long_topic)
    assert not a.may_publish("secret/" + "z" * 5000)
    assert a._publish_cache == {}
    assert a.may_publish("short")
    assert list(a._publish_cache) == ["short"]
