"""Typed broker configuration, loaded once from TOML; every default is written where declared.

Unknown keys and wrong types are refused with the key's dotted path, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kittiwake.broker.topics import TopicError, topic_matches, validate_topic_filter

log = logging.getLogger(__name__)

QueueFullPolicy = Literal["reject_new", "discard_oldest"]


# A web origin (RFC 6454) as a browser's Origin header gives it: scheme://host[:port].
_ORIGIN = re.compile(r"https?://(\[[0-9a-f:.]+\]|[^/\s:?#\[\]]+)(:[0-9]{1,5})?|null", re.IGNORECASE)


class ConfigError(ValueError):
    """The configuration file cannot be used; the message names the file and the key."""


ListenerProtocol = Literal["mqtt", "websockets", "amqp", "flight", "http"]
# The port a listener binds when its table names none: MQTT's and AMQP's registered ports
# (plain and TLS), the customary ones of MQTT over WebSockets, Arrow Flight's (the Spark
# data source's executors connect there) and HTTP's alternative ports (the operators' listener:
# console, /metrics, admin API).
DEFAULT_PORTS: dict[str, int] = {
    "mqtt": 1883,
    "websockets": 8080,
    "amqp": 5672,
    "flight": 8815,
    "http": 9080,
}
DEFAULT_TLS_PORTS: dict[str, int] = {
    "mqtt": 8883,
    "websockets": 8443,
    "amqp": 5671,
    "flight": 8815,
    "http": 9443,
}
_PROTOCOL_DEFAULT_PORT = -1
# Whether clients without credentials get in: "auto" = as the next level up says.
AnonymousPolicy = Literal["auto", True, False]


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """TLS on a listener (``tls = { certificate = ..., key = ... }``); off without a
    certificate. Paths are PEM files."""

    # The server's certificate (chain), and its private key (may be in the same file).
    certificate: str = ""
    key: str = ""
    # CA certificates that client certificates are checked against.
    ca: str = ""
    min_version: Literal["1.2", "1.3"] = "1.2"
    # Refuse clients without a certificate the CA signed (otherwise one is only checked
    # when a client offers it).
    require_client_certificate: bool = False
    # A client certificate names the user: its subject's common name ("cn") or its whole
    # subject ("subject", RFC 4514, e.g. "CN=alice,O=Example"); "none" = it names no one.
    certificate_user: Literal["none", "cn", "subject"] = "none"

    @property
    def enabled(self) -> bool:
        return bool(self.certificate)


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """One socket the broker accepts connections on: MQTT clients (over TCP or WebSockets),
    AMQP 1.0 clients, Arrow Flight (the journal's range reads for Spark executors), or HTTP
    (operators: the web console, /metrics and the admin API)."""

    protocol: ListenerProtocol = "mqtt"
    host: str = "127.0.0.1"
    # The protocol's default (DEFAULT_PORTS, or DEFAULT_TLS_PORTS with TLS) unless given;
    # 0 = any free port.
    port: int = _PROTOCOL_DEFAULT_PORT
    tls: TLSConfig = field(default_factory=TLSConfig)
    # Clients without credentials on this listener: "auto" = as auth.allow_anonymous says.
    allow_anonymous: AnonymousPolicy = "auto"
    # websockets listeners: the origins (as browsers send them, "https://app.example.com",
    # "http://localhost:3000") whose web pages may connect; a handshake from any other
    # origin is refused with HTTP 403. Empty = any origin (Mosquitto's and EMQX's default).
    # A handshake without an Origin header (not a browser) is not refused.
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.port == _PROTOCOL_DEFAULT_PORT:
            ports = DEFAULT_TLS_PORTS if self.tls.enabled else DEFAULT_PORTS
            object.__setattr__(self, "port", ports[self.protocol])


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """Every resource a client can make the broker spend, bounded."""

    max_connections: int = 100_000
    # Connections open at once from one client address, and new connections per second from
    # one address (a burst of one second's worth is allowed); 0 = no limit. Refused on every
    # listener kind (MQTT 5: CONNACK 0x97 / 0x9F). Generous: many clients can share an address
    # (NAT, a gateway, loopback in tests and benchmarks).
    max_connections_per_address: int = 0
    max_connection_rate: float = 0.0
    # Largest MQTT packet accepted from a client (bytes, fixed header included).
    max_packet_size: int = 16 * 1024 * 1024
    # QoS 1/2 publications a client may have unacknowledged towards us (v5 Receive Maximum).
    receive_maximum: int = 100
    # QoS 1/2 deliveries in flight to one client, further capped by the client's Receive Maximum.
    max_inflight: int = 100
    # Per-subscriber queue of messages waiting for a connection or for in-flight room.
    max_queued_messages: int = 10_000
    max_queued_bytes: int = 64 * 1024 * 1024
    queue_full_policy: QueueFullPolicy = "reject_new"
    # Producer flow control: a QoS 1/2 publisher's acknowledgement waits while a connected
    # subscriber it feeds has this many messages, or this many bytes, queued, so a fast
    # publisher cannot bury a slow subscriber. 0 disables either count. Held acknowledgements
    # go back oldest first as it drains below this depth (all of them at half of it; bytes:
    # at half the byte count).
    # Keep them well below max_queued_messages / max_queued_bytes: publishers already in flight
    # still arrive after the acknowledgements stop (see publisher_pause_bytes).
    # (The byte count is capped at half of max_queued_bytes, so it always engages first.)
    # 1,000: under a QoS 1 flood a depth of 200 cut fan-out and fan-in latency (p99 0.36x
    # and 0.71x) but cost 8-10% of msg/s (the publishers are held and released more often).
    flow_control_depth: int = 1000
    flow_control_bytes: int = 16 * 1024 * 1024
    # A congested subscriber that makes no progress (starts no new delivery, i.e. acknowledges
    # nothing) for this many seconds stops holding publishers back: its own queue fills to its
    # limits and queue_full_policy applies. 0 = a congested subscriber holds them for ever.
    stalled_subscriber_timeout: float = 5.0
    # Bytes of QoS 1/2 publications one connection may have waiting for their acknowledgement
    # before the broker stops reading from it until half of them are answered: bounds what a
    # held-back publisher still pushes in, however large its messages. 0 = never stop reading.
    publisher_pause_bytes: int = 8 * 1024 * 1024
    # Broker-wide bound on bytes queued for all sessions and shared subscriptions together:
    # above it every QoS 1/2 publisher's acknowledgement waits until the total is back under
    # half of it (checked twice a second). 0 = no bound.
    max_total_queued_bytes: int = 1024 * 1024 * 1024
    # Largest payload kept as a topic's retained message (bytes); 0 = no limit beyond
    # max_packet_size. A larger retained publication is still delivered live, but not
    # retained (the topic's older retained message stays); counted and logged, and an MQTT 5
    # QoS 1/2 publisher is answered 0x97 Quota exceeded.
    max_retained_payload: int = 0
    # Topic aliases a v5 client may use towards us.
    topic_alias_maximum: int = 64
    max_topic_levels: int = 128
    max_subscriptions_per_session: int = 10_000
    # Message groups (JMSXGroupID) one queue keeps with their consumer at once; past it the
    # group used longest ago whose consumer holds none of its messages is forgotten (its next
    # message goes to whichever consumer takes it). 0 = no limit.
    max_message_groups: int = 65_536
    # Topics whose receivers (route plan) are remembered, at the least: two per filter when
    # there are more filters, up to 16,384 (and as many again for recently published ones);
    # 0 remembers none.
    match_cache_size: int = 4096
    # One fenced write of the Spark sink (one partition of one batch), taken whole or not at
    # all: the broker holds it in memory and publishes it in one event-loop turn, so these
    # bound both its memory and how long the loop pauses for it. A larger one is refused.
    max_put_rows: int = 200_000
    max_put_bytes: int = 64 * 1024 * 1024
    # Puts taken at once (each may hold max_put_bytes in memory); one more is answered "busy"
    # and its sender retries.
    max_concurrent_puts: int = 8


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Session lifetimes and keepalive policy."""

    # Keepalive is capped at this many seconds and returned as v5 Server Keep Alive; 0 = no cap.
    max_keepalive: int = 60
    # Cap on a v5 client's requested Session Expiry Interval (seconds).
    max_session_expiry: int = 7 * 24 * 3600
    # Expiry of a 3.1/3.1.1 persistent session (clean session = 0), which has no expiry of its
    # own in those protocols; 0 = never expires.
    persistent_session_expiry_v3: int = 0
    # Longest message expiry the broker honours (seconds); 0 = no cap.
    max_message_expiry: int = 0


@dataclass(frozen=True, slots=True)
class SysConfig:
    """Statistics published under $SYS/broker/..."""

    # Seconds between publications; 0 disables $SYS.
    interval: float = 10.0


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """A named set of users that ACL rules can grant to at once."""

    name: str = ""
    users: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ACLRule:
    """What the users, groups and client ids it names may do (naming none: everyone). Topic
    filters may hold %u (the user name) and %c (the client id); a deny always wins."""

    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    clients: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    deny_publish: tuple[str, ...] = ()
    deny_subscribe: tuple[str, ...] = ()
    # JMS queues (their names matched as MQTT topic filters): sending to one, receiving
    # (consuming) from one, browsing one.
    send: tuple[str, ...] = ()
    receive: tuple[str, ...] = ()
    browse: tuple[str, ...] = ()
    deny_send: tuple[str, ...] = ()
    deny_receive: tuple[str, ...] = ()
    deny_browse: tuple[str, ...] = ()


# Every list of filters an ACL rule holds.
ACL_RULE_FILTERS = (
    "publish",
    "subscribe",
    "deny_publish",
    "deny_subscribe",
    "send",
    "receive",
    "browse",
    "deny_send",
    "deny_receive",
    "deny_browse",
)


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Users (who may connect) and the simple authorisation hook: topic allow/deny lists
    (MQTT filters)."""

    # "auto": clients without credentials are let in while no users are configured (a
    # listener may say otherwise for itself).
    allow_anonymous: AnonymousPolicy = "auto"
    # The users: lines of "name:$scrypt$...", managed with `kittiwake passwd FILE USER`; read
    # at start and again on SIGHUP. "" = no users.
    password_file: str = ""
    # Failed logins from one address within failed_login_window seconds, after which its
    # logins are refused unchecked until the window ends; 0 = no limit.
    max_failed_logins: int = 10
    failed_login_window: float = 60.0
    # Seconds a bearer token stays valid: the Flight listener issues one on a Basic login
    # (its Handshake), and later calls send it instead of the password. At least 1.
    token_lifetime: float = 3600.0
    # Groups of users, and per user/group/client rules ([[auth.acl]]); once any rule exists,
    # what no allow rule grants is denied.
    groups: tuple[GroupConfig, ...] = ()
    acl: tuple[ACLRule, ...] = ()
    # Who may use the http listener (console, /metrics, admin API and commands): users and
    # groups by name. Empty while no ACL rule exists: every client the listener lets in; once
    # ACL rules or admins exist, only the users and groups named here.
    admins: tuple[str, ...] = ()
    # Read-only operators: users and groups that may use the http listener's GET endpoints
    # (console pages, /metrics, the admin API's views and the read-only admin commands) but
    # no action (purge, disconnect, delete: 403). Admins may read too.
    monitors: tuple[str, ...] = ()
    # An empty allow list allows every topic; a deny entry always wins over an allow entry.
    publish_allow: tuple[str, ...] = ()
    publish_deny: tuple[str, ...] = ()
    subscribe_allow: tuple[str, ...] = ()
    subscribe_deny: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Where durable state lives and how the writer batches commits."""

    # "sqlite" (embedded, WAL, group commit) or "memory" (lost at exit; tests and demos).
    backend: Literal["sqlite", "memory"] = "sqlite"
    data_dir: str = "./data"
    # Most operations one transaction holds; a group commit takes whatever queued up meanwhile.
    max_batch: int = 5000
    # Extra wait before each commit to gather a bigger group (seconds); 0 = commit at once.
    # Without it a group is whatever gathered while the writer was busy with the last one.
    max_delay: float = 0.0
    # How long a batch of QoS 1 queue entries, every one on its way to a connected
    # subscriber (or a JMS PERSISTENT send to a queue whose consumer keeps up), may wait
    # for their acceptances before an idle writer takes it (seconds; 0 = never held): an
    # entry accepted meanwhile is never written, and its publisher was acknowledged at the
    # acceptance. Only a publisher whose copies are not all accepted that soon (a slow
    # subscriber's) waits up to this long more; an absent subscriber's copy is written at
    # once. While entries keep being accepted (any queue's), a batch past its window stays
    # held (a deep queue drained steadily), but never past four windows; once acceptances
    # stop, it is written a window after the last one.
    acceptance_window: float = 0.05
    # WAL pages after which SQLite checkpoints the WAL into the database (bounds the WAL file).
    wal_autocheckpoint: int = 1000
    # SQLite synchronous mode: "full" fsyncs every commit, which the acknowledgement promise needs.
    synchronous: Literal["full", "normal"] = "full"
    # Dispatch QoS 1 publications while their commit is pending, and write none of a copy
    # accepted before its batch reaches the writer (DESIGN.md section 3). Off: every stored
    # copy waits for its commit (persist -> acknowledge -> dispatch).
    store_and_dispatch: bool = True


@dataclass(frozen=True, slots=True)
class AMQPConfig:
    """What one AMQP 1.0 connection may make the broker spend."""

    # Largest frame either side may send (advertised in open); at least 512 (AMQP's floor).
    max_frame_size: int = 1024 * 1024
    # Sessions (channels) one connection may open.
    max_sessions: int = 32
    # Links one session may attach.
    max_links_per_session: int = 256
    # Seconds without any frame from the peer before the connection is closed (advertised as
    # idle-time-out, so clients send heartbeats); 0 = never.
    idle_timeout: float = 60.0
    # Bytes of incoming transfers one session may have buffered (its incoming window).
    session_capacity: int = 8 * 1024 * 1024
    # Largest message accepted on a link (advertised as max-message-size).
    max_message_size: int = 16 * 1024 * 1024
    # Credit the broker grants each producing link (topped up when half is used): how many
    # transfers a producer may have on their way before the broker answers.
    link_credit: int = 100


@dataclass(frozen=True, slots=True)
class QueuePattern:
    """Settings for the queues whose names ``match`` matches (MQTT wildcards over names split
    at '/': "orders/+", "audit/#", "#"); an option left out keeps the [queues] value."""

    match: str
    max_delivery_attempts: int | None = None
    dead_letter_queue: str | None = None
    expiry_queue: str | None = None
    auto_create: bool | None = None


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """What applies to one queue: [queues], overridden by the first pattern matching its name."""

    max_delivery_attempts: int
    dead_letter_queue: str
    expiry_queue: str
    auto_create: bool


@dataclass(frozen=True, slots=True)
class QueuesConfig:
    """Queue lifecycles, redelivery and where entries go that a queue gives up on (DESIGN.md
    section 5): JMS queues and JMS topic subscriptions (MQTT sessions' queues never
    dead-letter)."""

    # Failed deliveries of one entry before it moves to the dead-letter queue; 0 = no limit.
    max_delivery_attempts: int = 10
    # The dead-letter queue's name, or a pattern with {queue} for the original queue's name.
    dead_letter_queue: str = "DLQ"
    # Where expired entries move (a name or pattern, as above); "" drops them, still counted.
    expiry_queue: str = "ExpiryQueue"
    # A queue is created on first use (a send or a consumer); false: only declared queues
    # exist, and using another is refused (AMQP amqp:not-found).
    auto_create: bool = True
    # Queues that exist from start-up, whatever auto_create says.
    declared: tuple[str, ...] = ()
    # Per-name settings; the first whose match fits a queue's name applies.
    patterns: tuple[QueuePattern, ...] = ()

    def settings(self, name: str) -> QueueSettings:
        """The settings of the queue ``name`` (a subscription's queue, whose name is the
        broker's own "$session/...", is matched without its leading '$')."""
        name = name.lstrip("$")
        for pattern in self.patterns:
            if topic_matches(pattern.match, name):
                return QueueSettings(
                    _either(pattern.max_delivery_attempts, self.max_delivery_attempts),
                    _either(pattern.dead_letter_queue, self.dead_letter_queue),
                    _either(pattern.expiry_queue, self.expiry_queue),
                    _either(pattern.auto_create, self.auto_create),
                )
        return QueueSettings(
            self.max_delivery_attempts, self.dead_letter_queue, self.expiry_queue, self.auto_create
        )


_T = typing.TypeVar("_T")


def _either(value: _T | None, default: _T) -> _T:
    return default if value is None else value


@dataclass(frozen=True, slots=True)
class JournalConfig:
    """What the journal keeps for the data pipeline (the Spark data source reads it), and how
    long. Nothing is kept past its subscribers unless a retention is set."""

    # Keep journalled messages this long, counted from when the store wrote each one (not
    # from its acknowledgements: a queue still holding an older one keeps it for itself, but
    # readers of the journal no longer see it); 0 = no time bound (with retention_bytes 0
    # too, a message is kept only while a queue references it).
    retention_seconds: float = 0.0
    # Also (or instead) keep the newest messages up to this many payload bytes; 0 = no size
    # bound. Either retention turns the journal on.
    retention_bytes: int = 0
    # MQTT filters whose persistent publications (MQTT QoS 1/2, JMS PERSISTENT) the journal
    # keeps; "#" = every topic (except those starting with '$', which no wildcard matches).
    persistent_topics: tuple[str, ...] = ("#",)
    # Filters whose non-persistent publications (MQTT QoS 0, JMS NON_PERSISTENT: it arrives at
    # QoS 1 but is never written toward the store) the journal keeps too: an opt-in, because
    # each costs a disk write they otherwise never pay (no acknowledgement waits for it).
    qos0_topics: tuple[str, ...] = ()
    # Seconds the broker remembers a finished batch write of the Spark sink (df.write, whose
    # driver committed it): until then a late task of it, or a rerun with the same writeId,
    # publishes nothing again; after it, that writer's last fence is dropped.
    finished_write_retention: float = 7 * 24 * 3600.0

    @property
    def enabled(self) -> bool:
        return self.retention_seconds > 0 or self.retention_bytes > 0


@dataclass(frozen=True, slots=True)
class Config:
    """The whole broker configuration."""

    listeners: tuple[ListenerConfig, ...] = (ListenerConfig(),)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    sessions: SessionConfig = field(default_factory=SessionConfig)
    sys: SysConfig = field(default_factory=SysConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    amqp: AMQPConfig = field(default_factory=AMQPConfig)
    queues: QueuesConfig = field(default_factory=QueuesConfig)
    journal: JournalConfig = field(default_factory=JournalConfig)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # "text": one readable line per record; "json": one JSON object per line (timestamp,
    # level, logger, message, and the connection's id where there is one) for log collectors.
    log_format: Literal["text", "json"] = "text"
    # Use uvloop when it is installed.
    uvloop: bool = True


def load_config(path: str | Path | None) -> Config:
    """Read a TOML file into a :class:`Config`; ``None`` gives the defaults."""
    if path is None:
        return Config()
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    try:
        config = _build(Config, _renamed(raw, str(path)), "")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    assert isinstance(config, Config)
    return config


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Build a config from plain data (tests and embedding use this)."""
    config = _build(Config, _renamed(raw, "config"), "")
    assert isinstance(config, Config)
    return config


# Keys that moved: (old table, old key) -> (new table, new key). The old spelling keeps
# working, with a warning naming its replacement, so an upgrade never breaks a config file.
RENAMED_KEYS: dict[tuple[str, str], tuple[str, str]] = {
    ("store", "journal_retention_seconds"): ("journal", "retention_seconds"),
    ("store", "journal_retention_bytes"): ("journal", "retention_bytes"),
}


def _renamed(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """``raw`` with renamed keys moved to their new place (a copy; ``raw`` is not changed)."""
    raw = dict(raw)
    for (old_table, old_key), (new_table, new_key) in RENAMED_KEYS.items():
        table = raw.get(old_table)
        if not isinstance(table, dict) or old_key not in table:
            continue
        table = raw[old_table] = dict(table)
        value = table.pop(old_key)
        target = raw.get(new_table, {})
        if not isinstance(target, dict):
            continue  # _build names the malformed table
        if new_key in target:
            raise ConfigError(
                f"{old_table}.{old_key} and {new_table}.{new_key} are both set; "
                f"{old_table}.{old_key} is the old name of {new_table}.{new_key}: keep only that"
            )
        raw[new_table] = {**target, new_key: value}
        log.warning(
            "%s: %s.%s is deprecated; it is now %s.%s (the old name still works for now)",
            source,
            old_table,
            old_key,
            new_table,
            new_key,
        )
    return raw


def _build(cls: type[Any], raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'top level'}: expected a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"unknown key {_join(where, unknown[0])!r}; known keys: {sorted(names)}")
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in raw:
            raise ConfigError(f"{where or 'top level'}: {f.name} is required")
    values = {name: _convert(hints[name], value, _join(where, name)) for name, value in raw.items()}
    for name, value in values.items():
        # Checked before construction too: a listener turns its "protocol default" port
        # sentinel (-1) into a real port, which would hide a negative port written out.
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ConfigError(f"{_join(where, name)}: must not be negative, got {value}")
    result = cls(**values)
    _check_ranges(result, where)
    return result


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(typing.cast(type[Any], hint), value, where)
    if origin is tuple:
        (item_hint, _ellipsis) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list")
        return tuple(_convert(item_hint, item, f"{where}[{i}]") for i, item in enumerate(value))
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if origin in (typing.Union, types.UnionType):
        # An optional option (X | None): TOML has no null, so a value given is an X.
        (item_hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _convert(item_hint, value, where)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if not isinstance(value, hint):
        raise ConfigError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def _check_flight_certificates(tls: TLSConfig, where: str) -> None:
    """What a flight listener can do with client certificates: gRPC asks for one only when it
    requires it, and hands over the name it proves, not the whole subject."""
    if tls.certificate_user == "subject":
        raise ConfigError(
            f'{_join(where, "certificate_user")}: a flight listener names the user by "cn" '
            "only (gRPC hands over the certificate's name, not its whole subject)"
        )
    if tls.certificate_user == "cn" and not tls.require_client_certificate:
        raise ConfigError(
            f"{_join(where, 'require_client_certificate')}: a flight listener reads client "
            "certificates only when it requires them; set it to true with certificate_user"
        )


# LimitsConfig's limits that 0 does not turn off, and what 0 would refuse.
_NO_ZERO_LIMITS = {
    "max_connections": "every connection",
    "max_queued_messages": "every message queued for a subscriber",
    "max_queued_bytes": "every message queued for a subscriber",
    "max_topic_levels": "every topic filter",
    "max_subscriptions_per_session": "every subscription",
}


def _check_ranges(obj: Any, where: str) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ConfigError(f"{_join(where, f.name)}: must not be negative, got {value}")
    if isinstance(obj, ListenerConfig) and not 0 <= obj.port <= 65535:
        raise ConfigError(f"{_join(where, 'port')}: {obj.port} is not a TCP port")
    if isinstance(obj, ListenerConfig) and obj.allowed_origins:
        if obj.protocol != "websockets":
            raise ConfigError(
                f"{_join(where, 'allowed_origins')}: only a websockets listener checks origins"
            )
        for i, origin in enumerate(obj.allowed_origins):
            if not _ORIGIN.fullmatch(origin):
                raise ConfigError(
                    f"{_join(where, 'allowed_origins')}[{i}]: {origin!r} is not an origin "
                    'such as "https://app.example.com" or "http://localhost:3000" (scheme, '
                    "host and optional port; no path, no trailing slash)"
                )
    if isinstance(obj, ListenerConfig) and obj.protocol == "flight":
        _check_flight_certificates(obj.tls, _join(where, "tls"))
    if isinstance(obj, ACLRule):
        for name in ACL_RULE_FILTERS:
            for i, topic_filter in enumerate(getattr(obj, name)):
                try:
                    validate_topic_filter(topic_filter)
                except TopicError as exc:
                    raise ConfigError(f"{_join(where, name)}[{i}]: {exc}") from None
    if isinstance(obj, AuthConfig):
        for name in ("publish_allow", "publish_deny", "subscribe_allow", "subscribe_deny"):
            for i, topic_filter in enumerate(getattr(obj, name)):
                try:
                    validate_topic_filter(topic_filter)
                except TopicError as exc:
                    raise ConfigError(f"{_join(where, name)}[{i}]: {exc}") from None
    if isinstance(obj, TLSConfig):
        needs_ca = obj.require_client_certificate or obj.certificate_user != "none"
        if not obj.certificate and (obj.key or obj.ca or needs_ca):
            raise ConfigError(f"{_join(where, 'certificate')}: TLS options need a certificate")
        if needs_ca and not obj.ca:
            raise ConfigError(
                f"{_join(where, 'ca')}: client certificates are checked against a CA; name its "
                "PEM file"
            )
    if isinstance(obj, AuthConfig) and obj.token_lifetime < 1:
        raise ConfigError(f"{_join(where, 'token_lifetime')}: must be at least 1 second")
    if isinstance(obj, LimitsConfig):
        if not 1 <= obj.receive_maximum <= 65535:
            raise ConfigError(f"{_join(where, 'receive_maximum')}: must be 1..65535")
        if not 1 <= obj.max_inflight <= 65535:
            raise ConfigError(f"{_join(where, 'max_inflight')}: must be 1..65535")
        if obj.topic_alias_maximum > 65535:
            raise ConfigError(f"{_join(where, 'topic_alias_maximum')}: must be 0..65535")
        if not 16 <= obj.max_packet_size <= 268_435_460:
            raise ConfigError(f"{_join(where, 'max_packet_size')}: must be 16..268435460")
        if not math.isfinite(obj.max_connection_rate):
            raise ConfigError(f"{_join(where, 'max_connection_rate')}: must be finite")
        if not math.isfinite(obj.stalled_subscriber_timeout):
            raise ConfigError(f"{_join(where, 'stalled_subscriber_timeout')}: must be finite")
        for name in ("max_put_rows", "max_put_bytes", "max_concurrent_puts"):
            if getattr(obj, name) < 1:
                raise ConfigError(f"{_join(where, name)}: must be at least 1")
        # Limits with no "0 = no limit": 0 would refuse everything (every queued message,
        # every connection, every topic filter, every subscription), not turn it off.
        for name, refused in _NO_ZERO_LIMITS.items():
            if getattr(obj, name) < 1:
                raise ConfigError(
                    f"{_join(where, name)}: must be at least 1 (0 would refuse {refused}; "
                    "there is no setting for no limit)"
                )
    if isinstance(obj, AMQPConfig):
        if not 512 <= obj.max_frame_size <= 0xFFFFFFFF:
            raise ConfigError(f"{_join(where, 'max_frame_size')}: must be 512..4294967295")
        if not 1 <= obj.max_sessions <= 65536:
            raise ConfigError(f"{_join(where, 'max_sessions')}: must be 1..65536")
        if obj.link_credit < 1:
            raise ConfigError(f"{_join(where, 'link_credit')}: must be at least 1")
        if obj.max_links_per_session < 1:
            raise ConfigError(f"{_join(where, 'max_links_per_session')}: must be at least 1")
        if obj.max_message_size < 1:
            raise ConfigError(
                f"{_join(where, 'max_message_size')}: must be at least 1 (0 would refuse "
                "every message larger than one frame)"
            )
    if isinstance(obj, (QueuesConfig, QueuePattern)):
        for key in ("dead_letter_queue", "expiry_queue"):
            pattern = getattr(obj, key)
            if pattern is None:
                continue
            try:
                pattern.format(queue="q")
            except (KeyError, IndexError, ValueError):
                raise ConfigError(
                    f"{_join(where, key)}: {pattern!r} may only use the placeholder {{queue}}"
                ) from None
    if isinstance(obj, QueuePattern):
        try:
            validate_topic_filter(obj.match)
        except TopicError as exc:
            raise ConfigError(f"{_join(where, 'match')}: {exc}") from None
    if isinstance(obj, SessionConfig) and obj.max_keepalive > 65535:
        raise ConfigError(f"{_join(where, 'max_keepalive')}: must be 0..65535")
    if isinstance(obj, JournalConfig):
        for name in ("persistent_topics", "qos0_topics"):
            for i, topic_filter in enumerate(getattr(obj, name)):
                try:
                    validate_topic_filter(topic_filter)
                except TopicError as exc:
                    raise ConfigError(f"{_join(where, name)}[{i}]: {exc}") from None


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
