"""The route plan cache: a miss works the plan out and keeps it, a full cache
keeps its recent half instead of forgetting everything, and a lone subscription's shortcut plan
is the plan the general rule would make."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kittiwake.broker.mqtt_subscriptions import _copy, session_copies, sole_copy
from kittiwake.broker.route_plans import MAX_PLANS, RoutePlans
from kittiwake.broker.sessions import Subscription
from kittiwake.broker.shared_groups import SharedGroup
from kittiwake.broker.topic_tree import TopicTree


def small_cache(make_harness: Callable[..., Any], size: int) -> Any:
    return make_harness(limits={"match_cache_size": size})


def test_a_miss_works_the_plan_out_and_keeps_it(harness: Any) -> None:
    session, _, _ = harness.connect("sub")
    harness.subscribe(session, "a/+", 0)
    routes = harness.broker.routes
    assert "a/1" not in routes.by_topic
    plan = routes.missed("a/1")  # what the QoS 0 fast path calls on a KeyError
    assert plan.direct == (session,)
    assert routes.cached_topics() == ["a/1"]
    assert routes.by_topic["a/1"] is plan


def test_a_full_cache_keeps_its_recent_generation(make_harness: Callable[..., Any]) -> None:
    harness = small_cache(make_harness, 4)
    session, _, _ = harness.connect("sub")
    harness.subscribe(session, "t/#", 0)
    other, _, _ = harness.connect("other")
    harness.subscribe(other, "t/#", 0)  # two receivers: no subscription's shared plan
    routes = harness.broker.routes
    plans = {f"t/{i}": routes.plan(f"t/{i}") for i in range(4)}
    assert routes.cached_topics() == [f"t/{i}" for i in range(4)]
    # The fifth topic starts a new generation; the first four are still known.
    routes.plan("t/4")
    assert sorted(routes.cached_topics()) == sorted([*plans, "t/4"])
    # A topic of the older generation comes back without being worked out again.
    assert routes.plan("t/0") is plans["t/0"]
    # Four more new topics fill the new generation and push out the old one, save t/0,
    # which was used again in time.
    for i in range(5, 8):
        routes.plan(f"t/{i}")
    routes.plan("t/8")
    kept = set(routes.cached_topics())
    assert {"t/0", "t/4", "t/8"} <= kept
    assert not {"t/1", "t/2", "t/3"} & kept
    assert len(kept) <= 2 * 4
    # Dropped plans are worked out again, equal in what they say.
    again = routes.plan("t/1")
    assert again is not plans["t/1"]
    assert again.direct == plans["t/1"].direct == (session, other)


def test_a_cache_bound_grows_with_the_filters_up_to_the_cap(
    make_harness: Callable[..., Any],
) -> None:
    harness = small_cache(make_harness, 4)
    session, _, _ = harness.connect("sub")
    for i in range(10):
        harness.subscribe(session, f"d/{i}", 0)
    routes = harness.broker.routes
    for i in range(10):
        routes.plan(f"d/{i}")
    # Two per filter (20) is more than the minimum: nothing was pushed out.
    assert sorted(routes.cached_topics()) == sorted(f"d/{i}" for i in range(10))
    tree: TopicTree[Subscription | SharedGroup] = TopicTree(cache_size=0)
    for i in range(MAX_PLANS):
        tree.insert(
            f"x/{i}", Subscription(topic_filter=f"x/{i}", queue=session.queue, session=session)
        )
    capped = RoutePlans(tree, None, 4)
    capped.changed()
    assert capped._bound() == MAX_PLANS


def test_a_routing_change_empties_both_generations(make_harness: Callable[..., Any]) -> None:
    harness = small_cache(make_harness, 2)
    session, _, _ = harness.connect("sub")
    harness.subscribe(session, "t/#", 0)
    routes = harness.broker.routes
    old = [routes.plan(f"t/{i}") for i in range(3)]
    assert routes.cached_topics()
    other, _, _ = harness.connect("other")
    harness.subscribe(other, "t/#", 0)
    assert routes.cached_topics() == []
    fresh = routes.plan("t/0")
    assert fresh is not old[0]
    assert set(fresh.direct or ()) == {session, other}


def test_no_plan_is_kept_when_the_cache_size_is_zero(make_harness: Callable[..., Any]) -> None:
    harness = small_cache(make_harness, 0)
    session, _, _ = harness.connect("sub")
    harness.subscribe(session, "t/#", 0)
    routes = harness.broker.routes
    assert routes.plan("t/1").direct == (session,)
    assert routes.cached_topics() == []


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"no_local": True},
        {"subscription_id": 7},
        {"retain_as_published": True},
        {"no_local": True, "subscription_id": 3, "retain_as_published": True},
    ],
)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_a_lone_subscriptions_copy_is_the_merged_one(
    harness: Any, options: dict[str, object], qos: int
) -> None:
    session, _, _ = harness.connect("sub")
    subscription = harness.subscribe(session, "a/b", qos, **options).subscription
    assert isinstance(subscription, Subscription)
    subscription.copy = None
    copy = sole_copy(subscription)
    assert subscription.copy is copy
    assert sole_copy(subscription) is copy  # kept
    reference = _copy(session, [subscription])
    assert copy.session is reference.session
    assert copy.options == reference.options
    assert copy.own == reference.own
    assert (copy.own is copy.options) == (reference.own is reference.options)
    assert copy.plain == reference.plain
    assert session_copies([subscription]) == [copy]


@pytest.mark.parametrize("options", [{}, {"no_local": True}, {"subscription_id": 5}])
@pytest.mark.parametrize("connected", [True, False])
def test_a_lone_subscriptions_plan_is_the_general_one(
    harness: Any, options: dict[str, object], connected: bool
) -> None:
    session, _, _ = harness.connect("sub", clean_start=False, expiry=60)
    subscription = harness.subscribe(session, "a/+", 0, **options).subscription
    assert isinstance(subscription, Subscription)
    if not connected:
        harness.broker.disconnect(session, publish_will=False)
    routes = harness.broker.routes
    plan = routes.plan("a/1")
    assert subscription.plan is plan  # the shortcut was taken
    general = routes._work_out("a/1", (subscription,), False)
    assert plan.copies == general.copies
    assert plan.groups == general.groups == ()
    assert plan.direct == general.direct
    assert plan.generation == general.generation == routes.generation
