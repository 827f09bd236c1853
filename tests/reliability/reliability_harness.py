"""Broker processes that die and come back, and MQTT clients that live through it.

* :class:`BrokerCtl` runs one broker at a time on one data directory: ``start``, ``kill9``
  (SIGKILL, nothing flushed), ``terminate`` (SIGTERM, graceful). Every run gets its own work
  directory (and log) so a failure can be read back run by run; ``address`` is None while down.
* :class:`RawPublisher` / :class:`RawSubscriber` are durable-session clients on the raw test
  client, one thread each, that reconnect with clean session 0 to whatever broker is up,
  resend what was unacknowledged (PUBLISH with DUP and the same packet id, or PUBREL), and
  record exactly what they were told and what they received.
* :class:`PahoPublisher` / :class:`PahoSubscriber` do the same with paho-mqtt.

Payloads are ``b"<tag>:<seq>"`` with a unique sequence number per publisher, so a checker can
say which acknowledged message is missing and which one arrived twice.

Every loop is bounded by a deadline; every thread stops when told or when its deadline passes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kittiwake.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    Will,
)
from kittiwake.mqtt.properties import Properties
from tests.integration.brokerproc import BrokerProcess
from tests.integration.rawclient import ConnectionClosed, RawClient

SESSION_EXPIRY = 3600
KEEPALIVE = 60


class Stop(Exception):
    """A client thread was told to stop (or ran past its deadline) while waiting."""


# -- the broker -------------------------------------------------------------------------------


class BrokerCtl:
    """One data directory, one broker process at a time."""

    def __init__(self, base: Path, **sections: dict[str, Any] | str) -> None:
        self.base = base
        self.data_dir = base / "data"
        config: dict[str, Any] = {name: value for name, value in sections.items()}
        store = dict(config.pop("store", {}))
        store.setdefault("data_dir", str(self.data_dir))
        limits = dict(config.pop("limits", {}))
        # The suites count every acknowledged message: queues must never be the limit.
        limits.setdefault("max_queued_messages", 1_000_000)
        limits.setdefault("max_queued_bytes", 1 << 30)
        config["store"] = store
        config["limits"] = limits
        config.setdefault("sys", {"interval": 0})
        config.setdefault("log_level", "info")
        self.sections = config
        self.proc: BrokerProcess | None = None
        self.runs = 0
        self.kills = 0
        self.terminations = 0
        self.address: tuple[str, int] | None = None
        self.lock = threading.Lock()

    @property
    def pid(self) -> int:
        assert self.proc is not None and self.proc.proc is not None
        return self.proc.proc.pid

    def start(self) -> BrokerProcess:
        assert self.proc is None or not self.proc.alive(), "a broker is already running"
        self.runs += 1
        proc = BrokerProcess(self.base / f"run{self.runs:03d}", **self.sections)  # type: ignore[arg-type]
        self.proc = proc
        proc.start()
        self.address = proc.address
        return proc

    def kill9(self) -> None:
        """SIGKILL: no shutdown code runs, the store writes nothing more."""
        proc = self.proc
        assert proc is not None and proc.proc is not None
        self.address = None
        assert proc.alive(), f"the broker died on its own:\n{proc.log_text()[-3000:]}"
        os.kill(proc.proc.pid, signal.SIGKILL)
        proc.proc.wait(10)
        proc.stop()  # closes the log file
        self.kills += 1

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait for the graceful exit; returns the exit status."""
        proc = self.proc
        assert proc is not None and proc.proc is not None
        self.address = None
        assert proc.alive(), f"the broker died on its own:\n{proc.log_text()[-3000:]}"
        proc.proc.send_signal(signal.SIGTERM)
        try:
            code = proc.proc.wait(timeout)
        finally:
            proc.stop()
        self.terminations += 1
        return code

    def shutdown(self) -> None:
        """Teardown: whatever is still running is killed."""
        self.address = None
        proc = self.proc
        if proc is not None and proc.proc is not None:
            if proc.proc.poll() is None:
                proc.proc.kill()
                with contextlib.suppress(Exception):
                    proc.proc.wait(10)
            with contextlib.suppress(Exception):
                proc.stop()

    def log_text(self, runs: int = 2, limit: int = 4000) -> str:
        parts = []
        for n in range(max(1, self.runs - runs + 1), self.runs + 1):
            path = self.base / f"run{n:03d}" / "broker.log"
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")[-limit:]
                parts.append(f"--- run {n} ({path}) ---\n{text}")
        return "\n".join(parts)


