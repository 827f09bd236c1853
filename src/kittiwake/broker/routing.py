"""Routing: from a destination to the queues that get a copy. Bindings tie topic filters to
queues; queues are found by name. Knows no protocol: a protocol's rule for combining several
bindings of one queue (MQTT: overlapping subscriptions give one copy) is passed in, never here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kittiwake.broker.destinations import Destination
from kittiwake.broker.message import Message
from kittiwake.broker.queues import Queue, QueuedMessage
from kittiwake.broker.topic_tree import TopicTree

# Whether a message passes a binding's selector (JMS message selectors, once selector/ exists).
Selector = Callable[[Message], bool]
# Builds the one copy a queue gets from the bindings of that queue a message matched.
CopyRule = Callable[[Message, Sequence["Binding"]], QueuedMessage | None]


@dataclass(slots=True, eq=False)
class Binding:
    """A filter from the topic namespace to one queue: a topic filter, plus noLocal and a
    selector. ``max_qos`` caps the level of the copies it makes (the lower level wins)."""

    topic_filter: str
    queue: Queue
    max_qos: int = 2
    # noLocal: messages whose origin is ``owner`` (the subscriber's own connection) skip it.
    no_local: bool = False
    owner: str | None = None
    selector: Selector | None = None

    def accepts(self, message: Message) -> bool:
        if self.no_local and message.origin is not None and message.origin == self.owner:
            return False
        return self.selector is None or self.selector(message)

    def __repr__(self) -> str:
        return f"<Binding {self.topic_filter!r} -> {self.queue.name!r}>"


def first_binding_copy(message: Message, bindings: Sequence[Binding]) -> QueuedMessage:
    """The generic rule: a queue gets one copy, made by the first binding that matched."""
    return QueuedMessage.of(message, bindings[0].max_qos)


class Router:
    """The queue namespace (by name) and the bindings from the topic namespace."""

    __slots__ = ("_new_queue", "bindings", "queues")

    def __init__(self, new_queue: Callable[[str], Queue], *, cache_size: int = 4096) -> None:
        # Creates a queue on first use (DESIGN.md section 5), with its configured settings.
        self._new_queue = new_queue
        self.queues: dict[str, Queue] = {}
        self.bindings: TopicTree[Binding] = TopicTree(cache_size=cache_size)

    def queue(self, name: str) -> Queue:
        """The queue of this name, created on first use."""
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = self._new_queue(name)
        return queue

    def delete_queue(self, name: str) -> Queue | None:
        return self.queues.pop(name, None)

    def bind(self, binding: Binding) -> None:
        self.bindings.insert(binding.topic_filter, binding)

    def unbind(self, binding: Binding) -> bool:
        return self.bindings.remove(binding.topic_filter, binding)

    def route(
        self, destination: Destination, message: Message, copy_rule: CopyRule = first_binding_copy
    ) -> list[tuple[Queue, QueuedMessage]]:
        """The copy each queue gets: a queue destination's own queue, or one copy per queue
        with a matching binding (several bindings of one queue are combined by ``copy_rule``).
        Nothing is enqueued: the caller checks room (transactions) and pushes."""
        if not destination.is_topic:
            return [(self.queue(destination.name), QueuedMessage.of(message, 2))]
        matched: dict[Queue, list[Binding]] = {}
        for binding in self.bindings.match(destination.name):
            if binding.accepts(message):
                matched.setdefault(binding.queue, []).append(binding)
        copies: list[tuple[Queue, QueuedMessage]] = []
        for queue, bindings in matched.items():
            entry = copy_rule(message, bindings)
            if entry is not None:
                copies.append((queue, entry))
        return copies
