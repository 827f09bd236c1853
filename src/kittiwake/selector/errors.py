"""The one error a selector can raise: the text is not a selector Kittiwake will run.

Parsing and compiling raise nothing else, whatever the input; evaluation raises nothing at all.
"""

from __future__ import annotations


class InvalidSelector(ValueError):
    """A selector refused when it is presented, with where and why.

    ``column`` is 1-based and counts characters of the selector text (a column one past the end
    means the text ended too early). ``reason`` is a sentence a user can act on; ``str()`` gives
    ``"<reason> at column <n>"``, which is what a front end should send back.
    """

    def __init__(self, reason: str, column: int) -> None:
        super().__init__(f"{reason} at column {column}")
        self.reason = reason
        self.column = column
