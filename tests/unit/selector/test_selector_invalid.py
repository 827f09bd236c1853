"""Selectors refused when presented: each with the 1-based column and a reason a user can act on.

The columns below are counted by hand from the text; the reason is matched on the words a user
needs to fix the selector.
"""

from __future__ import annotations

import pytest

from kittiwake.selector import InvalidSelector, MappingSubject, compile_selector

INVALID: list[tuple[str, int, str]] = [
    # Structure.
    ("a = ", 5, "expected a value, found the end of the selector"),
    ("(a = 1", 7, "expected ')' to match the '(' in column 1"),
    ("color = 'blue' AND (weight > 2500", 34, "expected ')' to match the '(' in column 20"),
    ("a = 1)", 6, "')' without a matching '('"),
    ("()", 2, "expected a value, found ')'"),
    ("a b", 3, "expected AND, OR or the end of the selector, found identifier b"),
    ("a = 1 b = 2", 7, "expected AND, OR or the end of the selector"),
    ("a = 1 AND", 10, "expected a value, found the end of the selector"),
    ("a = 1\nAND b = ", 15, "expected a value"),  # columns count every character
    ("a = 1 = 2", 7, "comparisons cannot be chained"),
    ("a < b < c", 7, "comparisons cannot be chained"),
    ("a NOT = 1", 3, "NOT here must be followed by BETWEEN, LIKE or IN"),
    ("a IS 1", 6, "expected NULL or NOT NULL after IS"),
    ("a IS NOT 1", 10, "expected NULL after IS NOT"),
    ("a BETWEEN 1 OR 2", 13, "expected AND between the bounds of BETWEEN"),
    ("x IN ('a') ESCAPE", 12, "expected AND, OR or the end of the selector"),
    # Operators that are not selector syntax.
    ("a == 1", 3, "write '='"),
    ("a != 1", 3, "write '<>'"),
    ("a = 1 && b = 2", 7, "write AND"),
    ("a = 1 || b = 2", 7, "write OR"),
    ("!(a = 1)", 1, "write NOT"),
    ("a % 2 = 0", 3, "'%' is not an operator"),
    ("a = 1 /* comment */", 7, "comments are not allowed"),
    ("a # b", 3, "unexpected character '#'"),
    ("a = 1;", 6, "unexpected character ';'"),
    ('"a" = 1', 1, "string literals take single quotes"),
    # White space is Java's: a vertical tab, a no-break space or a zero-width space is not.
    ("a\v= 1", 2, "unexpected character"),
    ("a\u00a0= 1", 2, "unexpected character"),
    ("a\u200b = 1", 2, "unexpected character"),
    # NULL and the reserved words.
    ("NULL = 1", 1, "NULL can only be tested with IS NULL or IS NOT NULL"),
    ("a = NULL", 5, "NULL can only be tested with IS NULL"),
    ("a <> null", 6, "IS NOT NULL"),
    ("AND = 1", 1, "reserved word 'AND'"),
    ("a = 1 AND or = 2", 11, "reserved word 'or'"),
    ("between BETWEEN 1 AND 2", 1, "reserved words cannot be used as property names"),
    ("escape = 'x'", 1, "reserved word 'escape'"),
    ("is = 1", 1, "reserved word"),
    # LIKE and IN take string literals.
    ("x LIKE 3", 8, "LIKE takes a string literal pattern"),
    ("x LIKE y", 8, "LIKE takes a string literal pattern"),
    ("x LIKE 'a' ESCAPE 'ab'", 19, "exactly one character"),
    ("x LIKE 'a' ESCAPE ''", 19, "exactly one character"),
    ("x LIKE 'a' ESCAPE", 18, "ESCAPE takes a one-character string literal"),
    ("x LIKE 'a!b' ESCAPE '!'", 8, "may only precede '%', '_' or itself"),
    ("x LIKE 'ab!' ESCAPE '!'", 8, "ends with its escape character"),
    ("x IN (1, 2)", 7, "IN takes a list of string literals"),
    ("x IN ('a', 2)", 12, "IN takes a list of string literals"),
    ("x IN ()", 7, "IN takes a list of string literals"),
    ("x IN ('a', y)", 12, "IN takes a list of string literals"),
    ("x IN 'a'", 6, "expected '(' after IN"),
    ("x IN ('a' 'b')", 11, "expected ',' or ')'"),
    # Type rules that the text alone decides.
    ("'a' < 'b'", 1, "compares numbers only"),
    ("a < 'b'", 5, "compares numbers only"),
    ("TRUE > 1", 1, "compares numbers only"),
    ("a >= (b = 1)", 7, "compares numbers only"),
    ("5 = 'five'", 3, "compares a number with a string"),
    ("TRUE = 1", 6, "compares a condition with a number"),
    ("1 + 'a' = 2", 5, "'+' needs numbers, not a string"),
    ("'a' * 2 = 2", 1, "'*' needs numbers, not a string"),
    ("(a = 1) + 1 = 2", 2, "'+' needs numbers, not a condition"),
    ("- 'x' = 1", 3, "needs numbers, not a string"),
    ("-TRUE = 1", 2, "needs numbers, not a condition"),
    ("a BETWEEN 'x' AND 2", 11, "BETWEEN needs numbers, not a string"),
    ("'x' BETWEEN 1 AND 2", 1, "BETWEEN needs numbers, not a string"),
    ("TRUE LIKE 'x'", 1, "LIKE needs a string, not a condition"),
    ("3 IN ('3')", 1, "IN needs a string, not a number"),
    ("a + 1", 1, "a selector must be a condition"),
    ("'abc'", 1, "not a string"),
    ("42", 1, "not a number"),
    ("a AND 1", 7, "an operand of AND must be a condition"),
    ("a = 1 OR 'x'", 10, "an operand of OR must be a condition"),
    ("NOT 5", 5, "the operand of NOT must be a condition"),
    # Header fields: only those the spec allows, with their types.
    ("JMSExpiration > 0", 1, "JMSExpiration cannot be used in a selector"),
    ("JMSRedelivered = TRUE", 1, "the header fields a selector may name are"),
    ("a = 1 AND JMSDestination = 'q'", 11, "other names starting with JMS are reserved"),
    ("JMSPriority LIKE '1%'", 1, "LIKE needs a string, not a number"),
    ("JMSType > 3", 1, "compares numbers only"),
    ("JMSType + 1 = 2", 1, "needs numbers, not a string"),
    ("JMSDeliveryMode = 2", 17, "compares a string with a number"),
    # Numbers: Java literal syntax, long and double range.
    ("9223372036854775808 > 1", 1, "integer literal out of range"),
    ("-9223372036854775809 < 1", 1, "integer literal out of range"),
    ("- -9223372036854775808 < 1", 1, "integer literal out of range"),
    ("n = 99999999999999999999999", 5, "integer literal out of range"),
    ("n = 0x8000000000000000", 5, "integer literal out of range"),
    ("n = 01000000000000000000000", 5, "integer literal out of range"),
    ("1e400 > 1", 1, "floating-point literal out of range"),
    ("n = 3.5e38f", 5, "floating-point literal out of range"),
    ("n = 1e-400", 5, "too small for a double"),
    ("n = 1e-50f", 5, "too small for a float"),
    ("09 = 9", 1, "not a valid octal literal"),
    ("n = 08L", 5, "not a valid octal literal"),
    ("n = 12abc", 5, "malformed number '12abc'"),
    ("n = 1_000", 5, "malformed number '1_000'"),
    ("n = 0b101", 5, "malformed number '0b101'"),
    ("n = 0x1g", 5, "malformed number '0x1g'"),
    ("n = 1.5L", 5, "malformed number '1.5L'"),
    ("n = 1.2.3", 5, "malformed number '1.2.3'"),
    ("n = 1ANDx", 5, "malformed number '1ANDx'"),
    ("n = 0x", 5, "needs digits after 0x"),
    ("n = 0x.p1", 5, "needs digits after 0x"),
    ("n = 0x1.8", 10, "needs a binary exponent"),
    ("n = 1e", 6, "exponent of a number needs digits"),
    ("n = 1e+", 6, "exponent of a number needs digits"),
    # Strings.
    ("x = 'abc", 5, "unterminated string literal"),
    ("x = 'it's'", 10, "unterminated string literal"),
    ("x = '", 5, "unterminated string literal"),
]


