"""One client-id registry (DESIGN.md section 5): a JMS connection (desiring
sole-connection-for-container, as Qpid JMS does for an explicit client id) is refused with
amqp:invalid-field while its id is in use, by another such connection or an MQTT client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import ConnectionException, SymbolList, symbol
from proton.utils import BlockingConnection

from ..brokerproc import BrokerProcess
from ..clients import PahoClient, unique

SOLE = SymbolList([symbol("sole-connection-for-container")])


def jms_connection(url: str, client_id: str) -> BlockingConnection:
    return BlockingConnection(url, timeout=10, container_id=client_id, desired_capabilities=SOLE)


def test_a_second_jms_connection_with_the_id_is_refused(amqp_url: str) -> None:
    client_id = unique("jms")
    first = jms_connection(amqp_url, client_id)
    try:
        assert "ANONYMOUS-RELAY" in [str(c) for c in first.conn.remote_offered_capabilities]
        with pytest.raises(ConnectionException, match="invalid-field"):
            jms_connection(amqp_url, client_id)
    finally:
        first.close()
    # Free again once the first is gone.
    jms_connection(amqp_url, client_id).close()


def test_an_mqtt_client_holding_the_id_refuses_jms(
    amqp_url: str, paho: Callable[..., PahoClient], amqp_broker: BrokerProcess
) -> None:
    client_id = unique("shared-id")
    paho(amqp_broker.address, client_id)
    with pytest.raises(ConnectionException, match="in use"):
        jms_connection(amqp_url, client_id)


def test_connections_not_asking_for_it_may_share_a_container_id(amqp_url: str) -> None:
    client_id = unique("plain")
    connections: list[Any] = []
    try:
        for _ in range(2):
            connections.append(BlockingConnection(amqp_url, timeout=10, container_id=client_id))
    finally:
        for connection in connections:
            connection.close()
