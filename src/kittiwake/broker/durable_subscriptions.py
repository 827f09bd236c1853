"""What a JMS durable subscription is (its topic, selector and noLocal), and JMS's rule for
asking for one again: a durable subscription nobody consumes from, asked for with another
definition than it has, is deleted and created anew (JMS: changing a durable subscription's
topic, selector or noLocal is an unsubscribe and a new subscription), so what it held is gone;
asked for with the same one, it is resumed. Shared durable subscriptions
(shared_subscriptions.py) and unshared ones share the namespace and the rule. Knows no
protocol.

The topic is the subscription of the durable session, stored with it. The whole definition
(topic, selector, noLocal) is stored too, with the session's record, and recovered before any
listener accepts a publication, so after a restart another selector or noLocal replaces the
subscription as it would have before. Only a subscription stored by a version that kept no
definition (store schema 8 and older) is defined by its first consumer after the upgrade.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kittiwake.broker.sessions import Session
    from kittiwake.broker.store import Store


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
    with (None when unknown: stored by a version that kept no definition)."""
    if existing is None:
        return False
    if asked.topic not in existing.subscriptions:
        return True
    return previous is not None and previous != asked


class DurableDefinitions:
    """The definitions of the durable subscriptions, by their session's client id: recovered
    from the store at start-up, then as made or resumed."""

    __slots__ = ("_by_client_id", "_on_defined", "_store")

    def __init__(
        self,
        store: Store | None = None,
        on_defined: Callable[[str, SubscriptionDefinition], None] | None = None,
    ) -> None:
        self._by_client_id: dict[str, SubscriptionDefinition] = {}
        # Where a definition is kept with its session (None: in memory only). The store
        # forgets it with the session's record, so an unsubscribe needs no write of its own.
        self._store = store
        # Told of every definition in force (made, resumed or recovered): the broker puts
        # its selector where the subscription's publications are routed.
        self._on_defined = on_defined

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
        """The subscription is now (made or resumed) as ``definition``. Stored every time
        (one row, in the commit that stores the session's record on attach anyway): a session
        made anew (replaced, or deleted by an operator) lost the row with its record."""
        self._by_client_id[client_id] = definition
        if self._store is not None:
            self._store.save_durable_definition(client_id, definition)
        if self._on_defined is not None:
            self._on_defined(client_id, definition)

    def restore(self, definitions: Mapping[str, SubscriptionDefinition]) -> None:
        """What the store kept (recovery, before any publication is accepted)."""
        self._by_client_id.update(definitions)
        if self._on_defined is not None:
            for client_id, definition in definitions.items():
                self._on_defined(client_id, definition)

    def forget(self, client_id: str) -> None:
        """The subscription is gone (unsubscribed)."""
        self._by_client_id.pop(client_id, None)
