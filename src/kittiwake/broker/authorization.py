"""Authorisation: what one principal may publish, subscribe to and receive.

Rules are MQTT topic filters: the broker-wide allow/deny lists of ``[auth]`` apply to everyone;
``[[auth.acl]]`` rules apply to the users, groups and client ids they name, with ``%u`` (the
user name) and ``%c`` (the client id) substituted. A deny always wins. Without ACL rules an
empty allow list allows everything; once ACL rules exist, what no allow rule grants is denied.

Subscribing asks "could this subscriber receive anything here", not "could this filter ever
match a forbidden topic" (DESIGN.md §4): a filter is refused only when it lies wholly inside a
deny rule, or wholly outside every allow rule; the topics a granted filter may not receive are
filtered at delivery (:meth:`Permissions.may_read`), retained messages included.

JMS queues have rules of their own (``send``, ``receive``, ``browse`` and their denies, queue
names matched as MQTT topic filters); no broker-wide list applies to them, and without ACL rules
every queue is open.

Answers are cached per principal (a :class:`Permissions` lives as long as its connection),
never globally. The rules can be replaced while the broker runs (SIGHUP,
:meth:`Authorizer.replace_config`): each holder of a Permissions knows whose it is (a session,
a connection) and asks for its principal's new one. Knows no protocol: front ends turn a
refusal into reason codes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from kittiwake.broker.topics import MAX_CACHED_TOPIC_CHARS, topic_matches
from kittiwake.config import AuthConfig

# Per-connection caches are bounded; topics repeat, so a cleared cache refills quickly.
_MAX_CACHED: Final = 4096
# Publish verdicts kept by the Permissions every principal shares while no ACL rule exists: a
# fleet's topics (one or more per device) should all fit. A principal of its own (ACL rules)
# is one connection's, and keeps _MAX_CACHED.
SHARED_VERDICTS: Final = 16384


class QueueRules:
    """What one principal may do with JMS queues, per action: (allow or None for all, deny)."""

    __slots__ = ("_rules",)

    def __init__(self, rules: dict[str, tuple[tuple[str, ...] | None, tuple[str, ...]]]) -> None:
        self._rules = rules

    def may(self, action: str, queue: str) -> bool:
        allow, deny = self._rules.get(action, (None, ()))
        return _allowed(queue, allow, deny)


# Without ACL rules every queue is open to everyone.
OPEN_QUEUES: Final = QueueRules({})
QUEUE_ACTIONS: Final = ("send", "receive", "browse")


class Permissions:
    """One principal's rules, with %u and %c already substituted, and its cached answers."""

    __slots__ = (
        "_read_cache",
        "_verdict_limit",
        "publish_allow",
        "publish_deny",
        "publish_verdicts",
        "queues",
        "read_allow",
        "read_deny",
        "restricts_publishing",
        "restricts_reading",
    )

    def __init__(
        self,
        publish_allow: tuple[str, ...] | None,
        publish_deny: tuple[str, ...],
        read_allow: tuple[str, ...] | None,
        read_deny: tuple[str, ...],
        queues: QueueRules = OPEN_QUEUES,
        verdict_limit: int = _MAX_CACHED,
    ) -> None:
        # None: everything is allowed (no allow list, no ACL); () allows nothing.
        self.publish_allow = publish_allow
        self.publish_deny = publish_deny
        self.read_allow = read_allow
        self.read_deny = read_deny
        # False when no topic can be withheld from this principal: delivery skips the check.
        self.restricts_reading = read_allow is not None or bool(read_deny)
        # False when only $SYS is closed to this principal's publications.
        self.restricts_publishing = publish_allow is not None or bool(publish_deny)
        self._read_cache: dict[str, bool] = {}
        # A front end's verdicts on the topics this principal's clients published to: present
        # when the topic name is valid under the broker's limits, True when may_publish. Kept
        # here, shared by every connection of the principal (all of them while no ACL rule
        # exists), not per connection: a device publishing on its own topics, or a gateway on
        # thousands, would otherwise be checked again on nearly every message.
        self.publish_verdicts: dict[str, bool] = {}
        self._verdict_limit = verdict_limit
        self.queues = queues

    def may_send(self, queue: str) -> bool:
        return self.queues.may("send", queue)

    def may_receive(self, queue: str) -> bool:
        return self.queues.may("receive", queue)

    def may_browse(self, queue: str) -> bool:
        return self.queues.may("browse", queue)

    def may_publish(self, topic: str) -> bool:
        """Callers cache the answer per topic (a connection's topic verdicts)."""
        # [:1] first, a cached one-character string: cheaper than startswith's call for the
        # topics not starting with "$" (a fleet wider than the verdicts asks on every one).
        if topic[:1] == "$" and (topic == "$SYS" or topic.startswith("$SYS/")):
            return False  # $SYS is the broker's own voice (MQTT 5 §4.7.2)
        if not self.restricts_publishing:
            return True
        return _allowed(topic, self.publish_allow, self.publish_deny)

    def remember_publish_verdict(self, topic: str, allowed: bool) -> None:
        """Keep a verdict in :attr:`publish_verdicts` (the caller validated the topic): cleared
        when full rather than evicted one by one, as the broker's other per-topic caches."""
        if len(topic) > MAX_CACHED_TOPIC_CHARS:
            return
        verdicts = self.publish_verdicts
        if len(verdicts) >= self._verdict_limit:
            verdicts.clear()
        verdicts[topic] = allowed

    def may_subscribe(self, topic_filter: str) -> bool:
        """Refused only when the filter lies wholly inside a deny rule or wholly outside every
        allow rule; anything in between is granted and filtered at delivery."""
        deny = self.read_deny
        # Tested before any(): no generator is made per filter subscribed when there are none.
        if deny and any(_filter_covers(rule, topic_filter) for rule in deny):
            return False
        allow = self.read_allow
        return allow is None or any(_filters_overlap(rule, topic_filter) for rule in allow)

    def may_subscribe_wholly(self, topic_filter: str) -> bool:
        """Every topic the filter can match may be read: for receivers that cannot be filtered
        per message (a shared subscription's group, a journal reader)."""
        if any(_filters_overlap(rule, topic_filter) for rule in self.read_deny):
            return False
        allow = self.read_allow
        return allow is None or any(_filter_covers(rule, topic_filter) for rule in allow)

    def may_read(self, topic: str) -> bool:
        """May a message on ``topic`` be delivered to this principal (the per-message check)."""
        if not self.restricts_reading:
            return True
        cache = self._read_cache
        answer = cache.get(topic)
        if answer is None:
            answer = _allowed(topic, self.read_allow, self.read_deny)
            if len(topic) <= MAX_CACHED_TOPIC_CHARS:
                if len(cache) >= _MAX_CACHED:
                    cache.clear()
                cache[topic] = answer
        return answer


