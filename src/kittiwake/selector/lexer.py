"""Selector text to tokens: literals, identifiers, reserved words and operators, with columns.

Follows the lexical rules of JMS 2.0 section 3.8.1.1 (Java literal and identifier syntax, Java
white space). It never evaluates anything and raises only InvalidSelector.
"""

from __future__ import annotations

import struct
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from .errors import InvalidSelector

# Java white space as the spec defines it for selectors: space, tab, form feed, line terminators.
WHITESPACE = " \t\f\n\r"

# Reserved words, matched case-insensitively, ASCII only: Python upper-cases some non-ASCII
# letters to ASCII ones (the dotless i becomes I), and such a name is no reserved word.
RESERVED_WORDS: frozenset[str] = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE", "NULL", "TRUE", "FALSE"}
)

# Character.isJavaIdentifierStart / isJavaIdentifierPart by Unicode category. The "identifier
# ignorable" characters Java also allows inside a name (format and control characters) are
# refused: they are invisible, and a name that hides one is a trap, not a property.
_START_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})
_PART_CATEGORIES = _START_CATEGORIES | {"Nd", "Mn", "Mc"}
_ASCII_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_$")
_ASCII_PART = _ASCII_START | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_OCTAL_DIGITS = frozenset("01234567")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")

# Digits beyond which an integer literal cannot be a Java long whatever its value; checked
# before converting so a hostile literal costs nothing (int() of huge decimals is quadratic).
_MAX_DECIMAL_DIGITS = 19
_MAX_HEX_DIGITS = 16
_MAX_OCTAL_DIGITS = 22
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
_FLOAT32 = struct.Struct("<f")


class TokenKind(Enum):
    IDENTIFIER = "identifier"
    RESERVED = "reserved word"
    STRING = "string"
    INTEGER = "integer"
    FLOAT = "float"
    OPERATOR = "operator"
    END = "end"


@dataclass(frozen=True, slots=True)
class Token:
    kind: TokenKind
    # IDENTIFIER: the name; RESERVED: the word in upper case; STRING: the decoded text;
    # INTEGER: a non-negative int (range-checked by the parser, after any unary minus);
    # FLOAT: the float; OPERATOR: the operator's text; END: "".
    value: str | int | float
    column: int
    text: str

    def describe(self) -> str:
        """The token as an error message names it."""
        if self.kind is TokenKind.END:
            return "the end of the selector"
        if self.kind is TokenKind.RESERVED:
            return f"reserved word '{self.text}'"
        shown = self.text if len(self.text) <= 30 else self.text[:27] + "..."
        if self.kind is TokenKind.STRING:
            return f"string literal {shown}"
        if self.kind in (TokenKind.INTEGER, TokenKind.FLOAT):
            return f"number {shown}"
        if self.kind is TokenKind.IDENTIFIER:
            return f"identifier {shown}"
        return f"'{shown}'"


# How the scanners emit a token (list.append of the token list being built).
_Append = Callable[[Token], None]


def is_identifier_start(char: str) -> bool:
    if char in _ASCII_START:
        return True
    return not char.isascii() and unicodedata.category(char) in _START_CATEGORIES


def is_identifier_part(char: str) -> bool:
    if char in _ASCII_PART:
        return True
    return not char.isascii() and unicodedata.category(char) in _PART_CATEGORIES


# Operators that are not JMS selector syntax but that people write, with what to write instead.
_WRONG_OPERATORS = {
    "==": "unknown operator '=='; write '=' for equality",
    "!=": "unknown operator '!='; write '<>' for not equal",
    "&&": "unknown operator '&&'; write AND",
    "||": "unknown operator '||'; write OR",
    "/*": "comments are not allowed in a selector",
}
_WRONG_CHARACTERS = {
    "%": "'%' is not an operator in a selector (arithmetic has +, -, * and / only); "
    "use '%' inside a LIKE pattern",
    '"': "double quotes are not allowed; string literals take single quotes",
    "!": "unknown operator '!'; write NOT",
}


