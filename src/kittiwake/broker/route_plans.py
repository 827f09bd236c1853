"""Who gets a publication on a topic, worked out once per topic and kept until a subscription,
a connection or a disconnection may change the answer: the publish path's one per-topic cache.
A change forgets only the plans it can alter where it can tell them apart: a filter without
wildcards matches one topic, so subscribing, unsubscribing, connecting and disconnecting with
such filters (a fleet's devices) forget one plan each; a wildcard filter forgets every plan.

The chain is: the topic tree's uncached walk under it (no second per-topic cache, which would
only be filled and cleared under a fleet's many topics), and, on each plan, a slot where a
front end keeps what it derives from the plan (the MQTT front end: the connections one encoded
QoS 0 frame goes to), dropped with the plan. A topic that matches one subscription alone (a
fleet's device topics) gets the plan of that subscription's copy, kept until its session's
connection changes, and shared by all the session's plain subscriptions of the same options: a
topic never published before, or forgotten by a change elsewhere, costs a tree walk, not a
plan. Never enqueues anything.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from kittiwake.broker.mqtt_subscriptions import SessionCopy, session_copies, sole_copy
from kittiwake.broker.sessions import Session, Subscription
from kittiwake.broker.shared_groups import SharedGroup
from kittiwake.broker.topic_tree import TopicTree
from kittiwake.broker.topics import MAX_CACHED_TOPIC_CHARS

# Plans kept in each of the cache's two generations (see RoutePlans): two per filter in the
# tree (a fleet's devices each publish on their own topic), at least the configured minimum
# (limits.match_cache_size) and at most MAX_PLANS (a plan costs about 500 bytes, a topic
# matching one subscription alone shares its session's for those options: past that many in use
# the uncached path serves, and memory per filter stays as it was).
MIN_PLANS = 4096
MAX_PLANS = 16384
# Scan resistance (see RoutePlans): a generation filled mostly by new topics is a strike; after
# THRASH_STRIKES in a row the cache stops taking plans for a pause of misses, starting at one
# generation's worth and doubling, up to MAX_PAUSE_GENERATIONS, while the thrashing lasts.
THRASH_STRIKES = 2
MAX_PAUSE_GENERATIONS = 64


class RoutePlan:
    """The receivers of one topic's publications."""

    __slots__ = ("copies", "direct", "groups", "memo")

    def __init__(
        self,
        copies: tuple[SessionCopy, ...],
        groups: tuple[SharedGroup, ...],
        direct: tuple[Session, ...] | None,
    ) -> None:
        # One per session with a matching subscription (MQTT's overlap rule applied).
        self.copies = copies
        self.groups = groups
        # The connected sessions that get a QoS 0, non-retained publication exactly as
        # published: every match a plain subscription (no shared group, no noLocal, no
        # subscription identifier). None when some match needs the full publish path.
        self.direct = direct
        # A front end's data derived from this plan (from its sessions' connections); None
        # until it sets some.
        self.memo: object = None


