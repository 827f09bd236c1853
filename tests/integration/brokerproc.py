"""Start and stop a real ``kittiwake serve`` process on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

from kittiwake.store.sqlite import DATABASE_FILE

SRC_DIR = Path(__file__).resolve().parents[2] / "src"
HOST = "127.0.0.1"
START_TIMEOUT = 30.0  # a generous bound: the suite runs beside other work (two workers, Spark)
STOP_TIMEOUT = 15.0


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections for as long as the block runs: bound but not
    listening, so no other test worker's broker can take it meanwhile (a port from
    :func:`free_port` may be listening again by the time a test connects to it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        yield int(s.getsockname()[1])


def listening_socket_owned(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a TCP socket listening on ``port``; None when /proc
    cannot tell (not Linux, or not allowed to read the process's descriptors)."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):  # closed meanwhile
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table, encoding="ascii") as rows:
                next(rows)  # the header
                for row in rows:
                    fields = row.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    # State 0A is LISTEN; the local address ends in the port, in hex.
                    if (
                        state == "0A"
                        and int(local.rsplit(":", 1)[1], 16) == port
                        and inode in inodes
                    ):
                        return True
    except OSError:
        return None
    return False


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(config: dict[str, Any]) -> str:
    """The small subset of TOML the broker config needs: scalars, lists, tables, [[arrays]]."""
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for key, value in config.items():
        if isinstance(value, dict) or (
            isinstance(value, list) and value and all(isinstance(v, dict) for v in value)
        ):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, value in tables:
        entries = value if isinstance(value, list) else [value]
        header = f"[[{key}]]" if isinstance(value, list) else f"[{key}]"
        for entry in entries:
            lines.append("")
            lines.append(header)
            for k, v in entry.items():
                lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def writes_blocked(process: BrokerProcess) -> Iterator[None]:
    """Hold SQLite's write lock on the broker's database: its writer cannot commit (it waits
    on the lock, for up to its busy timeout of 5 s) until this ends."""
    connection = sqlite3.connect(process.workdir / "data" / DATABASE_FILE, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()


class _PortTaken(Exception):
    """The broker could not bind the port we picked: someone else got there first."""


class BrokerProcess:
    """One broker subprocess; ``host``/``port`` once :meth:`start` returned.

    Iterating gives ``(host, port)`` so tests can write ``host, port = broker(...)``.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        flight: bool = False,
        listener: dict[str, Any] | None = None,
        amqp: bool | dict[str, Any] = False,
        http: bool | dict[str, Any] = False,
        **sections: dict[str, Any],
    ) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = HOST
        self.port = 0
        # With ``flight``, an Arrow Flight listener too, on ``flight_port`` (bound before the
        # MQTT listener, so a broker that accepts MQTT connections serves Flight already).
        self.flight = flight
        self.flight_port = 0
        # Extra keys of the MQTT listener's table (protocol, tls, allow_anonymous...).
        self.listener = dict(listener or {})
        # With ``amqp``, an AMQP listener too, on ``amqp_port`` (bound before MQTT's, too); a
        # dict gives extra keys of its table (tls, allow_anonymous...).
        self.amqp = amqp is not False
        self.amqp_listener: dict[str, Any] = amqp if isinstance(amqp, dict) else {}
        self.amqp_port = 0
        # With ``http``, an HTTP listener too (console, /metrics, admin API), on ``http_port``;
        # a dict gives extra keys of its table (allow_anonymous, tls...).
        self.http: dict[str, Any] | None = (
            None if http is False else ({} if http is True else dict(http))
        )
        self.http_port = 0
        self.sections = sections
        self.proc: subprocess.Popen[bytes] | None = None
        self.config_path = workdir / "kittiwake.toml"
        self.log_path = workdir / "broker.log"

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter((self.host, self.port))

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def amqp_url(self) -> str:
        return f"amqp://{self.host}:{self.amqp_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def start(self, attempts: int = 3) -> BrokerProcess:
        """Start on a free port; retried on a fresh port if another process took it first."""
        for attempt in range(attempts):
            try:
                return self._start_once()
            except _PortTaken:
                if attempt == attempts - 1:
                    raise RuntimeError(f"no free port after {attempts} attempts") from None
        raise AssertionError("unreachable")

    def restart(self, attempts: int = 5) -> BrokerProcess:
        """Start again after :meth:`stop` or :meth:`kill`, on the same ports and data (clients
        that were told the address find the broker again). A port briefly held by someone
        else (another test worker's free_port() probe binds and closes it) is tried again."""
        for attempt in range(attempts):
            try:
                return self._start_once(same_ports=True)
            except _PortTaken:
                if attempt == attempts - 1:
                    raise RuntimeError(
                        f"port {self.port} (or another of this broker's) still taken after "
                        f"{attempts} attempts"
                    ) from None
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"log_level": "debug"}
        for name, values in self.sections.items():
            if name in ("log_level", "log_format", "uvloop"):
                config[name] = values
            else:
                config[name] = dict(values)
        config["listeners"] = [
            {"protocol": "mqtt", **self.listener, "host": self.host, "port": self.port}
        ]
        if self.amqp:
            config["listeners"].insert(
                0,
                {
                    "protocol": "amqp",
                    **self.amqp_listener,
                    "host": self.host,
                    "port": self.amqp_port,
                },
            )
        if self.http is not None:
            config["listeners"].insert(
                0, {"protocol": "http", **self.http, "host": self.host, "port": self.http_port}
            )
        if self.flight:
            config["listeners"].insert(
                0, {"protocol": "flight", "host": self.host, "port": self.flight_port}
            )
        return config

    def rewrite_config(self, **sections: dict[str, Any]) -> None:
        """Write the config file again with ``sections`` replacing those given at start (same
        listeners and ports): what an operator edits before sending SIGHUP."""
        self.sections = {**self.sections, **sections}
        self.config_path.write_text(to_toml(self._config()), encoding="utf-8")

    def _start_once(self, same_ports: bool = False) -> BrokerProcess:
        if not same_ports:
            self.port = free_port()
            if self.amqp:
                self.amqp_port = free_port()
            if self.http is not None:
                self.http_port = free_port()
            if self.flight:
                self.flight_port = free_port()
        self.config_path.write_text(to_toml(self._config()), encoding="utf-8")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SRC_DIR), env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        # Where this start's log begins: the file keeps every start's, and only this one's
        # can say that its port was taken.
        started_at = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kittiwake", "serve", "--config", str(self.config_path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.workdir,
        )
        deadline = time.monotonic() + START_TIMEOUT
        bound = f"{self.host}:{self.port}"
        while True:
            if self.proc.poll() is not None:
                self._log.close()
                text = self.log_text()
                with open(self.log_path, "rb") as log:
                    log.seek(started_at)
                    if b"in use" in log.read().lower():
                        raise _PortTaken
                raise RuntimeError(
                    f"broker exited with {self.proc.returncode} during start-up:\n{text}"
                )
            try:
                # Accepting connections on the port, and the listener is our process's, not
                # another broker's (parallel test runs) that grabbed the port meanwhile.
                with socket.create_connection(self.address, timeout=0.5):
                    if self._listener_is_ours(bound):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"broker did not accept connections on {self.address} within "
                    f"{START_TIMEOUT}s:\n{self.log_text()}"
                )
            time.sleep(0.05)

    @property
    def flight_url(self) -> str:
        return f"grpc://{self.host}:{self.flight_port}"

    def kill(self) -> None:
        """kill -9: no graceful stop, no final commit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        if not self._log.closed:
            self._log.close()

    def _listener_is_ours(self, bound: str) -> bool:
        """The process holds the listening socket (read from /proc); where /proc cannot say,
        our log's "listening" line (logged at info) must name the address."""
        assert self.proc is not None
        owned = listening_socket_owned(self.proc.pid, self.port)
        if owned is not None:
            return owned
        quiet = self.sections.get("log_level") in ("warning", "error")
        return quiet or bound in self.log_text()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                # Generous: a graceful stop on a busy machine can take seconds, and a kill here
                # would fail a test that checks the exit status.
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if not self._log.closed:
            self._log.close()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no broker log)"


@contextlib.contextmanager
def amqp_module_broker(workdir: Path, *, max_delivery_attempts: int) -> Iterator[BrokerProcess]:
    """A broker (memory store) with AMQP and MQTT listeners, for a module's AMQP or JMS tests."""
    process = BrokerProcess(
        workdir,
        amqp=True,
        store={"backend": "memory"},
        queues={"max_delivery_attempts": max_delivery_attempts},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def live_amqp_url(process: BrokerProcess) -> str:
    """The broker's AMQP URL, after checking it is still running (with its log if not)."""
    assert process.alive(), f"the broker died:\n{process.log_text()[-5000:]}"
    return process.amqp_url


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


@contextlib.contextmanager
def closing_all(make: Callable[..., C]) -> Iterator[Callable[..., C]]:
    """``make`` that remembers what it made and closes all of it afterwards, every one even
    when some fail to close (a test's connections)."""
    made: list[C] = []

    def tracked(*args: Any, **kwargs: Any) -> C:
        thing = make(*args, **kwargs)
        made.append(thing)
        return thing

    yield tracked
    for thing in made:
        with contextlib.suppress(Exception):  # teardown must reach every one
            thing.close()
