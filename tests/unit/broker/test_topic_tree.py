"""The topic tree against the reference matcher, and its upkeep: idempotence, pruning, cache."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kittiwake.broker.topic_tree import TopicTree
from kittiwake.broker.topics import TopicError, topic_matches

# A tiny alphabet so random filters and topics collide often; '' and '$x' cover §4.7's corners.
NAME_LEVELS = st.sampled_from(["", "a", "b", "$x"])
FILTER_LEVELS = st.sampled_from(["", "a", "b", "$x", "+"])


@st.composite
def _filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(FILTER_LEVELS, min_size=0, max_size=3))
    if not levels or draw(st.booleans()):
        levels.append("#")
    elif draw(st.booleans()):
        levels.append(draw(FILTER_LEVELS))
    return "/".join(levels)


def filters() -> st.SearchStrategy[str]:
    # [''] joins to '', which is no filter at all.
    return _filters().filter(bool)


TOPICS = st.lists(NAME_LEVELS, min_size=1, max_size=4).map("/".join).filter(bool)
VALUES = st.sampled_from(["s1", "s2", "s3", "s4"])


def example_topic(topic_filter: str) -> str:
    """A topic the filter matches (barring the '$' rule): '+' becomes 'a', a final '#' goes."""
    levels = ["a" if level == "+" else level for level in topic_filter.split("/")]
    if levels[-1] == "#":
        levels.pop()
    return "/".join(levels) or "a"


def brute_force(pairs: dict[str, dict[str, None]], topic: str) -> set[str]:
    return {v for f, values in pairs.items() if topic_matches(f, topic) for v in values}


def assert_agrees(tree: TopicTree[str], pairs: dict[str, dict[str, None]], topic: str) -> None:
    result = tree.match(topic)
    assert len(result) == len(set(result)), f"duplicates for {topic!r}: {result}"
    assert set(result) == brute_force(pairs, topic), topic


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(filters(), VALUES), max_size=25),
    st.lists(TOPICS, min_size=1, max_size=15),
)
def test_tree_agrees_with_reference(pairs: list[tuple[str, str]], topics: list[str]) -> None:
    tree: TopicTree[str] = TopicTree()
    model: dict[str, dict[str, None]] = {}
    for topic_filter, value in pairs:
        tree.insert(topic_filter, value)
        model.setdefault(topic_filter, {})[value] = None
    assert len(tree) == sum(len(v) for v in model.values())
    assert sorted(tree.filters()) == sorted(model)
    for topic in topics:
        assert_agrees(tree, model, topic)
        assert_agrees(tree, model, topic)  # the second answer comes from the cache


DEEP_NAMES = st.sampled_from(["", "a", "b", "c", "$x", "$SYS"])
DEEP_FILTERS = st.sampled_from(["", "a", "b", "c", "$x", "$SYS", "+", "+"])


@st.composite
def _deep_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(DEEP_FILTERS, min_size=1, max_size=6))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "#"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(_deep_filters(), VALUES), max_size=40),
    st.lists(st.lists(DEEP_NAMES, min_size=1, max_size=7).map("/".join).filter(bool), max_size=20),
)
def test_uncached_match_agrees_with_the_reference_and_with_match(
    pairs: list[tuple[str, str]], topics: list[str]
) -> None:
    """Deeper filters, several '+' branches and '$' first levels: many buckets per topic."""
    tree: TopicTree[str] = TopicTree(cache_size=0)
    model: dict[str, dict[str, None]] = {}
    for topic_filter, value in pairs:
        tree.insert(topic_filter, value)
        model.setdefault(topic_filter, {})[value] = None
    cached: TopicTree[str] = TopicTree()
    for topic_filter, value in pairs:
        cached.insert(topic_filter, value)
    for topic in topics:
        result = tree.match_uncached(topic)
        assert len(result) == len(set(result)), (topic, result)
        assert set(result) == brute_force(model, topic), topic
        assert cached.match(topic) == result  # the same order, cached or not
        assert cached.match(topic) == result


def test_literal_matches_come_before_wildcard_ones() -> None:
    tree: TopicTree[str] = TopicTree(cache_size=0)
    tree.insert("+/b", "plus")
    tree.insert("a/#", "multi")
    tree.insert("a/b", "exact")
    tree.insert("#", "all")
    assert tree.match_uncached("a/b") == ("all", "multi", "exact", "plus")
    assert tree.match_uncached("$a/b") == ()
    tree.insert("$a/+", "dollar")
    assert tree.match_uncached("$a/b") == ("dollar",)


def assert_compact(tree: TopicTree[str]) -> None:
    """Every node keeps an only child on itself, a dict only for two or more, and every
    child's level is its key."""
    stack = [tree._root]
    while stack:
        node = stack.pop()
        children = node.children
        if isinstance(children, dict):
            assert len(children) >= 2, children
            for level, child in children.items():
                assert child.level == level
        if node.plus is not None:
            stack.append(node.plus)
        stack.extend(child for _level, child in node.literal_children())


