"""MQTT's rule for the subscriptions of one session that match one topic: they give the session
one copy, at the highest QoS they grant, with every subscription identifier, retained as
published if any of them asks (MQTT 5 section 3.3.4, MQTT-3.3.4-2/-3/-5).

Only MQTT sessions follow it; generic routing (:mod:`kittiwake.broker.routing`) gives a queue
one copy by its own rule. Knows no wire format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kittiwake.broker.message import Message
from kittiwake.broker.sessions import Session, Subscription, SubscriptionMap

if TYPE_CHECKING:
    from kittiwake.broker.route_plans import RoutePlan


@dataclass(slots=True, frozen=True)
class CopyOptions:
    """What one session's copy of a message carries, merged from its matching subscriptions."""

    max_qos: int
    subscription_ids: tuple[int, ...]
    retain_as_published: bool


class SessionCopy:
    """One session's copy of whatever is published on a topic."""

    __slots__ = ("admits", "options", "own", "plain", "plan", "session")

    def __init__(
        self,
        session: Session,
        options: CopyOptions,
        own: CopyOptions | None,
        admits: Callable[[Message], bool] | None = None,
    ) -> None:
        self.session = session
        self.options = options
        # The messages the session gets a copy of, when not all (a subscription's route
        # filter: see routing.Binding.selector); None for all.
        self.admits = admits
        if admits is not None and own is options:
            # ``own is options`` means "nothing to decide per message" (the publish path's
            # inlined case): a filtered copy is decided per message.
            own = CopyOptions(
                options.max_qos, options.subscription_ids, options.retain_as_published
            )
        # The options when the session published the message itself: its noLocal
        # subscriptions left out; None when every matching subscription is noLocal. Same as
        # ``options`` when none is.
        self.own = own
        # Nothing to merge per message: no noLocal, no subscription identifier.
        self.plain = own is options and not options.subscription_ids
        # The route plan of a topic that gives this copy alone (route_plans.py); None until
        # one is worked out, and again when the session's connection changes.
        self.plan: RoutePlan | None = None

    def __repr__(self) -> str:
        return f"<SessionCopy {self.session.client_id!r} {self.options!r}>"


def merge(subscriptions: list[Subscription]) -> CopyOptions | None:
    """One copy for overlapping subscriptions of one session (MQTT-3.3.4-2/-3/-5)."""
    if not subscriptions:
        return None
    ids = tuple(s.subscription_id for s in subscriptions if s.subscription_id is not None)
    return CopyOptions(
        max(s.max_qos for s in subscriptions),
        ids,
        any(s.retain_as_published for s in subscriptions),
    )


def session_copies(subscriptions: Sequence[Subscription]) -> list[SessionCopy]:
    """The copies for every session among ``subscriptions`` (non-shared ones), in the order
    the sessions first appear."""
    if len(subscriptions) == 1:
        # A fleet's topic: one subscription matches (no set, no list building).
        sole = subscriptions[0]
        return [sole_copy(sole)]
    if len({s.session for s in subscriptions}) == len(subscriptions):
        # Nearly always: one matching subscription per session, whose copy never changes
        # while the subscription does not (see Subscription.copy).
        return [sole_copy(s) for s in subscriptions]
    by_session: dict[Session, list[Subscription]] = {}
    for subscription in subscriptions:
        by_session.setdefault(subscription.session, []).append(subscription)
    return [_copy(session, matched) for session, matched in by_session.items()]


# The options of one subscription without an identifier, by (QoS, retain as published): one
# shared (frozen) object each, not one per subscription of a fleet.
_LONE_OPTIONS = {
    (qos, retain): CopyOptions(qos, (), retain) for qos in range(3) for retain in (False, True)
}


def sole_copy(subscription: Subscription) -> SessionCopy:
    """The copy one subscription alone gives its session, kept on it (Subscription.copy): what
    :func:`_copy` makes of it, without merging a list of one. A plain subscription's copy is
    its session's one for those options (Session.plain_copies), so a fleet's first publication
    on each topic allocates nothing and its filters keep no copy of their own. The shared
    copies live on the session's SubscriptionMap; a subscription whose session has none (its
    subscriptions were cleared: the session ended) gets a copy of its own instead."""
    copy = subscription.copy
    if copy is not None:
        return copy
    retain = bool(subscription.retain_as_published)
    sid = subscription.subscription_id
    key = (subscription.max_qos, retain)
    options = None if sid is not None else _LONE_OPTIONS.get(key)
    admits = subscription.selector
    if options is not None and not subscription.no_local and admits is None:
        session = subscription.session
        subscriptions = session.subscriptions
        if type(subscriptions) is SubscriptionMap:
            shared = subscriptions.plain_copies
            if shared is None:
                shared = subscriptions.plain_copies = {}
            # By (QoS, retain as published), the key of the shared options: a tuple hashes
            # in C, the frozen dataclass by its generated __hash__ in Python (about a
            # fifth of a fleet's first publication on a topic).
            copy = shared.get(key)
            if copy is None:
                copy = shared[key] = SessionCopy(session, options, options)
            subscription.copy = copy
            return copy
    if options is None:
        ids = () if sid is None else (sid,)
        options = CopyOptions(subscription.max_qos, ids, retain)
    own = None if subscription.no_local else options
    copy = subscription.copy = SessionCopy(subscription.session, options, own, admits)
    return copy


def _copy(session: Session, matched: list[Subscription]) -> SessionCopy:
    options = merge(matched)
    assert options is not None
    if any(s.no_local for s in matched):
        own = merge([s for s in matched if not s.no_local])
    else:
        own = options
    return SessionCopy(session, options, own, _any_admits(matched))


def _any_admits(matched: list[Subscription]) -> Callable[[Message], bool] | None:
    """The session gets its one copy when any of its matching subscriptions admits the
    message (a route filter refuses for its own subscription only). MQTT sets none; a JMS
    subscription's session has one subscription."""
    filters = [s.selector for s in matched]
    if any(f is None for f in filters):
        return None
    return lambda message: any(f(message) for f in filters if f is not None)
