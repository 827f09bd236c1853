"""Session state: subscriptions, the one queue they feed and its consumer, wills and timers.

A Session is data with small invariant-keeping methods; the rules that move messages between
sessions live in :mod:`kittiwake.broker.broker` and the modules it names. Knows no protocol:
deliveries are :class:`~kittiwake.broker.consumers.Delivery` objects, which the front end maps
to its wire ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from kittiwake.broker.consumers import NO_DELIVERIES, Consumer, Delivery
from kittiwake.broker.message import Message
from kittiwake.broker.queues import DEFAULT_QUEUE_RULES, Queue, QueuedMessage, QueueRules
from kittiwake.broker.routing import Binding

if TYPE_CHECKING:
    from kittiwake.broker.authorization import Permissions
    from kittiwake.broker.mqtt_subscriptions import SessionCopy
    from kittiwake.broker.shared_groups import Member

# A session expiry interval meaning "never expires" (the MQTT 5 value 0xFFFFFFFF).
NEVER_EXPIRES = 0xFFFFFFFF

# The exactly-once keys of every session that holds none (most of them): an empty set of its
# own would cost each idle session 216 bytes.
_NO_KEYS: frozenset[int] = frozenset()

# The subscriptions and group memberships of every session that has none (every idle one):
# read-only, so a write that skipped Session's methods fails instead of reaching them all.
_NONE_YET: Mapping[str, Any] = MappingProxyType({})


def _none_yet() -> Mapping[str, Any]:
    return _NONE_YET


class SubscriptionMap(dict[str, "Subscription"]):
    """A session's subscriptions by full filter, and the copies its plain ones share, one per
    option set with its route plan (mqtt_subscriptions.sole_copy: a fleet's thousands of
    filters on one session share one plan instead of building and keeping one each). Kept
    here rather than on the session: a session without subscriptions (an idle device) pays
    nothing for them."""

    __slots__ = ("plain_copies",)

    def __init__(self) -> None:
        super().__init__()
        self.plain_copies: dict[tuple[int, bool], SessionCopy] | None = None


def session_queue_name(client_id: str) -> str:
    """The name of the queue a session's subscriptions feed: its key in the store.

    The broker names the queues it makes for sessions; a name starting with ``$`` is never a
    user's (JMS) queue name, so the two cannot collide.
    """
    return "$session/" + client_id


def session_producer_name(client_id: str) -> str:
    """The producer under which the store keeps a session's duplicate-detection keys (the
    ids of exactly-once publications received from its client and not yet released)."""
    return "$session/" + client_id


class SessionLink(Protocol):
    """The live connection attached to a session; a protocol front end implements it."""

    def tag(self, delivery: Delivery) -> int:
        """The wire id this delivery travels under (an MQTT packet identifier): picked once,
        kept in ``delivery.tag``, and stored with the delivery so a resend reuses it."""

    def deliver(self, delivery: Delivery) -> None:
        """Send one attempt: the message (marked redelivered when ``delivery.redelivered``),
        or, for a delivery the client holds already (RECEIVED), its release (PUBREL)."""

    def deliver_settled(self, entry: QueuedMessage) -> None:
        """Send an entry that needs no acknowledgement (QoS 0)."""

    def taken_over(self) -> None:
        """Another connection took this session; close without touching the session."""


@dataclass(slots=True, eq=False, kw_only=True)
class Subscription(Binding):
    """One filter of one session, with its MQTT options: a binding to the session's queue (or,
    for a shared subscription, to its group's queue)."""

    session: Session
    share_group: str | None = None
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None
    # Its session's copy of a publication that matches no other subscription of the session,
    # worked out once (mqtt_subscriptions.session_copies); None until then, and again
    # whenever its options change.
    copy: SessionCopy | None = field(default=None, repr=False)

    @property
    def full_filter(self) -> str:
        if self.share_group is None:
            return self.topic_filter
        return f"$share/{self.share_group}/{self.topic_filter}"