class RoutePlans:
    """Plans by topic, each kept until a change that may alter it (see the module's note).

    Two generations of cached plans, so a full cache evicts its coldest half instead of
    forgetting every topic: when ``by_topic`` is full it becomes ``_older`` (the previous older
    one is dropped whole) and a new ``by_topic`` starts; a miss finds a plan still in
    ``_older`` and moves it back. A topic published at least once per generation stays cached
    (what an LRU would keep), at O(1) per miss and no per-hit bookkeeping; popping a dict's
    oldest keys one by one would leave holes that later scans walk past.

    Scan resistant: a fleet cycling over more topics than the cache holds (every device on its
    own topic) would evict each plan before its topic comes round again, so no publication
    would hit and every miss would also pay for keeping its plan. So a generation filled
    mostly by new topics (fewer than one in four of its misses found in the older generation)
    is a strike, and after :data:`THRASH_STRIKES` strikes in a row the cache stops taking plans
    (it is *paused*): both generations stay as they are and keep serving the topics they hold
    (a fixed share of the cycle hits), while misses are worked out and not kept. The pause
    lasts a generation's worth of misses, doubling each time it ends into more thrashing (a
    cycle longer than the pause would otherwise see its kept share turn over before its
    topics come round), halved by each generation filled mostly by topics coming back. A
    change that forgets every plan ends the pause. The hit path (``by_topic.get``) pays
    nothing for any of it.
    """

    __slots__ = (
        "_built",
        "_journals_qos0",
        "_limit",
        "_min_plans",
        "_older",
        "_owed_retained",
        "_pause",
        "_paused",
        "_revived",
        "_strikes",
        "by_topic",
        "tree",
    )

    def __init__(
        self,
        tree: TopicTree[Subscription | SharedGroup],
        journals_qos0: Callable[[str], bool] | None = None,
        min_plans: int = MIN_PLANS,
        owed_retained: Container[Session] = (),
    ) -> None:
        self.tree = tree
        # Sessions still owed the retained messages of a new subscription (the broker's
        # retained cursors): never in a plan's ``direct`` (their live copies take the full
        # path, which sends a topic's owed retained message first); their plans are
        # forgotten when a cursor starts and when the last one ends (session_changed).
        self._owed_retained = owed_retained
        # Whether the journal keeps QoS 0 publications on a topic (None: on none); such a
        # publication must take the full publish path, which writes it.
        self._journals_qos0 = journals_qos0
        # The plans of this generation, emptied by a change that cannot be narrowed: a hit is
        # one .get, which a front end's hot path may take itself, calling missed() on None. A
        # plain dict (a subclass with __missing__ would cost every hit about 100 instructions).
        self.by_topic: dict[str, RoutePlan] = {}
        self._older: dict[str, RoutePlan] = {}
        # 0: no plan is kept (every publication works its plan out).
        self._min_plans = min_plans
        self._limit = -1  # worked out by the first miss (_bound)
        # Misses of the generation being filled: plans found in the older one, and new ones.
        self._revived = 0
        self._built = 0
        # Generations in a row filled mostly by new topics (a strike each).
        self._strikes = 0
        # Misses left before the cache takes plans again (0: it takes them), and the length
        # of the next pause, in generations.
        self._paused = 0
        self._pause = 1

    def changed(self) -> None:
        """Anything may have changed (a wildcard filter, rules reloaded): forget every plan.
        Plans kept on subscriptions stay: what they say changes only with their subscription's
        options or connection, and those changes drop them (subscription_changed,
        session_changed)."""
        if self.by_topic:
            self.by_topic.clear()
        if self._older:
            self._older = {}
        # Worked out again by the first miss (_bound): a burst of subscriptions pays nothing.
        self._limit = -1
        # An empty cache starts afresh: whatever thrashed before may fit now.
        self._revived = self._built = self._strikes = self._paused = 0
        self._pause = 1

    def subscription_changed(self, subscription: Subscription) -> None:
        """A subscription (or a shared group's member) came, went or changed its options: the
        plans of the topics its filter matches are forgotten. Its copy's own plan stays: what
        it says changes only with the session's connection (session_changed), and new options
        come with a new copy (subscriptions.subscribe). The work itself, not a call to more:
        every filter of a fleet's subscribe comes here."""
        topic_filter = subscription.topic_filter
        if "+" in topic_filter or "#" in topic_filter:  # is_wildcard, without its call
            self.changed()
            return
        # A filter without wildcards matches the topic spelled like it, and no other.
        if self.by_topic:
            self.by_topic.pop(topic_filter, None)
        if self._older:
            self._older.pop(topic_filter, None)
        self._limit = -1  # the tree's size changed: the bound follows it (_bound)

    def session_changed(self, session: Session) -> None:
        """A session connected or disconnected: its subscriptions' plans say who is connected
        (``direct``, and a front end's memo of the connections), so they are forgotten, with
        the plans of the topics their filters match; nobody else's."""
        if session.members:
            # A shared group's members are not in the plans; any doubt forgets everything.
            self.changed()
        plain = session.plain_copies
        if plain:
            for shared in plain.values():
                shared.plan = None
        for subscription in session.subscriptions.values():
            copy = subscription.copy
            if copy is not None:
                copy.plan = None
            self.subscription_changed(subscription)

    def plan(self, topic: str) -> RoutePlan:
        plan = self.by_topic.get(topic)  # not a subscript in try: raising costs a miss ~1 us
        if plan is None:
            return self.missed(topic)
        return plan

    def cached_topics(self) -> list[str]:
        return [*self._older, *self.by_topic]

    def missed(self, topic: str) -> RoutePlan:
        """A plan ``by_topic`` does not hold: from the older generation, else worked out; kept
        unless the topic is too long to remember or the cache is paused (see the class)."""
        if self._paused:
            # The older generation's plan stays where it is (moving it would evict another),
            # a new one is not kept. The last miss of the pause starts a new generation, whose
            # filling judges the thrashing again.
            plan = self._older.get(topic)
            if plan is None:
                plan = self._build(topic)
            self._paused -= 1
            if not self._paused:
                self._older = self.by_topic
                self.by_topic = {}
                self._revived = self._built = 0
                self._strikes = THRASH_STRIKES - 1  # one more thrashing generation pauses
            return plan
        plan = self._older.pop(topic, None)
        if plan is None:
            plan = self._build(topic)
            self._built += 1
        else:
            self._revived += 1
        limit = self._limit
        if limit < 0:
            limit = self._limit = self._bound()
        if limit and len(topic) <= MAX_CACHED_TOPIC_CHARS:
            cache = self.by_topic
            if len(cache) >= limit:
                if self._full(limit):
                    return plan
                self._older = cache
                cache = self.by_topic = {}
            cache[topic] = plan
        return plan

    def _full(self, limit: int) -> bool:
        """``by_topic`` is full: True to pause the cache rather than start a new generation
        (the plan in hand is then not kept). Judges the generation just filled."""
        if not self._older:
            pass  # the first generation: nothing could come back yet, no evidence
        elif 3 * self._revived < self._built:
            self._strikes += 1
            if self._strikes >= THRASH_STRIKES:
                self._paused = self._pause * limit
                self._pause = min(2 * self._pause, MAX_PAUSE_GENERATIONS)
                return True
        else:
            self._strikes = 0
            self._pause = max(1, self._pause // 2)
        self._revived = self._built = 0
        return False

    def _bound(self) -> int:
        """Plans kept per generation: see MIN_PLANS; 0 when the configured minimum is 0."""
        if not self._min_plans:
            return 0
        return max(self._min_plans, min(MAX_PLANS, 2 * len(self.tree)))

    def _build(self, topic: str) -> RoutePlan:
        matches = self.tree.match_uncached(topic)
        journaled = self._journals_qos0 is not None and self._journals_qos0(topic)
        if len(matches) == 1 and not journaled:
            match = matches[0]
            if type(match) is Subscription:
                permissions = match.session.permissions
                if permissions is None or not permissions.restricts_reading:
                    # Nothing here depends on the topic: the copy's plan serves them all (a
                    # plain one's is shared by its session's plain filters).
                    copy = match.copy  # sole_copy's kept answer, without the call
                    if copy is None:
                        copy = sole_copy(match)
                    plan = copy.plan
                    if plan is None:
                        plan = copy.plan = self._sole_plan(copy)
                    return plan
        return self._work_out(topic, matches, journaled)

    def _sole_plan(self, copy: SessionCopy) -> RoutePlan:
        """What :meth:`_work_out` makes of one readable subscription on a topic not journaled,
        without its lists: made once per copy, and again when its session's connection
        changes."""
        direct: tuple[Session, ...] | None = None
        if copy.plain:
            # Offline sessions never queue QoS 0.
            session = copy.session
            if session.link is None:
                direct = ()
            elif session not in self._owed_retained:
                direct = (session,)
        return RoutePlan((copy,), (), direct)

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
            owed = self._owed_retained
            for copy in copies:
                if not copy.plain:
                    direct = None
                    break
                if copy.session.link is not None:
                    if owed and copy.session in owed:
                        direct = None
                        break
                    direct += (copy.session,)
        return RoutePlan(copies, groups, direct)
