"""The brokers of the JMS scenarios, each started by the benchmark on a free loopback port with
a generated config and a data directory of its own under the run's workdir (emptied at every
start), observed through /proc like the MQTT brokers (``brokers.Broker``).

- kittiwake: ``python -m kittiwake serve`` with one AMQP 1.0 listener and its durable SQLite
  store with ``synchronous = "full"`` (an fsync per group commit, its default), as in the MQTT
  durable workloads. PERSISTENT messages are journalled there; the harness checks that the
  process holds ``kittiwake.db`` open.
- activemq: Debian's ActiveMQ 5.17 (package ``activemq``, installed by
  ``bench/setup_peers.sh --with-activemq``), its own launcher jar run by ``java`` in the
  foreground with a generated ``activemq.xml``: one OpenWire transport connector on
  127.0.0.1, KahaDB persistence with its default sync behaviour (``enableJournalDiskSyncs``
  true: the journal is fsynced before a PERSISTENT send or a commit is answered), no JMX, 1 GiB
  heap, memory limit 512 MB (the stock config's producer flow control stays on).

Neither broker is tuned beyond that.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from kwbench.brokers import Broker, BrokerUnavailable, Kittiwake

ACTIVEMQ_HOME = Path("/usr/share/activemq")
JAVA_DIR = Path("/usr/share/java")
JMS_SOURCE = Path(__file__).resolve().parent.parent / "jms" / "JmsBench.java"

# The jars the OpenWire client needs, by their Debian names in /usr/share/java.
CLIENT_JARS = ("activemq-client", "geronimo-jms_1.1_spec", "hawtbuf", "slf4j-api",
               "geronimo-j2ee-management-1.1-spec")


def disk_write_bytes(pid: int) -> int:
    """Bytes the process (every thread) caused to be written to storage (/proc/PID/io)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def io_calls(pid: int) -> tuple[int, int]:
    """Read and write system calls the process (every thread) has made (/proc/PID/io
    syscr, syscw): a broker's socket reads and writes, each a read()/write() call under
    libuv; (0, 0) when unreadable."""
    counts = {"syscr:": 0, "syscw:": 0}
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key in counts:
                    counts[key] = int(value)
    except OSError:
        pass
    return counts["syscr:"], counts["syscw:"]


