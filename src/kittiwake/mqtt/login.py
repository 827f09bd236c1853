"""How an MQTT client gets in: its CONNECT's user name and password (or its TLS certificate)
checked by the broker's one authentication service, and the answer in MQTT's codes.

Sans-IO, like the connection that uses it: a password that must be hashed is checked by the
``verify`` callable the asyncio shell gives it (:mod:`kittiwake.mqtt.server` runs it on a worker
thread, so it never blocks the event loop), and the connection waits for the answer (holding
whatever the client sent meanwhile).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final, Protocol

from kittiwake.broker.authentication import Authentication, Credentials, Principal, Refusal
from kittiwake.mqtt.reason_codes import ConnectReturnCode, ReasonCode

log = logging.getLogger(__name__)

Verdict = Principal | Refusal


class PendingVerdict(Protocol):
    """A verdict still being worked out (the shell's future of a password check): the
    connection registers a callback and reads the result once it is done."""

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None: ...

    def result(self) -> Verdict: ...


# How a password is checked: the full (slow, scrypt) check of the credentials, answered now or
# later. The asyncio shell runs it off the loop; without one it runs inline (unit tests).
Verify = Callable[[Credentials], Verdict | PendingVerdict]

# The CONNACK code of each refusal: (MQTT 5 reason code, 3.1/3.1.1 return code).
REFUSAL_CODES: Final[dict[Refusal, tuple[int, int]]] = {
    Refusal.BAD_CREDENTIALS: (
        ReasonCode.BAD_USER_NAME_OR_PASSWORD,
        ConnectReturnCode.BAD_USERNAME_OR_PASSWORD,
    ),
    Refusal.NOT_AUTHORIZED: (ReasonCode.NOT_AUTHORIZED, ConnectReturnCode.NOT_AUTHORIZED),
    Refusal.RATE_LIMITED: (
        ReasonCode.CONNECTION_RATE_EXCEEDED,
        ConnectReturnCode.SERVER_UNAVAILABLE,
    ),
}


class Login:
    """One connection's way in: the listener's anonymous policy, the identity its TLS client
    certificate proved (if the listener maps certificates to users), its address, and how a
    password is verified (``verify``; the authentication's own blocking check by default)."""

    __slots__ = ("address", "allow_anonymous", "authentication", "certificate_name", "verify")

    def __init__(
        self,
        authentication: Authentication,
        *,
        allow_anonymous: bool | None = None,
        certificate_name: str | None = None,
        address: str = "",
        verify: Verify | None = None,
    ) -> None:
        self.authentication = authentication
        self.allow_anonymous = allow_anonymous
        self.certificate_name = certificate_name
        self.address = address
        self.verify: Verify = authentication.verify if verify is None else verify

    def check(self, username: str | None, password: bytes | None) -> Verdict | PendingVerdict:
        """The verdict now, or (from ``verify``) a pending one when a password must be
        hashed."""
        text: str | None = None
        if password is not None:
            try:
                text = password.decode("utf-8")
            except UnicodeDecodeError:
                # Passwords are set as text: bytes that are not UTF-8 match none of them, so
                # they count as no password (refused as bad credentials, and counted).
                text = None
        credentials = Credentials(username, text, self.certificate_name, self.address)
        authentication = self.authentication
        verdict = authentication.check(credentials, self.allow_anonymous)
        if verdict is not None:
            return verdict
        return self.verify(credentials)


def refusal_code(refusal: Refusal, protocol_version: int) -> int:
    v5, v3 = REFUSAL_CODES[refusal]
    return v5 if protocol_version == 5 else v3