@dataclass(slots=True, eq=False)
class Session:
    """One client's session, alive across connections while it has not expired."""

    client_id: str
    # Makes the session's queue and its consumer (the broker's, with its limits and rules):
    # called on their first use (see :attr:`queue`).
    make_queue: Callable[[Session], tuple[Queue, Consumer]] = field(repr=False)
    # Where the session's subscriptions put its messages, and the one consumer taking them:
    # deliveries in flight stay on the consumer across connections (resent on resumption).
    # None until the first subscription or delivery needs them: an idle connected session
    # (most of a fleet) holds neither (about 600 bytes). Read these where "none yet" is an
    # answer (nothing queued, nothing in flight); :attr:`queue` and :attr:`consumer` make them.
    made_queue: Queue | None = field(default=None, repr=False)
    made_consumer: Consumer | None = field(default=None, repr=False)
    # The window granted to the connection (see :meth:`set_window`), kept here until the
    # consumer exists; the consumer's credit has it from then on.
    granted_window: int = 0
    # True from the connection's acceptance (Broker.start_delivery) until it ends: what the
    # consumer's receiver being set means, also before there is a consumer.
    delivering: bool = False
    expiry_interval: int = 0
    # Its subscriptions by full filter, and its memberships of shared subscription groups by
    # full filter ($share/...): changed only through the methods below, which make each dict
    # on its first entry (an idle session holds neither).
    subscriptions: Mapping[str, Subscription] = field(default_factory=_none_yet)
    members: Mapping[str, Member] = field(default_factory=_none_yet)
    # Ids of exactly-once publications received from the client and not yet released
    # (changed only through hold_key / release_key / clear_keys).
    exactly_once_keys: Set[int] = _NO_KEYS
    # The connection, while there is one.
    link: SessionLink | None = None
    will: Message | None = None
    will_delay: int = 0
    # Seconds the will lives once published (MQTT 5 will Message Expiry Interval).
    will_expiry: int | None = None
    # The newest future publishers' held acknowledgements wait on while this session's queue
    # drains (flow control keeps the older ones); None while nobody waits on it.
    drain_waiter: asyncio.Future[None] | None = None
    # Clock times while disconnected: when the session ends, when the will is due.
    expires_at: float | None = None
    will_at: float | None = None
    # What its client's principal may publish and receive; None until a connection, a
    # subscription or recovery sets it.
    permissions: Permissions | None = None
    # The user its client connected as (None: anonymous), stored with the session so that
    # recovery filters it by the same rules before its client is back.
    principal: str | None = None
    # How its queue orders entries and whether what it gives up on is dead-lettered: asked
    # for by the front end that connects it (broker.connect), stored with a persistent one.
    queue_rules: QueueRules = DEFAULT_QUEUE_RULES

    @property
    def plain_copies(self) -> dict[tuple[int, bool], SessionCopy] | None:
        """The copies its plain subscriptions share (see SubscriptionMap); None for none."""
        subscriptions = self.subscriptions
        return subscriptions.plain_copies if type(subscriptions) is SubscriptionMap else None

    def add_subscription(self, full_filter: str, subscription: Subscription) -> None:
        subscriptions = self.subscriptions
        if not isinstance(subscriptions, dict):
            self.subscriptions = subscriptions = SubscriptionMap()
        subscriptions[full_filter] = subscription

    def pop_subscription(self, full_filter: str) -> Subscription | None:
        subscriptions = self.subscriptions
        if not isinstance(subscriptions, dict):
            return None
        removed: Subscription | None = subscriptions.pop(full_filter, None)
        return removed

    def clear_subscriptions(self) -> None:
        # Its shared copies point back at it, and their plans at them (and at its last
        # connection): cycles the collector may never see once frozen (kittiwake.collector),
        # broken here.
        plain = self.plain_copies
        if plain:
            for copy in plain.values():
                copy.plan = None
        self.subscriptions = _NONE_YET

    def add_member(self, full_filter: str, member: Member) -> None:
        members = self.members
        if not isinstance(members, dict):
            self.members = members = {}
        members[full_filter] = member

    def pop_member(self, full_filter: str) -> Member | None:
        members = self.members
        if not isinstance(members, dict):
            return None
        removed: Member | None = members.pop(full_filter, None)
        return removed

    def hold_key(self, key: int) -> None:
        keys = self.exactly_once_keys
        if isinstance(keys, set):
            keys.add(key)
        else:
            self.exactly_once_keys = {*keys, key}

    def release_key(self, key: int) -> None:
        keys = self.exactly_once_keys
        if isinstance(keys, set):
            keys.discard(key)

    def clear_keys(self) -> None:
        self.exactly_once_keys = _NO_KEYS

    @property
    def persistent(self) -> bool:
        """A session that outlives its connection keeps its state in the store."""
        return self.expiry_interval > 0

    @property
    def queue(self) -> Queue:
        """The session's queue, made on first use."""
        queue = self.made_queue
        if queue is None:
            queue = self._make()[0]
        return queue

    @property
    def consumer(self) -> Consumer:
        """The session's consumer on its queue, made (with the queue) on first use."""
        consumer = self.made_consumer
        if consumer is None:
            consumer = self._make()[1]
        return consumer

    def _make(self) -> tuple[Queue, Consumer]:
        made = self.make_queue(self)
        self.made_queue, self.made_consumer = made
        return made

    def set_window(self, window: int) -> None:
        """The window a new connection is granted (what is in flight counts against it)."""
        self.granted_window = window
        consumer = self.made_consumer
        if consumer is not None:
            consumer.set_window(window)

    @property
    def window(self) -> int:
        """Deliveries allowed in flight: the lower of the client's Receive Maximum and ours."""
        consumer = self.made_consumer
        if consumer is None:
            return self.granted_window
        return consumer.window or 0

    @property
    def queued(self) -> int:
        """Entries waiting in the session's queue (none before it has one)."""
        queue = self.made_queue
        return 0 if queue is None else queue.count

    @property
    def inflight(self) -> Mapping[int, Delivery]:
        """Deliveries sent and not yet settled, by core delivery id (read-only)."""
        consumer = self.made_consumer
        return NO_DELIVERIES if consumer is None else consumer.unsettled
