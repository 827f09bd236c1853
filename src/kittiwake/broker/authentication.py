"""Who a client is: users with salted scrypt hashes, the anonymous policy, and the one check
every front end (MQTT, AMQP SASL PLAIN, Flight) asks before it lets a client in.

Knows no protocol and reads no file: the password file's text comes in (and goes out) as a
string. Password checks are slow by design; :meth:`Authentication.check` answers at once when it
can and says when a check must run off the event loop (:meth:`Authentication.verify`, which is
safe on any thread).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

log = logging.getLogger(__name__)

# scrypt cost: 2**14 x 8 x 1 takes ~50 ms and 16 MiB per check here, which makes guessing
# expensive while a login stays quick. Stored with each hash, so it can be raised later.
SCRYPT_LOG2_N: Final = 14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
_SALT_BYTES: Final = 16
_HASH_BYTES: Final = 32
_SCHEME: Final = "$scrypt$"
# User names: what MQTT, SASL and HTTP Basic can all carry, and what the file format can hold.
_FORBIDDEN_IN_NAMES: Final = frozenset(":\n\r\x00")


class PasswordFileError(ValueError):
    """The password file cannot be used; the message names the line."""


@dataclass(frozen=True, slots=True)
class PasswordHash:
    """One user's salted scrypt hash and the parameters it was made with."""

    log2_n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    @classmethod
    def make(cls, password: str, *, log2_n: int = SCRYPT_LOG2_N) -> PasswordHash:
        salt = os.urandom(_SALT_BYTES)
        digest = _scrypt(password, salt, log2_n, SCRYPT_R, SCRYPT_P)
        return cls(log2_n, SCRYPT_R, SCRYPT_P, salt, digest)

    def matches(self, password: str) -> bool:
        """The slow check; constant-time comparison."""
        attempt = _scrypt(password, self.salt, self.log2_n, self.r, self.p)
        return hmac.compare_digest(attempt, self.digest)

    def text(self) -> str:
        b64 = base64.b64encode
        return (
            f"{_SCHEME}ln={self.log2_n},r={self.r},p={self.p}$"
            f"{b64(self.salt).decode()}${b64(self.digest).decode()}"
        )

    @classmethod
    def parse(cls, text: str) -> PasswordHash:
        if not text.startswith(_SCHEME):
            raise ValueError("not an scrypt hash (expected it to start with $scrypt$)")
        try:
            params, salt, digest = text[len(_SCHEME) :].split("$")
            values = dict(item.split("=", 1) for item in params.split(","))
            log2_n, r, p = int(values["ln"]), int(values["r"]), int(values["p"])
            decoded = cls(
                log2_n,
                r,
                p,
                base64.b64decode(salt, validate=True),
                base64.b64decode(digest, validate=True),
            )
        except (ValueError, KeyError) as exc:
            raise ValueError(f"malformed scrypt hash: {exc}") from None
        if not (1 <= log2_n <= 20 and 1 <= r <= 32 and 1 <= p <= 16 and decoded.digest):
            raise ValueError("scrypt parameters out of range (ln 1..20, r 1..32, p 1..16)")
        return decoded