def test_a_fleets_filters_keep_no_dict_of_one_child() -> None:
    """A device's level has one child ("s/<i>/v"): it lives on the node, not in a one-entry
    dict (about 200 bytes and one more object for the collector per filter), and a second
    child, then its removal, move between the two forms with every match unchanged."""
    tree: TopicTree[str] = TopicTree(cache_size=0)
    for i in range(50):
        tree.insert(f"s/{i}/v", f"d{i}")
    device = tree._root.child("s")
    assert device is not None
    assert isinstance(device.children, dict)
    assert len(device.children) == 50
    for i in range(50):
        node = device.child(str(i))
        assert node is not None
        assert not isinstance(node.children, dict)
        assert node.child("v") is not None
        assert tree.match_uncached(f"s/{i}/v") == (f"d{i}",)
        assert tree.match_uncached(f"s/{i}/w") == ()
    tree.insert("s/7/w", "second")
    assert tree.match_uncached("s/7/w") == ("second",)
    assert tree.match_uncached("s/7/v") == ("d7",)
    assert_compact(tree)
    assert tree.remove("s/7/v", "d7")
    assert tree.match_uncached("s/7/w") == ("second",)
    assert tree.match_uncached("s/7/v") == ()
    assert_compact(tree)
    assert tree.remove("s/7/w", "second")
    assert device.child("7") is None
    for i in range(50):
        if i != 7:
            assert tree.remove(f"s/{i}/v", f"d{i}")
    assert tree._root.children is None
    assert tree.filters() == []


class TreeMachine(RuleBasedStateMachine):
    """Random insert/remove/match interleavings, so stale cache entries would be caught."""

    def __init__(self) -> None:
        super().__init__()
        # A small cache so eviction happens too.
        self.tree: TopicTree[str] = TopicTree(cache_size=4)
        self.model: dict[str, dict[str, None]] = {}

    @rule(topic_filter=filters(), value=VALUES)
    def insert(self, topic_filter: str, value: str) -> None:
        # Cache the answer for a topic this filter matches, so a stale entry would show.
        topic = example_topic(topic_filter)
        self.tree.match(topic)
        self.tree.insert(topic_filter, value)
        self.model.setdefault(topic_filter, {})[value] = None
        assert_agrees(self.tree, self.model, topic)

    @rule(topic_filter=filters(), value=VALUES)
    def remove(self, topic_filter: str, value: str) -> None:
        topic = example_topic(topic_filter)
        self.tree.match(topic)
        expected = value in self.model.get(topic_filter, {})
        assert self.tree.remove(topic_filter, value) is expected
        if expected:
            del self.model[topic_filter][value]
            if not self.model[topic_filter]:
                del self.model[topic_filter]
        assert_agrees(self.tree, self.model, topic)

    @rule(topic=TOPICS)
    def match(self, topic: str) -> None:
        assert_agrees(self.tree, self.model, topic)

    @invariant()
    def sizes_agree(self) -> None:
        assert len(self.tree) == sum(len(v) for v in self.model.values())
        assert len(self.tree._cache) <= 4

    @invariant()
    def only_children_need_no_dict(self) -> None:
        assert_compact(self.tree)

    def teardown(self) -> None:
        for topic_filter, values in list(self.model.items()):
            for value in list(values):
                assert self.tree.remove(topic_filter, value)
        assert not self.tree._root.children
        assert self.tree._root.plus is None
        assert self.tree._root.multi is None
        assert self.tree.filters() == []


TreeMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTreeMachine = TreeMachine.TestCase


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), _deep_filters(), VALUES), max_size=60),
    st.lists(st.lists(DEEP_NAMES, min_size=1, max_size=7).map("/".join).filter(bool), max_size=10),
)
def test_inserts_and_removes_agree_with_the_reference(
    steps: list[tuple[bool, str, str]], topics: list[str]
) -> None:
    """A filter's values go from none to one (kept alone), to several (a dict) and back."""
    tree: TopicTree[str] = TopicTree(cache_size=0)
    model: dict[str, dict[str, None]] = {}
    for insert, topic_filter, value in steps:
        if insert:
            tree.insert(topic_filter, value)
            model.setdefault(topic_filter, {})[value] = None
        else:
            there = value in model.get(topic_filter, {})
            assert tree.remove(topic_filter, value) == there
            if there:
                del model[topic_filter][value]
                if not model[topic_filter]:
                    del model[topic_filter]
        assert len(tree) == sum(len(v) for v in model.values())
        for topic in topics:
            result = tree.match_uncached(topic)
            assert len(result) == len(set(result)), (topic, result)
            assert set(result) == brute_force(model, topic), topic
    assert sorted(tree.filters()) == sorted(model)
    for topic_filter, values in model.items():
        for value in values:
            assert tree.remove(topic_filter, value)
    assert len(tree) == 0 and tree._root.is_empty()


def test_a_filters_values_keep_their_order_through_one_and_many() -> None:
    tree: TopicTree[str] = TopicTree(cache_size=0)
    tree.insert("a/b", "x")
    assert tree.match_uncached("a/b") == ("x",)
    tree.insert("a/b", "y")
    tree.insert("a/b", "z")
    assert tree.remove("a/b", "y")
    assert tree.match_uncached("a/b") == ("x", "z")
    assert tree.remove("a/b", "x")
    assert tree.match_uncached("a/b") == ("z",)
    assert not tree.remove("a/b", "x")
    tree.insert("a/b", "z")
    assert len(tree) == 1
    tree.insert("a/+", "z")
    assert tree.match_uncached("a/b") == ("z",)


def test_insert_is_idempotent_and_keeps_insertion_order() -> None:
    tree: TopicTree[str] = TopicTree()
    tree.insert("a/b", "x")
    tree.insert("a/b", "y")
    tree.insert("a/b", "x")
    assert len(tree) == 2
    assert tree.match("a/b") == ("x", "y")
    assert tree.filters() == ["a/b"]


def test_remove_reports_whether_the_pair_was_there() -> None:
    tree: TopicTree[str] = TopicTree()
    tree.insert("a/+", "x")
    assert not tree.remove("a/+", "y")
    assert not tree.remove("a/b", "x")
    assert not tree.remove("a/#", "x")
    assert not tree.remove("a/+/c", "x")
    assert tree.remove("a/+", "x")
    assert not tree.remove("a/+", "x")
    assert len(tree) == 0


def test_remove_of_a_malformed_filter_finds_nothing() -> None:
    tree: TopicTree[str] = TopicTree()
    tree.insert("a/#", "x")
    assert not tree.remove("a/#/b", "x")
    assert tree.match("a/b") == ("x",)


def test_insert_refuses_an_invalid_filter() -> None:
    tree: TopicTree[str] = TopicTree()
    for bad in ["", "a/#/b", "a+", "a/b#"]:
        with pytest.raises(TopicError):
            tree.insert(bad, "x")
    assert len(tree) == 0
    assert not tree._root.children


def test_removing_everything_prunes_the_tree() -> None:
    tree: TopicTree[str] = TopicTree()
    filters_ = ["a/b/c", "a/b/#", "a/+/c", "+/+", "#", "//", "$SYS/+/x", "a/b/c/d/e/f"]
    for i, topic_filter in enumerate(filters_):
        tree.insert(topic_filter, f"v{i}")
        tree.insert(topic_filter, "shared")
    tree.match("a/b/c")
    for i, topic_filter in enumerate(reversed(filters_)):
        assert tree.remove(topic_filter, "shared")
        assert tree.remove(topic_filter, f"v{len(filters_) - 1 - i}")
    root = tree._root
    assert root.children is None
    assert root.plus is None
    assert root.multi is None
    assert root.values is None
    assert len(tree) == 0
    assert tree.match("a/b/c") == ()


