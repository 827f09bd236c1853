"""The brokers under test: each started by the benchmark on its own free loopback port, with a
generated config, and observed through /proc (CPU time, RSS).

- kittiwake: ``python -m kittiwake serve --config FILE`` with this repo's ``src`` on PYTHONPATH.
- mosquitto: Debian's ``/usr/sbin/mosquitto -c FILE`` (``bench/setup_peers.sh`` installs it).
- amqtt:     the ``amqtt`` broker CLI from ``bench/.venv-amqtt`` (``bench/setup_peers.sh``).

Every broker gets comparable settings: loopback only, anonymous access, no $SYS publishing,
warning-level logging, in-flight window 100 and queues large enough that the bounded workloads
never hit them. Stores: mosquitto `persistence false` and amqtt (memory only) for the ordinary
workloads; kittiwake keeps its default SQLite store, which clean sessions never write to. The
durable workload restarts kittiwake and mosquitto with their durable stores on.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kwbench import wire

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BENCH_DIR.parent
AMQTT_VENV = BENCH_DIR / ".venv-amqtt"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# The `amqtt` console script's own entry point, run with INFO logging switched off so amqtt
# logs as little as the others (which run at warning level).
_AMQTT_LAUNCHER = """\
import logging, sys
logging.disable(logging.INFO)   # the CLI forces INFO (3 lines per connection); keep warnings
from amqtt.scripts.broker_script import main
sys.argv = ["amqtt", "-c", sys.argv[1]]
sys.exit(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def death_signal() -> Callable[[], None]:
    """What a child runs before exec so that it gets SIGTERM when the harness that started it
    dies, killed or timed out included: no run leaves a broker behind on a pinned core (Linux
    prctl PR_SET_PDEATHSIG; elsewhere nothing). Resolved here, in the parent: between fork and
    exec the child may not load libraries (a thread of the parent may hold the loader's lock)."""
    if not sys.platform.startswith("linux"):
        return lambda: None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the harness died before the signal was armed
            os._exit(1)

    return arm


class BrokerUnavailable(RuntimeError):
    pass


class Broker:
    name = "?"
    # Has a durable message store the "durable" workloads can switch on.
    supports_durable = True

    def __init__(self, workdir: Path, cpus: set[int] | None) -> None:
        self.workdir = workdir
        self.cpus = cpus
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.name}.log"
        self.version = "?"
        self.durable = False  # run with the durable store on (see write_config)

    # -- to implement ------------------------------------------------------------------
    probe_what = "an MQTT CONNECT"

    def probe(self) -> None:
        """Raise OSError unless the broker answers on ``self.port``."""
        probe(self.port)

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def check(self) -> None:
        """Raise BrokerUnavailable when the broker is not installed."""

    def write_config(self) -> None:
        """Write the config file for ``self.port``."""
        raise NotImplementedError

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, timeout: float = 20.0) -> None:
        self.check()
        self.port = free_port()
        self.write_config()
        cmd = self.command()
        cpus = self.cpus

        arm_death_signal = death_signal()

        def preexec() -> None:
            os.setsid()
            arm_death_signal()
            if cpus:
                os.sched_setaffinity(0, cpus)

        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env(),
                                         preexec_fn=preexec, cwd=self.workdir)
        end = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise BrokerUnavailable(f"{self.name} exited with {self.proc.returncode}: "
                                        f"{self.log_tail()}")
            try:
                self.probe()
                return
            except OSError as exc:
                last_error = exc
                time.sleep(0.1)
        self.stop()
        raise BrokerUnavailable(f"{self.name} did not answer {self.probe_what} on port "
                                f"{self.port} within {timeout}s ({last_error}): "
                                f"{self.log_tail()}")

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT if self.name == "amqtt" else signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu_seconds(self) -> float:
        """user + system CPU time of the broker process, from /proc/PID/stat."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def side_thread_cpu_seconds(self) -> float:
        """CPU time of every thread but the main one (kittiwake's store writer; 0 for the
        single-threaded peers), from /proc/PID/task/TID/stat."""
        total = 0
        for task in os.listdir(f"/proc/{self.pid}/task"):
            if int(task) == self.pid:
                continue
            try:
                with open(f"/proc/{self.pid}/task/{task}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            total += int(fields[11]) + int(fields[12])
        return total / CLK_TCK

    def rss_kb(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def threads(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
        return 0

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def settle(self, max_wait: float = 15.0, busy_pct: float = 5.0) -> float:
        """Wait until the broker is idle (CPU < busy_pct over 0.3 s); returns seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < max_wait:
            c0 = self.cpu_seconds()
            time.sleep(0.3)
            if (self.cpu_seconds() - c0) / 0.3 * 100 < busy_pct:
                break
        return time.monotonic() - t0

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "port": self.port,
                "command": " ".join(self.command()),
                "config": self.config_path.read_text() if self.config_path.exists() else ""}