def wait_for(condition: Any, timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def parse(payload: bytes) -> tuple[str, int]:
    tag, _, seq = payload.decode().partition(":")
    return tag, int(seq)


# -- raw durable clients ----------------------------------------------------------------------


class DurableClient(threading.Thread):
    """A durable-session client thread: connects (clean session 0) to whatever broker is up."""

    def __init__(self, ctl: BrokerCtl, client_id: str, *, version: int, deadline: float) -> None:
        super().__init__(name=client_id, daemon=True)
        self.ctl = ctl
        self.client_id = client_id
        self.version = version
        self.deadline = deadline
        self.stop_event = threading.Event()
        self.connects = 0
        self.not_present: list[int] = []  # reconnection numbers that came back without a session
        self.errors: list[str] = []
        self.anomalies: list[str] = []
        self.connected = threading.Event()

    def stop(self) -> None:
        self.stop_event.set()

    def _check_stop(self) -> None:
        if self.stop_event.is_set() or time.monotonic() > self.deadline:
            raise Stop

    def connect(self, will: Will | None = None) -> RawClient:
        while True:
            self._check_stop()
            address = self.ctl.address
            if address is None:
                time.sleep(0.01)
                continue
            conn: RawClient | None = None
            try:
                conn = RawClient(address, self.version, timeout=2.0)
                props = Properties()
                if self.version == 5:
                    props.session_expiry_interval = SESSION_EXPIRY
                conn.send(
                    Connect(
                        self.client_id, protocol_version=self.version, clean_start=False,
                        keepalive=KEEPALIVE, will=will, properties=props,
                    )
                )
                ack = conn.expect(ConnAck, timeout=3.0)
            except (OSError, ConnectionClosed, TimeoutError, AssertionError):
                if conn is not None:
                    conn.close()
                time.sleep(0.01)
                continue
            if ack.reason_code != 0:
                self.errors.append(f"CONNECT refused: {ack!r}")
                conn.close()
                time.sleep(0.05)
                continue
            self.connects += 1
            if self.connects > 1 and not ack.session_present:
                self.not_present.append(self.connects)
            self.connected.set()
            return conn

    def run(self) -> None:
        try:
            self.body()
        except Stop:
            pass
        except Exception:
            self.errors.append(traceback.format_exc())

    def body(self) -> None:
        raise NotImplementedError


class RawPublisher(DurableClient):
    """Publishes ``<tag>:<seq>`` at ``qos`` to ``topic``, ``rate`` per second, ``window`` in
    flight. Packet ids restart at 1 on every connection (skipping those still in flight), as
    any client that does not keep a counter across connections would."""

    def __init__(
        self, ctl: BrokerCtl, client_id: str, *, version: int, qos: int, topic: str, tag: str,
        rate: float, window: int, deadline: float,
    ) -> None:
        super().__init__(ctl, client_id, version=version, deadline=deadline)
        assert qos in (1, 2)
        self.qos = qos
        self.topic = topic
        self.tag = tag
        self.rate = rate
        self.window = window
        self.next_seq = 0
        # packet id -> [seq, stage]; stage "pub" awaits PUBACK/PUBREC, "rel" awaits PUBCOMP.
        self.inflight: OrderedDict[int, list[Any]] = OrderedDict()
        self.sent: set[int] = set()
        self.acked: set[int] = set()  # PUBACK, or PUBREC for QoS 2: the broker owns it
        self.completed: set[int] = set()  # PUBCOMP
        self.retry: list[int] = []  # negatively acknowledged: publish again
        self.negative = 0
        self.resent = 0
        self.finish = threading.Event()  # no new messages; complete what is in flight
        self._pid = 0
        self._t0 = 0.0
        # seq -> [(connection number, event, packet id)], for diagnosing a failure.
        self.trace: dict[int, list[tuple[int, str, int]]] = {}
        # packet id -> the (connection number, seq) of its last completed exchange.
        self.last_use: dict[int, list[tuple[int, int]]] = {}

    def history(self, seq: int) -> str:
        events = self.trace.get(seq, [])
        lines = [f"conn#{n} {event} id={pid}" for n, event, pid in events]
        first = min((n for n, _, _ in events), default=0)
        for pid in sorted({pid for _, _, pid in events}):
            earlier = [f"seq {s} on conn#{n}" for n, s in self.last_use.get(pid, []) if n < first]
            if earlier:
                lines.append(f"before that, id {pid} last completed for {earlier[-1]}")
        return "; ".join(lines)

    def _note(self, seq: int, event: str, pid: int) -> None:
        self.trace.setdefault(seq, []).append((self.connects, event, pid))

    def payload(self, seq: int) -> bytes:
        return f"{self.tag}:{seq}".encode()

    @property
    def done(self) -> bool:
        return self.finish.is_set() and not self.inflight and not self.retry

    def _allocate(self) -> int:
        while True:
            self._pid = self._pid % 65535 + 1
            if self._pid not in self.inflight:
                return self._pid

    def _send_new(self, conn: RawClient, seq: int) -> None:
        pid = self._allocate()
        self.inflight[pid] = [seq, "pub"]
        self.sent.add(seq)
        self._note(seq, "PUBLISH", pid)
        conn.send(Publish(self.topic, self.payload(seq), self.qos, False, False, pid))

    def _resume(self, conn: RawClient) -> None:
        self._pid = 0
        for pid, (seq, stage) in list(self.inflight.items()):
            self.resent += 1
            self._note(seq, "resend PUBLISH" if stage == "pub" else "resend PUBREL", pid)
            if stage == "pub":
                conn.send(Publish(self.topic, self.payload(seq), self.qos, False, True, pid))
            else:
                conn.send(PubRel(pid))

    def _pump(self, conn: RawClient) -> None:
        while self.retry and len(self.inflight) < self.window:
            self._send_new(conn, self.retry.pop(0))
        if self.finish.is_set():
            return
        allowed = int((time.monotonic() - self._t0) * self.rate) + 1
        while len(self.inflight) < self.window and self.next_seq < allowed:
            self.next_seq += 1
            self._send_new(conn, self.next_seq)

    def _handle(self, conn: RawClient, packet: Packet) -> None:
        if isinstance(packet, PubAck):
            entry = self.inflight.get(packet.packet_id)
            if entry is None or self.qos != 1:
                self.anomalies.append(f"unexpected {packet!r}")
                return
            del self.inflight[packet.packet_id]
            if packet.reason_code >= 0x80:
                self.negative += 1
                self.retry.append(entry[0])
            else:
                self.acked.add(entry[0])
                self._note(entry[0], "PUBACK", packet.packet_id)
                self.last_use.setdefault(packet.packet_id, []).append((self.connects, entry[0]))
        elif isinstance(packet, PubRec):
            entry = self.inflight.get(packet.packet_id)
            if entry is None or self.qos != 2:
                self.anomalies.append(f"unexpected {packet!r}")
                conn.send(PubRel(packet.packet_id))
                return
            if packet.reason_code >= 0x80:
                del self.inflight[packet.packet_id]
                self.negative += 1
                self.retry.append(entry[0])
                return
            self.acked.add(entry[0])
            self._note(entry[0], "PUBREC", packet.packet_id)
            entry[1] = "rel"
            conn.send(PubRel(packet.packet_id))
        elif isinstance(packet, PubComp):
            entry = self.inflight.get(packet.packet_id)
            if entry is None or entry[1] != "rel":
                self.anomalies.append(f"unexpected {packet!r}")
                return
            del self.inflight[packet.packet_id]
            self.completed.add(entry[0])
            self._note(entry[0], "PUBCOMP", packet.packet_id)
            self.last_use.setdefault(packet.packet_id, []).append((self.connects, entry[0]))
        elif isinstance(packet, Disconnect):
            raise ConnectionClosed(f"DISCONNECT from the broker: {packet!r}")
        elif not isinstance(packet, PingResp):
            self.anomalies.append(f"unexpected {packet!r}")

    def body(self) -> None:
        self._t0 = time.monotonic()
        conn: RawClient | None = None
        while True:
            if conn is None:
                conn = self.connect()
                try:
                    self._resume(conn)
                except OSError:
                    conn.close()
                    conn = None
                    continue
            try:
                self._pump(conn)
                if self.done:
                    conn.disconnect()
                    return
                self._handle(conn, conn.recv(0.02))
            except TimeoutError:
                self._check_stop()
            except (OSError, ConnectionClosed):
                conn.close()
                conn = None


class RawSubscriber(DurableClient):
    """Subscribes once (first connection) and then only reconnects; QoS 2 messages are
    delivered on PUBREL (the receiver keeps the packet id until then, across reconnections,
    as its half of the session)."""

    def __init__(
        self, ctl: BrokerCtl, client_id: str, *, version: int, filters: Iterable[tuple[str, int]],
        deadline: float,
    ) -> None:
        super().__init__(ctl, client_id, version=version, deadline=deadline)
        self.filters = list(filters)
        self.pending: dict[int, tuple[str, bytes]] = {}
        self.deliveries: list[tuple[str, bytes, int]] = []
        self.subscribed = threading.Event()
        # (connection number, packet, packet id, dup, payload), for diagnosing a failure.
        self.trace: list[tuple[int, str, int | None, bool, bytes]] = []

    def history(self, payload: bytes) -> list[str]:
        """Everything this subscriber saw of one message, in order."""
        return [
            f"conn#{n} {kind} id={pid} dup={dup}"
            for n, kind, pid, dup, p in self.trace
            if p == payload
        ]

    def _handle(self, conn: RawClient, packet: Packet) -> None:
        if isinstance(packet, Publish):
            self.trace.append(
                (self.connects, f"PUBLISH q{packet.qos}", packet.packet_id, packet.dup,
                 packet.payload)
            )
            if packet.qos == 0:
                self.deliveries.append((packet.topic, packet.payload, 0))
            elif packet.qos == 1:
                assert packet.packet_id is not None
                self.deliveries.append((packet.topic, packet.payload, 1))
                conn.send(PubAck(packet.packet_id))
            else:
                pid = packet.packet_id
                assert pid is not None
                known = self.pending.get(pid)
                if known is None:
                    self.pending[pid] = (packet.topic, packet.payload)
                elif known != (packet.topic, packet.payload):
                    # The receiver must treat it as the duplicate of the unreleased one
                    # (MQTT-4.3.3): the broker has forgotten an exchange this client still holds.
                    self.anomalies.append(
                        f"QoS 2 PUBLISH id {pid} (dup={packet.dup}) carries {packet.payload!r} "
                        f"while {known[1]!r} still awaits its PUBREL under that id"
                    )
                conn.send(PubRec(pid))
        elif isinstance(packet, PubRel):
            known = self.pending.pop(packet.packet_id, None)
            self.trace.append(
                (self.connects, "PUBREL", packet.packet_id, False,
                 known[1] if known is not None else b"(nothing pending)")
            )
            if known is not None:
                self.deliveries.append((known[0], known[1], 2))
            conn.send(PubComp(packet.packet_id))
        elif isinstance(packet, Disconnect):
            raise ConnectionClosed(f"DISCONNECT from the broker: {packet!r}")
        elif not isinstance(packet, (PingResp, SubAck)):
            self.anomalies.append(f"unexpected {packet!r}")

    def _subscribe(self, conn: RawClient) -> None:
        conn.send(Subscribe(1, [SubscriptionRequest(f, q) for f, q in self.filters]))
        while True:
            packet = conn.recv(3.0)
            if isinstance(packet, SubAck):
                assert all(code < 0x80 for code in packet.reason_codes), packet
                self.subscribed.set()
                return
            self._handle(conn, packet)

    def body(self) -> None:
        conn: RawClient | None = None
        while True:
            if conn is None:
                conn = self.connect()
                if not self.subscribed.is_set():
                    try:
                        self._subscribe(conn)
                    except (OSError, ConnectionClosed, TimeoutError):
                        self.errors.append("the first SUBSCRIBE did not complete")
                        raise Stop from None
            try:
                self._handle(conn, conn.recv(0.05))
            except TimeoutError:
                self._check_stop()
            except (OSError, ConnectionClosed):
                conn.close()
                conn = None


# -- paho clients -----------------------------------------------------------------------------


class PahoClient(threading.Thread):
    """paho-mqtt 2 with clean_session=False on a manual loop, reconnecting to whatever
    broker is up (each restart listens on a new port)."""

    def __init__(self, ctl: BrokerCtl, client_id: str, *, deadline: float) -> None:
        import paho.mqtt.client as mqtt

        super().__init__(name=client_id, daemon=True)
        self.mqtt = mqtt
        self.ctl = ctl
        self.client_id = client_id
        self.deadline = deadline
        self.stop_event = threading.Event()
        self.errors: list[str] = []
        self.anomalies: list[str] = []
        self.connects = 0
        self.not_present: list[int] = []
        self.connected = threading.Event()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False,
            protocol=mqtt.MQTTv311,
        )
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect

    def stop(self) -> None:
        self.stop_event.set()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            self.errors.append(f"CONNECT refused: {reason}")
            return
        self.connects += 1
        if self.connects > 1 and not flags.session_present:
            self.not_present.append(self.connects)
        self.connected.set()
        self.on_connected(flags.session_present)

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        self.connected.clear()

    def on_connected(self, session_present: bool) -> None:
        pass

    def tick(self) -> bool:
        """One step of the client's own work; True when it is finished."""
        return False

    def run(self) -> None:
        try:
            self._run()
        except Exception:
            self.errors.append(traceback.format_exc())
        finally:
            with contextlib.suppress(Exception):
                self.client.socket() and self.client.socket().close()  # type: ignore[union-attr]

    def _run(self) -> None:
        mqtt = self.mqtt
        attached: tuple[str, int] | None = None
        while not self.stop_event.is_set() and time.monotonic() < self.deadline:
            address = self.ctl.address
            if attached is None or (address is not None and address != attached):
                if address is None:
                    time.sleep(0.01)
                    continue
                try:
                    self.client.connect(address[0], address[1], keepalive=KEEPALIVE)
                except OSError:
                    time.sleep(0.01)
                    continue
                attached = address
            rc = self.client.loop(timeout=0.02)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                attached = None
                self.connected.clear()
                time.sleep(0.01)
                continue
            if self.connected.is_set() and self.tick():
                self.client.disconnect()
                self.client.loop(timeout=0.05)
                return


