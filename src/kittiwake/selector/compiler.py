"""A checked selector tree turned into nested closures, and the Selector the broker holds.

Compiling happens once per subscription; the closures run once per message per subscription,
so they fetch each value once, test the common types first, and fold constant parts away. No
string is ever passed to eval or exec, and evaluating never raises.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from operator import methodcaller

from .errors import InvalidSelector
from .lexer import WHITESPACE, tokenize
from .like import compile_like
from .nodes import (
    And,
    Arithmetic,
    Between,
    Comparison,
    Identifier,
    InList,
    IsNull,
    Like,
    Literal,
    Negate,
    Node,
    Not,
    NumberCheck,
    Or,
    Truth,
)
from .parser import parse
from .subject import SelectorSubject
from .values import Order, and3, divide, equal, is_number, not3, not_equal, or3, ordered

# A selector longer than this is refused: it bounds parse time and the work per message.
DEFAULT_MAX_LENGTH = 4096
# Parentheses nested deeper than this are refused, so hostile input never exhausts the stack.
DEFAULT_MAX_NESTING = 32

Evaluator = Callable[[SelectorSubject], object]

_ORDERINGS: dict[str, Order] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
# a < c  is  c > a: a constant on the left is moved to the right.
_MIRRORED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_ARITHMETIC: dict[str, Callable[[object, object], object]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": divide,
}


class Selector:
    """A compiled JMS message selector.

    ``matches`` is what the broker calls per message: TRUE selects, FALSE and UNKNOWN do not.
    ``evaluate`` gives the three-valued result (None for UNKNOWN). ``selects_everything`` is
    set for an empty selector, so a caller can skip the call altogether.
    """

    __slots__ = ("_evaluate", "selects_everything", "text")

    def __init__(self, text: str, evaluate: Evaluator, selects_everything: bool) -> None:
        self.text = text
        self.selects_everything = selects_everything
        self._evaluate = evaluate

    def matches(self, subject: SelectorSubject) -> bool:
        return self._evaluate(subject) is True

    def evaluate(self, subject: SelectorSubject) -> bool | None:
        result = self._evaluate(subject)
        return result if result is True or result is False else None

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def _select_all(subject: SelectorSubject) -> bool:
    return True


def compile_selector(
    text: str,
    *,
    max_length: int = DEFAULT_MAX_LENGTH,
    max_nesting: int = DEFAULT_MAX_NESTING,
) -> Selector:
    """Parse and compile ``text``; an empty or all-white-space selector selects everything.

    Raises :class:`InvalidSelector` (and nothing else) for any text that is not a selector.
    """
    if len(text) > max_length:
        raise InvalidSelector(
            f"the selector is {len(text)} characters long; at most {max_length} are allowed",
            max_length + 1,
        )
    if not text.strip(WHITESPACE):
        return Selector(text, _select_all, True)
    try:
        tree = parse(tokenize(text), max_nesting)
        return Selector(text, _compile(tree).evaluate, False)
    except RecursionError:
        # Only when the caller's own stack is nearly exhausted: the nesting cap keeps ours short.
        raise InvalidSelector("the selector is nested too deeply", 1) from None


class _Code:
    """A compiled node: its evaluator, and what specialised parents can use instead of it."""

    __slots__ = ("constant", "evaluate", "fetch_name", "is_constant")

    def __init__(
        self,
        evaluate: Evaluator,
        *,
        is_constant: bool = False,
        constant: object = None,
        fetch_name: str | None = None,
    ) -> None:
        self.evaluate = evaluate
        self.is_constant = is_constant
        self.constant = constant
        # Set for identifiers: the evaluator is then a C-level methodcaller, no Python frame.
        self.fetch_name = fetch_name


def _constant(value: object) -> _Code:
    def evaluate(subject: SelectorSubject) -> object:
        return value

    return _Code(evaluate, is_constant=True, constant=value)


class _NoSubject:
    """Stands in for a message while constant parts are folded; they never read it."""

    def get_header(self, name: str) -> object:
        return None

    def get_property(self, name: str) -> object:
        return None


_NO_SUBJECT = _NoSubject()


def _compile(node: Node) -> _Code:
    code = _COMPILERS[type(node)](node)
    if code.is_constant or code.fetch_name is not None:
        return code
    if _is_constant(node):
        return _constant(code.evaluate(_NO_SUBJECT))
    return code


def _is_constant(node: Node) -> bool:
    if isinstance(node, Literal):
        return True
    if isinstance(node, Identifier):
        return False
    if isinstance(node, (Negate, NumberCheck, Truth, Not, IsNull, InList, Like)):
        return _is_constant(node.operand)
    if isinstance(node, Arithmetic):
        return _is_constant(node.first) and all(_is_constant(x) for _, x in node.rest)
    if isinstance(node, Comparison):
        return _is_constant(node.left) and _is_constant(node.right)
    if isinstance(node, Between):
        return all(_is_constant(x) for x in (node.operand, node.low, node.high))
    return all(_is_constant(x) for x in node.operands)


def _literal(node: Node) -> _Code:
    assert isinstance(node, Literal)
    return _constant(node.value)


def _identifier(node: Node) -> _Code:
    assert isinstance(node, Identifier)
    method = "get_header" if node.header else "get_property"
    fetch: Evaluator = methodcaller(method, node.name)
    return _Code(fetch, fetch_name=node.name)


def _negate(node: Node) -> _Code:
    assert isinstance(node, Negate)
    operand = _compile(node.operand).evaluate

    def evaluate(subject: SelectorSubject) -> object:
        value = operand(subject)
        if is_number(value):
            return -value  # type: ignore[operator]
        return None

    return _Code(evaluate)


def _number_check(node: Node) -> _Code:
    assert isinstance(node, NumberCheck)
    operand = _compile(node.operand).evaluate

    def evaluate(subject: SelectorSubject) -> object:
        value = operand(subject)
        return value if is_number(value) else None

    return _Code(evaluate)


def _arithmetic(node: Node) -> _Code:
    assert isinstance(node, Arithmetic)
    first = _compile(node.first).evaluate
    rest = tuple((_ARITHMETIC[op], _compile(x).evaluate) for op, x in node.rest)

    def evaluate(subject: SelectorSubject) -> object:
        result = first(subject)
        kind = result.__class__
        if kind is not int and kind is not float and not is_number(result):
            return None  # NULL, or not a number: a string cannot be used in arithmetic
        try:
            for apply, operand in rest:
                value = operand(subject)
                kind = value.__class__
                if kind is not int and kind is not float and not is_number(value):
                    return None
                result = apply(result, value)
        except OverflowError:
            return None  # an integer beyond every double met a double
        return result

    return _Code(evaluate)


def _comparison(node: Node) -> _Code:
    assert isinstance(node, Comparison)
    left = _compile(node.left)
    right = _compile(node.right)
    op = node.operator
    if left.is_constant and not right.is_constant:
        left, right, op = right, left, _MIRRORED[op]
    fetch = left.evaluate
    if right.is_constant and right.constant is not None:
        return _Code(_against_constant(op, fetch, right.constant))
    other = right.evaluate
    if op == "=":
        return _Code(lambda subject: equal(fetch(subject), other(subject)))
    if op == "<>":
        return _Code(lambda subject: not_equal(fetch(subject), other(subject)))
    order = _ORDERINGS[op]
    return _Code(lambda subject: ordered(fetch(subject), other(subject), order))


def _against_constant(op: str, fetch: Evaluator, constant: object) -> Evaluator:
    """``x op constant``, the common shape (weight > 2500, color = 'blue'): when the value has
    the constant's own type the answer is one Python comparison."""
    constant_type = constant.__class__
    if op == "=":

        def evaluate_equal(subject: SelectorSubject) -> object:
            value = fetch(subject)
            if value.__class__ is constant_type:
                return value == constant
            return equal(value, constant)

        return evaluate_equal
    if op == "<>":

        def evaluate_not_equal(subject: SelectorSubject) -> object:
            value = fetch(subject)
            if value.__class__ is constant_type:
                return value != constant
            return not_equal(value, constant)

        return evaluate_not_equal
    order = _ORDERINGS[op]
    if constant_type is not int and constant_type is not float:
        return lambda subject: ordered(fetch(subject), constant, order)

    def evaluate_ordered(subject: SelectorSubject) -> object:
        value = fetch(subject)
        if value.__class__ is constant_type:
            return order(value, constant)
        return ordered(value, constant, order)

    return evaluate_ordered


