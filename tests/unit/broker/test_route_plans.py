"""The route plan cache: a miss works the plan out and keeps it, a full cache
keeps its recent half instead of forgetting everything, and a lone subscription's shortcut plan
is the plan the general rule would make."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from kittiwake.broker.mqtt_subscriptions import _copy, session_copies, sole_copy
from kittiwake.broker.route_plans import MAX_PAUSE_GENERATIONS, MAX_PLANS, RoutePlan, RoutePlans
from kittiwake.broker.sessions import Subscription
from kittiwake.broker.shared_groups import SharedGroup
from kittiwake.broker.subscriptions import SubscribeRefusal, SubscriptionOptions
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


def test_the_cache_bound_follows_filters_added_without_wildcards(
    make_harness: Callable[..., Any],
) -> None:
    """Filters without wildcards forget one plan each, not the cache: its bound (two plans per
    filter) must still grow with them, or a fleet that subscribes after the first
    publication would be served from a cache sized for the fleet as it was."""
    harness = small_cache(make_harness, 4)
    session, _, _ = harness.connect("sub")
    routes = harness.broker.routes
    routes.plan("d/0")
    for i in range(10):
        harness.subscribe(session, f"d/{i}", 0)
    for i in range(10):
        routes.plan(f"d/{i}")
    assert sorted(routes.cached_topics()) == sorted(f"d/{i}" for i in range(10))


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
    assert sole_copy(subscription).plan is plan  # the shortcut was taken
    general = routes._work_out("a/1", (subscription,), False)
    assert plan.copies == general.copies
    assert plan.groups == general.groups == ()
    assert plan.direct == general.direct


def test_a_sessions_plain_filters_share_one_copy_and_one_plan(harness: Any) -> None:
    """A subscriber of thousands of filters holds one plan per option set, not one per filter;
    a noLocal or identified filter keeps its own."""
    session, _, _ = harness.connect("sub")
    routes = harness.broker.routes
    for i in range(3):
        harness.subscribe(session, f"s/{i}/v", 1)
    harness.subscribe(session, "s/3/v", 0)
    harness.subscribe(session, "s/4/v", 1, no_local=True)
    harness.subscribe(session, "s/5/v", 1, subscription_id=7)
    plans = [routes.plan(f"s/{i}/v") for i in range(6)]
    assert plans[0] is plans[1] is plans[2]
    assert len({id(plan) for plan in plans[2:]}) == 4
    assert plans[0].copies[0].options.max_qos == 1
    assert plans[3].copies[0].options.max_qos == 0
    assert plans[4].copies[0].own is None
    assert plans[5].copies[0].options.subscription_ids == (7,)
    harness.subscribe(session, "s/1/v", 0)  # new options: the plan of QoS 0 filters
    assert routes.plan("s/1/v") is plans[3]
    assert routes.plan("s/0/v") is plans[0]


def test_an_ended_session_keeps_no_shared_copy(harness: Any) -> None:
    """The shared copies point back at their session: ending it breaks that cycle, since the
    collector may never look at a frozen one."""
    session, _, _ = harness.connect("sub")
    harness.subscribe(session, "s/1/v", 0)
    assert harness.broker.routes.plan("s/1/v").copies[0].session is session
    assert session.plain_copies
    harness.broker.disconnect(session, publish_will=False)  # clean: the session ends
    assert session.plain_copies is None
    assert harness.broker.routes.plan("s/1/v").copies == ()


def test_a_subscription_whose_session_has_no_map_gets_a_copy_of_its_own(harness: Any) -> None:
    """sole_copy for a plain subscription of a session whose subscriptions were cleared (it
    ended) makes a private copy instead of sharing one through a map the session no longer
    has (it used to raise there)."""
    session, _, _ = harness.connect("sub")
    harness.subscribe(session, "s/1/v", 1)
    (subscription,) = session.subscriptions.values()
    harness.broker.disconnect(session, publish_will=False)  # clean: the session ends
    subscription.copy = None
    copy = sole_copy(subscription)
    assert copy.session is session and copy.options.max_qos == 1 and copy.own is copy.options
    assert subscription.copy is copy and session.plain_copies is None


def test_a_device_connecting_forgets_only_the_plans_of_its_own_filters(
    harness: Any,
) -> None:
    """A fleet subscribes and connects all the time: a device with filters without wildcards
    costs the others' plans nothing (each stays, with its subscription's shared plan)."""
    sessions = []
    for i in range(3):
        session, _, _ = harness.connect(f"d{i}", clean_start=False, expiry=60)
        harness.subscribe(session, f"s/{i}/v", 0)
        sessions.append(session)
    routes = harness.broker.routes
    kept = {i: routes.plan(f"s/{i}/v") for i in range(3)}
    harness.broker.disconnect(sessions[1], publish_will=False)
    assert routes.plan("s/0/v") is kept[0]
    assert routes.plan("s/2/v") is kept[2]
    assert routes.plan("s/1/v").direct == ()
    newcomer, _, _ = harness.connect("new")
    harness.subscribe(newcomer, "s/9/v", 0)
    assert routes.plan("s/0/v") is kept[0]
    harness.subscribe(newcomer, "s/0/+", 0)  # a wildcard: every plan is worked out again
    assert "s/0/v" not in routes.cached_topics()
    assert set(routes.plan("s/0/v").direct or ()) == {sessions[0], newcomer}


def _reference(routes: RoutePlans, topic: str) -> RoutePlan:
    """The plan worked out from the tree now, by the general rule, nothing reused."""
    return routes._work_out(topic, routes.tree.match_uncached(topic), False)


def _said(plan: RoutePlan) -> object:
    return (
        [(c.session, c.options, c.own, c.plain) for c in plan.copies],
        plan.groups,
        None if plan.direct is None else sorted(s.client_id for s in plan.direct),
    )


@pytest.mark.parametrize("seed", range(6))
def test_cached_plans_equal_an_uncached_walk_after_random_changes(
    make_harness: Callable[..., Any], seed: int
) -> None:
    """Brute force: after every subscribe, unsubscribe, option change, connect and disconnect
    of a random sequence, each topic's cached plan says what a fresh walk of the tree says."""
    rng = random.Random(seed)
    harness = small_cache(make_harness, 8)  # small, so the older generation is exercised
    broker = harness.broker
    routes = broker.routes
    levels = ["a", "b", "c"]
    topics = [f"{x}/{y}" for x in levels for y in levels] + levels + ["$s/a"]
    filters = [
        *topics,
        "a/+",
        "+/b",
        "+/+",
        "#",
        "a/#",
        "$s/+",
        "$share/g/a/b",
        "$share/g/+/c",
        "$share/h/a/b",
    ]
    ids = [f"c{i}" for i in range(4)]
    sessions: dict[str, Any] = {}
    for step in range(300):
        client_id = rng.choice(ids)
        session = sessions.get(client_id)
        action = rng.random()
        if session is None or (session.link is None and action < 0.5):
            sessions[client_id], _, _ = harness.connect(
                client_id, clean_start=rng.random() < 0.2, expiry=600
            )
        elif action < 0.1:
            broker.disconnect(session, publish_will=False)
        elif action < 0.6:
            options = rng.choice([{}, {"no_local": True}, {"subscription_id": step + 1}, {}])
            result = broker.subscribe(
                session,
                rng.choice(filters),
                SubscriptionOptions(max_qos=rng.randrange(3), **options),
            )
            assert not isinstance(result, SubscribeRefusal)
        else:
            broker.unsubscribe(session, rng.choice(filters))
        for topic in rng.sample(topics, 4):
            routes.plan(topic)  # fills and rotates the cache between changes
        for topic in topics:
            assert _said(routes.plan(topic)) == _said(_reference(routes, topic)), (step, topic)


