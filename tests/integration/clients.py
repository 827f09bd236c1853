"""Thin, bounded-wait wrappers around third-party MQTT clients: paho-mqtt and the mosquitto
command-line tools. They add no protocol logic of their own, only waiting and collecting."""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import queue
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

MQTTv311 = mqtt.MQTTv311
MQTTv5 = mqtt.MQTTv5
VERSIONS = {"v311": MQTTv311, "v5": MQTTv5}

_ids = itertools.count(1)


def unique(prefix: str) -> str:
    """A client id / topic part no other test in this run uses."""
    return f"{prefix}-{os.getpid()}-{next(_ids)}"


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; return it, or None on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def props(packet_type: int, **values: Any) -> PahoProperties:
    """paho Properties for ``packet_type`` (e.g. PacketTypes.PUBLISH) from attribute names."""
    p = PahoProperties(packet_type)
    for name, value in values.items():
        setattr(p, name, value)
    return p


@dataclass
class Disconnected:
    reason_code: int
    properties: Any


class PahoClient:
    """A paho-mqtt client running its network loop in a thread; every wait is bounded."""

    def __init__(
        self,
        address: tuple[str, int],
        client_id: str = "",
        *,
        protocol: int = MQTTv311,
        clean: bool = True,
        manual_ack: bool = False,
        transport: str = "tcp",
    ) -> None:
        self.address = address
        self.protocol = protocol
        self.clean = clean
        kwargs: dict[str, Any] = {}
        if protocol != MQTTv5:
            kwargs["clean_session"] = clean
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            reconnect_on_failure=False,
            manual_ack=manual_ack,
            transport=transport,  # "websockets": path /mqtt, subprotocol mqtt (paho's defaults)
            **kwargs,
        )
        self.client_id = client_id
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connack: tuple[Any, int, Any] | None = None
        self._connected = threading.Event()
        self._subacks: dict[int, tuple[list[int], Any]] = {}
        self._pubacks: dict[int, tuple[int, Any]] = {}
        self.disconnects: list[Disconnected] = []
        self._disconnected = threading.Event()
        self._lock = threading.Lock()
        c = self.client
        c.on_connect = self._on_connect
        c.on_message = self._on_message
        c.on_subscribe = self._on_subscribe
        c.on_unsubscribe = self._on_unsubscribe
        c.on_publish = self._on_publish
        c.on_disconnect = self._on_disconnect
        c.on_log = self._on_log
        self.log: collections.deque[str] = collections.deque(maxlen=50)

    # -- callbacks (paho's thread) -----------------------------------------------------

    def _on_log(self, client, userdata, level, text) -> None:  # type: ignore[no-untyped-def]
        self.log.append(text)

    def diagnosis(self) -> str:
        """paho's recent log lines and disconnect reasons, for assertion messages."""
        return f"disconnects={self.disconnects!r}; paho log: {list(self.log)!r}"

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        self.connack = (flags, reason_code.value, properties)
        self._connected.set()

    def _on_message(self, client, userdata, message) -> None:  # type: ignore[no-untyped-def]
        self.messages.put(message)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            self._subacks[mid] = ([rc.value for rc in reason_codes], properties)

    def _on_unsubscribe(self, client, userdata, mid, reason_codes, properties) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            self._subacks[mid] = ([rc.value for rc in reason_codes], properties)

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            self._pubacks[mid] = (reason_code.value, properties)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        self.disconnects.append(Disconnected(reason_code.value, properties))
        self._disconnected.set()
        self._connected.set()  # wake a connect() waiting for a CONNACK that will never come

    # -- actions -----------------------------------------------------------------------

    def connect(
        self,
        *,
        keepalive: int = 10,
        clean_start: bool | None = None,
        properties: PahoProperties | None = None,
        will: tuple[str, bytes, int, bool] | None = None,
        will_properties: PahoProperties | None = None,
        username: str | None = None,
        password: str | None = None,
        expect_success: bool = True,
        timeout: float = 5.0,
    ) -> PahoClient:
        c = self.client
        if username is not None:
            c.username_pw_set(username, password)
        if will is not None:
            topic, payload, qos, retain = will
            c.will_set(topic, payload, qos, retain, properties=will_properties)
        kwargs: dict[str, Any] = {}
        if self.protocol == MQTTv5:
            kwargs["clean_start"] = self.clean if clean_start is None else clean_start
            kwargs["properties"] = properties
        self._connected.clear()
        self._disconnected.clear()
        self.connack = None
        c.connect(self.address[0], self.address[1], keepalive, **kwargs)
        c.loop_start()
        assert self._connected.wait(timeout), "no CONNACK within the timeout"
        if expect_success:
            assert self.connack is not None, f"connection failed: {self.diagnosis()}"
            assert self.connack[1] == 0, f"CONNECT refused with reason {self.connack[1]:#x}"
        return self

    @property
    def session_present(self) -> bool:
        assert self.connack is not None
        return bool(self.connack[0].session_present)

    @property
    def connack_properties(self) -> Any:
        assert self.connack is not None
        return self.connack[2]

    def subscribe(
        self,
        topic: str,
        qos: int = 0,
        *,
        options: SubscribeOptions | None = None,
        properties: PahoProperties | None = None,
        timeout: float = 5.0,
    ) -> list[int]:
        """Subscribe and wait for the SUBACK; returns its reason codes (granted QoS or failure)."""
        if self.protocol == MQTTv5:
            opts = options or SubscribeOptions(qos=qos)
            result, mid = self.client.subscribe(topic, options=opts, properties=properties)
        else:
            result, mid = self.client.subscribe(topic, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS, (
            f"subscribe failed locally: {result}; {self.diagnosis()}"
        )
        got = wait_until(lambda: self._subacks.get(mid), timeout)
        assert got is not None, f"no SUBACK for {topic!r} within {timeout}s"
        return list(got[0])

    def unsubscribe(self, topic: str, timeout: float = 5.0) -> list[int]:
        result, mid = self.client.unsubscribe(topic)
        assert result == mqtt.MQTT_ERR_SUCCESS
        got = wait_until(lambda: self._subacks.get(mid), timeout)
        assert got is not None, f"no UNSUBACK for {topic!r} within {timeout}s"
        return list(got[0])

    def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 0,
        retain: bool = False,
        *,
        properties: PahoProperties | None = None,
        wait: bool = True,
        timeout: float = 5.0,
    ) -> mqtt.MQTTMessageInfo:
        """Publish; with ``wait`` block until the exchange for its QoS is complete."""
        info = self.client.publish(topic, payload, qos, retain, properties=properties)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, (
            f"publish failed locally: {info.rc}; {self.diagnosis()}"
        )
        if wait:
            info.wait_for_publish(timeout)
            assert info.is_published(), (
                f"publish to {topic!r} (QoS {qos}) not completed; {self.diagnosis()}"
            )
        return info

    def publish_result(self, info: mqtt.MQTTMessageInfo, timeout: float = 5.0) -> int:
        """The v5 PUBACK/PUBREC reason code paho reported for a publication."""
        got = wait_until(lambda: self._pubacks.get(info.mid), timeout)
        assert got is not None, "no acknowledgement reported"
        return int(got[0])

    def get(self, timeout: float = 3.0) -> mqtt.MQTTMessage:
        """The next message received; AssertionError if none arrives in time."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            who = self.client_id or "client"
            raise AssertionError(f"{who}: no message within {timeout}s") from None

    def get_many(self, count: int, timeout: float = 5.0) -> list[mqtt.MQTTMessage]:
        deadline = time.monotonic() + timeout
        got = []
        for _ in range(count):
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                got.append(self.messages.get(timeout=remaining))
            except queue.Empty:
                raise AssertionError(
                    f"received {len(got)} of {count} messages within {timeout}s: "
                    f"{[(m.topic, m.payload) for m in got]!r}"
                ) from None
        return got

    def no_message(self, within: float = 0.5) -> None:
        """Assert that no message arrives for ``within`` seconds."""
        try:
            message = self.messages.get(timeout=within)
        except queue.Empty:
            return
        raise AssertionError(
            f"unexpected message on {message.topic!r}: {message.payload!r} "
            f"(qos {message.qos}, retain {message.retain})"
        )

    def drain(self) -> list[mqtt.MQTTMessage]:
        out = []
        while True:
            try:
                out.append(self.messages.get_nowait())
            except queue.Empty:
                return out

    def wait_disconnected(self, timeout: float = 5.0) -> Disconnected:
        assert self._disconnected.wait(timeout), f"still connected after {timeout}s"
        return self.disconnects[-1]

    def disconnect(self, properties: PahoProperties | None = None, reasoncode: Any = None) -> None:
        """A clean MQTT DISCONNECT, then stop the network thread."""
        self.client.disconnect(reasoncode=reasoncode, properties=properties)
        self._disconnected.wait(3.0)
        self.client.loop_stop()

    def kill(self) -> None:
        """End the TCP connection without DISCONNECT: an abnormal disconnection."""
        sock = self.client.socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._disconnected.wait(3.0)
        self.client.loop_stop()

    def stop(self) -> None:
        """Teardown helper: whatever the state, end the connection and the thread."""
        if self.client.is_connected():
            try:
                self.disconnect()
                return
            except Exception:
                pass
        self.client.loop_stop()


# -- mosquitto command-line clients ----------------------------------------------------

MOSQUITTO_SUB = shutil.which("mosquitto_sub")
MOSQUITTO_PUB = shutil.which("mosquitto_pub")
STDBUF = shutil.which("stdbuf")
_MSG_PREFIX = "=>msg|"  # '@' and '%' are format directives for -F


@dataclass
class SubMessage:
    """One message as mosquitto_sub printed it (v5 properties empty when absent)."""

    topic: str
    qos: int
    retain: bool
    payload: str
    expiry: str = ""
    user_properties: str = ""
    subscription_ids: str = ""


def mosquitto_pub(
    address: tuple[str, int], topic: str, message: str | None, *,
    version: str = "mqttv311", qos: int = 0, retain: bool = False,
    extra: Iterable[str] = (), timeout: float = 10.0, stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run mosquitto_pub once; ``message=None`` sends a zero-length payload (-n), unless
    ``extra`` chooses another source (-l, -f) and ``stdin`` feeds it."""
    assert MOSQUITTO_PUB, "mosquitto_pub is not installed (Debian package mosquitto-clients)"
    extra = list(extra)
    cmd = [
        MOSQUITTO_PUB, "-h", address[0], "-p", str(address[1]), "-V", version,
        "-q", str(qos), "-t", topic, "-i", unique("mpub"),
    ]
    if message is not None:
        cmd += ["-m", message]
    elif not {"-l", "-s", "-f"} & set(extra):
        cmd.append("-n")
    if retain:
        cmd.append("-r")
    cmd += list(extra)
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"mosquitto_pub failed ({result.returncode}): {result.stderr}"
    return result