def _between(node: Node) -> _Code:
    assert isinstance(node, Between)
    fetch = _compile(node.operand).evaluate
    low_code, high_code = _compile(node.low), _compile(node.high)
    low, high = low_code.evaluate, high_code.evaluate
    negated = node.negated
    bounds_type = low_code.constant.__class__
    if (
        low_code.is_constant
        and high_code.is_constant
        and bounds_type is high_code.constant.__class__
        and (bounds_type is int or bounds_type is float)
    ):
        low_value, high_value = low_code.constant, high_code.constant

        def evaluate_constant(subject: SelectorSubject) -> object:
            value = fetch(subject)
            if value.__class__ is bounds_type:
                if negated:
                    return value < low_value or value > high_value  # type: ignore[operator]
                return low_value <= value <= high_value  # type: ignore[operator]
            return _between_slow(value, low_value, high_value, negated)

        return _Code(evaluate_constant)

    def evaluate(subject: SelectorSubject) -> object:
        return _between_slow(fetch(subject), low(subject), high(subject), negated)

    return _Code(evaluate)


def _between_slow(value: object, low: object, high: object, negated: bool) -> bool | None:
    """x BETWEEN a AND b is x >= a AND x <= b; NOT BETWEEN is x < a OR x > b (spec 3.8.1.1)."""
    if negated:
        return or3(ordered(value, low, operator.lt), ordered(value, high, operator.gt))
    return and3(ordered(value, low, operator.ge), ordered(value, high, operator.le))


