"""Destinations: the names a producer sends to. A topic (publish/subscribe over the MQTT topic
tree; JMS topic names are MQTT topic names) or a queue (point to point); the two kinds are
separate namespaces, so a topic and a queue may share a name. Knows no protocol."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class DestinationKind(Enum):
    TOPIC = "topic"
    QUEUE = "queue"


@dataclass(frozen=True, slots=True)
class Destination:
    """A kind and a name; equal destinations are the same destination."""

    kind: DestinationKind
    name: str

    @classmethod
    def topic(cls, name: str) -> Destination:
        return cls(DestinationKind.TOPIC, name)

    @classmethod
    def queue(cls, name: str) -> Destination:
        return cls(DestinationKind.QUEUE, name)

    @property
    def is_topic(self) -> bool:
        return self.kind is DestinationKind.TOPIC

    def __str__(self) -> str:
        # The form dead letters carry as their original destination (topic://a/b, queue://q).
        return f"{self.kind.value}://{self.name}"