# A reload's source of new rules (Broker.replace_authorization): a principal's user (None:
# anonymous) and client id in, its Permissions out, one object per principal so that holders
# which shared one (a connection and its session) still do.
RenewPermissions = Callable[[str | None, str], Permissions]


class Authorizer:
    """Builds each principal's :class:`Permissions` from the configuration."""

    __slots__ = ("_config", "_everyone", "_groups")

    def __init__(self, config: AuthConfig) -> None:
        self._config = config
        self.replace_config(config)

    @property
    def config(self) -> AuthConfig:
        return self._config

    def replace_config(self, config: AuthConfig) -> None:
        """Take new rules (a reload). Permissions made before keep the old rules until their
        holders ask :meth:`permissions` again for their principal; checks made from here on (new
        connections, Flight requests, the admin API) see the new rules at once."""
        self._config = config
        groups: dict[str, set[str]] = {}
        for group in config.groups:
            for user in group.users:
                groups.setdefault(user, set()).add(group.name)
        self._groups = groups
        # The principal-free answers (the broker-wide lists alone): wills of sessions whose
        # principal is unknown, readers without a user. Every connection's while no ACL rule
        # exists, so its publish verdicts hold a fleet's topics.
        self._everyone = self._rules_for(None, "", SHARED_VERDICTS)

    @property
    def acl_configured(self) -> bool:
        return bool(self._config.acl)

    def may_administer(self, user: str | None) -> bool:
        """May this user operate the broker (console, metrics, admin API, actions)? Anyone
        let in while no ACL rules, admins or monitors are configured; then only the users and
        members of the groups auth.admins names."""
        return self._named(user, self._config.admins)

    def may_monitor(self, user: str | None) -> bool:
        """May this user read what operators see (console pages, /metrics, the admin API's
        views) without acting? Admins may; so may the users and groups auth.monitors names."""
        return self._named(user, self._config.admins) or self._named(
            user, self._config.monitors
        )

    def _named(self, user: str | None, names: tuple[str, ...]) -> bool:
        """Is ``user`` (or a group of theirs) among ``names``? Anyone is while no ACL rule,
        admin or monitor is configured (the operators' listener is then as open as the
        others)."""
        config = self._config
        if not config.acl and not config.admins and not config.monitors:
            return True
        if user is None:
            return False
        return user in names or bool(self.groups_of(user).intersection(names))

    def groups_of(self, user: str | None) -> frozenset[str]:
        return frozenset(self._groups.get(user, ())) if user is not None else frozenset()

    def permissions(self, user: str | None, client_id: str) -> Permissions:
        """The rules for ``user`` (None: anonymous) connected as ``client_id``.

        Without ACLs the rules name no one: every principal shares one Permissions (and its
        read cache) instead of a copy per connection.
        """
        if not self._config.acl:
            return self._everyone
        return self._rules_for(user, client_id)

    def _rules_for(
        self, user: str | None, client_id: str, verdict_limit: int = _MAX_CACHED
    ) -> Permissions:
        config = self._config
        publish_allow = list(config.publish_allow)
        publish_deny = list(config.publish_deny)
        read_allow = list(config.subscribe_allow)
        read_deny = list(config.subscribe_deny)
        queue_allow: dict[str, list[str]] = {action: [] for action in QUEUE_ACTIONS}
        queue_deny: dict[str, list[str]] = {action: [] for action in QUEUE_ACTIONS}
        groups = self.groups_of(user)
        for rule in config.acl:
            named = rule.users or rule.groups or rule.clients
            if named and not (
                (user is not None and user in rule.users)
                or bool(groups.intersection(rule.groups))
                or client_id in rule.clients
            ):
                continue
            for source, target in (
                (rule.publish, publish_allow),
                (rule.deny_publish, publish_deny),
                (rule.subscribe, read_allow),
                (rule.deny_subscribe, read_deny),
                (rule.send, queue_allow["send"]),
                (rule.deny_send, queue_deny["send"]),
                (rule.receive, queue_allow["receive"]),
                (rule.deny_receive, queue_deny["receive"]),
                (rule.browse, queue_allow["browse"]),
                (rule.deny_browse, queue_deny["browse"]),
            ):
                for pattern in source:
                    topic_filter = _substituted(pattern, user, client_id)
                    if topic_filter is not None:
                        target.append(topic_filter)
        default_deny = bool(config.acl)
        queues = (
            QueueRules(
                {
                    action: (tuple(queue_allow[action]), tuple(queue_deny[action]))
                    for action in QUEUE_ACTIONS
                }
            )
            if default_deny
            else OPEN_QUEUES
        )
        return Permissions(
            tuple(publish_allow) if publish_allow or default_deny else None,
            tuple(publish_deny),
            tuple(read_allow) if read_allow or default_deny else None,
            tuple(read_deny),
            queues,
            verdict_limit,
        )

    # Principal-free checks (the broker-wide lists and, for ACLs, the rules naming no one).

    def may_publish(self, topic: str) -> bool:
        return self._everyone.may_publish(topic)

    def may_subscribe(self, topic_filter: str) -> bool:
        """Whether every topic the filter can match may be read (no per-message filtering
        is possible for such a reader)."""
        return self._everyone.may_subscribe_wholly(topic_filter)


