"""How an MQTT client gets in: its CONNECT's user name and password (or its TLS certificate)
checked by the broker's one authentication service, and the answer in MQTT's codes.

Never blocks the event loop: a password that must be hashed is checked on a worker thread and
the connection waits for the answer (holding whatever the client sent meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from kittiwake.broker.authentication import Authentication, Credentials, Principal, Refusal
from kittiwake.mqtt.reason_codes import ConnectReturnCode, ReasonCode

log = logging.getLogger(__name__)

Verdict = Principal | Refusal

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
    certificate proved (if the listener maps certificates to users), and its address."""

    __slots__ = ("address", "allow_anonymous", "authentication", "certificate_name")

    def __init__(
        self,
        authentication: Authentication,
        *,
        allow_anonymous: bool | None = None,
        certificate_name: str | None = None,
        address: str = "",
    ) -> None:
        self.authentication = authentication
        self.allow_anonymous = allow_anonymous
        self.certificate_name = certificate_name
        self.address = address

    def check(
        self, username: str | None, password: bytes | None
    ) -> Verdict | asyncio.Future[Verdict]:
        """The verdict now, or a future of it when a password must be hashed."""
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
        return asyncio.get_running_loop().run_in_executor(
            None, authentication.verify, credentials
        )


def refusal_code(refusal: Refusal, protocol_version: int) -> int:
    v5, v3 = REFUSAL_CODES[refusal]
    return v5 if protocol_version == 5 else v3