def probe(port: int, timeout: float = 2.0) -> None:
    """One MQTT 3.1.1 CONNECT/CONNACK round trip; raises OSError when it fails."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(wire.connect(f"bench-probe-{os.getpid()}", keepalive=10, clean=True))
        data = b""
        while len(data) < 4:
            chunk = s.recv(4 - len(data))
            if not chunk:
                raise ConnectionError("closed before CONNACK")
            data += chunk
        if wire.read_connack(data) != 0:
            raise ConnectionError(f"CONNACK {data.hex()}")
        s.sendall(wire.DISCONNECT_BYTES)


class Kittiwake(Broker):
    name = "kittiwake"

    def __init__(self, workdir: Path, cpus: set[int] | None, python: str = sys.executable,
                 store: str = "sqlite") -> None:
        super().__init__(workdir, cpus)
        self.python = python
        self.store = store  # the backend of the ordinary (non-durable) workloads
        self.config_path = workdir / f"{self.name}.toml"
        try:
            out = subprocess.run(
                [python, "-c", "import kittiwake, sys\n"
                 "try:\n import uvloop; loop = 'uvloop ' + uvloop.__version__\n"
                 "except ImportError:\n loop = 'asyncio'\n"
                 "print(kittiwake.__version__, sys.version.split()[0], loop)"],
                env=self.env(), capture_output=True, text=True, timeout=30, check=True)
            version, pyver, loop = out.stdout.strip().split(" ", 2)
            self.version = f"{version} (python {pyver}, {loop})"
        except (subprocess.SubprocessError, OSError, ValueError) as exc:
            self.version = f"? ({exc})"

    # The source tree this broker runs (this repo's; another checkout's for a baseline).
    src: Path = REPO_DIR / "src"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        src = str(self.src)
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                   else "")
        return env

    def command(self) -> list[str]:
        return [self.python, "-m", "kittiwake", "serve", "--config", str(self.config_path)]

    def check(self) -> None:
        if self.version.startswith("?"):
            raise BrokerUnavailable(f"kittiwake does not import: {self.version}")

    def write_config(self) -> None:
        # kittiwake's default store is SQLite; clean-session traffic never touches it.
        # Durable workloads always get SQLite with fsync on every group commit (its default).
        backend = "sqlite" if self.durable else self.store
        data_dir = self.workdir / f"{self.name}-data"
        shutil.rmtree(data_dir, ignore_errors=True)  # every start begins empty
        self.config_path.write_text(f"""\
log_level = "warning"
uvloop = true

[[listeners]]
protocol = "mqtt"
host = "127.0.0.1"
port = {self.port}

[limits]
max_inflight = 100
receive_maximum = 100
max_queued_messages = 1000000

[sys]
interval = 0

