"""Many publications as columns: a fenced write's rows (the Spark sink's unit) as they arrive,
one list per field, instead of one :class:`~kittiwake.broker.message.Message` per row.

A unit is mostly rows nobody subscribes to: their only work is a journal row, which the store
writes from these columns without a message object (``Store.journal_rows``). Only the rows a
session or group receives, or that are retained, become messages (:meth:`message`). Knows no
protocol and no store format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kittiwake.broker.message import Message, MQTT5Fields

UserProperties = list[tuple[str, str]]


@dataclass(slots=True)
class PublicationRows:
    """Row ``i`` is one publication: ``topics[i]``, ``payloads[i]`` at ``qos[i]`` (1 and 2
    persistent, as MQTT's are), retained if ``retain[i]``, with MQTT 5 user properties
    ``user_properties[i]`` (None: none). The flags summarise the columns so the common unit
    (one QoS, nothing retained, no properties) is taken whole."""

    topics: list[str]
    payloads: list[bytes]
    qos: list[int]
    retain: list[bool]
    # None when no row has properties (the common case: nothing per row to look at).
    user_properties: list[UserProperties | None] | None = None
    # The QoS every row has, or None when they differ.
    uniform_qos: int | None = None
    # Whether any row is retained.
    any_retained: bool = False
    # The topics of the rows, each once.
    distinct_topics: Sequence[str] = ()

    def __len__(self) -> int:
        return len(self.topics)

    @classmethod
    def of(
        cls,
        topics: list[str],
        payloads: list[bytes],
        qos: list[int],
        retain: list[bool],
        user_properties: list[UserProperties | None] | None = None,
    ) -> PublicationRows:
        """Rows from plain columns, their summary worked out (tests, small units)."""
        if user_properties is not None and not any(user_properties):
            user_properties = None
        levels = set(qos)
        return cls(
            topics,
            payloads,
            qos,
            retain,
            user_properties,
            next(iter(levels)) if len(levels) == 1 else None,
            any(retain),
            list(dict.fromkeys(topics)),
        )

    @classmethod
    def of_messages(cls, messages: Sequence[Message]) -> PublicationRows:
        """The rows of messages that carry only what a row can (tests: the two paths agree)."""
        return cls.of(
            [m.topic for m in messages],
            [m.payload for m in messages],
            [m.qos for m in messages],
            [m.retain for m in messages],
            [m.mqtt5.user_properties if m.mqtt5 else None for m in messages],
        )

    def message(self, index: int) -> Message:
        """Row ``index`` as the message the publish path takes."""
        qos = self.qos[index]
        pairs = self.user_properties[index] if self.user_properties is not None else None
        return Message(
            self.topics[index],
            self.payloads[index],
            qos,
            self.retain[index],
            qos > 0,
            mqtt5=MQTT5Fields(user_properties=list(pairs)) if pairs else None,
        )

    def messages(self) -> list[Message]:
        return [self.message(index) for index in range(len(self.topics))]