class PahoPublisher(PahoClient):
    """QoS 1 and QoS 2 streams (``<tag>1:<seq>`` / ``<tag>2:<seq>``); acknowledged means
    paho's on_publish fired (PUBACK, or PUBCOMP for QoS 2)."""

    def __init__(
        self, ctl: BrokerCtl, client_id: str, *, topics: dict[int, str], tag: str, rate: float,
        window: int, deadline: float,
    ) -> None:
        super().__init__(ctl, client_id, deadline=deadline)
        self.topics = topics
        self.tag = tag
        self.rate = rate
        self.window = window
        self.client.max_inflight_messages_set(window)
        self.client.max_queued_messages_set(0)
        self.client.on_publish = self._on_publish
        self.by_mid: dict[int, tuple[int, int]] = {}
        self.sent: dict[int, set[int]] = {q: set() for q in topics}
        self.acked: dict[int, set[int]] = {q: set() for q in topics}
        self.next_seq = 0
        self.finish = threading.Event()
        self._t0 = time.monotonic()

    def stream_tag(self, qos: int) -> str:
        return f"{self.tag}{qos}"

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        known = self.by_mid.pop(mid, None)
        if known is None:
            self.anomalies.append(f"on_publish for unknown mid {mid}")
            return
        self.acked[known[0]].add(known[1])

    def tick(self) -> bool:
        if self.finish.is_set():
            return not self.by_mid
        allowed = int((time.monotonic() - self._t0) * self.rate) + 1
        while len(self.by_mid) < self.window * 2 and self.next_seq < allowed:
            self.next_seq += 1
            qos = 1 + self.next_seq % 2
            seq = self.next_seq
            info = self.client.publish(
                self.topics[qos], f"{self.stream_tag(qos)}:{seq}".encode(), qos=qos
            )
            self.by_mid[info.mid] = (qos, seq)
            self.sent[qos].add(seq)
        return False


