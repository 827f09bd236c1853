"""The clients connected right now, across every front end, and disconnecting one: the one
place that knows both the MQTT and the AMQP connection registries. Decides nothing about a
protocol: each front end says how its clients are told (MQTT 5 DISCONNECT 0x98, an AMQP close
with amqp:connection:forced)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from kittiwake.amqp.connection import AMQPConnection
from kittiwake.amqp.server import AMQPServer
from kittiwake.mqtt.server import MQTTServer


@dataclass(frozen=True, slots=True)
class ClientView:
    client_id: str
    protocol: str  # "mqtt 3.1.1", "mqtt 5", "amqp"
    peer: str
    user: str | None
    # MQTT's keepalive in seconds; 0 = none (and for AMQP, which has idle timeouts instead).
    keepalive: int
    # Deliveries in flight to the client (MQTT; AMQP counts per link, not here).
    in_flight: int


_MQTT_VERSIONS = {3: "mqtt 3.1", 4: "mqtt 3.1.1", 5: "mqtt 5"}


def clients(mqtt: MQTTServer, amqp: AMQPServer) -> list[ClientView]:
    """Connections that got in (a connection still logging in is no client yet)."""
    views = []
    for protocol in list(mqtt.connections):
        connection = protocol.connection
        if connection is None or connection.closed or connection.session is None:
            continue
        principal = connection.principal
        views.append(
            ClientView(
                client_id=connection.client_id,
                protocol=_MQTT_VERSIONS.get(connection.protocol_version, "mqtt"),
                peer=connection.peer,
                user=None if principal is None else principal.name,
                keepalive=connection.keepalive,
                in_flight=len(connection.session.inflight),
            )
        )
    for amqp_protocol in list(amqp.connections):
        amqp_connection = amqp_protocol.connection
        if amqp_connection is None or amqp_connection.closed or not amqp_connection.opened:
            continue
        amqp_principal = amqp_connection.principal
        views.append(
            ClientView(
                client_id=_container(amqp_connection),
                protocol="amqp",
                peer=amqp_connection.peer,
                user=None if amqp_principal is None else amqp_principal.username,
                keepalive=0,
                in_flight=0,
            )
        )
    views.sort(key=lambda view: (view.client_id, view.peer))
    return views


def disconnect(mqtt: MQTTServer, amqp: AMQPServer, client_id: str) -> int:
    """Disconnect every connection of ``client_id`` (an MQTT client id or an AMQP container
    id); how many there were."""
    count = 0
    for protocol in list(mqtt.connections):
        connection = protocol.connection
        if (
            connection is not None
            and not connection.closed
            and connection.session is not None
            and connection.client_id == client_id
        ):
            connection.close_by_operator()
            count += 1
    for amqp_protocol in list(amqp.connections):
        amqp_connection = amqp_protocol.connection
        if (
            amqp_connection is not None
            and not amqp_connection.closed
            and amqp_connection.opened
            and _container(amqp_connection) == client_id
        ):
            amqp_protocol.close_by_operator()
            count += 1
    return count


def _container(connection: AMQPConnection) -> str:
    """The client's container id ("" when it sent none, or one that is not UTF-8)."""
    with contextlib.suppress(UnicodeDecodeError):
        return connection.engine.remote_container or ""
    return ""