def _substituted(pattern: str, user: str | None, client_id: str) -> str | None:
    """``pattern`` with %u and %c filled in; None when it needs a user and there is none, or
    when a substituted name would add levels or wildcards (it must stay one level)."""
    if "%" not in pattern:
        return pattern
    if "%u" in pattern:
        if user is None or any(c in user for c in "/+#"):
            return None
        pattern = pattern.replace("%u", user)
    if "%c" in pattern:
        if not client_id or any(c in client_id for c in "/+#"):
            return None
        pattern = pattern.replace("%c", client_id)
    return pattern


def _allowed(topic: str, allow: tuple[str, ...] | None, deny: tuple[str, ...]) -> bool:
    if any(topic_matches(rule, topic) for rule in deny):
        return False
    return allow is None or any(topic_matches(rule, topic) for rule in allow)


def _filter_covers(rule: str, topic_filter: str) -> bool:
    """Does every topic ``topic_filter`` can match also match ``rule``?"""
    rule_levels = rule.split("/")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if i >= len(rule_levels):
            return False
        expected = rule_levels[i]
        if expected == "#":
            return True
        if expected == "+":
            if level == "#":
                return False
            continue
        if level != expected:
            return False
    return len(rule_levels) == len(levels) or rule_levels[len(levels) :] == ["#"]


def _filters_overlap(a: str, b: str) -> bool:
    """Could some topic match both filters?"""
    a_levels, b_levels = a.split("/"), b.split("/")
    for i in range(max(len(a_levels), len(b_levels))):
        x = a_levels[i] if i < len(a_levels) else None
        y = b_levels[i] if i < len(b_levels) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != y and x != "+" and y != "+":
            return False
    return True