class PahoSubscriber(PahoClient):
    def __init__(
        self, ctl: BrokerCtl, client_id: str, *, filters: list[tuple[str, int]], deadline: float,
    ) -> None:
        super().__init__(ctl, client_id, deadline=deadline)
        self.filters = filters
        self.deliveries: list[tuple[str, bytes, int]] = []
        self.subscribed = threading.Event()
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe

    def on_connected(self, session_present: bool) -> None:
        if self.connects == 1:
            self.client.subscribe(self.filters)

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        if any(code.is_failure for code in codes):
            self.errors.append(f"SUBSCRIBE refused: {codes}")
        self.subscribed.set()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        self.deliveries.append((message.topic, bytes(message.payload), message.qos))


def start_soak_subscribers(
    ctl: BrokerCtl, deadline: float, threads: list[Any]
) -> dict[str, Any]:
    """The soaks' three durable subscribers on k/# at QoS 2 (raw 3.1.1, raw 5.0, paho), started,
    added to ``threads`` and subscribed."""
    filters = [("k/#", 2)]
    subscribers: dict[str, Any] = {
        "raw-v4-sub": RawSubscriber(ctl, "raw-v4-sub", version=4, filters=filters,
                                    deadline=deadline),
        "raw-v5-sub": RawSubscriber(ctl, "raw-v5-sub", version=5, filters=filters,
                                    deadline=deadline),
        "paho-sub": PahoSubscriber(ctl, "paho-sub", filters=filters, deadline=deadline),
    }
    for sub in subscribers.values():
        sub.start()
        threads.append(sub)
    assert wait_for(lambda: all(s.subscribed.is_set() for s in subscribers.values()), 10)
    return subscribers


