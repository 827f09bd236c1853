"""Temporary queues and topics (JMS TemporaryQueue/TemporaryTopic, AMQP dynamic nodes): named
by the broker, owned by the connection that asked, consumable only by it, deleted with it (or
sooner, when it deletes them). Sending to one that is gone fails (DESIGN.md section 5). Knows
no protocol; the owner is whatever string a front end uses for its connection.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from kittiwake.broker.destinations import Destination
from kittiwake.broker.queue_destinations import QueueDestinations

# Every temporary name starts with this; "$" keeps it out of users' names and MQTT wildcards.
PREFIX = "$temp/"


@dataclass(slots=True, frozen=True)
class Temporary:
    destination: Destination
    owner: str


class TemporaryDestinations:
    """The live temporary destinations of one broker."""

    def __init__(self, queues: QueueDestinations) -> None:
        self.queues = queues
        self.live: dict[Destination, Temporary] = {}
        self._numbers = itertools.count(1)

    def create(self, *, topic: bool, owner: str) -> Destination:
        name = f"{PREFIX}{'topic' if topic else 'queue'}/{next(self._numbers)}"
        destination = Destination.topic(name) if topic else Destination.queue(name)
        self.live[destination] = Temporary(destination, owner)
        if not topic:
            self.queues.queue(name)
        return destination

    @staticmethod
    def is_temporary(name: str) -> bool:
        return name.startswith(PREFIX)

    def exists(self, destination: Destination) -> bool:
        return destination in self.live

    def owner(self, destination: Destination) -> str | None:
        temporary = self.live.get(destination)
        return None if temporary is None else temporary.owner

    def delete(self, destination: Destination) -> bool:
        if self.live.pop(destination, None) is None:
            return False
        if not destination.is_topic:
            self.queues.delete(destination.name)
        return True

    def delete_owned(self, owner: str) -> int:
        """The owner's connection ended: every destination it made goes."""
        owned = [d for d, t in self.live.items() if t.owner == owner]
        for destination in owned:
            self.delete(destination)
        return len(owned)
