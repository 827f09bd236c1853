"""Assembles a running broker from a config: core, listeners, timers, shutdown.

The only place that knows every part; tests embed it to run a real broker on a free port.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from pathlib import Path

from kittiwake.amqp.links import LinkLayer, link_layer_factory
from kittiwake.amqp.server import AMQPServer
from kittiwake.broker.authentication import (
    Authentication,
    PasswordFileError,
    PasswordHash,
    parse_password_file,
)
from kittiwake.broker.broker import Broker
from kittiwake.broker.periodic import run_every
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.broker.store import MemoryStore, Store
from kittiwake.broker.sys_topics import SysPublisher
from kittiwake.broker.temporary_destinations import TemporaryDestinations
from kittiwake.clock import Clock, MonotonicClock
from kittiwake.collector import CollectorPolicy
from kittiwake.config import (
    AnonymousPolicy,
    AuthConfig,
    Config,
    ConfigError,
    JournalConfig,
    ListenerConfig,
    StoreConfig,
    load_config,
)
from kittiwake.flight.auth import BearerTokens
from kittiwake.flight.listener import FlightListener, FlightUnavailable
from kittiwake.mqtt.server import MQTTServer
from kittiwake.store.journal_selection import JournalSelection
from kittiwake.store.sqlite import SQLiteStore
from kittiwake.web.admin_api import Operated
from kittiwake.web.listener import HTTPListener
from kittiwake.web.throughput import Throughput

log = logging.getLogger(__name__)

# Allocations between two young-generation collections in a serving process (see serve).
GC_YOUNG_THRESHOLD = 10_000


class BrokerApp:
    """A broker with its listeners; ``start`` binds, ``stop`` closes everything."""

    def __init__(
        self, config: Config, *, clock: Clock | None = None, config_path: str | None = None
    ) -> None:
        self.config = config
        # The file the config came from: SIGHUP reads its authorisation rules again.
        self.config_path = config_path
        # One clock for the core and the store: expiry, sweeps and stored times agree.
        clock = clock or MonotonicClock()
        self.broker = Broker(
            config, clock=clock, store=open_store(config.store, clock, config.journal)
        )
        auth = config.auth
        # One authentication service for every front end (DESIGN.md §5).
        self.authentication = Authentication(
            read_users(auth),
            allow_anonymous=anonymous_policy(auth.allow_anonymous),
            max_failed_logins=auth.max_failed_logins,
            failure_window=auth.failed_login_window,
            clock=clock.now,
        )
        self.mqtt = MQTTServer(self.broker, self.authentication)
        self.queues = QueueDestinations(self.broker)
        self.temporaries = TemporaryDestinations(self.queues)
        self.amqp = AMQPServer(
            self.broker,
            link_layer_factory(self.broker, self.queues, self.temporaries),
            self.authentication,
        )
        self.sys = SysPublisher(self.broker, config.sys.interval)
        # The bearer tokens Flight logins issue, one table for every flight listener.
        self.flight_tokens = BearerTokens(auth.token_lifetime, clock.now)
        self.flight = [
            self._flight_listener(listener)
            for listener in config.listeners
            if listener.protocol == "flight"
        ]
        # The operators' HTTP listeners (console, /metrics, admin API) and the throughput
        # samples their console draws; made only when one is configured.
        self.throughput: Throughput | None = None
        self.http: list[HTTPListener] = []
        http_listeners = [each for each in config.listeners if each.protocol == "http"]
        if http_listeners:
            self.throughput = Throughput(
                self.broker.stats,
                lambda: len(self.mqtt.connections) + len(self.amqp.connections),
                lambda: clock.wall_ms() / 1000,
            )
            operated = Operated(self.broker, self.queues, self.mqtt, self.amqp, self.throughput)
            self.http = [
                HTTPListener(listener, self.authentication, operated)
                for listener in http_listeners
            ]
        self.addresses: list[tuple[str, int]] = []
        self._cancel_ticks: Callable[[], None] | None = None
        self._cancel_queue_ticks: Callable[[], None] | None = None
        self._cancel_collector: Callable[[], None] | None = None

    async def start(self, *, freeze_gc: bool = True) -> None:
        loop = asyncio.get_running_loop()
        self.broker.recover()
        self._cancel_ticks = self.broker.schedule_ticks(loop)
        self._cancel_queue_ticks = self.queues.schedule_ticks(loop)
        flight = iter(self.flight)
        http = iter(self.http)
        for listener in self.config.listeners:
            if listener.protocol == "flight":
                self.addresses.append(await next(flight).start())
            elif listener.protocol == "http":
                self.addresses.append(await next(http).start())
            elif listener.protocol == "amqp":
                self.addresses.append(
                    await self.amqp.listen(listener.host, listener.port, listener=listener)
                )
            else:
                self.addresses.append(
                    await self.mqtt.listen(listener.host, listener.port, listener=listener)
                )
        self.sys.start()
        if self.throughput is not None:
            self.throughput.start(loop)
        # Everything built so far lives as long as the broker: keep it out of every future
        # garbage collection, so a full collection never walks it mid-traffic.
        if freeze_gc:
            gc.freeze()
            # And what it builds to keep as it grows (subscriptions, sessions): collector.py.
            broker = self.broker
            policy = CollectorPolicy(lambda: len(broker.routes.tree) + len(broker.sessions))
            self._cancel_collector = run_every(loop, 1.0, policy.check, "collector policy")
        log.info("kittiwake %s ready", self.broker.version)

    async def stop(self) -> None:
        log.info("kittiwake stopping")
        if self.throughput is not None:
            self.throughput.stop()
        # Operators' listeners first: an action must not race the shutdown below.
        for http in self.http:
            await http.stop()
        self.sys.stop()
        if self._cancel_ticks is not None:
            self._cancel_ticks()
        if self._cancel_queue_ticks is not None:
            self._cancel_queue_ticks()
        if self._cancel_collector is not None:
            self._cancel_collector()
        await self.mqtt.close()
        await self.amqp.close()
        for flight in self.flight:
            await flight.stop()
        # Drops the tick had not reported yet: the log's counts stay true to the end.
        self.broker.queue_totals.report_drops(final=True)
        self.broker.store.close()

    def _flight_listener(self, listener: ListenerConfig) -> FlightListener:
        store = self.broker.store
        if not isinstance(store, SQLiteStore):
            raise FlightUnavailable(
                "a flight listener serves the journal on disk: set store.backend = \"sqlite\""
            )
        if not self.config.journal.enabled:
            log.warning(
                "a flight listener is configured but the journal keeps nothing past its "
                "subscribers: set journal.retention_seconds or journal.retention_bytes"
            )
        return FlightListener(
            listener.host,
            listener.port,
            store.directory,
            store.journal_selection,
            self.broker.authorizer,
            self.authentication,
            anonymous_policy(listener.allow_anonymous),
            tls=listener.tls,
            fenced_writes=self.broker.fenced_writes,
            limits=self.config.limits,
            tokens=self.flight_tokens,
        )

    async def reload(self) -> None:
        """SIGHUP: the password file, then the authorisation rules, read again; nobody is
        disconnected."""
        await self.reload_users()
        await self.reload_rules()

    async def reload_rules(self) -> None:
        """Read the configuration file again and apply its authorisation rules (RELOADED_AUTH
        keys of ``[auth]``) to everyone, connected clients included. A file that cannot be
        read or is not valid leaves the rules as they were; other changed settings are named
        in the log and wait for a restart."""
        path = self.config_path
        if path is None:
            log.info("SIGHUP: no configuration file; authorisation rules unchanged")
            return
        try:
            config = await asyncio.to_thread(load_config, path)
        except ConfigError as exc:
            log.error("SIGHUP: rules not reloaded, authorisation unchanged: %s", exc)
            return
        auth = replace(
            self.config.auth, **{key: getattr(config.auth, key) for key in RELOADED_AUTH}
        )
        waiting = changes_needing_restart(self.config, replace(config, auth=auth))
        renew = self.broker.replace_authorization(auth)
        self.mqtt.permissions_renewed(renew)
        for protocol in self.amqp.connections:
            handler = protocol.connection.handler if protocol.connection is not None else None
            if isinstance(handler, LinkLayer):
                handler.permissions_renewed(renew)
        self.config = replace(self.config, auth=auth)
        log.info(
            "SIGHUP: authorisation rules reloaded from %s (%d ACL rules, %d groups, "
            "%d admins, %d monitors)",
            path,
            len(auth.acl),
            len(auth.groups),
            len(auth.admins),
            len(auth.monitors),
        )
        if waiting:
            log.warning(
                "SIGHUP: %s changed in %s: applied at the next start only",
                ", ".join(waiting),
                path,
            )

    async def reload_users(self) -> None:
        """SIGHUP: read the password file again; connections stay, new logins see the change.
        A file that cannot be read or parsed leaves the users as they were."""
        path = self.config.auth.password_file
        if not path:
            log.info("SIGHUP: no auth.password_file configured; nothing to reload")
            return
        try:
            text = await asyncio.to_thread(Path(path).read_text, encoding="utf-8")
            users = parse_password_file(text)
        except (OSError, PasswordFileError) as exc:
            log.error("SIGHUP: password file %s not loaded, users unchanged: %s", path, exc)
            return
        self.authentication.replace_users(users)
        log.info("SIGHUP: %d users loaded from %s", len(users), path)


# The [auth] keys SIGHUP applies to a running broker (with the password file's users).
RELOADED_AUTH = (
    "groups",
    "acl",
    "admins",
    "monitors",
    "publish_allow",
    "publish_deny",
    "subscribe_allow",
    "subscribe_deny",
)


def changes_needing_restart(running: Config, read: Config) -> list[str]:
    """The settings (dotted keys) that differ between the running config and the one read,
    outside what a reload applies."""
    changed: list[str] = []
    for item in fields(Config):
        before, after = getattr(running, item.name), getattr(read, item.name)
        if before == after:
            continue
        if is_dataclass(before):
            changed.extend(
                f"{item.name}.{inner.name}"
                for inner in fields(before)
                if getattr(before, inner.name) != getattr(after, inner.name)
            )
        else:
            changed.append(item.name)
    return changed


def anonymous_policy(policy: AnonymousPolicy) -> bool | None:
    """A config's anonymous setting for the authentication service: None = "auto"."""
    return None if policy == "auto" else bool(policy)


