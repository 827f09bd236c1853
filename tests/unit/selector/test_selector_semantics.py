"""What a selector says about a message: a table of expressions and their three-valued results.

Every row is checked three ways: ``evaluate`` gives TRUE, FALSE or UNKNOWN (None); ``matches``
is true only for TRUE; and ``NOT (<expression>)`` gives the negation by the spec's NOT table
(UNKNOWN stays UNKNOWN), which is how a JMS client could tell UNKNOWN from FALSE.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

from kittiwake.selector import MappingSubject, compile_selector

T, F, U = True, False, None

Row = tuple[str, dict[str, Any], bool | None]


def _float32(value: float) -> float:
    """The double a Java float property widens to."""
    result: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return result


def check(
    text: str, properties: dict[str, Any], headers: dict[str, Any] | None = None
) -> bool | None:
    subject = MappingSubject(properties, headers or {})
    selector = compile_selector(text)
    result = selector.evaluate(subject)
    assert selector.matches(subject) is (result is True), text
    negated = compile_selector(f"NOT ({text})").evaluate(subject)
    assert negated == (None if result is None else not result), f"NOT ({text})"
    return result


# -- the JMS 2.0 specification's own examples (section 3.8.1.1) ---------------------------------

CAR = {"color": "blue", "weight": 3000}

SPEC_EXAMPLES: list[tuple[str, dict[str, Any], dict[str, Any], bool | None]] = [
    ("JMSType = 'car' AND color = 'blue' AND weight > 2500", CAR, {"JMSType": "car"}, T),
    ("JMSType = 'car' AND color = 'blue' AND weight > 2500", CAR, {"JMSType": "bus"}, F),
    (
        "JMSType = 'car' AND color = 'blue' AND weight > 2500",
        {"color": "blue", "weight": 2500},
        {"JMSType": "car"},
        F,
    ),
    # No weight at all: TRUE AND TRUE AND UNKNOWN.
    ("JMSType = 'car' AND color = 'blue' AND weight > 2500", {"color": "blue"},
     {"JMSType": "car"}, U),
    ("phone LIKE '12%3'", {"phone": "123"}, {}, T),
    ("phone LIKE '12%3'", {"phone": "12993"}, {}, T),
    ("phone LIKE '12%3'", {"phone": "1234"}, {}, F),
    ("phone NOT LIKE '12%3'", {"phone": "123"}, {}, F),
    ("phone NOT LIKE '12%3'", {"phone": "12993"}, {}, F),
    ("phone NOT LIKE '12%3'", {"phone": "1234"}, {}, T),
    ("word LIKE 'l_se'", {"word": "lose"}, {}, T),
    ("word LIKE 'l_se'", {"word": "loose"}, {}, F),
    ("underscored LIKE '\\_%' ESCAPE '\\'", {"underscored": "_foo"}, {}, T),
    ("underscored LIKE '\\_%' ESCAPE '\\'", {"underscored": "bar"}, {}, F),
    # The spec's literal really is ' UK', with a leading space; it says "true for 'UK'", which
    # only holds for ' UK': IN compares strings exactly.
    ("Country IN (' UK', 'US', 'France')", {"Country": " UK"}, {}, T),
    ("Country IN (' UK', 'US', 'France')", {"Country": "US"}, {}, T),
    ("Country IN (' UK', 'US', 'France')", {"Country": "France"}, {}, T),
    ("Country IN (' UK', 'US', 'France')", {"Country": "Peru"}, {}, F),
    ("Country IN (' UK', 'US', 'France')", {"Country": "UK"}, {}, F),
    ("Country NOT IN (' UK', 'US', 'France')", {"Country": " UK"}, {}, F),
    ("Country NOT IN (' UK', 'US', 'France')", {"Country": "Peru"}, {}, T),
    ("Country IN (' UK', 'US', 'France')", {}, {}, U),
    ("Country NOT IN (' UK', 'US', 'France')", {}, {}, U),
    ("age BETWEEN 15 AND 19", {"age": 15}, {}, T),
    ("age BETWEEN 15 AND 19", {"age": 19}, {}, T),
    ("age BETWEEN 15 AND 19", {"age": 14}, {}, F),
    ("age BETWEEN 15 AND 19", {"age": 20}, {}, F),
    ("age NOT BETWEEN 15 AND 19", {"age": 14}, {}, T),
    ("age NOT BETWEEN 15 AND 19", {"age": 20}, {}, T),
    ("age NOT BETWEEN 15 AND 19", {"age": 17}, {}, F),
    ("age BETWEEN 15 AND 19", {}, {}, U),
    ("age NOT BETWEEN 15 AND 19", {}, {}, U),
    ("prop_name IS NULL", {}, {}, T),
    ("prop_name IS NULL", {"prop_name": 0}, {}, F),
    ("prop_name IS NOT NULL", {}, {}, F),
    ("prop_name IS NOT NULL", {"prop_name": ""}, {}, T),
    # "a string cannot be used in an arithmetic expression" (the NumberOfOrders example).
    ("NumberOfOrders > 1", {"NumberOfOrders": "2"}, {}, F),
    ("NumberOfOrders > 1", {"NumberOfOrders": 2}, {}, T),
    ("'literal''s' = s", {"s": "literal's"}, {}, T),
]


@pytest.mark.parametrize(("text", "properties", "headers", "expected"), SPEC_EXAMPLES)
def test_spec_examples(
    text: str, properties: dict[str, Any], headers: dict[str, Any], expected: bool | None
) -> None:
    assert check(text, properties, headers) is expected


# -- three-valued logic: the spec's AND, OR and NOT tables -------------------------------------

_LOGIC = {"t": True, "f": False}
_VALUES = {"t": T, "f": F, "u": U}


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


# The spec's tables, written out rather than computed, for the rows below.
AND_TABLE = {
    ("t", "t"): T, ("t", "f"): F, ("t", "u"): U,
    ("f", "t"): F, ("f", "f"): F, ("f", "u"): F,
    ("u", "t"): U, ("u", "f"): F, ("u", "u"): U,
}  # fmt: skip
OR_TABLE = {
    ("t", "t"): T, ("t", "f"): T, ("t", "u"): T,
    ("f", "t"): T, ("f", "f"): F, ("f", "u"): U,
    ("u", "t"): T, ("u", "f"): U, ("u", "u"): U,
}  # fmt: skip


@pytest.mark.parametrize(("pair", "expected"), sorted(AND_TABLE.items()))
def test_and_truth_table(pair: tuple[str, str], expected: bool | None) -> None:
    # "u" names no property: a missing property used as a condition is UNKNOWN.
    assert check(f"{pair[0]} AND {pair[1]}", _LOGIC) is expected


@pytest.mark.parametrize(("pair", "expected"), sorted(OR_TABLE.items()))
def test_or_truth_table(pair: tuple[str, str], expected: bool | None) -> None:
    assert check(f"{pair[0]} OR {pair[1]}", _LOGIC) is expected


@pytest.mark.parametrize(("operand", "expected"), [("t", F), ("f", T), ("u", U)])
def test_not_truth_table(operand: str, expected: bool | None) -> None:
    assert check(f"NOT {operand}", _LOGIC) is expected


@pytest.mark.parametrize("first", ["t", "f", "u"])
@pytest.mark.parametrize("second", ["t", "f", "u"])
@pytest.mark.parametrize("third", ["t", "f", "u"])
def test_longer_chains_fold_left_to_right(first: str, second: str, third: str) -> None:
    """Chains of three are n-ary nodes inside; they must agree with the two-operand tables."""
    a, b, c = _VALUES[first], _VALUES[second], _VALUES[third]
    assert check(f"{first} AND {second} AND {third}", _LOGIC) is _and(_and(a, b), c)
    assert check(f"{first} OR {second} OR {third}", _LOGIC) is _or(_or(a, b), c)


# -- everything else, as one table --------------------------------------------------------------

HEADERS = {
    "JMSDeliveryMode": "PERSISTENT",
    "JMSPriority": 7,
    "JMSTimestamp": 1_700_000_000_000,
    "JMSMessageID": "ID:42",
    "JMSType": "car",
    "JMSXDeliveryCount": 2,
}

TABLE: list[Row] = [
    # NULL propagates through arithmetic and comparisons; IS [NOT] NULL turns it into T/F.
    ("missing + 1 = 2", {}, U),
    ("1 + missing = 2", {}, U),
    ("missing * 2 = 0", {}, U),
    ("missing / 2 = 0", {}, U),
    ("missing - 2 = 0", {}, U),
    ("-missing = 0", {}, U),
    ("+missing = 0", {}, U),
    ("missing = 0", {}, U),
    ("missing <> 0", {}, U),
    ("missing > 0", {}, U),
    ("missing >= 0", {}, U),
    ("missing < 0", {}, U),
    ("missing <= 0", {}, U),
    ("missing = 'x'", {}, U),
    ("missing = TRUE", {}, U),
    ("'x' = missing", {}, U),
    ("missing LIKE 'x%'", {}, U),
    ("missing NOT LIKE 'x%'", {}, U),
    ("missing IN ('x')", {}, U),
    ("missing NOT IN ('x')", {}, U),
    ("(missing + 1) IS NULL", {}, T),
    ("(n + 1) IS NULL", {"n": 1}, F),
    ("n BETWEEN missing AND 10", {"n": 5}, U),
    ("n BETWEEN missing AND 1", {"n": 5}, F),  # UNKNOWN AND FALSE
    ("n NOT BETWEEN missing AND 1", {"n": 5}, T),  # UNKNOWN OR TRUE
    ("n = other", {"n": 1}, U),
    # A property used as a condition: TRUE and FALSE as they are, anything else UNKNOWN.
    ("flag", {"flag": True}, T),
    ("flag", {"flag": False}, F),
    ("flag", {"flag": "true"}, U),
    ("flag", {"flag": 1}, U),
    ("flag", {}, U),
    ("(flag)", {"flag": True}, T),
    ("NOT NOT flag", {"flag": "true"}, U),
    ("NOT NOT flag", {"flag": True}, T),
    # Booleans compare with = and <> only.
    ("flag = TRUE", {"flag": True}, T),
    ("flag <> FALSE", {"flag": True}, T),
    ("flag = FALSE", {"flag": True}, F),
    ("flag = other", {"flag": True, "other": True}, T),
    ("flag > other", {"flag": True, "other": False}, F),
    ("(n = 1) = TRUE", {"n": 1}, T),
    ("(n = 1) = (m = 1)", {"n": 1, "m": 2}, F),
    ("TRUE", {}, T),
    ("FALSE", {}, F),
    # Numeric promotion: exact and approximate numerics compare as Java promotes them.
    ("n = 2.0", {"n": 2}, T),
    ("n = 2", {"n": 2.0}, T),
    ("n > 2", {"n": 2.5}, T),
    ("n < 2.5", {"n": 2}, T),
    ("1 = 1.0", {}, T),
    ("n + 0.5 = 2.5", {"n": 2}, T),
    ("n * 2.0 = 4", {"n": 2}, T),
    ("n * 2 = 4.0", {"n": 2}, T),
    ("n BETWEEN 1.5 AND 2.5", {"n": 2}, T),
    ("n BETWEEN 1 AND 3", {"n": 2.5}, T),
    ("n BETWEEN 1 AND 3", {"n": 3.5}, F),
    # A long meeting a double becomes a double (2**53 + 1 rounds to 2**53), as in Java.
    ("n = 9007199254740992.0", {"n": 9007199254740993}, T),
    ("n = 9007199254740992", {"n": 9007199254740993}, F),
    # A Java float property arrives widened to a double: 1.1f is not 1.1.
    ("f = 1.1", {"f": _float32(1.1)}, F),
    ("f = 1.1f", {"f": _float32(1.1)}, T),
    ("f = 1.1d", {"f": 1.1}, T),
    # Division is always floating point, as in Artemis and Qpid; by zero it gives IEEE
    # infinities and NaN, never an error.
    ("7 / 2 = 3.5", {}, T),
    ("n / 2 = 3", {"n": 7}, F),
    ("n / 0 > 1.0E308", {"n": 1}, T),
    ("n / 0 < -1.0E308", {"n": -1}, T),
    ("n / 0.0 = n / 0.0", {"n": 0}, F),  # NaN equals nothing, itself included
    ("n / 0.0 <> n / 0.0", {"n": 0}, T),
    ("n / 0 = 1", {"n": 0}, F),
    ("n / 0 > 0", {"n": 0}, F),
    ("missing / 0 > 0", {}, U),
    ("n / -0.0 < 0", {"n": 1}, T),
    ("n = n", {"n": float("nan")}, F),
    ("n > 1.0E308 * 10", {"n": 1}, F),  # the product overflows to Infinity
    # Integer arithmetic is exact: it does not wrap around as Java's long does.
    ("n + 1 > n", {"n": 9223372036854775807}, T),
    ("n * n > 0", {"n": -9223372036854775808}, T),
    # Arithmetic precedence and left-to-right evaluation.
    ("2 + 3 * 4 = 14", {}, T),
    ("(2 + 3) * 4 = 20", {}, T),
    ("10 - 2 - 3 = 5", {}, T),
    ("12 / 3 / 2 = 2", {}, T),
    ("2 * 3 / 4 = 1.5", {}, T),
    ("- - 3 = 3", {}, T),
    ("-n = -2", {"n": 2}, T),
    ("- n * 2 = -4", {"n": 2}, T),
    ("-(n - 5) = 3", {"n": 2}, T),
    ("+n = 2", {"n": 2}, T),
    ("1 - -1 = 2", {}, T),
    ("2500 < weight", {"weight": 3000}, T),  # a constant on the left is mirrored
    ("2500 >= weight", {"weight": 3000}, F),
    ("a + b * c = 7", {"a": 1, "b": 2, "c": 3}, T),
    ("a * b + c = 5", {"a": 1, "b": 2, "c": 3}, T),
    # Literal forms: Java integer and floating-point syntax.
    ("n = 57", {"n": 57}, T),
    ("n = -957", {"n": -957}, T),
    ("n = +62", {"n": 62}, T),
    ("n = 57L", {"n": 57}, T),
    ("n = 57l", {"n": 57}, T),
    ("n = 0x1F", {"n": 31}, T),
    ("n = 0X1fL", {"n": 31}, T),
    ("n = 010", {"n": 8}, T),
    ("n = 0", {"n": 0}, T),
    ("n = 7E3", {"n": 7000}, T),
    ("n = -57.9E2", {"n": -5790}, T),
    ("n = 7.", {"n": 7}, T),
    ("n = -95.7", {"n": -95.7}, T),
    ("n = +6.2", {"n": 6.2}, T),
    ("n = .5", {"n": 0.5}, T),
    ("n = 5e-1", {"n": 0.5}, T),
    ("n = 1.5E+2", {"n": 150}, T),
    ("n = 2d", {"n": 2}, T),
    ("n = 0x1.8p1", {"n": 3}, T),
    ("n = 9223372036854775807", {"n": 2**63 - 1}, T),
    ("n = -9223372036854775808", {"n": -(2**63)}, T),
    ("n = 0x7FFFFFFFFFFFFFFF", {"n": 2**63 - 1}, T),
    ("n = 08.5", {"n": 8.5}, T),  # a leading 0 means octal for integers only
    # Only like types compare; comparing unlike types is FALSE (spec 3.8.1.1), even with <>.
    ("s = 'x'", {"s": 1}, F),
    ("s <> 'x'", {"s": 1}, F),
    ("n = 1", {"n": "1"}, F),
    ("n <> 1", {"n": "1"}, F),
    ("n > 1", {"n": "2"}, F),
    ("flag = TRUE", {"flag": "TRUE"}, F),
    ("flag = TRUE", {"flag": 1}, F),
    ("n = 1", {"n": True}, F),
    ("a = b", {"a": "1", "b": 1}, F),
    ("a <> b", {"a": "1", "b": 1}, F),
    ("a < b", {"a": "a", "b": "b"}, F),  # strings compare with = and <> only
    ("a = b", {"a": "a", "b": "a"}, T),
    ("a <> b", {"a": "a", "b": "b"}, T),
    ("s = 'Blue'", {"s": "blue"}, F),  # string comparison is case-sensitive
    ("s = 'blaß'", {"s": "blaß"}, T),
    # A string cannot be used in arithmetic: the result is NULL, so the comparison UNKNOWN.
    ("s + 1 = 2", {"s": "1"}, U),
    ("-s = -1", {"s": "1"}, U),
    ("flag * 1 = 1", {"flag": True}, U),
    # BETWEEN is >= AND <=, NOT BETWEEN is < OR >, so both are FALSE for a non-number.
    ("s BETWEEN 1 AND 3", {"s": "2"}, F),
    ("s NOT BETWEEN 1 AND 3", {"s": "2"}, F),
    # IN is an OR of =, NOT IN its NOT; LIKE of a non-string is FALSE and NOT LIKE its NOT.
    ("n IN ('1', '2')", {"n": 1}, F),
    ("n NOT IN ('1', '2')", {"n": 1}, T),
    ("n LIKE '1%'", {"n": 1}, F),
    ("n NOT LIKE '1%'", {"n": 1}, T),
    # A property of a type JMS does not have matches no comparison and is no number.
    ("b = 'x'", {"b": b"x"}, F),
    ("b IS NULL", {"b": b"x"}, F),
    ("b + 1 = 2", {"b": b"x"}, U),
    ("b LIKE 'x'", {"b": b"x"}, F),
    # LIKE.
    ("s LIKE '%'", {"s": ""}, T),
    ("s LIKE ''", {"s": ""}, T),
    ("s LIKE ''", {"s": "a"}, F),
    ("s LIKE '_'", {"s": ""}, F),
    ("s LIKE '_'", {"s": "\n"}, T),  # '_' matches any character, a newline too
    ("s LIKE 'a%b%c'", {"s": "abc"}, T),
    ("s LIKE 'a%b%c'", {"s": "aXbYbZc"}, T),
    ("s LIKE 'a%b%c'", {"s": "acb"}, F),
    ("s LIKE '%a_c%'", {"s": "xxabcxx"}, T),
    ("s LIKE '%a_c%'", {"s": "xxacxx"}, F),
    ("s LIKE 'a%a'", {"s": "a"}, F),
    ("s LIKE 'a%%a'", {"s": "aa"}, T),
    ("s LIKE '_%_'", {"s": "ab"}, T),
    ("s LIKE '_%_'", {"s": "a"}, F),
    ("s LIKE 'a.c'", {"s": "abc"}, F),  # regular-expression characters are literal
    ("s LIKE '(a)*'", {"s": "(a)*"}, T),
    ("s LIKE '100!%' ESCAPE '!'", {"s": "100%"}, T),
    ("s LIKE '100!%' ESCAPE '!'", {"s": "1000"}, F),
    ("s LIKE 'a!!b' ESCAPE '!'", {"s": "a!b"}, T),
    ("s LIKE 'a\\b'", {"s": "a\\b"}, T),  # without ESCAPE a backslash is an ordinary char
    ("s LIKE 'Ä_'", {"s": "Äx"}, T),
    ("s like 'a%' escape '#'", {"s": "abc"}, T),
    # IN.
    ("s IN ('a')", {"s": "a"}, T),
    ("s IN ('a', 'a', 'b')", {"s": "b"}, T),
    ("s IN ('')", {"s": ""}, T),
    ("s IN ('it''s')", {"s": "it's"}, T),
    # Header fields, case-sensitive names; the rest are properties.
    ("JMSDeliveryMode = 'PERSISTENT'", {}, T),
    ("JMSDeliveryMode = 'NON_PERSISTENT'", {}, F),
    ("JMSPriority > 4", {}, T),
    ("JMSPriority BETWEEN 0 AND 4", {}, F),
    ("JMSTimestamp >= 1700000000000", {}, T),
    ("JMSTimestamp + 1000 > 1700000000500", {}, T),
    ("JMSMessageID = 'ID:42'", {}, T),
    ("JMSType IN ('car', 'bus')", {}, T),
    ("JMSXDeliveryCount > 1", {}, T),
    ("JMSCorrelationID IS NULL", {}, T),
    ("JMSCorrelationID = 'x'", {}, U),
    ("jmstype = 'car'", {}, U),  # not the header: a property nobody set
    ("JMSXGroupID = 'g'", {"JMSXGroupID": "g"}, T),  # other JMSX names are properties
    ("JMS_IBM_Retain = 1", {"JMS_IBM_Retain": 1}, T),  # provider-specific properties
    # Reserved words are case-insensitive; identifiers are not.
    ("n between 1 and 3", {"n": 2}, T),
    ("nOt n BeTwEeN 1 AnD 3", {"n": 2}, F),
    ("flag = true", {"flag": True}, T),
    ("s is null", {}, T),
    ("s IS not NULL", {}, F),
    ("color = 'x'", {"Color": "x"}, U),
    # Identifiers follow Java's rules: letters, digits, '_', '$', and any Unicode letter.
    ("$price > 1", {"$price": 2}, T),
    ("_x = 1", {"_x": 1}, T),
    ("a1$_ = 1", {"a1$_": 1}, T),
    ("größe = 1", {"größe": 1}, T),
    ("日本 = 'x'", {"日本": "x"}, T),
    ("€cost > 1", {"€cost": 2}, T),
    # "\u0131n" (dotless i, n) upper-cases to "IN" in Python; it is still an identifier.
    ("\u0131n = 1", {"\u0131n": 1}, T),
    # Precedence: NOT binds tighter than AND, AND tighter than OR; NOT covers a whole
    # comparison, not its left operand.
    ("a = 1 OR b = 1 AND c = 1", {"a": 1, "b": 0, "c": 0}, T),
    ("(a = 1 OR b = 1) AND c = 1", {"a": 1, "b": 0, "c": 0}, F),
    ("NOT a = 1 AND b = 1", {"a": 2, "b": 1}, T),
    ("NOT a = 1 OR b = 1", {"a": 1, "b": 1}, T),
    ("NOT (a = 1 OR b = 1)", {"a": 1, "b": 2}, F),
    ("a BETWEEN 1 AND 3 AND b = 1", {"a": 2, "b": 1}, T),
    ("a BETWEEN 1 + 1 AND 3 * 2", {"a": 6}, T),
    ("a BETWEEN 1 + 1 AND 3 * 2", {"a": 1}, F),
    # White space: space, tab, form feed and line terminators.
    ("\ta\n=\r1\f", {"a": 1}, T),
    # A reserved word may follow a number directly, as Java-style lexers read it.
    ("a=1AND b=2", {"a": 1, "b": 2}, T),
    ("a=1.5OR b=2", {"a": 0, "b": 2}, T),
]


@pytest.mark.parametrize(("text", "properties", "expected"), TABLE)
def test_table(text: str, properties: dict[str, Any], expected: bool | None) -> None:
    assert check(text, properties, HEADERS) is expected


@pytest.mark.parametrize("text", ["", " ", "\t\n\r\f  "])
def test_empty_selector_selects_everything(text: str) -> None:
    selector = compile_selector(text)
    assert selector.selects_everything
    assert selector.matches(MappingSubject())
    assert selector.matches(MappingSubject({"a": 1}, HEADERS))


def test_a_selector_keeps_its_text() -> None:
    text = "color = 'blue'"
    selector = compile_selector(text)
    assert selector.text == text
    assert not selector.selects_everything
    assert text in repr(selector)


def test_a_compiled_selector_is_reused_across_messages() -> None:
    """Compiled once, evaluated many times: no state leaks from one message to the next."""
    selector = compile_selector("n > 2 AND s LIKE 'a%' AND t IN ('x', 'y')")
    results = [
        selector.evaluate(MappingSubject(properties))
        for properties in (
            {"n": 3, "s": "ab", "t": "x"},
            {"n": 1, "s": "ab", "t": "x"},
            {"s": "ab", "t": "x"},
            {"n": 3, "s": "ab", "t": "x"},
        )
    ]
    assert results == [T, F, U, T]


def test_many_operands_in_one_chain() -> None:
    """Hundreds of ANDs or additions are one n-ary node each: no recursion per operand."""
    count = 600
    conjunction = " AND ".join(f"p{i} = {i}" for i in range(count))
    properties = {f"p{i}": i for i in range(count)}
    selector = compile_selector(conjunction, max_length=100_000)
    assert selector.evaluate(MappingSubject(properties)) is T
    assert selector.evaluate(MappingSubject({**properties, "p599": 0})) is F
    assert selector.evaluate(MappingSubject({**properties, "p599": None})) is U
    disjunction = compile_selector(conjunction.replace(" AND ", " OR "), max_length=100_000)
    assert disjunction.evaluate(MappingSubject({"p599": 599})) is T
    assert disjunction.evaluate(MappingSubject({"p599": 0})) is U
    total = " + ".join("n" for _ in range(count))
    selector = compile_selector(f"{total} = {count * 3}", max_length=100_000)
    assert selector.evaluate(MappingSubject({"n": 3})) is T
