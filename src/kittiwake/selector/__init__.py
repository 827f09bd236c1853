"""JMS message selectors: the SQL-92 subset of JMS 2.0, parsed once, evaluated per message.

Pure code: no I/O, no broker imports. The broker hands each message over through the small
:class:`SelectorSubject` protocol; the semantics and limits are described in README.md.
"""

from .compiler import DEFAULT_MAX_LENGTH, DEFAULT_MAX_NESTING, Selector, compile_selector
from .errors import InvalidSelector
from .subject import HEADER_FIELDS, MappingSubject, SelectorSubject

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_MAX_NESTING",
    "HEADER_FIELDS",
    "InvalidSelector",
    "MappingSubject",
    "Selector",
    "SelectorSubject",
    "compile_selector",
]
