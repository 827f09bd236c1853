"""Topic rules against MQTT 5 §4.7 (names, filters, wildcards, '$' topics) and §4.8.2 ($share)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kittiwake.broker.topics import (
    MAX_TOPIC_BYTES,
    TopicError,
    is_wildcard,
    parse_shared,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

# (filter, topic name, expected) — the spec's own examples first, then edge cases.
MATCH_TABLE: list[tuple[str, str, bool]] = [
    # §4.7.1.2 multi-level wildcard
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/tennis/player1/#", "sport/tennis/player2", False),
    ("sport/tennis/player1/#", "sport/tennis", False),
    ("sport/#", "sport", True),
    ("sport/#", "sport/", True),
    ("sport/#", "sports", False),
    ("#", "sport", True),
    ("#", "sport/tennis/player1", True),
    ("#", "/", True),
    ("#", "/finance", True),
    # §4.7.1.3 single-level wildcard
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/tennis/+", "sport/tennis", False),
    ("sport/tennis/+", "sport/tennis/", True),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+", "sport", True),
    ("+", "/finance", False),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("/+", "finance", False),
    ("+/tennis/#", "sport/tennis", True),
    ("+/tennis/#", "sport/tennis/player1", True),
    ("+/tennis/#", "sport/golf", False),
    ("sport/+/player1", "sport/tennis/player1", True),
    ("sport/+/player1", "sport//player1", True),
    ("+/+/+", "a/b/c", True),
    ("+/+/+", "a/b", False),
    ("+/#", "a", True),
    ("+/#", "a/b/c", True),
    # Empty levels are levels like any other.
    ("a//b", "a//b", True),
    ("a//b", "a/b", False),
    ("a/+/b", "a//b", True),
    ("/", "/", True),
    ("//", "/", False),
    ("/#", "/", True),
    ("/#", "a", False),
    # Literal filters and case sensitivity (§4.7.3).
    ("sport/tennis", "sport/tennis", True),
    ("sport/tennis", "Sport/tennis", False),
    ("sport/tennis", "sport/tennis/", False),
    ("sport tennis", "sport tennis", True),
    # §4.7.2 topics beginning with '$'.
    ("#", "$SYS/x", False),
    ("#", "$SYS", False),
    ("+", "$SYS", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/broker", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS/+/Clients", "$SYS/monitor/Clients", True),
    ("$SYS/broker", "$SYS/broker", True),
    ("+/$SYS", "a/$SYS", True),
    ("a/#", "a/$b", True),
    ("$share/g/a", "$share/g/a", True),
]


@pytest.mark.parametrize(("topic_filter", "name", "expected"), MATCH_TABLE)
def test_topic_matches(topic_filter: str, name: str, expected: bool) -> None:
    assert topic_matches(topic_filter, name) is expected


def test_match_table_is_well_formed() -> None:
    assert len(MATCH_TABLE) >= 40
    for topic_filter, name, _ in MATCH_TABLE:
        validate_topic_filter(topic_filter)
        validate_topic_name(name)


VALID_NAMES = [
    "a",
    "/",
    "//",
    "/finance",
    "finance/",
    "a//b",
    " ",
    "sport/tennis/player1",
    "$SYS/broker/clients",
    "$share/g/a",
    "ünïcödé/トピック",
    "a" * MAX_TOPIC_BYTES,
]

# (name, max_levels, what the message must mention)
INVALID_NAMES: list[tuple[str, int | None, str]] = [
    ("", None, "at least one character"),  # §4.7.3: at least one character
    ("sport/+", None, "wildcard"),  # §4.7.1: wildcards only in filters
    ("sport/#", None, "wildcard"),
    ("+", None, "wildcard"),
    ("a+b", None, "wildcard"),
    ("a#", None, "wildcard"),
    ("a\0b", None, "U+0000"),  # §4.7.3: no null character
    ("\ud800", None, "UTF-8"),  # §1.5.4: no surrogates
    ("a" * (MAX_TOPIC_BYTES + 1), None, "bytes"),
    ("é" * (MAX_TOPIC_BYTES // 2 + 1), None, "bytes"),  # two bytes each: too long as UTF-8
    ("a/b/c", 2, "levels"),
    ("/", 1, "levels"),
]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize(("name", "max_levels", "reason"), INVALID_NAMES)
def test_invalid_topic_names(name: str, max_levels: int | None, reason: str) -> None:
    with pytest.raises(TopicError, match=re.escape(reason)):
        validate_topic_name(name, max_levels)


def test_max_levels_is_inclusive() -> None:
    validate_topic_name("a/b/c", 3)
    validate_topic_filter("a/+/#", 3)
    with pytest.raises(TopicError, match="levels"):
        validate_topic_filter("a/+/#", 2)


VALID_FILTERS = [
    "a",
    "#",
    "+",
    "/",
    "+/+",
    "/+",
    "+/",
    "sport/#",
    "sport/tennis/+",
    "sport/+/player1",
    "+/tennis/#",
    "a//b",
    "//#",
    "$SYS/#",
    "$share",
    "$sharefoo/x",
    "$share/g/a",  # ordinary here: parse_shared is the caller's first step
    "ünïcödé/+",
    "a" * MAX_TOPIC_BYTES,
]

INVALID_FILTERS: list[tuple[str, int | None, str]] = [
    ("", None, "at least one character"),
    ("sport/tennis#", None, "'#' inside"),  # §4.7.1.2: '#' must occupy a whole level
    ("sport/tennis/#/ranking", None, "last level"),  # '#' must be last
    ("#/a", None, "last level"),
    ("##", None, "'#' inside"),
    ("+#", None, "'#' inside"),
    ("sport+", None, "'+' inside"),  # §4.7.1.3: '+' must occupy a whole level
    ("sport/+tennis", None, "'+' inside"),
    ("++", None, "'+' inside"),
    ("a\0", None, "U+0000"),
    ("\udfff/#", None, "UTF-8"),
    ("a" * (MAX_TOPIC_BYTES + 1), None, "bytes"),
    ("+/+/+", 2, "levels"),
]


@pytest.mark.parametrize("topic_filter", VALID_FILTERS)
def test_valid_topic_filters(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(("topic_filter", "max_levels", "reason"), INVALID_FILTERS)
def test_invalid_topic_filters(topic_filter: str, max_levels: int | None, reason: str) -> None:
    with pytest.raises(TopicError, match=re.escape(reason)):
        validate_topic_filter(topic_filter, max_levels)


def test_topic_error_is_a_value_error_with_a_readable_sentence() -> None:
    with pytest.raises(ValueError) as info:
        validate_topic_filter("x" * 1000 + "#")
    message = str(info.value)
    assert message.endswith(".")
    assert len(message) < 400  # the offending filter is quoted, but truncated


SHARED_OK: list[tuple[str, tuple[str | None, str]]] = [
    ("$share/group/a/b", ("group", "a/b")),
    ("$share/group/#", ("group", "#")),
    ("$share/g/+/x", ("g", "+/x")),
    ("$share/g//", ("g", "/")),
    ("$share/g/$SYS/#", ("g", "$SYS/#")),
    ("$share/g/$share/h/x", ("g", "$share/h/x")),
    ("a/b", (None, "a/b")),
    ("#", (None, "#")),
    ("$share", (None, "$share")),
    ("$sharefoo/x", (None, "$sharefoo/x")),
    ("$SHARE/g/x", (None, "$SHARE/g/x")),  # case-sensitive, like every topic
    ("x/$share/g/y", (None, "x/$share/g/y")),
]

SHARED_BAD: list[tuple[str, str]] = [
    ("$share/", "empty group"),
    ("$share//a", "empty group"),
    ("$share/group", "no topic filter"),
    ("$share/group/", "no topic filter"),
    ("$share/+/a", "'+', '#'"),
    ("$share/#/a", "'+', '#'"),
    ("$share/gr+oup/a", "'+', '#'"),
    ("$share/gr#/a", "'+', '#'"),
    ("$share/g\0/a", "U+0000"),
]


@pytest.mark.parametrize(("topic_filter", "expected"), SHARED_OK)
def test_parse_shared(topic_filter: str, expected: tuple[str | None, str]) -> None:
    assert parse_shared(topic_filter) == expected


@pytest.mark.parametrize(("topic_filter", "reason"), SHARED_BAD)
def test_parse_shared_refuses(topic_filter: str, reason: str) -> None:
    with pytest.raises(TopicError, match=re.escape(reason)):
        parse_shared(topic_filter)


def test_parse_shared_leaves_the_filter_to_validate_topic_filter() -> None:
    group, topic_filter = parse_shared("$share/g/a#")
    assert group == "g"
    with pytest.raises(TopicError):
        validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [("a/b", False), ("/", False), ("$SYS/x", False), ("+", True), ("a/#", True), ("a/+/b", True)],
)
def test_is_wildcard(topic_filter: str, expected: bool) -> None:
    assert is_wildcard(topic_filter) is expected


def _wildcards_well_placed(topic_filter: str) -> bool:
    """The wildcard rule level by level: '+' and '#' whole levels, '#' the last one."""
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


@given(st.text(alphabet="ab+/#", min_size=1, max_size=12))
def test_filter_validation_agrees_with_the_level_by_level_rule(topic_filter: str) -> None:
    """validate_topic_filter's shortcut for '+' filters ("s/<device>/+") accepts exactly
    what the level-by-level rule accepts, consecutive '+' levels included."""
    if _wildcards_well_placed(topic_filter):
        validate_topic_filter(topic_filter)
    else:
        with pytest.raises(TopicError):
            validate_topic_filter(topic_filter)
