"""Retained messages: one per topic, newest wins, an empty payload clears, expiry removes.

Knows nothing of subscriptions; the broker asks it which retained messages a new filter sees,
all at once (:meth:`RetainedMessages.matching`) or one at a time from a cursor that walks a tree
of the retained topics as the subscriber's window opens (:meth:`RetainedMessages.cursor`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from kittiwake.broker.message import Message
from kittiwake.broker.topics import is_wildcard


class _Level:
    """One level of the tree of retained topics: its children by name, and the message of
    the topic that ends here, if any."""

    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Level] = {}
        self.message: Message | None = None


class RetainedMessages:
    """The retained message of every topic that has one."""

    __slots__ = ("_by_topic", "_expiring", "_root", "_since", "_updates")

    def __init__(self) -> None:
        self._by_topic: dict[str, Message] = {}
        # The same messages by topic level, so a wildcard filter visits only what can match.
        self._root = _Level()
        # Updates applied so far, and for each topic the update that set its message: a cursor
        # skips a message set after it started (its subscriber got that one live already).
        self._updates = 0
        self._since: dict[str, int] = {}
        # (expiry, tie-breaker, message) for messages that expire, so the periodic sweep
        # looks only at what is due instead of every retained message.
        self._expiring: list[tuple[float, int, Message]] = []

    def __len__(self) -> int:
        return len(self._by_topic)

    def __contains__(self, topic: str) -> bool:
        return topic in self._by_topic

    def get(self, topic: str) -> Message | None:
        return self._by_topic.get(topic)

    @property
    def updates(self) -> int:
        """Updates applied so far: a cursor's start (see :meth:`cursor`)."""
        return self._updates

    def set_before(self, topic: str, started: int) -> Message | None:
        """The topic's retained message if it was set before a cursor that started at
        ``started`` (one the cursor would send); None otherwise."""
        message = self._by_topic.get(topic)
        if message is None or self._since[topic] > started:
            return None
        return message

    def messages(self) -> list[Message]:
        """Every retained message (a copy of the list: operators' views, not the hot path)."""
        return list(self._by_topic.values())

    def update(self, message: Message) -> Message | None:
        """Apply a retained publication; returns the message it replaced or cleared.

        A zero-length MQTT payload clears the topic and is not itself retained; an empty JMS
        message neither clears nor is retained (DESIGN.md §2).
        """
        if not message.payload:
            if message.clears_retained:
                return self._remove(message.topic)
            return None
        previous = self._by_topic.get(message.topic)
        self._set(message)
        self._track(message)
        return previous

    def restore(self, message: Message) -> None:
        self._set(message)
        self._track(message)

    def _set(self, message: Message) -> None:
        topic = message.topic
        self._by_topic[topic] = message
        self._updates += 1
        self._since[topic] = self._updates
        level = self._root
        for name in topic.split("/"):
            child = level.children.get(name)
            if child is None:
                child = level.children[name] = _Level()
            level = child
        level.message = message

    def _remove(self, topic: str) -> Message | None:
        message = self._by_topic.pop(topic, None)
        if message is None:
            return None
        del self._since[topic]
        path = [self._root]
        names = topic.split("/")
        for name in names:
            path.append(path[-1].children[name])
        path[-1].message = None
        # Prune the levels nothing is left under, from the leaf up.
        for depth in range(len(names), 0, -1):
            level = path[depth]
            if level.message is not None or level.children:
                break
            del path[depth - 1].children[names[depth - 1]]
        return message

    def _track(self, message: Message) -> None:
        if message.expiry is None:
            return
        heap = self._expiring
        if len(heap) > 2 * len(self._by_topic) + 1024:
            # Replaced messages linger in the heap until due; rebuild before they pile up.
            heap[:] = [e for e in heap if self._by_topic.get(e[2].topic) is e[2]]
            heapq.heapify(heap)
        heapq.heappush(heap, (message.expiry, id(message), message))

    def matching(self, topic_filter: str, now: float) -> list[Message]:
        """Unexpired retained messages a filter matches."""
        if not is_wildcard(topic_filter):
            message = self._by_topic.get(topic_filter)
            if message is None or message.expired(now):
                return []
            return [message]
        return [m for m in self.cursor(topic_filter) if not m.expired(now)]

    def cursor(self, topic_filter: str, started: int | None = None) -> Iterator[Message]:
        """The retained messages a filter matches, found one at a time as they are asked for:
        the first comes without collecting the rest, and the tree may change in between. A
        topic retained (or replaced) after the cursor started is left out: whoever holds the
        cursor is subscribed by then and got that publication live. It starts at
        ``started`` (:attr:`updates` when its subscription was made), else when the first
        message is asked for. Expired messages are the caller's to skip."""
        if started is None:
            started = self._updates
        since = self._since
        by_topic = self._by_topic
        for message in _walk(self._root, topic_filter.split("/")):
            topic = message.topic
            # Still the topic's message, and set before the cursor started.
            if by_topic.get(topic) is message and since[topic] <= started:
                yield message

    def remove_expired(self, now: float) -> list[Message]:
        """Drop expired messages; returns them so their stored copies can go too."""
        expired: list[Message] = []
        heap = self._expiring
        while heap and heap[0][0] <= now:
            message = heapq.heappop(heap)[2]
            # Only if it is still the topic's retained message (not replaced or cleared).
            if self._by_topic.get(message.topic) is message:
                self._remove(message.topic)
                expired.append(message)
        return expired


def _walk(root: _Level, names: list[str]) -> Iterator[Message]:
    """The messages in the tree that the filter levels ``names`` match, depth first.

    Iterative (a topic may have thousands of levels; recursion would overflow). A level's
    children are visited from a snapshot of their names (one list made in C), so the first
    message of a wide level comes at once rather than after a frame per child; each child is
    looked up when it is visited, so the tree may change while a walk is suspended. A
    wildcard in the first level never matches a topic starting with '$' (MQTT-4.7.2-1).
    """
    last = len(names)
    # Levels whose children are being visited: (level, names still to visit, their depth,
    # under '#').
    pending: list[tuple[_Level, Iterator[str], int, bool]] = []
    # The next visit: (parent, child name or None for the parent itself, depth, under '#').
    visit: tuple[_Level, str | None, int, bool] | None = (root, None, 0, False)
    while True:
        if visit is None:
            if not pending:
                return
            parent, children, child_depth, under = pending[-1]
            child_name = next(children, None)
            if child_name is None:
                pending.pop()
                continue
            if child_depth == 1 and child_name.startswith("$"):
                continue
            visit = (parent, child_name, child_depth, under)
        parent, name, depth, everything = visit
        visit = None
        level = parent if name is None else parent.children.get(name)
        if level is None:
            continue
        if not everything and depth < last and names[depth] == "#":
            everything = True  # '#' matches its parent level too, and everything below
        if everything or depth == last:
            if level.message is not None:
                yield level.message
            if not everything:
                continue
        elif names[depth] != "+":
            visit = (level, names[depth], depth + 1, False)
            continue
        # '+' or under '#': every child, in order
        if level.children:
            pending.append((level, iter(list(level.children)), depth + 1, everything))