[store]
backend = "{backend}"
data_dir = "{data_dir}"
synchronous = "full"
""")


class KittiwakeBaseline(Kittiwake):
    """Another checkout of kittiwake (``--kittiwake-baseline``), measured in the same run as
    this one: a before/after comparison of two versions of the code on the same machine."""

    name = "kittiwake-baseline"

    def __init__(self, workdir: Path, cpus: set[int] | None, src: Path,
                 python: str = sys.executable, store: str = "sqlite") -> None:
        # A checkout's root or its src/; anything else would silently import this venv's
        # installed kittiwake instead and compare the code with itself.
        if (src / "src" / "kittiwake").is_dir():
            src = src / "src"
        if not (src / "kittiwake" / "__init__.py").is_file():
            raise SystemExit(f"--kittiwake-baseline {src}: no kittiwake package there (give a "
                             "checkout or its src/)")
        self.src = src
        super().__init__(workdir, cpus, python, store)


class Mosquitto(Broker):
    name = "mosquitto"

    def __init__(self, workdir: Path, cpus: set[int] | None) -> None:
        super().__init__(workdir, cpus)
        self.binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.config_path = workdir / "mosquitto.conf"
        if os.path.exists(self.binary):
            out = subprocess.run([self.binary, "-h"], capture_output=True, text=True)
            first = (out.stdout or out.stderr).splitlines()
            self.version = first[0].replace("mosquitto version ", "") if first else "?"

    def command(self) -> list[str]:
        return [self.binary, "-c", str(self.config_path)]

    def check(self) -> None:
        if not os.path.exists(self.binary):
            raise BrokerUnavailable("mosquitto is not installed: run bench/setup_peers.sh")

    def write_config(self) -> None:
        # `listener` replaces the default listener; nothing binds beyond 127.0.0.1:port.
        # Nagle stays on (mosquitto's default; set_tcp_nodelay true costs it ~35% here).
        # `user root`: started as root, mosquitto would switch to its own user, and a change
        # of user clears the death signal that stops it with the harness (death_signal).
        user = "user root\n" if os.geteuid() == 0 else ""
        persistence = "persistence false"
        if self.durable:
            data_dir = self.workdir / "mosquitto-data"
            shutil.rmtree(data_dir, ignore_errors=True)
            data_dir.mkdir()
            persistence = f"persistence true\npersistence_location {data_dir}/"
        self.config_path.write_text(f"""\
listener {self.port} 127.0.0.1
allow_anonymous true
{user}{persistence}
sys_interval 0
max_inflight_messages 100
max_queued_messages 1000000
log_dest stderr
log_type error
log_type warning
""")


class Amqtt(Broker):
    name = "amqtt"
    supports_durable = False

    def __init__(self, workdir: Path, cpus: set[int] | None) -> None:
        super().__init__(workdir, cpus)
        self.python = str(AMQTT_VENV / "bin" / "python")
        self.config_path = workdir / "amqtt.yaml"
        self.launcher = workdir / "amqtt_launch.py"
        if os.path.exists(self.python):
            out = subprocess.run(
                [self.python, "-c", "import importlib.metadata as m; print(m.version('amqtt'))"],
                capture_output=True, text=True)
            self.version = out.stdout.strip() or "?"

    def command(self) -> list[str]:
        return [self.python, str(self.launcher), str(self.config_path)]

    def check(self) -> None:
        if not os.path.exists(AMQTT_VENV / "bin" / "amqtt"):
            raise BrokerUnavailable("amqtt is not installed: run bench/setup_peers.sh")

    def write_config(self) -> None:
        # No logging/$SYS plugins: the same "quiet, no $SYS" footing as the others.
        self.config_path.write_text(f"""\
listeners:
  default:
    type: tcp
    bind: 127.0.0.1:{self.port}
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: true
""")
        self.launcher.write_text(_AMQTT_LAUNCHER)


BROKERS = {"kittiwake": Kittiwake, "mosquitto": Mosquitto, "amqtt": Amqtt}


def make_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="kwbench-"))
