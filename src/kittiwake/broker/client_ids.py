"""The one client-id registry of DESIGN.md section 5, for every protocol: MQTT sessions are
:attr:`Broker.sessions`; a connection that holds an id without a session of that id (a JMS
connection, whose subscriptions are sessions of their own) is a holder here. The newcomer's
protocol decides: :meth:`ClientIds.claim` refuses (JMS), :meth:`Broker.connect` takes the id
over (MQTT). Knows no protocol.
"""

from __future__ import annotations

from typing import Protocol

from kittiwake.broker.sessions import Session


class ClientIdHolder(Protocol):
    """A connection holding a client id (an AMQP connection of a JMS client)."""

    def taken_over(self) -> None:
        """Another connection took the id (an MQTT connect): close, saying so."""


class ClientIds:
    """Who holds each client id that is not an MQTT session's."""

    __slots__ = ("holders", "sessions")

    def __init__(self, sessions: dict[str, Session]) -> None:
        self.sessions = sessions
        self.holders: dict[str, ClientIdHolder] = {}

    def claim(self, client_id: str, holder: ClientIdHolder) -> bool:
        """Hold ``client_id`` unless a connected client of any protocol holds it (the JMS
        rule: a second connection with an id in use is refused)."""
        session = self.sessions.get(client_id)
        if client_id in self.holders or (session is not None and session.link is not None):
            return False
        self.holders[client_id] = holder
        return True

    def release(self, client_id: str, holder: ClientIdHolder) -> None:
        if self.holders.get(client_id) is holder:
            del self.holders[client_id]

    def take_over(self, client_id: str) -> None:
        """An MQTT connect with this id (MQTT's rule, MQTT-3.1.4-3): its holder is closed."""
        holder = self.holders.pop(client_id, None)
        if holder is not None:
            holder.taken_over()
