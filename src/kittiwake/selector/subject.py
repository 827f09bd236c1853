"""What a selector reads from a message: header fields and typed properties, nothing more.

The broker adapts its own message and delivery state to :class:`SelectorSubject` so a selector
reads them in place; this module never imports the broker and never copies a message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

# The header fields a JMS 2.0 selector may name (spec 3.8.1.1), plus JMSXDeliveryCount, the
# JMS-defined property the broker itself keeps per delivery. Names are case-sensitive.
HEADER_FIELDS: frozenset[str] = frozenset(
    {
        "JMSDeliveryMode",
        "JMSPriority",
        "JMSMessageID",
        "JMSTimestamp",
        "JMSCorrelationID",
        "JMSType",
        "JMSXDeliveryCount",
    }
)

# Header fields whose selector type is known when the selector is compiled, so that misuse
# ("JMSPriority LIKE 'x'", "JMSType > 3") is refused instead of never matching.
NUMERIC_HEADER_FIELDS: frozenset[str] = frozenset(
    {"JMSPriority", "JMSTimestamp", "JMSXDeliveryCount"}
)
STRING_HEADER_FIELDS: frozenset[str] = HEADER_FIELDS - NUMERIC_HEADER_FIELDS


class SelectorSubject(Protocol):
    """A message as a selector sees it.

    Values are Python ``bool``, ``int`` (JMS byte, short, int and long), ``float`` (JMS float
    and double) or ``str``; ``None`` is SQL NULL. A JMS float property should be handed over as
    the ``float`` its 32-bit value widens to, as Java widens it, so ``1.1f`` differs from
    ``1.1``. A value of any other type matches no comparison and is no number.
    """

    def get_header(self, name: str) -> object:
        """The value of one of :data:`HEADER_FIELDS`, or None when the message has none.

        JMSPriority (0-9), JMSTimestamp (milliseconds since the epoch) and JMSXDeliveryCount
        (1 on first delivery) are ints; JMSDeliveryMode is the string ``'PERSISTENT'`` or
        ``'NON_PERSISTENT'``; JMSMessageID, JMSCorrelationID and JMSType are strings or None.
        """
        ...

    def get_property(self, name: str) -> object:
        """The typed application (or JMSX/JMS_) property ``name``, None when absent."""
        ...


class MappingSubject:
    """A subject over two plain mappings: for tests, tools, and callers that hold dicts."""

    __slots__ = ("headers", "properties")

    def __init__(
        self,
        properties: Mapping[str, object] | None = None,
        headers: Mapping[str, object] | None = None,
    ) -> None:
        self.properties: Mapping[str, object] = properties if properties is not None else {}
        self.headers: Mapping[str, object] = headers if headers is not None else {}

    def get_header(self, name: str) -> object:
        return self.headers.get(name)

    def get_property(self, name: str) -> object:
        return self.properties.get(name)