def tokenize(text: str) -> list[Token]:
    """Split a selector into tokens, ending with one END token."""
    tokens: list[Token] = []
    append = tokens.append
    length = len(text)
    i = 0
    while i < length:
        char = text[i]
        if char in WHITESPACE:
            i += 1
            continue
        if char == "'":
            i = _string(text, i, append)
        elif char in _DIGITS or (
            char == "." and i + 1 < length and text[i + 1] in _DIGITS
        ):
            i = _number(text, i, append)
        elif is_identifier_start(char):
            end = i + 1
            while end < length and is_identifier_part(text[end]):
                end += 1
            word = text[i:end]
            if word.isascii() and word.upper() in RESERVED_WORDS:
                append(Token(TokenKind.RESERVED, word.upper(), i + 1, word))
            else:
                append(Token(TokenKind.IDENTIFIER, word, i + 1, word))
            i = end
        else:
            i = _operator(text, i, append)
    append(Token(TokenKind.END, "", length + 1, ""))
    return tokens


def _string(text: str, start: int, append: _Append) -> int:
    """A single-quoted literal; a quote inside is written twice."""
    parts: list[str] = []
    i = start + 1
    while True:
        quote = text.find("'", i)
        if quote < 0:
            raise InvalidSelector(
                "unterminated string literal (a quote inside a literal is written twice: '')",
                start + 1,
            )
        parts.append(text[i:quote])
        if text.startswith("'", quote + 1):
            parts.append("'")
            i = quote + 2
            continue
        end = quote + 1
        append(Token(TokenKind.STRING, "".join(parts), start + 1, text[start:end]))
        return end


def _operator(text: str, i: int, append: _Append) -> int:
    pair = text[i : i + 2]
    if pair in ("<=", ">=", "<>"):
        append(Token(TokenKind.OPERATOR, pair, i + 1, pair))
        return i + 2
    if pair in _WRONG_OPERATORS:
        raise InvalidSelector(_WRONG_OPERATORS[pair], i + 1)
    char = text[i]
    if char in "=<>+-*/(),":
        append(Token(TokenKind.OPERATOR, char, i + 1, char))
        return i + 1
    if char in _WRONG_CHARACTERS:
        raise InvalidSelector(_WRONG_CHARACTERS[char], i + 1)
    raise InvalidSelector(f"unexpected character {char!r}", i + 1)


def _number(text: str, start: int, append: _Append) -> int:
    """A Java integer or floating-point literal (decimal, octal or hex; L, F and D suffixes).

    Binary literals and underscores between digits are refused, as Artemis and Qpid refuse them.
    """
    length = len(text)
    i = start
    if text.startswith(("0x", "0X"), i):
        i = _digits(text, i + 2, _HEX_DIGITS)
        if i < length and text[i] in ".pP":
            return _hex_float(text, start, append)
        digits = text[start + 2 : i]
        if not digits:
            raise InvalidSelector("a hexadecimal literal needs digits after 0x", start + 1)
        if i < length and text[i] in "lL":
            i += 1
        _check_end(text, start, i)
        if len(digits.lstrip("0")) > _MAX_HEX_DIGITS:
            raise _out_of_range(start)
        append(Token(TokenKind.INTEGER, int(digits, 16), start + 1, text[start:i]))
        return i

    i = _digits(text, i, _DIGITS)
    whole = text[start:i]
    is_float = False
    if i < length and text[i] == ".":
        is_float = True
        i = _digits(text, i + 1, _DIGITS)
    if i < length and text[i] in "eE":
        is_float = True
        exponent = i + 1
        if exponent < length and text[exponent] in "+-":
            exponent += 1
        end = _digits(text, exponent, _DIGITS)
        if end == exponent:
            _check_end(text, start, i + 1)  # "1e" followed by letters: malformed number
            raise InvalidSelector("the exponent of a number needs digits", i + 1)
        i = end
    if i < length and text[i] in "fFdD":
        suffix = text[i]
        _check_end(text, start, i + 1)
        value = _float_value(text[start:i], suffix in "fF", start)
        append(Token(TokenKind.FLOAT, value, start + 1, text[start : i + 1]))
        return i + 1
    if is_float:
        _check_end(text, start, i)
        append(Token(TokenKind.FLOAT, _float_value(text[start:i], False, start), start + 1,
                     text[start:i]))
        return i
    if i < length and text[i] in "lL":
        i += 1
    _check_end(text, start, i)
    if len(whole) > 1 and whole[0] == "0":
        if not set(whole) <= _OCTAL_DIGITS:
            raise InvalidSelector(
                f"{whole} is not a valid octal literal (a leading 0 makes a number octal)",
                start + 1,
            )
        if len(whole.lstrip("0")) > _MAX_OCTAL_DIGITS:
            raise _out_of_range(start)
        value_int = int(whole, 8)
    else:
        if len(whole) > _MAX_DECIMAL_DIGITS + 1:
            raise _out_of_range(start)
        value_int = int(whole)
    append(Token(TokenKind.INTEGER, value_int, start + 1, text[start:i]))
    return i


