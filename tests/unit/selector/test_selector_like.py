"""LIKE patterns: the segment matcher against a plain regular-expression translation of SQL LIKE.

The reference below is the textbook translation ('%' to '.*', '_' to '.'), fine for the short
strings hypothesis generates; the real matcher must agree with it everywhere.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kittiwake.selector.like import LikePatternError, compile_like


def reference_like(pattern: str, escape: str | None, value: str) -> bool:
    source = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == escape:
            source.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        source.append(".*" if char == "%" else "." if char == "_" else re.escape(char))
        i += 1
    return re.fullmatch("".join(source), value, re.DOTALL) is not None


# Pattern pieces over a small alphabet, so that matches and near-misses are both common.
_PIECES = st.sampled_from(["a", "b", "%", "_", "\n", ".", "*"])
_ESCAPED_PIECES = st.sampled_from(["a", "b", "%", "_", "!%", "!_", "!!", "x"])


@settings(deadline=None)
@given(
    pattern=st.lists(_PIECES, max_size=8).map("".join),
    value=st.text(alphabet="ab\n.*", max_size=10),
)
def test_like_agrees_with_the_regex_translation(pattern: str, value: str) -> None:
    assert compile_like(pattern, None)(value) is reference_like(pattern, None, value)


@settings(deadline=None)
@given(
    pattern=st.lists(_ESCAPED_PIECES, max_size=8).map("".join),
    value=st.text(alphabet="ab%_!x", max_size=10),
)
def test_like_with_an_escape_agrees_with_the_regex_translation(pattern: str, value: str) -> None:
    assert compile_like(pattern, "!")(value) is reference_like(pattern, "!", value)


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("%", "", True),
        ("%%%", "abc", True),
        ("a%", "abc", True),
        ("%c", "abc", True),
        ("%b%", "abc", True),
        ("%x%", "abc", False),
        ("a%c", "ac", True),
        ("a%c", "abcabc", True),
        ("a%c", "abcab", False),
        ("ab%ba", "aba", False),  # head and tail may not overlap
        ("ab%ba", "abba", True),
        ("_b%", "abc", True),
        ("%_c", "c", False),
        ("%a_a%", "xaxa", True),
        ("%a_a%", "xaxb", False),
        ("a_%_a", "a12a", True),
        ("a_%_a", "a1a", False),
    ],
)
def test_like_cases(pattern: str, value: str, expected: bool) -> None:
    assert compile_like(pattern, None)(value) is expected
    assert reference_like(pattern, None, value) is expected


def test_a_pattern_that_makes_regexes_backtrack_is_answered_correctly() -> None:
    """'%a%a...%b' against 'aaaa...' makes a backtracking '.*a.*a...b' regex explore every
    split (exponential); the segment matcher answers after one scan per segment."""
    pattern = "%a" * 30 + "%b"
    value = "a" * 5000
    assert compile_like(pattern, None)(value) is False
    assert compile_like(pattern, None)(value + "b") is True
    pattern = "%a_" * 30 + "%b"
    assert compile_like(pattern, None)(value) is False
    assert compile_like(pattern, None)(value + "b") is True


@pytest.mark.parametrize(
    ("pattern", "escape", "reason"),
    [
        ("a!", "!", "ends with its escape character"),
        ("a!b", "!", "may only precede '%', '_' or itself, not 'b'"),
        ("a", "!!", "exactly one character"),
        ("a", "", "exactly one character"),
    ],
)
def test_malformed_escapes_are_refused(pattern: str, escape: str, reason: str) -> None:
    with pytest.raises(LikePatternError, match=re.escape(reason)):
        compile_like(pattern, escape)
