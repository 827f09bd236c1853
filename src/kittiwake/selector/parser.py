"""Tokens to a checked syntax tree: the JMS 2.0 selector grammar by recursive descent.

It refuses, with a column and a reason, everything the grammar or the type rules make
meaningless; it never evaluates a selector. Only parentheses recurse, and their depth is capped.

    selector       = or_expr END
    or_expr        = and_expr { OR and_expr }
    and_expr       = not_expr { AND not_expr }
    not_expr       = { NOT } predicate
    predicate      = additive [ comparison_op additive
                              | [NOT] BETWEEN additive AND additive
                              | [NOT] LIKE string [ESCAPE string]
                              | [NOT] IN '(' string { ',' string } ')'
                              | IS [NOT] NULL ]
    additive       = multiplicative { ('+' | '-') multiplicative }
    multiplicative = unary { ('*' | '/') unary }
    unary          = { '+' | '-' } primary
    primary        = string | number | TRUE | FALSE | identifier | '(' or_expr ')'
"""

from __future__ import annotations

from .errors import InvalidSelector
from .lexer import LONG_MAX, LONG_MIN, Token, TokenKind
from .like import LikePatternError, compile_like
from .nodes import (
    And,
    Arithmetic,
    Between,
    Comparison,
    Identifier,
    InList,
    IsNull,
    Kind,
    Like,
    Literal,
    Negate,
    Node,
    Not,
    NumberCheck,
    Or,
    Truth,
)
from .subject import HEADER_FIELDS, NUMERIC_HEADER_FIELDS

_COMPARISON_OPERATORS = frozenset({"=", "<>", "<", "<=", ">", ">="})
_HEADER_LIST = ", ".join(sorted(HEADER_FIELDS))


def parse(tokens: list[Token], max_nesting: int) -> Node:
    """The condition a token list (ending with END) spells, type-checked."""
    return _Parser(tokens, max_nesting).selector()