@pytest.mark.parametrize(("text", "column", "reason"), INVALID)
def test_invalid_selector_is_refused_with_its_column(text: str, column: int, reason: str) -> None:
    with pytest.raises(InvalidSelector) as caught:
        compile_selector(text)
    error = caught.value
    assert error.column == column, error
    assert reason in error.reason
    assert str(error) == f"{error.reason} at column {column}"


def test_invalid_selector_is_a_value_error() -> None:
    with pytest.raises(ValueError) as caught:
        compile_selector("(a = 1")
    assert str(caught.value) == (
        "expected ')' to match the '(' in column 1, found the end of the selector at column 7"
    )


def test_the_length_limit_counts_characters_and_is_configurable() -> None:
    long_text = "a = 1 OR " * 500 + "a = 1"
    with pytest.raises(InvalidSelector) as caught:
        compile_selector(long_text)
    assert caught.value.column == 4097
    assert f"{len(long_text)} characters long; at most 4096" in caught.value.reason
    assert compile_selector(long_text, max_length=len(long_text)).text == long_text
    with pytest.raises(InvalidSelector) as caught:
        compile_selector("a = 1", max_length=4)
    assert caught.value.column == 5
    # White space counts too: the limit bounds the text a client can make the broker hold.
    with pytest.raises(InvalidSelector):
        compile_selector(" " * 4097)


def test_nesting_limit_is_enforced_at_the_first_parenthesis_too_deep() -> None:
    assert compile_selector("(" * 32 + "a" + ")" * 32).matches is not None
    with pytest.raises(InvalidSelector) as caught:
        compile_selector("(" * 33 + "a" + ")" * 33)
    assert caught.value.column == 33
    assert "nested deeper than 32 levels" in caught.value.reason
    with pytest.raises(InvalidSelector) as caught:
        compile_selector("a = 1 AND ((b = 2))", max_nesting=1)
    assert caught.value.column == 12


def test_hostile_nesting_is_refused_without_recursion_error() -> None:
    """Parentheses far beyond Python's recursion limit, even with the length limit lifted."""
    for text in ("(" * 100_000, "(" * 50_000 + "a" + ")" * 50_000, "a = " + "(" * 50_000):
        for max_length in (4096, len(text)):
            with pytest.raises(InvalidSelector):
                compile_selector(text, max_length=max_length)


def test_long_runs_of_not_and_signs_cost_no_stack() -> None:
    """NOT NOT ... and - - ... are read in loops and folded, so any number of them compiles."""
    nots = "NOT " * 50_000 + "flag"
    selector = compile_selector(nots, max_length=len(nots))
    assert selector.evaluate(MappingSubject({"flag": True})) is True
    assert selector.evaluate(MappingSubject({"flag": 1})) is None
    odd = compile_selector("NOT " + nots, max_length=len(nots) + 4)
    assert odd.evaluate(MappingSubject({"flag": True})) is False
    minus = "- " * 50_001 + "n = -3"
    selector = compile_selector(minus, max_length=len(minus))
    assert selector.evaluate(MappingSubject({"n": 3})) is True
    assert selector.evaluate(MappingSubject({"n": "3"})) is None
