"""The parsed selector: a small typed tree the parser builds and the compiler turns into code.

Nodes are plain data. Chains of AND, OR, + - and * / are n-ary nodes, never deep left-leaning
trees, so neither compiling nor evaluating recurses further than the parentheses nest.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# Every node's ``column`` is where its expression starts in the text (1-based), so an error
# about a whole operand points at its beginning.


class Kind(Enum):
    """What a node yields, as far as the selector text alone can tell."""

    BOOLEAN = "a condition"
    NUMBER = "a number"
    STRING = "a string"
    # A property: its type is known only when a message arrives.
    ANY = "a property"


@dataclass(frozen=True, slots=True)
class Literal:
    value: bool | int | float | str
    kind: Kind
    column: int


@dataclass(frozen=True, slots=True)
class Identifier:
    name: str
    # A header field (read with get_header) rather than a property (get_property).
    header: bool
    kind: Kind
    column: int


@dataclass(frozen=True, slots=True)
class Negate:
    """Unary minus; unary plus is :class:`NumberCheck` (it changes nothing but the type)."""

    operand: Node
    column: int
    kind: Kind = Kind.NUMBER


@dataclass(frozen=True, slots=True)
class NumberCheck:
    """Unary plus: the operand itself when it is a number, NULL otherwise."""

    operand: Node
    column: int
    kind: Kind = Kind.NUMBER


@dataclass(frozen=True, slots=True)
class Arithmetic:
    """``first op1 x1 op2 x2 ...`` left to right, all ops of one precedence level."""

    first: Node
    rest: tuple[tuple[str, Node], ...]
    column: int
    kind: Kind = Kind.NUMBER


@dataclass(frozen=True, slots=True)
class Comparison:
    operator: str  # one of = <> < <= > >=
    left: Node
    right: Node
    column: int
    kind: Kind = Kind.BOOLEAN


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node
    negated: bool
    column: int
    kind: Kind = Kind.BOOLEAN


@dataclass(frozen=True, slots=True)
class InList:
    operand: Node
    values: frozenset[str]
    negated: bool
    column: int
    kind: Kind = Kind.BOOLEAN


@dataclass(frozen=True, slots=True)
class Like:
    operand: Node
    pattern: str
    escape: str | None
    negated: bool
    column: int
    kind: Kind = Kind.BOOLEAN


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    negated: bool
    column: int
    kind: Kind = Kind.BOOLEAN


@dataclass(frozen=True, slots=True)
class Truth:
    """A property used as a condition: its value when boolean, UNKNOWN otherwise."""

    operand: Node
    column: int
    kind: Kind = Kind.BOOLEAN


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node
    column: int
    kind: Kind = Kind.BOOLEAN


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Node, ...]
    column: int
    kind: Kind = Kind.BOOLEAN


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Node, ...]
    column: int
    kind: Kind = Kind.BOOLEAN


Node = (
    Literal
    | Identifier
    | Negate
    | NumberCheck
    | Arithmetic
    | Comparison
    | Between
    | InList
    | Like
    | IsNull
    | Truth
    | Not
    | And
    | Or
)