class _Parser:
    __slots__ = ("_depth", "_max_nesting", "_position", "_tokens")

    def __init__(self, tokens: list[Token], max_nesting: int) -> None:
        self._tokens = tokens
        self._position = 0
        self._depth = 0
        self._max_nesting = max_nesting

    # -- token helpers ------------------------------------------------------------------------

    def _peek(self) -> Token:
        return self._tokens[self._position]

    def _advance(self) -> Token:
        token = self._tokens[self._position]
        if token.kind is not TokenKind.END:
            self._position += 1
        return token

    def _at_word(self, word: str) -> bool:
        token = self._tokens[self._position]
        return token.kind is TokenKind.RESERVED and token.value == word

    def _at_operator(self, *operators: str) -> bool:
        token = self._tokens[self._position]
        return token.kind is TokenKind.OPERATOR and token.value in operators

    def _expect_word(self, word: str, reason: str) -> Token:
        if not self._at_word(word):
            raise self._unexpected(reason)
        return self._advance()

    def _expect_operator(self, operator: str, reason: str) -> Token:
        if not self._at_operator(operator):
            raise self._unexpected(reason)
        return self._advance()

    def _expect_string(self, reason: str) -> Token:
        if self._peek().kind is not TokenKind.STRING:
            raise self._unexpected(reason)
        return self._advance()

    def _unexpected(self, expected: str) -> InvalidSelector:
        token = self._peek()
        return InvalidSelector(f"{expected}, found {token.describe()}", token.column)

    # -- grammar ------------------------------------------------------------------------------

    def selector(self) -> Node:
        node = self._or()
        token = self._peek()
        if token.kind is not TokenKind.END:
            if token.kind is TokenKind.OPERATOR and token.value == ")":
                raise InvalidSelector("')' without a matching '('", token.column)
            raise self._unexpected("expected AND, OR or the end of the selector")
        return _condition(node, "a selector")

    def _or(self) -> Node:
        operands = [self._and()]
        while self._at_word("OR"):
            self._advance()
            operands.append(self._and())
        if len(operands) == 1:
            return operands[0]
        conditions = tuple(_condition(node, "an operand of OR") for node in operands)
        return Or(conditions, operands[0].column)

    def _and(self) -> Node:
        operands = [self._not()]
        while self._at_word("AND"):
            self._advance()
            operands.append(self._not())
        if len(operands) == 1:
            return operands[0]
        conditions = tuple(_condition(node, "an operand of AND") for node in operands)
        return And(conditions, operands[0].column)

    def _not(self) -> Node:
        # A run of NOTs is read in a loop (NOT NOT x is x as a condition), so it costs no stack.
        nots = 0
        column = self._peek().column
        while self._at_word("NOT"):
            self._advance()
            nots += 1
        node = self._predicate()
        if not nots:
            return node
        condition = _condition(node, "the operand of NOT")
        return Not(condition, column) if nots % 2 else condition

    def _predicate(self) -> Node:
        left = self._additive()
        token = self._peek()
        if token.kind is TokenKind.OPERATOR and token.value in _COMPARISON_OPERATORS:
            self._advance()
            right = self._additive()
            node = _comparison(str(token.value), left, right, token.column)
            if self._at_operator(*_COMPARISON_OPERATORS):
                raise InvalidSelector(
                    "comparisons cannot be chained; join them with AND", self._peek().column
                )
            return node
        negated = False
        if self._at_word("NOT"):
            following = self._tokens[self._position + 1]
            if following.kind is TokenKind.RESERVED and following.value in ("BETWEEN", "LIKE",
                                                                              "IN"):
                self._advance()
                negated = True
            else:
                raise InvalidSelector(
                    "NOT here must be followed by BETWEEN, LIKE or IN "
                    "(to negate a condition, put NOT before it)",
                    self._peek().column,
                )
        if self._at_word("BETWEEN"):
            return self._between(left, negated)
        if self._at_word("LIKE"):
            return self._like(left, negated)
        if self._at_word("IN"):
            return self._in(left, negated)
        if self._at_word("IS"):
            self._advance()
            is_not = False
            if self._at_word("NOT"):
                self._advance()
                is_not = True
            self._expect_word("NULL", "expected NULL after IS NOT" if is_not else
                              "expected NULL or NOT NULL after IS")
            return IsNull(left, is_not, left.column)
        return left

    def _between(self, operand: Node, negated: bool) -> Node:
        self._advance()
        _require_number(operand, "BETWEEN")
        low = self._additive()
        _require_number(low, "BETWEEN")
        self._expect_word("AND", "expected AND between the bounds of BETWEEN")
        high = self._additive()
        _require_number(high, "BETWEEN")
        return Between(operand, low, high, negated, operand.column)

    def _like(self, operand: Node, negated: bool) -> Node:
        self._advance()
        _require_string(operand, "LIKE")
        pattern = self._expect_string("LIKE takes a string literal pattern, as in name LIKE 'a%'")
        escape: Token | None = None
        if self._at_word("ESCAPE"):
            self._advance()
            escape = self._expect_string(
                "ESCAPE takes a one-character string literal, as in ESCAPE '\\'"
            )
            if len(str(escape.value)) != 1:
                raise InvalidSelector(
                    "ESCAPE takes a string literal of exactly one character", escape.column
                )
        escape_char = None if escape is None else str(escape.value)
        try:
            compile_like(str(pattern.value), escape_char)
        except LikePatternError as error:
            raise InvalidSelector(str(error), pattern.column) from None
        return Like(operand, str(pattern.value), escape_char, negated, operand.column)

    def _in(self, operand: Node, negated: bool) -> Node:
        self._advance()
        _require_string(operand, "IN")
        self._expect_operator("(", "expected '(' after IN")
        reason = "IN takes a list of string literals, as in Country IN ('UK', 'US')"
        values = [str(self._expect_string(reason).value)]
        while self._at_operator(","):
            self._advance()
            values.append(str(self._expect_string(reason).value))
        self._expect_operator(")", "expected ',' or ')' in the IN list")
        return InList(operand, frozenset(values), negated, operand.column)

    def _additive(self) -> Node:
        first = self._multiplicative()
        rest: list[tuple[str, Node]] = []
        while self._at_operator("+", "-"):
            operator = str(self._advance().value)
            rest.append((operator, self._multiplicative()))
        return _arithmetic(first, rest)

    def _multiplicative(self) -> Node:
        first = self._unary()
        rest: list[tuple[str, Node]] = []
        while self._at_operator("*", "/"):
            operator = str(self._advance().value)
            rest.append((operator, self._unary()))
        return _arithmetic(first, rest)

    def _unary(self) -> Node:
        # Signs are read in a loop, and folded into a number that follows them, so that
        # -9223372036854775808 (Long.MIN_VALUE) is a literal, as in Java.
        column = self._peek().column
        negations = 0
        signed = False
        while self._at_operator("+", "-"):
            signed = True
            if self._advance().value == "-":
                negations += 1
        token = self._peek()
        node = self._primary()
        if isinstance(node, Literal) and node.kind is Kind.NUMBER:
            value = node.value
            assert isinstance(value, (int, float))
            if negations % 2:
                value = -value
            if token.kind is TokenKind.INTEGER and not LONG_MIN <= value <= LONG_MAX:
                raise InvalidSelector(
                    "integer literal out of range (exact numerics are Java longs, "
                    f"{LONG_MIN} to {LONG_MAX})",
                    column,
                )
            return Literal(value, Kind.NUMBER, column) if signed else node
        if not signed:
            return node
        _require_number(node, "unary + and -")
        return Negate(node, column) if negations % 2 else NumberCheck(node, column)

    def _primary(self) -> Node:
        token = self._peek()
        kind = token.kind
        if kind is TokenKind.STRING:
            self._advance()
            return Literal(str(token.value), Kind.STRING, token.column)
        if kind is TokenKind.INTEGER or kind is TokenKind.FLOAT:
            self._advance()
            return Literal(token.value, Kind.NUMBER, token.column)
        if kind is TokenKind.IDENTIFIER:
            self._advance()
            return _identifier(str(token.value), token.column)
        if kind is TokenKind.RESERVED:
            if token.value in ("TRUE", "FALSE"):
                self._advance()
                return Literal(token.value == "TRUE", Kind.BOOLEAN, token.column)
            if token.value == "NULL":
                raise InvalidSelector(
                    "NULL can only be tested with IS NULL or IS NOT NULL", token.column
                )
            raise InvalidSelector(
                f"expected a value, found {token.describe()} "
                "(reserved words cannot be used as property names)",
                token.column,
            )
        if kind is TokenKind.OPERATOR and token.value == "(":
            self._advance()
            self._depth += 1
            if self._depth > self._max_nesting:
                raise InvalidSelector(
                    f"parentheses nested deeper than {self._max_nesting} levels", token.column
                )
            node = self._or()
            if not self._at_operator(")"):
                raise self._unexpected(f"expected ')' to match the '(' in column {token.column}")
            self._advance()
            self._depth -= 1
            return node
        raise self._unexpected("expected a value")


