"""What a JMS durable subscription is (its topic, selector and noLocal), and JMS's rule for
asking for one again: a durable subscription nobody consumes from, asked for with another
definition than it has, is deleted and created anew (JMS: changing a durable subscription's
topic, selector or noLocal is an unsubscribe and a new subscription), so what it held is gone;
asked for with the same one, it is resumed. Shared durable subscriptions
(shared_subscriptions.py) and unshared ones share the namespace and the rule. Knows no
protocol.

The topic is the subscription of the durable session, stored with it, so another topic is seen
after a restart too. The selector and noLocal are kept here, in memory (the store has no place
for them): after a restart, the first consumer of a durable subscription defines them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kittiwake.broker.sessions import Session


@dataclass(frozen=True, slots=True)
class SubscriptionDefinition:
    """What a JMS topic subscription is: ``selector`` is the selector's text (surrounding
    blanks dropped), None for none; an empty selector is none (JMS)."""

    topic: str
    selector: str | None = None
    no_local: bool = False

    @classmethod
    def of(cls, topic: str, selector: str | None, no_local: bool = False) -> SubscriptionDefinition:
        text = (selector or "").strip()
        return cls(topic, text or None, no_local)


def redefined(
    existing: Session | None,
    previous: SubscriptionDefinition | None,
    asked: SubscriptionDefinition,
) -> bool:
    """Whether asking for a durable subscription as ``asked`` replaces the one that exists
    (``existing``, its session; None when there is none): another topic than its session
    subscribes, or another selector or noLocal than ``previous``, the definition it was made
    with (None when unknown: made before a restart)."""
    if existing is None:
        return False
    if asked.topic not in existing.subscriptions:
        return True
    return previous is not None and previous != asked


class DurableDefinitions:
    """The definitions of the durable subscriptions made or resumed since the broker started,
    by their session's client id."""

    __slots__ = ("_by_client_id",)

    def __init__(self) -> None:
        self._by_client_id: dict[str, SubscriptionDefinition] = {}

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._by_client_id

    def get(self, client_id: str) -> SubscriptionDefinition | None:
        return self._by_client_id.get(client_id)

    def replaces(
        self, client_id: str, existing: Session | None, asked: SubscriptionDefinition
    ) -> bool:
        """Whether asking for the durable subscription ``client_id`` (its session
        ``existing``) as ``asked`` replaces it (see :func:`redefined`)."""
        return redefined(existing, self._by_client_id.get(client_id), asked)

    def define(self, client_id: str, definition: SubscriptionDefinition) -> None:
        """The subscription is now (made or resumed) as ``definition``."""
        self._by_client_id[client_id] = definition

    def forget(self, client_id: str) -> None:
        """The subscription is gone (unsubscribed)."""
        self._by_client_id.pop(client_id, None)
