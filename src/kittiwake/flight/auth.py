"""Who is calling the Flight service: credentials from the call's headers, the bearer tokens a
login issues, and the hook that accepts or refuses a call. Runs on the Flight server's threads;
must never touch the event loop.

:class:`UsersAuthenticator` asks the broker's one authentication service (the users every
front end shares). Flight's own login flow is supported: a ``Handshake`` carrying HTTP Basic
``user:password`` (``FlightClient.authenticate_basic_token``) is answered with an
``authorization: Bearer <token>`` header, and later calls send that token instead of the
password. Basic on any call is accepted too. Anonymous calls pass as the listener's policy
says. While no users exist, presented credentials are refused, since nothing could check them.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kittiwake.broker.authentication import Authentication, PasswordHash, Refusal
from kittiwake.broker.authentication import Credentials as UserCredentials

# How long an issued bearer token stands for its user unless configured (auth.token_lifetime).
DEFAULT_TOKEN_LIFETIME = 3600.0
# Random bytes in a token (URL-safe base64 on the wire).
_TOKEN_BYTES = 32


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


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a call acts as."""

    # The authenticated user; None for an anonymous call (whose ACLs name no user).
    user: str | None
    # The token this call's login issued (a Basic handshake): sent back in its headers.
    issued_token: str | None = None

    @property
    def name(self) -> str:
        return self.user if self.user is not None else "anonymous"


class Authenticator(Protocol):
    def authenticate(self, credentials: Credentials, *, login: bool = False) -> Caller:
        """The caller, or raise AuthenticationRefused. ``login``: the call is a Handshake,
        which issues a bearer token for a user that proved itself with a password."""
        ...


@dataclass(frozen=True, slots=True)
class _Issued:
    user: str
    # The user's hash when the token was issued: a changed password or a removed user
    # (a reloaded password file) ends the token.
    proof: PasswordHash
    expires_at: float


class BearerTokens:
    """Tokens issued on login, kept in memory only (a broker restart ends them: clients log in
    again). Shared by the Flight server's threads, hence the lock; never held across a slow
    step."""

    def __init__(self, lifetime: float, clock: Callable[[], float]) -> None:
        self.lifetime = lifetime
        self._clock = clock
        self._lock = threading.Lock()
        # Insertion order is expiry order (one lifetime for all): expired ones leave from
        # the front, so the table holds only live tokens plus what expired since the last
        # issue.
        self._issued: dict[str, _Issued] = {}

    def issue(self, user: str, proof: PasswordHash) -> str:
        token = secrets.token_urlsafe(_TOKEN_BYTES)
        now = self._clock()
        with self._lock:
            issued = self._issued
            for old in list(issued):
                if issued[old].expires_at > now:
                    break
                del issued[old]
            issued[token] = _Issued(user, proof, now + self.lifetime)
        return token

    def holder(self, token: str) -> _Issued:
        """The token's record, or refuse it (unknown, or expired: then it is forgotten)."""
        with self._lock:
            issued = self._issued.get(token)
            if issued is not None and issued.expires_at <= self._clock():
                del self._issued[token]
                raise AuthenticationRefused(
                    "the bearer token expired; log in again (a Basic handshake, "
                    "FlightClient.authenticate_basic_token)"
                )
        if issued is None:
            raise AuthenticationRefused(
                "the bearer token is not one this broker issued (or the broker restarted "
                "since); log in again (FlightClient.authenticate_basic_token)"
            )
        return issued

    def revoke(self, token: str) -> None:
        with self._lock:
            self._issued.pop(token, None)

    def __len__(self) -> int:
        return len(self._issued)


class UsersAuthenticator:
    """The broker's users, checked on the Flight server's own threads (the slow hash there
    blocks no one but the caller)."""

    def __init__(
        self,
        authentication: Authentication,
        allow_anonymous: bool | None,
        tokens: BearerTokens,
    ) -> None:
        self._authentication = authentication
        self._allow_anonymous = allow_anonymous
        self.tokens = tokens

    def authenticate(self, credentials: Credentials, *, login: bool = False) -> Caller:
        authentication = self._authentication
        if credentials.token is not None:
            issued = self.tokens.holder(credentials.token)
            if authentication.password_hash(issued.user) != issued.proof:
                self.tokens.revoke(credentials.token)
                raise AuthenticationRefused(
                    f"user {issued.user!r} was removed or changed its password since this "
                    "token was issued; log in again"
                )
            return Caller(issued.user)
        if credentials.anonymous:
            if not authentication.anonymous_allowed(self._allow_anonymous):
                raise AuthenticationRefused("anonymous access is disabled on this listener")
            return Caller(None)
        if not authentication.users_configured:
            raise AuthenticationRefused(
                "this broker has no users configured, so it cannot check credentials; "
                "connect without an authorization header"
            )
        verdict = authentication.verify(
            UserCredentials(credentials.username, credentials.password)
        )
        if isinstance(verdict, Refusal):
            raise AuthenticationRefused(verdict.value)
        user = verdict.name
        if user is None:  # pragma: no cover - a password login always names its user
            raise AuthenticationRefused("the login named no user")
        if not login:
            return Caller(user)
        proof = authentication.password_hash(user)
        if proof is None:  # removed by a reload during the check
            raise AuthenticationRefused(Refusal.BAD_CREDENTIALS.value)
        return Caller(user, self.tokens.issue(user, proof))


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