def _hex_float(text: str, start: int, append: _Append) -> int:
    """A Java hexadecimal floating-point literal such as 0x1.8p3 (the p exponent is required)."""
    length = len(text)
    i = _digits(text, start + 2, _HEX_DIGITS)
    has_digits = i > start + 2
    if i < length and text[i] == ".":
        fraction = i + 1
        i = _digits(text, fraction, _HEX_DIGITS)
        has_digits = has_digits or i > fraction
    if not has_digits:
        raise InvalidSelector("a hexadecimal literal needs digits after 0x", start + 1)
    if i >= length or text[i] not in "pP":
        raise InvalidSelector(
            "a hexadecimal floating-point literal needs a binary exponent (p)", i + 1
        )
    exponent = i + 1
    if exponent < length and text[exponent] in "+-":
        exponent += 1
    end = _digits(text, exponent, _DIGITS)
    if end == exponent:
        raise InvalidSelector("the exponent of a number needs digits", i + 1)
    single = end < length and text[end] in "fF"
    stop = end + 1 if end < length and text[end] in "fFdD" else end
    _check_end(text, start, stop)
    try:
        value = float.fromhex(text[start:end])
    except OverflowError:
        raise _float_out_of_range(start) from None
    value = _checked_float(value, text[start:end], single, start)
    append(Token(TokenKind.FLOAT, value, start + 1, text[start:stop]))
    return stop


def _digits(text: str, i: int, allowed: frozenset[str]) -> int:
    length = len(text)
    while i < length and text[i] in allowed:
        i += 1
    return i


def _check_end(text: str, start: int, end: int) -> None:
    """A number must not run into a name: "12abc", "1_000", "0b101", "0x1g" are errors.

    A reserved word may follow directly ("a=1AND b=2"), as Java-style lexers read it.
    """
    if end < len(text) and (is_identifier_part(text[end]) or text[end] == "."):
        stop = end
        while stop < len(text) and (is_identifier_part(text[stop]) or text[stop] == "."):
            stop += 1
        word = text[end:stop]
        if word.isascii() and word.upper() in RESERVED_WORDS:
            return
        raise InvalidSelector(f"malformed number {text[start:stop]!r}", start + 1)


def _float_value(literal: str, single: bool, start: int) -> float:
    return _checked_float(float(literal), literal, single, start)


def _checked_float(value: float, literal: str, single: bool, start: int) -> float:
    """Java refuses a literal that rounds to infinity or, if it is not zero, to zero."""
    if single:
        try:
            value = _FLOAT32.unpack(_FLOAT32.pack(value))[0]
        except OverflowError:
            raise _float_out_of_range(start) from None
    if value in (float("inf"), float("-inf")):
        raise _float_out_of_range(start)
    if value == 0.0 and _has_nonzero_digit(literal):
        raise InvalidSelector(
            f"{literal} is too small for a {'float' if single else 'double'}", start + 1
        )
    return value


def _has_nonzero_digit(literal: str) -> bool:
    """Whether the significand (before any exponent) has a digit other than 0."""
    lowered = literal.lower()
    if lowered.startswith("0x"):
        significand = lowered[2:].split("p", 1)[0]
        return any(c not in "0." for c in significand)
    significand = lowered.split("e", 1)[0]
    return any(c in "123456789" for c in significand)


def _out_of_range(start: int) -> InvalidSelector:
    return InvalidSelector(
        "integer literal out of range (exact numerics are Java longs, "
        f"{LONG_MIN} to {LONG_MAX})",
        start + 1,
    )


def _float_out_of_range(start: int) -> InvalidSelector:
    return InvalidSelector("floating-point literal out of range", start + 1)