class KittiwakeAMQP(Kittiwake):
    """Kittiwake with an AMQP 1.0 listener and its durable store."""

    probe_what = "an AMQP protocol header"
    url_scheme = "amqp"

    def __init__(self, workdir: Path, cpus: set[int] | None, python: str | None = None) -> None:
        if python is None:
            super().__init__(workdir, cpus)
        else:
            super().__init__(workdir, cpus, python=python)
        self.config_path = workdir / "kittiwake-amqp.toml"
        self.data_dir = workdir / "kittiwake-amqp-data"
        self.durable = True

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"

    def probe(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as s:
            s.sendall(b"AMQP\x03\x01\x00\x00")  # SASL layer first, as every client does
            data = s.recv(8)
            if not data.startswith(b"AMQP"):
                raise ConnectionError(f"no AMQP header back: {data!r}")

    def write_config(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)  # every start begins empty
        self.config_path.write_text(f"""\
log_level = "warning"
uvloop = true

[[listeners]]
protocol = "amqp"
host = "127.0.0.1"
port = {self.port}

[limits]
max_queued_messages = 1000000
max_queued_bytes = 1073741824

[sys]
interval = 0

[store]
backend = "sqlite"
data_dir = "{self.data_dir}"
synchronous = "full"
""")

    def store_check(self) -> str:
        """What holds the PERSISTENT messages, checked on the live process."""
        db = (self.data_dir / "kittiwake.db").resolve()
        try:
            open_files = {os.readlink(f"/proc/{self.pid}/fd/{fd}")
                          for fd in os.listdir(f"/proc/{self.pid}/fd")}
        except OSError as exc:
            return f"unknown ({exc})"
        if str(db) in open_files:
            return f"SQLite {db.name} open, synchronous=full (fsync per group commit)"
        return f"NOT CONFIRMED: {db} is not open"


class ActiveMQ(Broker):
    name = "activemq"
    probe_what = "an OpenWire connection"
    url_scheme = "tcp"

    def __init__(self, workdir: Path, cpus: set[int] | None) -> None:
        super().__init__(workdir, cpus)
        self.java = shutil.which("java") or "/usr/bin/java"
        self.config_path = workdir / "activemq.xml"
        self.data_dir = workdir / "activemq-data"
        self.durable = True
        self.launcher = ACTIVEMQ_HOME / "bin" / "activemq.jar"
        jars = sorted(glob.glob(str(JAVA_DIR / "activemq-broker-*.jar")))
        self.version = Path(jars[-1]).stem.removeprefix("activemq-broker-") if jars else "?"

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def check(self) -> None:
        if not self.launcher.exists():
            raise BrokerUnavailable(f"ActiveMQ is not installed ({self.launcher} missing): run "
                                    "bench/setup_peers.sh --with-activemq")
        if not os.path.exists(self.java):
            raise BrokerUnavailable("java is not installed")

    def start(self, timeout: float = 60.0) -> None:
        super().start(timeout)

    def probe(self) -> None:
        # The broker speaks first: its WireFormatInfo once the connector is up.
        with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as s:
            if not s.recv(16):
                raise ConnectionError("closed without a WireFormatInfo")

    def command(self) -> list[str]:
        conf = self.workdir / "activemq-conf"
        return [self.java, "-Xms256m", "-Xmx1g", "-Djava.awt.headless=true",
                f"-Dactivemq.home={ACTIVEMQ_HOME}", f"-Dactivemq.base={self.workdir}",
                f"-Dactivemq.conf={conf}", f"-Dactivemq.data={self.data_dir}",
                f"-Dactivemq.classpath={conf}",
                "-jar", str(self.launcher), "start", f"xbean:file:{self.config_path}"]

    def write_config(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.data_dir.mkdir(parents=True)
        conf = self.workdir / "activemq-conf"
        conf.mkdir(exist_ok=True)
        # Warnings to the log (Debian's ActiveMQ logs through log4j 1.2, configured from
        # activemq.conf on its classpath).
        (conf / "log4j.properties").write_text(
            "log4j.rootLogger=WARN, console\n"
            "log4j.appender.console=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.console.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.console.layout.ConversionPattern=%d %p %c - %m%n\n")
        self.config_path.write_text(f"""\
<beans xmlns="http://www.springframework.org/schema/beans"
       xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
       xsi:schemaLocation="http://www.springframework.org/schema/beans
         http://www.springframework.org/schema/beans/spring-beans.xsd
         http://activemq.apache.org/schema/core
         http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="kwbench"
          dataDirectory="{self.data_dir}" useJmx="false" persistent="true">
    <persistenceAdapter>
      <kahaDB directory="{self.data_dir}/kahadb"/>
    </persistenceAdapter>
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage limit="512 mb"/></memoryUsage>
        <storeUsage><storeUsage limit="8 gb"/></storeUsage>
        <tempUsage><tempUsage limit="4 gb"/></tempUsage>
      </systemUsage>
    </systemUsage>
    <transportConnectors>
      <transportConnector name="openwire" uri="tcp://127.0.0.1:{self.port}"/>
    </transportConnectors>
  </broker>
</beans>
""")

    def store_check(self) -> str:
        logs = sorted(glob.glob(str(self.data_dir / "kahadb" / "db-*.log")))
        if logs:
            return f"KahaDB ({len(logs)} journal file(s)), enableJournalDiskSyncs default (true)"
        return f"NOT CONFIRMED: no KahaDB journal in {self.data_dir / 'kahadb'}"

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"store": "KahaDB"}


def java_classpath() -> tuple[str, list[str]]:
    """The OpenWire client's classpath from Debian's jars, and the jars it lacks."""
    found, missing = [], []
    for name in CLIENT_JARS:
        path = JAVA_DIR / f"{name}.jar"
        if path.exists():
            found.append(str(path))
        else:
            missing.append(name)
    return os.pathsep.join(found), missing


def compile_java_client(out_dir: Path) -> str:
    """javac JmsBench.java against Debian's jars; returns the classpath that runs it."""
    javac = shutil.which("javac")
    if javac is None:
        raise BrokerUnavailable("javac is not installed (Debian's openjdk-17-jdk-headless)")
    classpath, missing = java_classpath()
    if "activemq-client" in missing or "geronimo-jms_1.1_spec" in missing:
        raise BrokerUnavailable(f"the OpenWire client's jars are missing ({', '.join(missing)}): "
                                "run bench/setup_peers.sh --with-activemq")
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([javac, "-nowarn", "-cp", classpath, "-d", str(out_dir),
                           str(JMS_SOURCE)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise BrokerUnavailable(f"javac failed: {proc.stderr[-2000:]}")
    return os.pathsep.join([str(out_dir), classpath])