def retained_snapshot(
    address: tuple[str, int], filters: list[str], sentinel: str
) -> dict[str, bytes]:
    """The retained messages a fresh (clean) subscriber gets for ``filters``. A SUBSCRIBE to
    ``sentinel`` (which has a persistent retained message) follows; its retained copy comes after
    every earlier one on the connection, so no waiting for silence is needed."""
    got: dict[str, bytes] = {}
    with RawClient(address, 4, timeout=5.0) as c:
        c.connect(f"retained-check-{time.monotonic_ns()}", clean_start=True)
        c.send(Subscribe(1, [SubscriptionRequest(f, 1) for f in filters]))
        c.send(Subscribe(2, [SubscriptionRequest(sentinel, 1)]))
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            packet = c.recv(5.0)
            if isinstance(packet, Publish):
                if packet.qos:
                    c.send(PubAck(packet.packet_id))  # type: ignore[arg-type]
                if packet.topic == sentinel:
                    return got
                assert packet.retain, packet
                got[packet.topic] = packet.payload
            else:
                assert isinstance(packet, SubAck), packet
        raise AssertionError(f"the sentinel retained message {sentinel!r} never came back")


# -- checking ---------------------------------------------------------------------------------


@dataclass
class Stream:
    """One publisher's stream as its publisher saw it."""

    name: str
    tag: str
    topic: str
    qos: int
    sent: set[int]
    acked: set[int]