def _in_list(node: Node) -> _Code:
    assert isinstance(node, InList)
    fetch = _compile(node.operand).evaluate
    values = node.values
    negated = node.negated

    def evaluate(subject: SelectorSubject) -> object:
        value = fetch(subject)
        if value.__class__ is str:
            return (value in values) is not negated
        if value is None:
            return None
        if isinstance(value, str):
            return (str(value) in values) is not negated
        # x IN (...) is x = '...' OR ...: FALSE for a value that is not a string, and NOT IN
        # is NOT of that, TRUE, by the equivalences the spec gives.
        return negated

    return _Code(evaluate)


def _like(node: Node) -> _Code:
    assert isinstance(node, Like)
    fetch = _compile(node.operand).evaluate
    match = compile_like(node.pattern, node.escape)
    negated = node.negated

    def evaluate(subject: SelectorSubject) -> object:
        value = fetch(subject)
        if value.__class__ is str:
            return match(value) is not negated
        if value is None:
            return None
        if isinstance(value, str):
            return match(str(value)) is not negated
        return negated  # LIKE of a non-string is FALSE; NOT LIKE is NOT of it

    return _Code(evaluate)


def _is_null(node: Node) -> _Code:
    assert isinstance(node, IsNull)
    fetch = _compile(node.operand).evaluate
    if node.negated:
        return _Code(lambda subject: fetch(subject) is not None)
    return _Code(lambda subject: fetch(subject) is None)


def _truth(node: Node) -> _Code:
    assert isinstance(node, Truth)
    fetch = _compile(node.operand).evaluate

    def evaluate(subject: SelectorSubject) -> object:
        value = fetch(subject)
        return value if value is True or value is False else None

    return _Code(evaluate)


def _not(node: Node) -> _Code:
    assert isinstance(node, Not)
    operand = _compile(node.operand).evaluate

    def evaluate(subject: SelectorSubject) -> object:
        return not3(operand(subject))  # type: ignore[arg-type]

    return _Code(evaluate)


def _and(node: Node) -> _Code:
    assert isinstance(node, And)
    operands = _evaluators(node.operands)
    if len(operands) == 2:
        first, second = operands

        def evaluate_pair(subject: SelectorSubject) -> object:
            left = first(subject)
            if left is False:
                return False
            right = second(subject)
            if right is False:
                return False
            return True if left is True and right is True else None

        return _Code(evaluate_pair)

    def evaluate(subject: SelectorSubject) -> object:
        result: bool | None = True
        for operand in operands:
            value = operand(subject)
            if value is False:
                return False
            if value is None:
                result = None
        return result

    return _Code(evaluate)


def _or(node: Node) -> _Code:
    assert isinstance(node, Or)
    operands = _evaluators(node.operands)

    def evaluate(subject: SelectorSubject) -> object:
        result: bool | None = False
        for operand in operands:
            value = operand(subject)
            if value is True:
                return True
            if value is None:
                result = None
        return result

    return _Code(evaluate)


def _evaluators(nodes: Sequence[Node]) -> tuple[Evaluator, ...]:
    return tuple(_compile(node).evaluate for node in nodes)


_COMPILERS: dict[type, Callable[[Node], _Code]] = {
    Literal: _literal,
    Identifier: _identifier,
    Negate: _negate,
    NumberCheck: _number_check,
    Arithmetic: _arithmetic,
    Comparison: _comparison,
    Between: _between,
    InList: _in_list,
    Like: _like,
    IsNull: _is_null,
    Truth: _truth,
    Not: _not,
    And: _and,
    Or: _or,
}