def test_pruning_keeps_nodes_other_filters_still_use() -> None:
    tree: TopicTree[str] = TopicTree()
    tree.insert("a/b/c", "deep")
    tree.insert("a", "shallow")
    tree.insert("a/#", "multi")
    assert tree.remove("a/b/c", "deep")
    assert [level for level, _child in tree._root.literal_children()] == ["a"]
    kept = tree._root.child("a")
    assert kept is not None
    assert kept.children is None
    assert tree.match("a") == ("multi", "shallow")


def test_cache_sees_inserts_and_removes() -> None:
    for topic_filter in ["sport/tennis", "sport/+", "sport/#", "#", "+/tennis"]:
        tree: TopicTree[str] = TopicTree()
        tree.insert("other", "o")
        assert tree.match("sport/tennis") == ()
        assert tree.match("other") == ("o",)
        tree.insert(topic_filter, "s")
        assert tree.match("sport/tennis") == ("s",), topic_filter
        assert tree.remove(topic_filter, "s")
        assert tree.match("sport/tennis") == (), topic_filter
        assert tree.match("other") == ("o",)


def test_literal_change_keeps_unrelated_cache_entries() -> None:
    tree: TopicTree[str] = TopicTree()
    tree.insert("a", "x")
    tree.match("a")
    tree.match("b")
    tree.insert("b", "y")
    assert "a" in tree._cache
    assert "b" not in tree._cache
    assert tree.match("b") == ("y",)


def test_cache_is_bounded_and_can_be_disabled() -> None:
    tree: TopicTree[str] = TopicTree(cache_size=3)
    tree.insert("#", "all")
    for topic in ["a", "b", "c", "d", "e"]:
        assert tree.match(topic) == ("all",)
    assert len(tree._cache) <= 3
    assert "e" in tree._cache  # the newest answer is kept
    uncached: TopicTree[str] = TopicTree(cache_size=0)
    uncached.insert("#", "all")
    assert uncached.match("a") == ("all",)
    assert uncached._cache == {}
    with pytest.raises(ValueError):
        TopicTree(cache_size=-1)


def test_very_long_topics_are_matched_but_not_cached() -> None:
    tree: TopicTree[str] = TopicTree()
    tree.insert("#", "all")
    long_topic = "x" * 5000
    assert tree.match(long_topic) == ("all",)
    assert long_topic not in tree._cache


def test_value_under_two_matching_filters_appears_once() -> None:
    tree: TopicTree[str] = TopicTree()
    tree.insert("a/+", "sub")
    tree.insert("a/#", "sub")
    tree.insert("a/b", "sub")
    tree.insert("a/b", "other")
    assert len(tree) == 4
    result = tree.match("a/b")
    assert sorted(result) == ["other", "sub"]
    assert tree.match("a/b") == result  # same order from cache
    fresh: TopicTree[str] = TopicTree(cache_size=0)
    for topic_filter, value in [("a/+", "sub"), ("a/#", "sub"), ("a/b", "sub"), ("a/b", "other")]:
        fresh.insert(topic_filter, value)
    assert fresh.match("a/b") == result  # order depends on the filters, not on caching


def test_dollar_topics_hide_from_leading_wildcards() -> None:
    tree: TopicTree[str] = TopicTree()
    tree.insert("#", "hash")
    tree.insert("+/monitor/Clients", "plus")
    tree.insert("$SYS/#", "sys")
    tree.insert("$SYS/monitor/+", "sys-plus")
    assert set(tree.match("$SYS/monitor/Clients")) == {"sys", "sys-plus"}
    assert set(tree.match("x/monitor/Clients")) == {"hash", "plus"}
    assert tree.match("$SYS") == ("sys",)


def test_parent_level_and_empty_levels() -> None:
    tree: TopicTree[str] = TopicTree()
    tree.insert("sport/tennis/player1/#", "p1")
    tree.insert("+/+", "pp")
    tree.insert("/+", "slash")
    tree.insert("+", "one")
    assert tree.match("sport/tennis/player1") == ("p1",)
    assert set(tree.match("/finance")) == {"pp", "slash"}
    assert tree.match("finance") == ("one",)
    assert set(tree.match("/")) == {"pp", "slash"}


def test_filters_lists_every_filter_once() -> None:
    tree: TopicTree[int] = TopicTree()
    names = ["a", "a/b", "a/#", "+", "#", "+/#", "/", "a/+/c"]
    for i, topic_filter in enumerate(names):
        tree.insert(topic_filter, i)
        tree.insert(topic_filter, i + 100)
    assert sorted(tree.filters()) == sorted(names)