# -- checks on what the text alone tells -------------------------------------------------------


def _identifier(name: str, column: int) -> Identifier:
    if name in HEADER_FIELDS:
        kind = Kind.NUMBER if name in NUMERIC_HEADER_FIELDS else Kind.STRING
        return Identifier(name, True, kind, column)
    if name.startswith("JMS") and not name.startswith(("JMSX", "JMS_")):
        raise InvalidSelector(
            f"{name} cannot be used in a selector: the header fields a selector may name are "
            f"{_HEADER_LIST}; other names starting with JMS are reserved",
            column,
        )
    return Identifier(name, False, Kind.ANY, column)


def _condition(node: Node, role: str) -> Node:
    """A node used where a condition belongs: conditions pass, a property is tested for TRUE."""
    if node.kind is Kind.BOOLEAN:
        return node
    if node.kind is Kind.ANY:
        return Truth(node, node.column)
    raise InvalidSelector(
        f"{role} must be a condition (a comparison or a boolean property), not {node.kind.value}",
        node.column,
    )


def _require_number(node: Node, operation: str) -> None:
    if node.kind is not Kind.NUMBER and node.kind is not Kind.ANY:
        raise InvalidSelector(f"{operation} needs numbers, not {node.kind.value}", node.column)


def _require_string(node: Node, operation: str) -> None:
    if node.kind is not Kind.STRING and node.kind is not Kind.ANY:
        raise InvalidSelector(f"{operation} needs a string, not {node.kind.value}", node.column)


def _arithmetic(first: Node, rest: list[tuple[str, Node]]) -> Node:
    if not rest:
        return first
    _require_number(first, f"'{rest[0][0]}'")
    for operator, operand in rest:
        _require_number(operand, f"'{operator}'")
    return Arithmetic(first, tuple(rest), first.column)


def _comparison(operator: str, left: Node, right: Node, column: int) -> Node:
    if operator in ("=", "<>"):
        if Kind.ANY not in (left.kind, right.kind) and left.kind is not right.kind:
            raise InvalidSelector(
                f"'{operator}' compares {left.kind.value} with {right.kind.value}; values of "
                "different types are never equal",
                column,
            )
    else:
        for operand in (left, right):
            if operand.kind is Kind.STRING or operand.kind is Kind.BOOLEAN:
                raise InvalidSelector(
                    f"'{operator}' compares numbers only; strings and booleans can only be "
                    "compared with = and <>",
                    operand.column,
                )
    return Comparison(operator, left, right, left.column)
