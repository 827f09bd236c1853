"""The authorisation hook: may this client publish to, or subscribe to, this topic?

Rules are MQTT topic filters from the configuration; a deny match always wins, and an empty
allow list allows everything. Knows no protocol: front ends turn a refusal into reason codes.
"""

from __future__ import annotations

from kittiwake.broker.topics import MAX_CACHED_TOPIC_CHARS, topic_matches
from kittiwake.config import AuthConfig


class Authorizer:
    """Answers publish and subscribe checks from the configured allow/deny lists."""

    __slots__ = ("_config", "_publish_cache")

    def __init__(self, config: AuthConfig) -> None:
        self._config = config
        # Publish checks run per message; topics repeat, so remember recent answers.
        self._publish_cache: dict[str, bool] = {}

    def may_publish(self, topic: str) -> bool:
        if topic.startswith("$SYS"):
            # $SYS is the broker's own voice (MQTT 5 §4.7.2); no client may speak in it.
            return topic != "$SYS" and not topic.startswith("$SYS/")
        if not self._config.publish_allow and not self._config.publish_deny:
            return True
        answer = self._publish_cache.get(topic)
        if answer is None:
            answer = _allowed(topic, self._config.publish_allow, self._config.publish_deny)
            if len(topic) <= MAX_CACHED_TOPIC_CHARS:
                if len(self._publish_cache) > 10_000:
                    self._publish_cache.clear()
                self._publish_cache[topic] = answer
        return answer

    def may_subscribe(self, topic_filter: str) -> bool:
        """A filter is refused when a deny rule covers any topic it could match.

        Deny rules are compared as filters: a subscription to "a/#" is refused by a deny of
        "a/secret" because it would otherwise receive that topic.
        """
        allow, deny = self._config.subscribe_allow, self._config.subscribe_deny
        for rule in deny:
            if _filters_overlap(rule, topic_filter):
                return False
        if not allow:
            return True
        return any(_filter_covers(rule, topic_filter) for rule in allow)


def _allowed(topic: str, allow: tuple[str, ...], deny: tuple[str, ...]) -> bool:
    if any(topic_matches(rule, topic) for rule in deny):
        return False
    return not allow or any(topic_matches(rule, topic) for rule in allow)


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
