"""Who gets a publication on a topic, worked out once per topic and kept until a subscription,
a connection or a disconnection may change the answer: the publish path's one per-topic cache.

The chain is: the topic tree's match cache (filters that match a topic) under it, and, on each
plan, a slot where a front end keeps what it derives from the plan (the MQTT front end: the
connections one encoded QoS 0 frame goes to), dropped with the plan. A topic that matches one
subscription alone (a fleet's device topics) gets that subscription's plan, kept on the
subscription for the routing generation: a topic never published before costs a tree walk,
not a plan. Never enqueues anything.
"""

from __future__ import annotations

from collections.abc import Callable

from kittiwake.broker.mqtt_subscriptions import SessionCopy, session_copies
from kittiwake.broker.sessions import Session, Subscription
from kittiwake.broker.shared_groups import SharedGroup
from kittiwake.broker.topic_tree import TopicTree
from kittiwake.broker.topics import MAX_CACHED_TOPIC_CHARS

# Plans kept: two per filter in the tree (a fleet's devices each publish on their own topic,
# and a cache smaller than the set of topics in use is cleared before any plan is reused),
# at least MIN_PLANS and at most MAX_PLANS (a plan costs about 500 bytes; past that many
# topics in use the uncached path serves, and memory per filter stays as it was). The cache
# is cleared when full: topics repeat, so it refills quickly, and clearing costs nothing per
# publication.
MIN_PLANS = 4096
MAX_PLANS = 16384


class RoutePlan:
    """The receivers of one topic's publications."""

    __slots__ = ("copies", "direct", "generation", "groups", "memo")

    def __init__(
        self,
        copies: tuple[SessionCopy, ...],
        groups: tuple[SharedGroup, ...],
        direct: tuple[Session, ...] | None,
        generation: int = 0,
    ) -> None:
        # One per session with a matching subscription (MQTT's overlap rule applied).
        self.copies = copies
        self.groups = groups
        # The connected sessions that get a QoS 0, non-retained publication exactly as
        # published: every match a plain subscription (no shared group, no noLocal, no
        # subscription identifier). None when some match needs the full publish path.
        self.direct = direct
        # A front end's data derived from this plan; None until it sets some.
        self.memo: object = None
        # The routing generation it was worked out in: a plan kept on a subscription serves
        # only within it.
        self.generation = generation


class RoutePlans:
    """Plans by topic, valid for one routing generation."""

    __slots__ = ("_journals_qos0", "by_topic", "generation", "tree")

    def __init__(
        self,
        tree: TopicTree[Subscription | SharedGroup],
        journals_qos0: Callable[[str], bool] | None = None,
    ) -> None:
        self.tree = tree
        # Whether the journal keeps QoS 0 publications on a topic (None: on none); such a
        # publication must take the full publish path, which writes it.
        self._journals_qos0 = journals_qos0
        # Bumped by every change that can alter who receives a publication (subscribe,
        # unsubscribe, connect, disconnect).
        self.generation = 0
        # The plans of this generation, emptied by every change: a hit is one subscript, which
        # a front end's hot path may take itself before calling plan() (no call per message).
        self.by_topic: dict[str, RoutePlan] = {}

    def changed(self) -> None:
        self.generation += 1
        if self.by_topic:
            self.by_topic.clear()

    def plan(self, topic: str) -> RoutePlan:
        cache = self.by_topic
        try:
            return cache[topic]  # a hit costs one subscript (.get costs a call more)
        except KeyError:
            pass
        plan = self._build(topic)
        if len(topic) <= MAX_CACHED_TOPIC_CHARS:
            if len(cache) >= MIN_PLANS and len(cache) >= min(MAX_PLANS, 2 * len(self.tree)):
                cache.clear()
            cache[topic] = plan
        return plan

    def cached_topics(self) -> list[str]:
        return list(self.by_topic)

    def _build(self, topic: str) -> RoutePlan:
        matches = self.tree.match(topic)
        journaled = self._journals_qos0 is not None and self._journals_qos0(topic)
        if len(matches) == 1 and not journaled:
            match = matches[0]
            if type(match) is Subscription:
                permissions = match.session.permissions
                if permissions is None or not permissions.restricts_reading:
                    # Nothing here depends on the topic: the subscription's plan serves them all.
                    plan = match.plan
                    if plan is None or plan.generation != self.generation:
                        plan = match.plan = self._work_out(topic, matches, journaled)
                    return plan
        return self._work_out(topic, matches, journaled)

    def _work_out(
        self, topic: str, matches: tuple[Subscription | SharedGroup, ...], journaled: bool
    ) -> RoutePlan:
        subscriptions: list[Subscription] = []
        groups_found: list[SharedGroup] = []
        for match in matches:
            if isinstance(match, SharedGroup):
                groups_found.append(match)
                continue
            permissions = match.session.permissions
            if permissions is not None and not permissions.may_read(topic):
                continue  # a wildcard granted over denied topics: filtered here, once
            subscriptions.append(match)
        groups = tuple(groups_found)
        copies = tuple(session_copies(subscriptions))
        direct: tuple[Session, ...] | None = None
        if not groups and not journaled:
            # Offline sessions never queue QoS 0.
            direct = ()
            for copy in copies:
                if not copy.plain:
                    direct = None
                    break
                if copy.session.link is not None:
                    direct += (copy.session,)
        return RoutePlan(copies, groups, direct, self.generation)
