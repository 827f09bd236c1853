"""What an attaching link asks for, read from its source or target: which node (a queue or a
topic, by capability or address prefix), a durable or shared subscription, a selector, noLocal,
a dynamic (temporary) node, or the transaction coordinator. Pure code over proton's terminus
objects; decides nothing about whether the broker grants it.

Address conventions (what Qpid JMS sends, and a prefix for clients without capabilities):
- A node capability decides the kind: ``queue``, ``topic``, ``temporary-queue``,
  ``temporary-topic`` (Qpid JMS always sends one).
- Else a prefix: ``queue://name`` or ``topic://name``.
- Else the address is a queue (as in ActiveMQ).
JMS topic names are MQTT topic names, so ``topic://sensors/+/temperature`` subscribes with
MQTT wildcards.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from proton import Data, Described, Link, Terminus, symbol

# Filter descriptors (the AMQP filters registry), numeric and symbolic.
SELECTOR_FILTER_CODE = 0x0000468C00000004
SELECTOR_FILTER_NAME = "apache.org:selector-filter:string"
NO_LOCAL_FILTER_CODE = 0x0000468C00000003
NO_LOCAL_FILTER_NAME = "apache.org:no-local-filter:list"

QUEUE_PREFIX = "queue://"
TOPIC_PREFIX = "topic://"

QUEUE_CAPABILITY = "queue"
TOPIC_CAPABILITY = "topic"
TEMPORARY_QUEUE_CAPABILITY = "temporary-queue"
TEMPORARY_TOPIC_CAPABILITY = "temporary-topic"
SHARED_CAPABILITY = "shared"
GLOBAL_CAPABILITY = "global"


class NodeKind(Enum):
    QUEUE = "queue"
    TOPIC = "topic"


class TerminusError(ValueError):
    """The terminus asks for something malformed; the link is refused with this condition."""

    def __init__(self, description: str, condition: str = "amqp:invalid-field") -> None:
        super().__init__(description)
        self.condition = condition


@dataclass(slots=True, frozen=True)
class NodeRequest:
    """One end of a link as the client described it."""

    # None for an anonymous relay target (each message names its destination) and for a
    # durable subscription looked up by name alone (Qpid JMS's unsubscribe).
    name: str | None
    kind: NodeKind
    # The client asks the broker to create a temporary node (the broker names it).
    dynamic: bool = False
    temporary: bool = False
    # Subscription terminus: durable (configuration or unsettled-state durability with expiry
    # policy never), shared, global (shared across client ids).
    durable: bool = False
    shared: bool = False
    global_: bool = False
    selector: str | None = None
    no_local: bool = False
    coordinator: bool = False
    capabilities: frozenset[str] = frozenset()


def capabilities_of(terminus: Terminus) -> frozenset[str]:
    return frozenset(str(c) for c in _symbols(terminus.capabilities))


def _symbols(data: Data) -> list[Any]:
    data.rewind()
    if not data.next():
        return []
    value = data.get_object()
    if isinstance(value, (symbol, str)):
        return [value]
    elements = getattr(value, "elements", None)  # an Array
    if elements is not None:
        return list(elements)
    if isinstance(value, list):
        return value
    return []


def filters_of(terminus: Terminus) -> dict[str, Any]:
    """The filter map: key -> described filter value."""
    data = terminus.filter
    data.rewind()
    if not data.next():
        return {}
    value = data.get_object()
    if not isinstance(value, dict):
        raise TerminusError("the source filter must be a map")
    return {str(k): v for k, v in value.items()}


def read_node(terminus: Terminus, *, source: bool) -> NodeRequest:
    """The node a link's source (``source=True``, a consumer) or target (a producer) names."""
    if terminus.type == Terminus.COORDINATOR:
        return NodeRequest(None, NodeKind.QUEUE, coordinator=True)
    capabilities = capabilities_of(terminus)
    address = terminus.address
    kind, name = _kind_and_name(address, capabilities)
    temporary = bool(capabilities & {TEMPORARY_QUEUE_CAPABILITY, TEMPORARY_TOPIC_CAPABILITY})
    durable = (
        terminus.durability != Terminus.NONDURABLE
        and terminus.expiry_policy == Terminus.EXPIRE_NEVER
    )
    selector: str | None = None
    no_local = False
    if source:
        for key, value in filters_of(terminus).items():
            descriptor = value.descriptor if isinstance(value, Described) else None
            if descriptor in (SELECTOR_FILTER_CODE, symbol(SELECTOR_FILTER_NAME)):
                text = value.value
                if not isinstance(text, str):
                    raise TerminusError(f"filter {key!r}: a selector is a string")
                selector = text
            elif descriptor in (NO_LOCAL_FILTER_CODE, symbol(NO_LOCAL_FILTER_NAME)):
                no_local = True
            else:
                raise TerminusError(
                    f"filter {key!r} ({descriptor!r}) is not supported", "amqp:not-implemented"
                )
    return NodeRequest(
        name,
        kind,
        dynamic=bool(terminus.dynamic),
        temporary=temporary,
        durable=durable,
        shared=SHARED_CAPABILITY in capabilities,
        global_=GLOBAL_CAPABILITY in capabilities,
        selector=selector,
        no_local=no_local,
        capabilities=capabilities,
    )


def _kind_and_name(
    address: str | None, capabilities: frozenset[str]
) -> tuple[NodeKind, str | None]:
    if address is not None:
        if address.startswith(TOPIC_PREFIX):
            return NodeKind.TOPIC, address[len(TOPIC_PREFIX) :]
        if address.startswith(QUEUE_PREFIX):
            return NodeKind.QUEUE, address[len(QUEUE_PREFIX) :]
    if capabilities & {TOPIC_CAPABILITY, TEMPORARY_TOPIC_CAPABILITY}:
        return NodeKind.TOPIC, address
    return NodeKind.QUEUE, address


def subscription_name(link: Link) -> str:
    """A durable or shared subscription's name: the link name without Qpid JMS's suffixes
    (``|global`` for a shared subscription without client id, ``|volatileN`` for a shared
    non-durable one)."""
    name = str(link.name)
    base, bar, _suffix = name.partition("|")
    return base if bar else name


def set_capabilities(terminus: Terminus, names: list[str]) -> None:
    """Offer capabilities on our side's terminus (the attach we answer with)."""
    data = terminus.capabilities
    data.clear()
    data.put_array(False, Data.SYMBOL)
    data.enter()
    for name in names:
        data.put_symbol(symbol(name))
    data.exit()


def copy_filter(remote: Terminus, local: Terminus) -> None:
    """Answer with the filters the client asked for (all of which the broker applies)."""
    data = remote.filter
    data.rewind()
    if data.next():
        local.filter.put_object(data.get_object())


def put_filters(local: Terminus, selector: str | None, no_local: bool) -> None:
    """Answer with filters the broker applies that the client did not send (a durable
    subscription looked up by name: its stored selector and noLocal), in Qpid JMS's form."""
    filters: dict[Any, Any] = {}
    if selector is not None:
        filters[symbol("jms-selector")] = Described(symbol(SELECTOR_FILTER_NAME), selector)
    if no_local:
        filters[symbol("no-local")] = Described(symbol(NO_LOCAL_FILTER_NAME), ["NoLocalFilter{}"])
    if filters:
        local.filter.put_object(filters)