class MosquittoSub:
    """A running mosquitto_sub; its output is parsed line by line on a reader thread.

    ``-d`` debug output tells us when the SUBACK arrived; messages are printed with a format
    that carries topic, QoS and the RETAIN flag.
    """

    def __init__(
        self, address: tuple[str, int], topics: Iterable[str], *, version: str = "mqttv311",
        qos: int = 0, client_id: str | None = None, extra: Iterable[str] = (),
    ) -> None:
        assert MOSQUITTO_SUB, "mosquitto_sub is not installed (Debian package mosquitto-clients)"
        self.client_id = client_id or unique("msub")
        cmd = [
            MOSQUITTO_SUB, "-h", address[0], "-p", str(address[1]), "-V", version,
            "-q", str(qos), "-i", self.client_id, "-d", "-F", f"{_MSG_PREFIX}%t|%q|%r|%E|%P|%S|%p",
        ]
        for topic in topics:
            cmd += ["-t", topic]
        cmd += list(extra)
        if STDBUF:  # mosquitto_sub's -d lines are block-buffered on a pipe otherwise
            cmd = [STDBUF, "-oL", *cmd]
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        self.output: list[str] = []  # every line, for failure messages
        self.messages: queue.Queue[SubMessage] = queue.Queue()
        self._events: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.output.append(line)
            if line.startswith(_MSG_PREFIX):
                topic, qos, retain, expiry, user, ids, payload = line[len(_MSG_PREFIX):].split(
                    "|", 6
                )
                self.messages.put(
                    SubMessage(topic, int(qos), retain == "1", payload, expiry, user, ids)
                )
            else:
                with self._cond:
                    self._events.append(line)
                    self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for_event(self, text: str, timeout: float = 5.0) -> str:
        """Wait for (and consume) a debug/diagnostic line containing ``text``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i, line in enumerate(self._events):
                    if text in line:
                        del self._events[i]
                        return line
                remaining = deadline - time.monotonic()
                if self._eof or remaining <= 0:
                    raise AssertionError(
                        f"mosquitto_sub: no {text!r} within {timeout}s (exited: {self._eof}); "
                        f"output: {self.output!r}"
                    )
                self._cond.wait(remaining)

    def wait_subscribed(self, timeout: float = 5.0) -> MosquittoSub:
        self.wait_for_event("received SUBACK", timeout)
        return self

    def get(self, timeout: float = 3.0) -> SubMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"mosquitto_sub: no message within {timeout}s; output: {self.output!r}"
            ) from None

    def no_message(self, within: float = 0.5) -> None:
        try:
            message = self.messages.get(timeout=within)
        except queue.Empty:
            return
        raise AssertionError(f"mosquitto_sub: unexpected message {message!r}")

    def wait_exit(self, timeout: float = 5.0) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: the TCP connection ends without DISCONNECT."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)

    def stop(self) -> None:
        """Teardown: end the process (SIGKILL; tests that need a clean DISCONNECT use -C)."""
        self.kill()
        self._reader.join(2)
