"""Reading what an attaching link asks for, from proton terminus objects."""

from __future__ import annotations

import pytest
from proton import Connection, Data, Described, Session, Terminus, symbol, ulong

from kittiwake.amqp.terminus import (
    NodeKind,
    TerminusError,
    read_node,
    subscription_name,
)

# The engine objects a terminus belongs to must outlive it: kept here for the module.
_CONNECTIONS: list[Connection] = []


def new_session() -> Session:
    connection = Connection()
    _CONNECTIONS.append(connection)
    return connection.session()


def receiver_source(address: str | None, *capabilities: str) -> Terminus:
    link = new_session().receiver("r")
    source = link.source
    source.address = address  # type: ignore[assignment]
    if capabilities:
        source.capabilities.put_array(False, Data.SYMBOL)
        source.capabilities.enter()
        for capability in capabilities:
            source.capabilities.put_symbol(symbol(capability))
        source.capabilities.exit()
    return source


def put_filter(terminus: Terminus, filters: dict[symbol, Described]) -> None:
    terminus.filter.put_object(filters)


@pytest.mark.parametrize(
    ("address", "capabilities", "kind", "name"),
    [
        ("orders", (), NodeKind.QUEUE, "orders"),
        ("orders", ("queue",), NodeKind.QUEUE, "orders"),
        ("a/b", ("topic",), NodeKind.TOPIC, "a/b"),
        ("topic://a/+", (), NodeKind.TOPIC, "a/+"),
        ("queue://q", (), NodeKind.QUEUE, "q"),
        ("tmp-1", ("temporary-topic",), NodeKind.TOPIC, "tmp-1"),
    ],
)
def test_node_kind_by_capability_or_prefix(
    address: str, capabilities: tuple[str, ...], kind: NodeKind, name: str
) -> None:
    request = read_node(receiver_source(address, *capabilities), source=True)
    assert (request.kind, request.name) == (kind, name)


def test_selector_and_no_local_filters_numeric_and_symbolic() -> None:
    for selector_descriptor, no_local_descriptor in (
        (ulong(0x0000468C00000004), ulong(0x0000468C00000003)),
        (symbol("apache.org:selector-filter:string"), symbol("apache.org:no-local-filter:list")),
    ):
        source = receiver_source("t", "topic")
        put_filter(
            source,
            {
                symbol("jms-selector"): Described(selector_descriptor, "a > 1"),
                symbol("no-local"): Described(no_local_descriptor, []),
            },
        )
        request = read_node(source, source=True)
        assert (request.selector, request.no_local) == ("a > 1", True)


def test_unknown_filter_is_refused() -> None:
    source = receiver_source("t", "topic")
    put_filter(source, {symbol("x"): Described(symbol("x:filter"), "y")})
    with pytest.raises(TerminusError, match="not supported"):
        read_node(source, source=True)


def test_durable_shared_subscription() -> None:
    source = receiver_source("news", "topic", "shared", "global")
    source.durability = Terminus.DELIVERIES
    source.expiry_policy = Terminus.EXPIRE_NEVER
    request = read_node(source, source=True)
    assert request.durable and request.shared and request.global_
    volatile = receiver_source("news", "topic")
    assert not read_node(volatile, source=True).durable


def test_subscription_names_drop_qpid_jms_suffixes() -> None:
    session = new_session()
    assert subscription_name(session.receiver("sub")) == "sub"
    assert subscription_name(session.receiver("sub|global")) == "sub"
    assert subscription_name(session.receiver("sub|volatile2")) == "sub"


def test_coordinator_and_dynamic() -> None:
    sender = new_session().sender("s")
    sender.target.type = Terminus.COORDINATOR
    assert read_node(sender.target, source=False).coordinator
    other = new_session().sender("d")
    other.target.dynamic = True
    assert read_node(other.target, source=False).dynamic
