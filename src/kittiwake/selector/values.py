"""The JMS rules for selector values: NULL, like types, numeric promotion, three-valued logic.

Every function here takes already-fetched values and returns a value, True, False or None
(NULL / UNKNOWN); none of them raises, whatever it is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Value = object
# True, False, or None for UNKNOWN.
Truth = bool | None
# operator.lt and friends; Any because they accept whatever the values turn out to be.
Order = Callable[[Any, Any], bool]


def is_number(value: object) -> bool:
    """bool is an int in Python but never a number in a selector."""
    kind = value.__class__
    if kind is int or kind is float:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _promoted(left: object, right: object, compare: Order) -> bool:
    """Java binary numeric promotion: a long meeting a double is compared as a double."""
    if isinstance(left, float) is not isinstance(right, float):
        try:
            return compare(float(left), float(right))  # type: ignore[arg-type]
        except OverflowError:
            pass  # an integer beyond every double (from exact arithmetic): compare exactly
    return compare(left, right)


def equal(left: object, right: object) -> Truth:
    """``=``: UNKNOWN with a NULL, FALSE for values of unlike types (spec 3.8.1.1)."""
    if left is None or right is None:
        return None
    kind = left.__class__
    if kind is right.__class__ and (kind is str or kind is int or kind is float or kind is bool):
        return left == right
    if is_number(left):
        return is_number(right) and _promoted(left, right, _eq)
    if isinstance(left, str):
        return isinstance(right, str) and str(left) == str(right)
    if left is True or left is False:
        return left is right
    return False


def not_equal(left: object, right: object) -> Truth:
    """``<>``: the comparison of unlike types is FALSE here too, as the spec says of any
    comparison (Artemis computes NOT (a = b) instead, which is TRUE for unlike types)."""
    if left is None or right is None:
        return None
    kind = left.__class__
    if kind is right.__class__ and (kind is str or kind is int or kind is float or kind is bool):
        return left != right
    if is_number(left):
        return is_number(right) and _promoted(left, right, _ne)
    if isinstance(left, str):
        return isinstance(right, str) and str(left) != str(right)
    if left is True or left is False:
        return (right is True or right is False) and left is not right
    return False


def ordered(left: object, right: object, compare: Order) -> Truth:
    """``< <= > >=``: numbers only; strings and booleans compare with = and <> alone."""
    if left is None or right is None:
        return None
    kind = left.__class__
    if kind is right.__class__ and (kind is int or kind is float):
        return compare(left, right)
    if is_number(left) and is_number(right):
        return _promoted(left, right, compare)
    return False


def _eq(left: object, right: object) -> bool:
    return left == right


def _ne(left: object, right: object) -> bool:
    return left != right


def divide(left: object, right: object) -> float:
    """``/`` always divides as doubles, as Artemis, Qpid and ActiveMQ do: 7 / 2 is 3.5, and
    dividing by zero gives an IEEE 754 infinity or NaN instead of an error."""
    numerator = float(left)  # type: ignore[arg-type]
    denominator = float(right)  # type: ignore[arg-type]
    if denominator == 0.0:
        if numerator == 0.0 or math.isnan(numerator):
            return math.nan
        return math.copysign(math.inf, numerator) * math.copysign(1.0, denominator)
    return numerator / denominator


def and3(left: Truth, right: Truth) -> Truth:
    if left is False or right is False:
        return False
    if left is None or right is None:
        return None
    return True


def or3(left: Truth, right: Truth) -> Truth:
    if left is True or right is True:
        return True
    if left is None or right is None:
        return None
    return False


def not3(value: Truth) -> Truth:
    return None if value is None else not value
