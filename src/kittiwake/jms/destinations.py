"""JMS destinations: a queue or topic name with its kind, as the AMQP JMS mapping addresses it
(node capability and x-opt-jms-dest type). Value objects only; creates nothing on the broker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


@dataclass(frozen=True, slots=True)
class Destination:
    name: str
    # x-opt-jms-dest / x-opt-jms-reply-to value and the node capability Qpid JMS sends.
    type_code: ClassVar[int] = 0
    capability: ClassVar[str] = "queue"
    is_topic: ClassVar[bool] = False

    def __str__(self) -> str:
        return f"{'topic' if self.is_topic else 'queue'}://{self.name}"


@dataclass(frozen=True, slots=True)
class Queue(Destination):
    def get_queue_name(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Topic(Destination):
    type_code: ClassVar[int] = 1
    capability: ClassVar[str] = "topic"
    is_topic: ClassVar[bool] = True

    def get_topic_name(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True, eq=False)
class TemporaryQueue(Queue):
    """Lives as long as its connection, or until ``delete()``."""

    type_code: ClassVar[int] = 2
    capability: ClassVar[str] = "temporary-queue"
    deleter: Callable[[], Awaitable[None]] | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Destination) and other.name == self.name and not other.is_topic

    def __hash__(self) -> int:
        return hash(("queue", self.name))


@dataclass(frozen=True, slots=True, eq=False)
class TemporaryTopic(Topic):
    type_code: ClassVar[int] = 3
    capability: ClassVar[str] = "temporary-topic"
    deleter: Callable[[], Awaitable[None]] | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Destination) and other.name == self.name and other.is_topic

    def __hash__(self) -> int:
        return hash(("topic", self.name))


def destination_of(address: str | None, type_code: int | None) -> Destination | None:
    """The destination an incoming message names (its ``to`` or ``reply-to`` and the type)."""
    if address is None:
        return None
    for prefix, kind in (("queue://", Queue), ("topic://", Topic)):
        if address.startswith(prefix):
            return kind(address[len(prefix) :])
    if type_code == 1:
        return Topic(address)
    if type_code == 2:
        return TemporaryQueue(address)
    if type_code == 3:
        return TemporaryTopic(address)
    return Queue(address)