@dataclass
class Verdict:
    missing: dict[str, list[str]] = field(default_factory=dict)
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    phantoms: dict[str, list[str]] = field(default_factory=dict)

    def ok(self) -> bool:
        return not (self.missing or self.duplicates or self.phantoms)


def check(
    streams: list[Stream], subscribers: dict[str, list[tuple[str, bytes, int]]],
    exactly_once: dict[str, bool],
) -> Verdict:
    """Every acknowledged message reached every subscriber; QoS 2 (``exactly_once``) streams
    reached each at most once; nothing arrived that was never sent."""
    verdict = Verdict()
    for sub_name, deliveries in subscribers.items():
        got: dict[str, Counter[int]] = {s.tag: Counter() for s in streams}
        for _topic, payload, _qos in deliveries:
            try:
                tag, seq = parse(payload)
            except ValueError:
                continue
            if tag in got:
                got[tag][seq] += 1
        for stream in streams:
            counts = got[stream.tag]
            missing = sorted(stream.acked - set(counts))
            if missing:
                verdict.missing.setdefault(sub_name, []).append(
                    f"{stream.name}: {len(missing)} of {len(stream.acked)} acknowledged, "
                    f"e.g. seq {missing[:12]}"
                )
            phantoms = sorted(set(counts) - stream.sent)
            if phantoms:
                verdict.phantoms.setdefault(sub_name, []).append(f"{stream.name}: {phantoms[:12]}")
            if exactly_once.get(stream.tag):
                dups = sorted(seq for seq, n in counts.items() if n > 1)
                if dups:
                    verdict.duplicates.setdefault(sub_name, []).append(
                        f"{stream.name}: {len(dups)} delivered twice or more, e.g. "
                        f"{[(s, counts[s]) for s in dups[:12]]}"
                    )
    return verdict