def _scrypt(password: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    n = 1 << log2_n
    return hashlib.scrypt(
        password.encode("utf-8"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        maxmem=256 * n * r + (1 << 20),
        dklen=_HASH_BYTES,
    )


def check_user_name(name: str) -> None:
    """Refuse a user name the file cannot hold or a protocol cannot carry."""
    if not name:
        raise ValueError("a user name must not be empty")
    if any(c in _FORBIDDEN_IN_NAMES for c in name):
        raise ValueError("a user name must not contain ':', a line break or U+0000")
    if name != name.strip():
        raise ValueError("a user name must not start or end with white space")


def parse_password_file(text: str) -> dict[str, PasswordHash]:
    """``user:$scrypt$...`` lines; blank lines and lines starting with '#' are ignored."""
    users: dict[str, PasswordHash] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, colon, hashed = line.partition(":")
        try:
            if not colon:
                raise ValueError("expected user:hash")
            check_user_name(name)
            if name in users:
                raise ValueError(f"user {name!r} appears twice")
            users[name] = PasswordHash.parse(hashed.strip())
        except ValueError as exc:
            raise PasswordFileError(f"line {number}: {exc}") from None
    return users


def format_password_file(users: dict[str, PasswordHash]) -> str:
    header = "# Kittiwake users: name:scrypt hash. Manage with `kittiwake passwd FILE USER`.\n"
    return header + "".join(f"{name}:{users[name].text()}\n" for name in sorted(users))


class Refusal(enum.Enum):
    """Why a client was not let in; front ends map each to their protocol's code."""

    BAD_CREDENTIALS = "bad user name or password"
    NOT_AUTHORIZED = "anonymous access is not allowed"
    RATE_LIMITED = "too many failed logins from this address"


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a client presented. ``certificate_name`` is the identity its TLS client
    certificate proved (when the listener maps certificates to users)."""

    username: str | None = None
    password: str | None = None
    certificate_name: str | None = None
    # The client's network address (no port): failed logins are counted per address.
    address: str = ""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection acts as. ``authenticated`` is False for an anonymous client and for a
    user name taken on trust while no users are configured."""

    name: str | None
    authenticated: bool
    how: str  # "password", "certificate", "anonymous" or "unchecked"

    @property
    def anonymous(self) -> bool:
        return self.name is None


ANONYMOUS: Final = Principal(None, False, "anonymous")


class Authentication:
    """The users and the anonymous policy; replaced users take effect for the next login only
    (connections already in keep their principal, so a reload drops nobody)."""

    def __init__(
        self,
        users: dict[str, PasswordHash] | None = None,
        *,
        allow_anonymous: bool | None = None,
        max_failed_logins: int = 10,
        failure_window: float = 60.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._users: dict[str, PasswordHash] = dict(users or {})
        # None: allowed while no users are configured (DESIGN.md §5).
        self._allow_anonymous = allow_anonymous
        self._max_failed = max_failed_logins
        self._window = failure_window
        self._now = clock or time.monotonic
        # A keyed fast digest of the last password that verified, per user: a client that
        # reconnects with the same password skips scrypt. The key lives only in memory.
        self._cache_key = secrets.token_bytes(32)
        self._verified: dict[str, tuple[PasswordHash, bytes]] = {}
        # address -> (start of its window, failures in it)
        self._failures: dict[str, tuple[float, int]] = {}

    # -- users -------------------------------------------------------------------------

    @property
    def users_configured(self) -> bool:
        return bool(self._users)

    def replace_users(self, users: dict[str, PasswordHash]) -> None:
        """The password file changed (SIGHUP): new logins see the new users at once."""
        self._users = dict(users)
        self._verified = {}

    def user_names(self) -> Iterable[str]:
        return tuple(self._users)

    def password_hash(self, name: str) -> PasswordHash | None:
        """The user's current hash (None: no such user): what a credential derived from a
        login, such as a bearer token, is checked against, so a removed user or a changed
        password ends it."""
        return self._users.get(name)

    def anonymous_allowed(self, listener_policy: bool | None = None) -> bool:
        """A listener's own setting wins; then the broker's; then "while no users exist"."""
        if listener_policy is not None:
            return listener_policy
        if self._allow_anonymous is not None:
            return self._allow_anonymous
        return not self._users

    # -- the check ---------------------------------------------------------------------

    def check(
        self, credentials: Credentials, listener_policy: bool | None = None
    ) -> Principal | Refusal | None:
        """The answer when it needs no slow work; None when :meth:`verify` must run (off the
        event loop) to check a password."""
        if credentials.certificate_name is not None:
            return Principal(credentials.certificate_name, True, "certificate")
        name = credentials.username
        if name is None:
            if self.anonymous_allowed(listener_policy):
                return ANONYMOUS
            return Refusal.NOT_AUTHORIZED
        users = self._users
        if not users:
            # Nothing to check against: the name is taken on trust, as before users existed.
            return Principal(name, False, "unchecked")
        if self._rate_limited(credentials.address):
            return Refusal.RATE_LIMITED
        hashed = users.get(name)
        password = credentials.password
        if hashed is None or password is None:
            why = "unknown user" if hashed is None else "no password"
            self._failed(credentials.address, name, why)
            return Refusal.BAD_CREDENTIALS
        known = self._verified.get(name)
        if (
            known is not None
            and known[0] is hashed
            and hmac.compare_digest(known[1], self._fast_digest(name, password))
        ):
            return Principal(name, True, "password")
        return None

    def verify(self, credentials: Credentials) -> Principal | Refusal:
        """The full check, scrypt included: blocking, safe on any thread."""
        answer = self.check(credentials)
        if answer is not None:
            return answer
        name, password = credentials.username, credentials.password
        assert name is not None and password is not None
        hashed = self._users.get(name)
        if hashed is None:  # removed by a reload meanwhile
            self._failed(credentials.address, name, "unknown user")
            return Refusal.BAD_CREDENTIALS
        if not hashed.matches(password):
            self._failed(credentials.address, name, "wrong password")
            return Refusal.BAD_CREDENTIALS
        self._verified[name] = (hashed, self._fast_digest(name, password))
        return Principal(name, True, "password")

    def _fast_digest(self, name: str, password: str) -> bytes:
        message = name.encode("utf-8", "surrogatepass") + b"\x00" + password.encode(
            "utf-8", "surrogatepass"
        )
        return hmac.digest(self._cache_key, message, "sha256")

    # -- failed logins, per address ----------------------------------------------------

    def _rate_limited(self, address: str) -> bool:
        entry = self._failures.get(address)
        if entry is None or not self._max_failed:
            return False
        start, count = entry
        if self._now() - start > self._window:
            self._failures.pop(address, None)
            return False
        return count >= self._max_failed

    def _failed(self, address: str, name: str, why: str) -> None:
        log.warning("failed login for user %r from %s: %s", name, address or "?", why)
        now = self._now()
        start, count = self._failures.get(address, (now, 0))
        if now - start > self._window:
            start, count = now, 0
        self._failures[address] = (start, count + 1)
        if len(self._failures) > 10_000:
            # Bounded: forget the windows that are over (a flood of addresses cannot grow it).
            self._failures = {
                a: v for a, v in self._failures.items() if now - v[0] <= self._window
            }
