"""The subscription index: a trie of topic levels answering "who wants a message on this topic?".

Stores opaque values (subscriptions) by plain filter; must never parse "$share", apply broker
limits or know any protocol: callers split shared filters and check max_levels before inserting.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

from kittiwake.broker.topics import MAX_CACHED_TOPIC_CHARS, is_wildcard, validate_topic_filter

__all__ = ["TopicTree"]

V = TypeVar("V", bound=Hashable)

class _Node(Generic[V]):
    """One level of the trie; the path from the root spells the filter's leading levels.

    '+' and '#' get their own slots instead of dict keys so the matcher never hashes them,
    and '#' holds values directly because nothing can follow it.
    """

    __slots__ = ("children", "level", "multi", "plus", "values")

    def __init__(self, level: str) -> None:
        # The literal children: None for a leaf, the child itself while it is the only one
        # (its ``level`` is its key), a dict by level from the second on. A fleet's filters
        # ("s/<device>/v") give every device's level one child: a one-entry dict each would
        # be about 200 bytes and one more object for the cyclic collector per filter.
        self.children: dict[str, _Node[V]] | _Node[V] | None = None
        # This node's level: its key under its parent (the only child is found by it).
        self.level = level
        self.plus: _Node[V] | None = None
        # Values of the filter "<this path>/#"; None rather than {} keeps idle nodes small.
        self.multi: dict[V, None] | None = None
        # Values of the filter that ends exactly at this node: the value itself while it is
        # the only one (a fleet's filter each has one subscriber: no dict of one per filter,
        # about 180 bytes and an object for the collector), a dict from the second on.
        self.values: dict[V, None] | V | None = None

    def child(self, level: str) -> _Node[V] | None:
        """The literal child at ``level``, if any (the match walk writes this out)."""
        children = self.children
        if type(children) is dict:
            return children.get(level)
        if children is not None and children.level == level:  # type: ignore[union-attr]
            return children  # type: ignore[return-value]
        return None

    def add_child(self, level: str) -> _Node[V]:
        """The literal child at ``level``, made if missing."""
        children = self.children
        if children is None:
            child = self.children = _Node(level)
            return child
        if type(children) is dict:
            found = children.get(level)
            if found is None:
                found = children[level] = _Node(level)
            return found
        only: _Node[V] = children  # type: ignore[assignment]
        if only.level == level:
            return only
        child = _Node(level)
        self.children = {only.level: only, level: child}
        return child

    def drop_child(self, level: str) -> None:
        """Unlink the (present) literal child at ``level``; a dict left with one child gives
        way to the child alone."""
        children = self.children
        if type(children) is dict:
            del children[level]
            if len(children) == 1:
                self.children = next(iter(children.values()))
        else:
            self.children = None

    def literal_children(self) -> list[tuple[str, _Node[V]]]:
        children = self.children
        if children is None:
            return []
        if type(children) is dict:
            return list(children.items())
        only: _Node[V] = children  # type: ignore[assignment]
        return [(only.level, only)]

    def is_empty(self) -> bool:
        return (
            self.children is None
            and self.plus is None
            and not self.multi
            and self.values is None
        )


class TopicTree(Generic[V]):
    """Filters to values, matched against topic names, with a cache of recent answers.

    Values under one filter keep insertion order (a dict used as an ordered set), and match()
    returns each value once in an order fixed by the filters present, so fan-out is repeatable.
    Not thread-safe: the broker drives it from one event loop.
    """

    __slots__ = ("_cache", "_cache_size", "_count", "_root")

    def __init__(self, cache_size: int = 4096) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be 0 (no cache) or more, not {cache_size}.")
        self._root: _Node[V] = _Node("")
        self._count = 0
        self._cache_size = cache_size
        self._cache: dict[str, tuple[V, ...]] = {}

    def __len__(self) -> int:
        return self._count

    def insert(self, topic_filter: str, value: V) -> None:
        """Add value under topic_filter; inserting the same pair again changes nothing.

        Raises TopicError for an invalid filter, since one would corrupt the trie's shape.
        """
        validate_topic_filter(topic_filter)
        self.insert_valid(topic_filter, value)

    def insert_valid(self, topic_filter: str, value: V) -> None:
        """:meth:`insert` for a caller that has validated ``topic_filter`` already (the broker
        must refuse an invalid filter before its other checks): a filter is validated once."""
        node = self._root
        bucket: dict[V, None] | None = None
        for level in topic_filter.split("/"):
            if level == "#":
                # Validation put '#' last, so the filter ends here.
                if node.multi is None:
                    node.multi = {}
                bucket = node.multi
                break
            if level == "+":
                if node.plus is None:
                    node.plus = _Node(level)
                node = node.plus
            else:
                # add_child, written out: every level of every filter subscribed.
                children = node.children
                if children is None:
                    # Not "node = node.children = ...": targets are assigned left to right.
                    child = node.children = _Node(level)
                    node = child
                elif type(children) is dict:
                    found = children.get(level)
                    if found is None:
                        found = children[level] = _Node(level)
                    node = found
                elif children.level == level:  # type: ignore[union-attr]
                    node = children  # type: ignore[assignment]
                else:
                    node = node.add_child(level)
        else:
            values = node.values
            if values is None:
                node.values = value
                self._count += 1
                if self._cache:  # the call only when there is something to forget
                    self._invalidate(topic_filter)
                return
            if type(values) is not dict:
                if values is value or values == value:
                    return
                values = node.values = {values: None}  # type: ignore[dict-item]
            bucket = values
        if value in bucket:
            return
        bucket[value] = None
        self._count += 1
        if self._cache:
            self._invalidate(topic_filter)

    def remove(self, topic_filter: str, value: V) -> bool:
        """Drop value from topic_filter; False if it was not there.

        Nodes left empty are unlinked on the way back up, so subscribe/unsubscribe churn over
        ever-new topics does not leave a growing skeleton behind.
        """
        levels = topic_filter.split("/")
        last = len(levels) - 1
        node = self._root
        # (parent, level) for every step taken, to prune bottom-up afterwards.
        path: list[tuple[_Node[V], str]] = []
        for i, level in enumerate(levels):
            if level == "#":
                if i != last or node.multi is None or value not in node.multi:
                    return False
                del node.multi[value]
                if not node.multi:
                    node.multi = None
                break
            nxt = node.plus if level == "+" else node.child(level)
            if nxt is None:
                return False
            path.append((node, level))
            node = nxt
        else:
            values = node.values
            if type(values) is dict:
                if value not in values:
                    return False
                del values[value]
                if len(values) == 1:
                    node.values = next(iter(values))  # back to the value alone
            elif values is not None and (values is value or values == value):
                node.values = None
            else:
                return False
        self._count -= 1
        for parent, level in reversed(path):
            if not node.is_empty():
                break
            if level == "+":
                parent.plus = None
            else:
                parent.drop_child(level)
            node = parent
        self._invalidate(topic_filter)
        return True

    def match(self, topic_name: str) -> tuple[V, ...]:
        """Every value whose filter matches topic_name, each once, in a repeatable order.

        This is the per-publish hot path: a cache lookup, else one split and a stack walk.
        """
        cached = self._cache.get(topic_name)
        if cached is not None:
            return cached
        result = self.match_uncached(topic_name)
        if self._cache_size and len(topic_name) <= MAX_CACHED_TOPIC_CHARS:
            cache = self._cache
            if len(cache) >= self._cache_size:
                # Cleared, not evicted one by one: popping a dict's oldest key leaves a hole
                # that every later next(iter(...)) walks past, so under a stream of distinct
                # topics eviction cost grows until the dict is resized.
                cache.clear()
            cache[topic_name] = result
        return result

    def filters(self) -> list[str]:
        """Every filter holding at least one value, for diagnostics and persistence checks."""
        out: list[str] = []
        stack: list[tuple[_Node[V], list[str]]] = [(self._root, [])]
        while stack:
            node, prefix = stack.pop()
            if node.values is not None:
                out.append("/".join(prefix))
            if node.multi:
                out.append("/".join([*prefix, "#"]))
            if node.plus is not None:
                stack.append((node.plus, [*prefix, "+"]))
            for level, child in reversed(node.literal_children()):
                stack.append((child, [*prefix, level]))
        return out

    def match_uncached(self, topic_name: str) -> tuple[V, ...]:
        """:meth:`match` without the cache, for a caller keeping its own per-topic answers
        (the broker's route plans): a second cache under theirs would only be filled and
        cleared, never read while theirs holds the topic. The walk itself, not a wrapper:
        a fleet wider than the caller's cache calls it on every publication."""
        levels = topic_name.split("/")
        last = len(levels)
        node: _Node[V] | None = self._root
        depth = 0
        # [:1], not startswith (a method call parsing its arguments): a one-character slice
        # is a cached string, about a fifth cheaper on the uncached path's every publication.
        if topic_name[:1] == "$":
            # §4.7.2: a first-level wildcard must not see "$SYS/..."-style topics, so the walk
            # starts below the root's '+' and '#'.
            node = self._root.child(levels[0])
            if node is None:
                return ()
            depth = 1
        # The first bucket found (a dict, or a filter's value alone), and a list only once a
        # second one is (a fleet's topic matches one filter: no list is built for it).
        first: dict[V, None] | V | None = None
        more: list[dict[V, None] | V] | None = None
        # '+' branches still to walk, with the depth below them; None until there is one, so
        # a topic no '+' filter shares costs no stacking. Walked after the literal descent:
        # literal matches come first.
        branches: list[tuple[_Node[V], int]] | None = None
        while True:
            # The literal descent from node at depth; node is never None inside.
            while node is not None:
                multi = node.multi
                if multi:
                    # "a/#" also matches "a" itself, so '#' values count at any depth reached.
                    if first is None:
                        first = multi
                    elif more is None:
                        more = [multi]
                    else:
                        more.append(multi)
                if depth == last:
                    values = node.values
                    if values is not None:
                        if first is None:
                            first = values
                        elif more is None:
                            more = [values]
                        else:
                            more.append(values)
                    break
                plus = node.plus
                if plus is not None:
                    if branches is None:
                        branches = [(plus, depth + 1)]
                    else:
                        branches.append((plus, depth + 1))
                # child(), written out: every level of every uncached publication. A
                # fleet's device level has one child, compared by its level.
                children = node.children
                if type(children) is dict:
                    node = children.get(levels[depth])
                elif children is not None and children.level == levels[depth]:  # type: ignore[union-attr]
                    node = children  # type: ignore[assignment]
                else:
                    node = None
                depth += 1
            if not branches:
                break
            node, depth = branches.pop()
        if first is None:
            return ()
        if more is None:
            if type(first) is dict:
                return tuple(first)
            return (first,)  # type: ignore[return-value]
        merged: dict[V, None] = {}
        for bucket in (first, *more):
            if type(bucket) is dict:
                merged.update(bucket)
            else:
                merged[bucket] = None  # type: ignore[index]
        return tuple(merged)

    def _invalidate(self, topic_filter: str) -> None:
        cache = self._cache
        if not cache:
            return
        if not is_wildcard(topic_filter):
            # A literal filter matches only the topic spelled the same: one O(1) pop.
            cache.pop(topic_filter, None)
            return
        # Clear, not scan: topic_matches over 4096 keys costs about as much as re-walking them all,
        # and clearing defers that work to the topics actually published again.
        cache.clear()
