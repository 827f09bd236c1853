"""Connection URLs of kittiwake.jms: ``amqp://[user:password@]host[:port]``, Qpid JMS's
``failover:(amqp://a:5672,amqp://b:5672)?failover.maxReconnectAttempts=...`` and
``vm://name`` (a broker in this process). Parsing only; connects nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from kittiwake.jms.exceptions import JMSException

DEFAULT_PORT = 5672

# Qpid JMS's failover options (with or without the ``failover.`` prefix) and what they set.
_FAILOVER_OPTIONS = {
    "maxReconnectAttempts": "max_attempts",
    "initialReconnectDelay": "initial_delay_ms",
    "reconnectDelay": "initial_delay_ms",
    "maxReconnectDelay": "max_delay_ms",
    "reconnectBackOffMultiplier": "backoff",
}


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"amqp://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Failover:
    """How to reconnect: ``max_attempts`` rounds over the addresses (None: without end, Qpid
    JMS's -1), waiting ``initial_delay_ms`` first, multiplied by ``backoff`` up to
    ``max_delay_ms`` between rounds."""

    max_attempts: int | None = None
    initial_delay_ms: float = 10.0
    max_delay_ms: float = 30_000.0
    backoff: float = 2.0


@dataclass(frozen=True, slots=True)
class BrokerURL:
    addresses: tuple[Address, ...]
    username: str | None = None
    password: str | None = None
    # Set for a failover: URL; a plain URL reconnects only when the factory says so.
    failover: Failover | None = None
    # vm://name: the in-process broker's name (no address is dialled).
    vm: str | None = None


def parse_url(url: str) -> BrokerURL:
    """The addresses, credentials and failover options of a connection URL; a JMSException
    names what is wrong with a bad one."""
    if url.startswith("failover:"):
        return _parse_failover(url[len("failover:") :], url)
    if url.startswith("vm://"):
        name = urlsplit(url).hostname or ""
        if not name:
            raise JMSException(f"no broker name in {url!r} (vm://name)")
        return BrokerURL((Address(name, 0),), vm=name)
    address, username, password = _parse_amqp(url)
    return BrokerURL((address,), username, password)


def _parse_amqp(url: str) -> tuple[Address, str | None, str | None]:
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", ""):
        raise JMSException(
            f"unsupported URL scheme {parts.scheme!r} (use amqp://, failover: or vm://)"
        )
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise JMSException(f"bad port in {url!r}") from None
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return Address(parts.hostname or "127.0.0.1", port), username, password


def _parse_failover(rest: str, url: str) -> BrokerURL:
    if rest.startswith("("):
        inner, closing, query = rest[1:].partition(")")
        if not closing:
            raise JMSException(f"no closing parenthesis in {url!r}")
        query = query.removeprefix("?")
    else:
        inner, _, query = rest.partition("?")
    members = [m.strip() for m in inner.split(",") if m.strip()]
    if not members:
        raise JMSException(f"no broker URL in {url!r}")
    parsed = [_parse_amqp(m) for m in members]
    values: dict[str, float] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        name = _FAILOVER_OPTIONS.get(key.removeprefix("failover."))
        if name is None:
            known = ", ".join(f"failover.{k}" for k in _FAILOVER_OPTIONS)
            raise JMSException(f"unknown failover option {key!r} (known: {known})")
        try:
            values[name] = float(value)
        except ValueError:
            raise JMSException(f"failover option {key!r} needs a number, not {value!r}") from None
    attempts = values.pop("max_attempts", -1)
    failover = Failover(
        max_attempts=None if attempts < 0 else int(attempts),
        **values,
    )
    username = next((u for _, u, _ in parsed if u is not None), None)
    password = next((p for _, _, p in parsed if p is not None), None)
    return BrokerURL(tuple(a for a, _, _ in parsed), username, password, failover)