def read_users(auth: AuthConfig) -> dict[str, PasswordHash]:
    """The users of the configured password file (none without one); ConfigError if it is
    configured but cannot be used, so the broker never starts open by mistake."""
    if not auth.password_file:
        return {}
    try:
        return parse_password_file(Path(auth.password_file).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"auth.password_file {auth.password_file}: cannot read it: {exc.strerror}"
        ) from exc
    except PasswordFileError as exc:
        raise ConfigError(f"auth.password_file {auth.password_file}: {exc}") from exc


def open_store(
    config: StoreConfig, clock: Clock | None, journal: JournalConfig | None = None
) -> Store:
    """The configured store; a broken database raises StoreError before anything listens."""
    journal = journal or JournalConfig()
    if config.backend == "memory":
        log.warning("store backend is 'memory': persistent messages will not survive a restart")
        if journal.enabled:
            log.warning("store backend is 'memory': the journal keeps nothing")
        return MemoryStore()
    return SQLiteStore(
        config.data_dir,
        clock=clock,
        max_batch=config.max_batch,
        max_delay=config.max_delay,
        acceptance_window=config.acceptance_window,
        journal_retention_seconds=journal.retention_seconds,
        journal_retention_bytes=journal.retention_bytes,
        journal_selection=journal_selection(journal),
        wal_autocheckpoint=config.wal_autocheckpoint,
        synchronous=config.synchronous.upper(),
    )


