"""JMS destinations: a queue or topic name with its kind, as the AMQP JMS mapping addresses it
(node capability and x-opt-jms-dest type). Value objects only; creates nothing on the broker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from kittiwake.jms.exceptions import IllegalStateException


class TemporaryLifetime(Protocol):
    """The connection side of a temporary destination this process created (kittiwake.jms.aio
    makes it): deletes it, as JMS says, only while no consumer of its connection uses it."""

    async def delete_async(self) -> None: ...

    def delete(self) -> None: ...


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


class TemporaryDestination:
    """JMS's ``delete()`` for temporary queues and topics: they live as long as the connection
    that created them (a reconnection makes a new connection: they are gone with the old one),
    or until deleted. ``delete()`` is the blocking call, ``await delete_async()`` the asyncio
    one. Refused (IllegalStateException) while a consumer of the connection uses it, after
    the connection closed, and on a copy received in JMSReplyTo (only its creator deletes it);
    deleting it twice does nothing."""

    __slots__ = ()
    lifetime: TemporaryLifetime | None

    def delete(self) -> None:
        self._lifetime().delete()

    async def delete_async(self) -> None:
        await self._lifetime().delete_async()

    def _lifetime(self) -> TemporaryLifetime:
        if self.lifetime is None:
            raise IllegalStateException("only the connection that created it deletes it")
        return self.lifetime


@dataclass(frozen=True, slots=True, eq=False)
class TemporaryQueue(TemporaryDestination, Queue):
    type_code: ClassVar[int] = 2
    capability: ClassVar[str] = "temporary-queue"
    lifetime: TemporaryLifetime | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Destination) and other.name == self.name and not other.is_topic

    def __hash__(self) -> int:
        return hash(("queue", self.name))


@dataclass(frozen=True, slots=True, eq=False)
class TemporaryTopic(TemporaryDestination, Topic):
    type_code: ClassVar[int] = 3
    capability: ClassVar[str] = "temporary-topic"
    lifetime: TemporaryLifetime | None = None

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
