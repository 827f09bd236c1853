"""Who is calling the Flight service: credentials from the call's headers, and the hook that
accepts or refuses them. Runs on the Flight server's threads; must never touch the event loop.

:class:`UsersAuthenticator` asks the broker's one authentication service (the users every
front end shares): HTTP Basic user:password is checked against them, anonymous calls pass as
the listener's policy says. While no users exist, presented credentials are refused, since
nothing could check them. Bearer tokens are not issued yet, so they are refused too.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kittiwake.broker.authentication import Authentication, Refusal
from kittiwake.broker.authentication import Credentials as UserCredentials


class AuthenticationRefused(Exception):
    """The credentials (or their absence) are refused; the message is safe to show."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a call presented: a bearer token, or a user name and password (HTTP Basic)."""

    token: str | None = None
    username: str | None = None
    password: str | None = None

    @property
    def anonymous(self) -> bool:
        return self.token is None and self.username is None


class Authenticator(Protocol):
    def authenticate(self, credentials: Credentials) -> str:
        """The principal's name, or raise AuthenticationRefused."""
        ...


class UsersAuthenticator:
    """The broker's users, checked on the Flight server's own threads (the slow hash there
    blocks no one but the caller)."""

    def __init__(self, authentication: Authentication, allow_anonymous: bool | None) -> None:
        self._authentication = authentication
        self._allow_anonymous = allow_anonymous

    def authenticate(self, credentials: Credentials) -> str:
        if credentials.token is not None:
            raise AuthenticationRefused(
                "bearer tokens are not supported yet; use Basic with a user name and password"
            )
        if credentials.anonymous:
            if not self._authentication.anonymous_allowed(self._allow_anonymous):
                raise AuthenticationRefused("anonymous access is disabled on this listener")
            return "anonymous"
        if not self._authentication.users_configured:
            raise AuthenticationRefused(
                "this broker has no users configured, so it cannot check credentials; "
                "connect without an authorization header"
            )
        verdict = self._authentication.verify(
            UserCredentials(credentials.username, credentials.password)
        )
        if isinstance(verdict, Refusal):
            raise AuthenticationRefused(verdict.value)
        return verdict.name or "anonymous"


def credentials_from_headers(headers: Mapping[str, Sequence[str | bytes]]) -> Credentials:
    """Read the ``authorization`` header: ``Bearer <token>`` or ``Basic base64(user:pass)``."""
    values = headers.get("authorization") or ()
    if not values:
        return Credentials()
    if len(values) > 1:
        raise AuthenticationRefused("more than one authorization header")
    raw = values[0]
    value = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    scheme, _space, rest = value.strip().partition(" ")
    rest = rest.strip()
    if scheme.lower() == "bearer" and rest:
        return Credentials(token=rest)
    if scheme.lower() == "basic" and rest:
        try:
            decoded = base64.b64decode(rest, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise AuthenticationRefused("the Basic authorization header is not base64") from None
        username, colon, password = decoded.partition(":")
        if not colon:
            raise AuthenticationRefused("the Basic authorization header has no user:password")
        return Credentials(username=username, password=password)
    raise AuthenticationRefused("the authorization header must be 'Bearer <token>' or 'Basic ...'")
