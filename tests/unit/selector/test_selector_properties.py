"""Properties that hold for every input: the parser raises nothing but InvalidSelector, evaluation
raises nothing at all, and the compiled fast paths agree with the spec's own equivalences.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kittiwake.selector import InvalidSelector, MappingSubject, Selector, compile_selector

# -- the parser on arbitrary input -------------------------------------------------------------

_SELECTOR_CHARACTERS = st.sampled_from(
    [*"()'=<>!+-*/%,.\\ \t\n_$0123456789abexXlLfFdDpP\"#;", "\u00e9", "\u200b", "\v"]
)
_WORDS = st.sampled_from(
    [
        "a", "flag", "JMSType", "JMSPriority", "JMSExpiration", "NOT", "and", "OR", "BETWEEN",
        "LIKE", "in", "IS", "NULL", "ESCAPE", "TRUE", "false", "(", ")", "(", ")", ",", "=",
        "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "'x'", "'%a_'", "'!'", "'it''s'", "'",
        "1", "0x1F", "010", "09", "57L", "7E3", "-57.9E2", "7.", ".5", "1.5f", "0x1.8p1",
        "9223372036854775808", "1e400", "==", "!=", "%", "1AND", "12abc",
    ]
)  # fmt: skip


def _compiles_or_refuses(text: str) -> Selector | None:
    try:
        return compile_selector(text)
    except InvalidSelector as error:
        assert 1 <= error.column <= len(text) + 1
        assert error.reason
        return None


@settings(deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_is_compiled_or_refused(text: str) -> None:
    _compiles_or_refuses(text)


@settings(deadline=None)
@given(st.lists(_SELECTOR_CHARACTERS, max_size=200).map("".join))
def test_text_made_of_selector_characters_is_compiled_or_refused(text: str) -> None:
    _compiles_or_refuses(text)


@settings(deadline=None)
@given(st.lists(_WORDS, max_size=40).map(" ".join))
def test_token_soup_is_compiled_or_refused(words: str) -> None:
    selector = _compiles_or_refuses(words)
    if selector is not None:
        assert selector.evaluate(MappingSubject({"a": 1, "flag": True})) in (True, False, None)


@given(
    st.integers(min_value=1, max_value=20_000),
    st.sampled_from([("(", ""), ("NOT (", ""), ("-(", " = 1"), ("a = (", "")]),
)
@settings(max_examples=30, deadline=None)
def test_deep_nesting_never_recurses_without_bound(depth: int, shape: tuple[str, str]) -> None:
    opener, suffix = shape
    text = opener * depth + "a" + ")" * depth + suffix
    _compiles_or_refuses(text)
    _compiles_or_refuses(text[: len(text) // 2])
    try:
        compile_selector(text, max_length=len(text))
    except InvalidSelector as error:
        assert depth > 32
        assert "nested deeper than 32 levels" in error.reason
    else:
        assert depth <= 32


# -- generated valid selectors ------------------------------------------------------------------

_NAMES = ["a", "b", "s", "flag", "missing"]
_names = st.sampled_from(_NAMES)
_numbers = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12).map(repr),
)
_strings = st.text(alphabet="ab'%_ ", max_size=5).map(lambda s: "'" + s.replace("'", "''") + "'")
_patterns = st.lists(st.sampled_from(["a", "b", "%", "_", "!%", "!!"]), max_size=5).map(
    lambda pieces: "'" + "".join(pieces) + "'"
)

_numeric = st.recursive(
    st.one_of(_names, _numbers),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda x: f"-{x}"),
    ),
    max_leaves=6,
)


def _predicates() -> st.SearchStrategy[str]:
    comparisons = st.tuples(_numeric, st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), _numeric)
    return st.one_of(
        comparisons.map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        st.tuples(_names, st.sampled_from(["=", "<>"]), _strings).map(
            lambda t: f"{t[0]} {t[1]} {t[2]}"
        ),
        st.tuples(_names, st.sampled_from(["=", "<>"]), _names).map(
            lambda t: f"{t[0]} {t[1]} {t[2]}"
        ),
        st.tuples(_names, st.sampled_from(["", "NOT "]), _patterns).map(
            lambda t: f"{t[0]} {t[1]}LIKE {t[2]} ESCAPE '!'"
        ),
        st.tuples(_names, st.sampled_from(["", "NOT "]), st.lists(_strings, min_size=1,
                                                                    max_size=3)).map(
            lambda t: f"{t[0]} {t[1]}IN ({', '.join(t[2])})"
        ),
        st.tuples(_numeric, st.sampled_from(["", "NOT "]), _numeric, _numeric).map(
            lambda t: f"{t[0]} {t[1]}BETWEEN {t[2]} AND {t[3]}"
        ),
        st.tuples(_numeric, st.sampled_from(["IS NULL", "IS NOT NULL"])).map(" ".join),
        _names,
        st.sampled_from(["TRUE", "FALSE"]),
    )


_conditions = st.recursive(
    _predicates(),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda c: f"NOT ({c})"),
    ),
    max_leaves=8,
)

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(),  # NaN and the infinities included
    st.text(alphabet="ab%_ ", max_size=4),
    st.just(b"x"),
)
_properties = st.dictionaries(st.sampled_from(_NAMES), _values)


def _negation(value: bool | None) -> bool | None:
    return None if value is None else not value


@settings(deadline=None)
@given(_conditions, _properties)
def test_valid_selectors_compile_and_evaluate_without_raising(
    text: str, properties: dict[str, Any]
) -> None:
    selector = compile_selector(text)
    subject = MappingSubject(properties)
    result = selector.evaluate(subject)
    assert result in (True, False, None)
    assert selector.matches(subject) is (result is True)
    assert compile_selector(f"NOT ({text})").evaluate(subject) is _negation(result)
    assert compile_selector(f"({text}) OR FALSE").evaluate(subject) is result
    assert compile_selector(f"({text}) AND TRUE").evaluate(subject) is result


# -- the spec's equivalences, and fast paths against the general ones ---------------------------


def _evaluate(text: str, properties: dict[str, Any]) -> bool | None:
    return compile_selector(text).evaluate(MappingSubject(properties))


@settings(deadline=None)
@given(_values, _values, _values)
def test_between_is_the_conjunction_the_spec_defines(x: Any, low: Any, high: Any) -> None:
    properties = {"x": x, "low": low, "high": high}
    assert _evaluate("x BETWEEN low AND high", properties) is _evaluate(
        "x >= low AND x <= high", properties
    )
    assert _evaluate("x NOT BETWEEN low AND high", properties) is _evaluate(
        "x < low OR x > high", properties
    )


_numbers_and_nan = st.one_of(st.integers(-4, 4), st.floats(-4, 4), st.just(float("nan")))


@settings(deadline=None)
@given(
    _values | _numbers_and_nan,
    st.integers(-3, 3) | st.floats(-3, 3),
    st.integers(-3, 3) | st.floats(-3, 3),
)
def test_between_constant_bounds_agree_with_property_bounds(x: Any, low: Any, high: Any) -> None:
    properties = {"x": x, "low": low, "high": high}
    for negation in ("", "NOT "):
        assert _evaluate(f"x {negation}BETWEEN {low!r} AND {high!r}", properties) is _evaluate(
            f"x {negation}BETWEEN low AND high", properties
        )


@settings(deadline=None)
@given(_values)
def test_in_is_the_disjunction_the_spec_defines(x: Any) -> None:
    properties = {"x": x}
    assert _evaluate("x IN ('a', 'b ')", properties) is _evaluate(
        "x = 'a' OR x = 'b '", properties
    )
    assert _evaluate("x NOT IN ('a', 'b ')", properties) is _evaluate(
        "NOT (x = 'a' OR x = 'b ')", properties
    )


@settings(deadline=None)
@given(_values, st.sampled_from(["a%", "%", "_", "a_%", "%b", ""]))
def test_not_like_is_not_of_like(x: Any, pattern: str) -> None:
    properties = {"x": x}
    assert _evaluate(f"x NOT LIKE '{pattern}'", properties) is _negation(
        _evaluate(f"x LIKE '{pattern}'", properties)
    )


_OPERATORS = ["=", "<>", "<", "<=", ">", ">="]
_MIRROR = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_constants = st.one_of(
    st.integers(-5, 5),
    st.floats(-5, 5),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)


@settings(deadline=None)
@given(_values, _constants, st.sampled_from(_OPERATORS))
def test_comparison_with_a_constant_agrees_with_comparison_with_a_property(
    x: Any, constant: int | float, operator: str
) -> None:
    properties = {"x": x, "c": constant}
    general = _evaluate(f"x {operator} c", properties)
    assert _evaluate(f"x {operator} {constant!r}", properties) is general
    assert _evaluate(f"{constant!r} {_MIRROR[operator]} x", properties) is general
    assert _evaluate(f"c {_MIRROR[operator]} x", properties) is general


@settings(deadline=None)
@given(_values, st.text(alphabet="ab ", max_size=3), st.sampled_from(["=", "<>"]))
def test_string_comparison_with_a_constant_agrees(x: Any, constant: str, operator: str) -> None:
    properties = {"x": x, "c": constant}
    general = _evaluate(f"x {operator} c", properties)
    assert _evaluate(f"x {operator} '{constant}'", properties) is general
    assert _evaluate(f"'{constant}' {operator} x", properties) is general


@settings(deadline=None)
@given(_values, _values)
def test_equal_and_not_equal(x: Any, y: Any) -> None:
    """For like types <> is NOT =; for unlike types both are FALSE; with a NULL both UNKNOWN."""
    properties = {"x": x, "y": y}
    equal = _evaluate("x = y", properties)
    not_equal = _evaluate("x <> y", properties)
    if x is None or y is None:
        assert equal is None and not_equal is None
        return

    def kind(value: Any) -> str:
        if isinstance(value, bool):
            return "boolean"
        if isinstance(value, (int, float)):
            return "number"
        return type(value).__name__

    if kind(x) == kind(y) and kind(x) in ("boolean", "number", "str"):
        assert not_equal is (not equal)
    else:
        assert equal is False and not_equal is False


@settings(deadline=None)
@given(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)
def test_numeric_promotion_and_exact_integer_arithmetic(a: int, b: int, f: float) -> None:
    properties = {"a": a, "b": b, "f": f}
    # Two longs: exact.
    assert _evaluate("a + b = c", {**properties, "c": a + b}) is True
    assert _evaluate("a * b = c", {**properties, "c": a * b}) is True
    assert _evaluate("a < b", properties) is (a < b)
    # A long and a double: the long becomes a double first, as Java promotes it.
    assert _evaluate("a < f", properties) is (float(a) < f)
    assert _evaluate("a = f", properties) is (float(a) == f)