def _cycle(routes: RoutePlans, topics: list[str]) -> int:
    """Plan every topic once, in order; how many were cached when their turn came."""
    found = 0
    for topic in topics:
        if topic in routes.by_topic or topic in routes._older:
            found += 1
        routes.plan(topic)
    return found


def test_a_cycle_longer_than_the_cache_still_hits(make_harness: Callable[..., Any]) -> None:
    """A fleet publishing round its devices' topics, more of them than the cache holds: an
    LRU-like cache evicts each plan before its topic comes back and never hits. The cache
    pauses instead (takes no new plans), so the topics it holds hit on every round."""
    harness = small_cache(make_harness, 16)
    session, _, _ = harness.connect("sub")
    harness.subscribe(session, "t/#", 0)
    other, _, _ = harness.connect("other")
    harness.subscribe(other, "t/#", 0)  # two receivers: plans of their own per topic
    routes = harness.broker.routes
    topics = [f"t/{i}" for i in range(160)]  # ten generations' worth
    found = [_cycle(routes, topics) for _ in range(4)]
    assert found[0] == 0
    assert sum(found) > 0  # an LRU-like cache: none at all
    # Each pause longer than the last: soon one outlasts a round, whose held topics all hit.
    for _ in range(8):
        if routes._paused >= len(topics):
            break
        _cycle(routes, topics)
    assert routes._paused >= len(topics)
    held = set(routes.cached_topics())
    assert held
    assert _cycle(routes, topics) == len(held)
    # While paused, the plans it holds still follow every change.
    third, _, _ = harness.connect("third")
    harness.subscribe(third, "t/5", 0)
    for topic in topics:
        assert _said(routes.plan(topic)) == _said(_reference(routes, topic)), topic


def test_a_paused_cache_takes_plans_again_when_topics_come_back(
    make_harness: Callable[..., Any],
) -> None:
    harness = small_cache(make_harness, 16)
    session, _, _ = harness.connect("sub")
    harness.subscribe(session, "t/#", 0)
    other, _, _ = harness.connect("other")
    harness.subscribe(other, "t/#", 0)
    routes = harness.broker.routes
    topics = [f"t/{i}" for i in range(160)]
    for _ in range(3):
        _cycle(routes, topics)
    assert routes._paused or routes._strikes
    # The fleet shrinks to two topics: once the pause runs out they are kept and hit.
    hot = ["t/a", "t/b"]
    for _ in range(MAX_PAUSE_GENERATIONS * 16):
        _cycle(routes, hot)
    assert not routes._paused
    assert _cycle(routes, hot) == 2
    # A change that forgets every plan ends a pause at once.
    for i in range(100 * len(topics)):
        routes.plan(f"t/x{i}")
        if routes._paused:
            break
    assert routes._paused
    third, _, _ = harness.connect("third")
    harness.subscribe(third, "t/+", 0)
    assert not routes._paused
    routes.plan("t/a")
    assert "t/a" in routes.by_topic