def diagnose(publishers: list[RawPublisher], subscribers: list[Any]) -> list[str]:
    """What the raw clients saw of each QoS 2 duplicate and of each message lost everywhere."""
    lines: list[str] = []
    dups: list[str] = []
    for sub in subscribers:
        if not isinstance(sub, RawSubscriber):
            continue
        counts = Counter(payload for _t, payload, qos in sub.deliveries if qos == 2)
        for payload, n in counts.items():
            if n > 1:
                dups.append(f"{sub.name} got {payload!r} {n}x: " + "; ".join(sub.history(payload)))
    for pub in publishers:
        lost = set(pub.acked)
        for sub in subscribers:
            seen = set()
            for _t, payload, _q in list(sub.deliveries):
                with contextlib.suppress(ValueError):
                    tag, seq = parse(payload)
                    if tag == pub.tag:
                        seen.add(seq)
            lost &= pub.acked - seen
        for seq in sorted(lost)[:4]:
            lines.append(f"{pub.client_id} seq {seq} missing at every subscriber: "
                         + pub.history(seq))
    return lines + dups


def all_delivered(streams: list[Stream], deliveries: list[tuple[str, bytes, int]]) -> bool:
    seen: dict[str, set[int]] = {}
    for _topic, payload, _qos in list(deliveries):
        with contextlib.suppress(ValueError):
            tag, seq = parse(payload)
            seen.setdefault(tag, set()).add(seq)
    return all(stream.acked <= seen.get(stream.tag, set()) for stream in streams)