def journal_selection(journal: JournalConfig) -> JournalSelection:
    """What the journal keeps, for its writer and its readers alike."""
    return JournalSelection(
        enabled=journal.enabled,
        persistent_topics=journal.persistent_topics,
        qos0_topics=journal.qos0_topics,
    )


async def serve(config: Config, config_path: str | None = None) -> None:
    """Run until SIGINT or SIGTERM; SIGHUP reloads users and authorisation rules (from
    ``config_path``, the file ``config`` was read from).

    The signal handlers come first, before the store opens or anything listens: a stop
    requested at any moment of start-up is then a graceful stop once start-up is done, never
    the signal's default action (death without closing the store).
    """
    # A young collection every 10,000 allocations instead of 700: a broker holding 100,000
    # subscriptions otherwise spends a third of an uncached publication in the collector
    # (bench/inprocess.py topics --filters 100000), with no gain in memory returned.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    app: BrokerApp | None = None
    reloads: set[asyncio.Task[None]] = set()

    def reload() -> None:
        if app is not None:
            task = asyncio.ensure_future(app.reload())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

    # Before anything else too: SIGHUP's default action would end the broker.
    loop.add_signal_handler(signal.SIGHUP, reload)
    app = BrokerApp(config, config_path=config_path)
    try:
        await app.start()
        await stop.wait()
    finally:
        await app.stop()
