"""LIKE patterns ('_' one character, '%' any run, an optional escape) as fast string matchers.

A pattern is split at its '%' wildcards into fixed-length segments matched left to right with
``str.find`` (or a quantifier-free regular expression when a segment holds '_'), so a hostile
pattern such as '%a%a%a%a%b' costs at most one scan per segment, never exponential backtracking.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass


class LikePatternError(ValueError):
    """The pattern or its escape is malformed; the parser reports it with the column."""


@dataclass(frozen=True, slots=True)
class _Segment:
    """Characters between two '%': plain text, or a regex of literals and '.' when '_' occurs."""

    length: int
    text: str | None
    regex: re.Pattern[str] | None

    def matches_at(self, value: str, position: int) -> bool:
        if self.text is not None:
            return value.startswith(self.text, position)
        assert self.regex is not None
        return self.regex.match(value, position) is not None

    def find(self, value: str, start: int, end: int) -> int:
        if self.text is not None:
            return value.find(self.text, start, end)
        assert self.regex is not None
        found = self.regex.search(value, start, end)
        return -1 if found is None else found.start()


def compile_like(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A function telling whether a string matches ``pattern`` as SQL LIKE defines it.

    The escape character may precede '_', '%' or itself; anything else after it, or an escape
    ending the pattern, is an error (SQL-92 says so; silently dropping it hides a mistake).
    """
    if escape is not None and len(escape) != 1:
        raise LikePatternError("ESCAPE takes a string literal of exactly one character")
    pieces: list[list[str | None]] = [[]]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == escape:
            if i + 1 == len(pattern):
                raise LikePatternError(
                    f"the LIKE pattern ends with its escape character {escape!r}"
                )
            escaped = pattern[i + 1]
            if escaped not in ("%", "_", escape):
                raise LikePatternError(
                    f"in a LIKE pattern the escape character {escape!r} may only precede "
                    f"'%', '_' or itself, not {escaped!r}"
                )
            pieces[-1].append(escaped)
            i += 2
            continue
        if char == "%":
            pieces.append([])
        elif char == "_":
            pieces[-1].append(None)
        else:
            pieces[-1].append(char)
        i += 1
    segments = [_segment(piece) for piece in pieces]
    if len(segments) == 1:
        return _whole(segments[0])
    return _with_wildcards(segments[0], [s for s in segments[1:-1] if s.length], segments[-1])


def _segment(piece: list[str | None]) -> _Segment:
    if None not in piece:
        return _Segment(len(piece), "".join(c for c in piece if c is not None), None)
    source = "".join("." if c is None else re.escape(c) for c in piece)
    return _Segment(len(piece), None, re.compile(source, re.DOTALL))


def _whole(segment: _Segment) -> Callable[[str], bool]:
    text = segment.text
    if text is not None:
        return text.__eq__
    length = segment.length
    regex = segment.regex
    assert regex is not None
    fullmatch = regex.fullmatch

    def match(value: str) -> bool:
        return len(value) == length and fullmatch(value) is not None

    return match


def _with_wildcards(
    head: _Segment, middle: list[_Segment], tail: _Segment
) -> Callable[[str], bool]:
    if not middle and head.regex is None and tail.regex is None:
        prefix, suffix = head.text or "", tail.text or ""
        if not suffix:
            return lambda value: value.startswith(prefix)
        if not prefix:
            return lambda value: value.endswith(suffix)
        least = len(prefix) + len(suffix)
        return lambda value: (
            len(value) >= least and value.startswith(prefix) and value.endswith(suffix)
        )
    if not head.length and not tail.length and len(middle) == 1 and middle[0].text is not None:
        needle = middle[0].text
        return lambda value: needle in value
    least = head.length + tail.length + sum(s.length for s in middle)

    def match(value: str) -> bool:
        end = len(value)
        if end < least:
            return False
        if head.length and not head.matches_at(value, 0):
            return False
        if tail.length:
            end -= tail.length
            if not tail.matches_at(value, end):
                return False
        start = head.length
        # Leftmost placement of each segment is always safe: '%' between them absorbs the rest.
        for segment in middle:
            found = segment.find(value, start, end)
            if found < 0:
                return False
            start = found + segment.length
        return True

    return match
