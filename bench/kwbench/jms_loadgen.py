"""Load-generator workers of the JMS scenarios, one spawned process each, with the harness
protocol of ``loadgen`` (ready_q / go / result_q). Never measures the broker: it counts what
its own clients sent and received.

Three clients:
- ``proton``: python-qpid-proton's own Container, used as fast as it honestly goes. A sender
  keeps its credit full with unsettled deliveries and counts the broker's outcomes as they
  come (synchronous sends: one delivery in flight at a time); a transacted sender declares a
  transaction, sends a batch and commits. A receiver keeps a window of credit and accepts
  every message (transacted: flows one batch of credit per transaction, accepts in it,
  commits).
- ``jms``: ``kittiwake.jms``, the blocking API as an application uses it: ``send`` in a loop
  (PERSISTENT waits for the broker, NON_PERSISTENT does not), ``receive`` in a loop on one
  thread per consumer, AUTO_ACKNOWLEDGE (``--jms-ack dups_ok``: DUPS_OK_ACKNOWLEDGE) or
  ``commit()`` every batch.
- ``java``: the OpenWire JMS 1.1 client (bench/jms/JmsBench.java, compiled by the harness);
  this worker runs the JVM and relays its READY / GO / RESULT lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import threading
import time
import traceback
from typing import Any

from kwbench import jms_workloads
from kwbench.runner import cpu_wait_seconds

MAX_SAMPLES = 20_000  # latency samples one worker keeps (stride-sampled)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _waited() -> float:
    """Seconds this process's threads spent runnable but waiting for a CPU: a client held
    back by other load shows low CPU % while it is in fact starved."""
    return cpu_wait_seconds(os.getpid())


def worker_main(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any, release: Any
                ) -> None:
    wid = spec["id"]
    try:
        cpus = spec.get("cpus")
        if cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, cpus)
        client, role = spec["client"], spec["role"]
        if client == "java":
            _java(spec, ready_q, go, result_q)
        elif client == "proton" and role == "producer":
            _proton_producer(spec, ready_q, go, result_q)
        elif client == "proton":
            _proton_consumers(spec, ready_q, go, result_q)
        elif client == "jms" and role == "producer":
            _jms_producer(spec, ready_q, go, result_q)
        elif client == "jms":
            _jms_consumers(spec, ready_q, go, result_q)
        else:
            raise ValueError(f"unknown client/role {client}/{role}")
    except BaseException:
        text = traceback.format_exc()
        with contextlib.suppress(Exception):
            ready_q.put(("error", wid, text))
            result_q.put(("error", wid, text))


class _Samples:
    """Every ``stride``-th latency (receive - send stamp), at most MAX_SAMPLES."""

    def __init__(self, expected: int) -> None:
        self.stride = max(1, expected // MAX_SAMPLES)
        self.values: list[int] = []
        self.seen = 0

    def add(self, text: Any, now: int) -> None:
        self.seen += 1
        if self.seen % self.stride == 0 and isinstance(text, str):
            sent = jms_workloads.sent_ns(text)
            if sent:
                self.values.append(now - sent)


def _address(spec: dict[str, Any]) -> str:
    return f"{spec['kind']}://{spec['destination']}"


# -- python-qpid-proton ------------------------------------------------------------------------


def _proton_producer(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any) -> None:
    from proton import Message
    from proton.handlers import MessagingHandler, TransactionHandler
    from proton.reactor import Container

    count = spec["count"]
    batch = jms_workloads.COMMIT_EVERY
    durable = spec["persistent"]

    class Producer(MessagingHandler, TransactionHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
            self.sent = 0
            self.acked = 0
            self.in_txn = 0  # sent in the open transaction
            self.txn: Any = None
            self.declaring = False
            self.started = False
            self.finished = False
            self.first = 0
            self.last = 0
            self.cpu0 = 0.0
            self.wait0 = 0.0
            self.errors: list[str] = []
            self.timed_out = False

        def on_start(self, event: Any) -> None:
            self.container = event.container
            self.conn = event.container.connect(spec["url"], allowed_mechs="ANONYMOUS",
                                                heartbeat=30)
            self.sender = event.container.create_sender(self.conn, _address(spec))

        def on_sendable(self, event: Any) -> None:
            if not self.started:
                self.started = True
                ready_q.put(("ready", spec["id"], {}))
                if not go.wait(spec["start_timeout_s"]):
                    self.errors.append("no go within the start timeout")
                    self._finish()
                    return
                self.cpu0 = _cpu()
                self.wait0 = _waited()
                self.first = time.monotonic_ns()
                self.container.schedule(spec["deadline_s"], _Timer(self._deadline))
                if spec["transacted"]:
                    self._declare()
                    return
            self._pump()

        def _message(self) -> Any:
            return Message(body=jms_workloads.body(time.monotonic_ns()), durable=durable)

        def _pump(self) -> None:
            sender = self.sender
            if self.finished:
                return
            if spec["transacted"]:
                if self.txn is None:
                    return
                want = min(batch, count - (self.sent - self.in_txn))
                while self.in_txn < want and sender.credit > 0:
                    self.txn.send(sender, self._message())
                    self.sent += 1
                    self.in_txn += 1
                if self.in_txn == want:
                    txn, self.txn = self.txn, None
                    txn.commit()
                return
            if spec["sync_send"]:
                if self.sent == self.acked and self.sent < count and sender.credit > 0:
                    sender.send(self._message())
                    self.sent += 1
                return
            while self.sent < count and sender.credit > 0:
                sender.send(self._message())
                self.sent += 1

        def _declare(self) -> None:
            self.in_txn = 0
            self.container.declare_transaction(self.conn, handler=self)

        def on_transaction_declared(self, event: Any) -> None:
            self.txn = event.transaction
            self._pump()

        def on_transaction_committed(self, event: Any) -> None:
            self.acked += self.in_txn
            self.in_txn = 0
            if self.acked >= count:
                self._finish()
            else:
                self._declare()

        def on_transaction_commit_failed(self, event: Any) -> None:
            self.errors.append("commit failed")
            self._finish()

        def on_transaction_declare_failed(self, event: Any) -> None:
            self.errors.append("declare failed")
            self._finish()

        def on_accepted(self, event: Any) -> None:
            if spec["transacted"]:
                return  # counted at the commit
            self.acked += 1
            if self.acked >= count:
                self._finish()
            elif spec["sync_send"]:
                self._pump()

        def on_rejected(self, event: Any) -> None:
            self.errors.append(f"rejected: {event.delivery.remote.condition}")
            self._finish()

        def on_released(self, event: Any) -> None:
            self.errors.append("released")
            self._finish()

        def _deadline(self) -> None:
            if not self.finished:
                self.timed_out = True
                self._finish()

        def _finish(self) -> None:
            if self.finished:
                return
            self.finished = True
            self.last = time.monotonic_ns()
            self.cpu1 = _cpu()
            self.wait1 = _waited()
            self.conn.close()
            self.container.stop()

        def on_transport_error(self, event: Any) -> None:
            cond = event.transport.condition
            self.errors.append(f"transport error: {cond}")
            self._finish()

    producer = Producer()
    Container(producer).run()
    result_q.put(("result", spec["id"], {
        "kind": "producer", "sent": producer.sent, "acked": producer.acked,
        "first_ns": producer.first, "last_ns": producer.last,
        "cpu_s": getattr(producer, "cpu1", _cpu()) - producer.cpu0 if producer.cpu0 else 0.0,
        "wait_s": (getattr(producer, "wait1", _waited()) - producer.wait0
                   if producer.cpu0 else 0.0),
        "timed_out": producer.timed_out, "errors": producer.errors}))


class _Timer:
    """A proton timer task's handler calling ``function``."""

    def __init__(self, function: Any) -> None:
        self.function = function

    def on_timer_task(self, event: Any) -> None:
        self.function()


def _proton_consumers(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any) -> None:
    from proton.handlers import MessagingHandler, TransactionHandler
    from proton.reactor import Container

    expected = spec["count"]
    batch = jms_workloads.COMMIT_EVERY
    transacted = spec["transacted"]
    samples = _Samples(expected * spec["consumers"])

    class Group:
        """What the consumers of this worker share (one reactor thread: no locking)."""

        def __init__(self) -> None:
            self.opened = 0
            self.done = 0
            self.finished = False
            self.first = 0
            self.last = 0
            self.progress = 0  # receive time of the latest message, for the idle timeout
            self.cpu0 = 0.0
            self.cpu1 = 0.0
            self.wait0 = 0.0
            self.wait1 = 0.0
            self.deadline = 0.0
            self.timed_out = False
            self.errors: list[str] = []
            self.container: Any = None

    group = Group()
    consumers: list[Any] = []

    class Consumer(MessagingHandler, TransactionHandler):  # type: ignore[misc]
        def __init__(self, index: int) -> None:
            super().__init__(prefetch=0 if transacted else spec["prefetch"],
                             auto_accept=not transacted)
            self.index = index
            self.received = 0
            self.committed = 0
            self.in_txn = 0
            self.txn: Any = None
            self.closed = False

        def on_start(self, event: Any) -> None:  # not called: the group's handler starts us
            pass

        def open(self, container: Any) -> None:
            self.container = container
            self.conn = container.connect(spec["url"], handler=self, allowed_mechs="ANONYMOUS",
                                          heartbeat=30)
            self.receiver = container.create_receiver(self.conn, _address(spec),
                                                      name=f"{spec['id']}-{self.index}")

        def on_link_opened(self, event: Any) -> None:
            if event.receiver is None:  # (the coordinator link of a transaction is a sender)
                return
            group.opened += 1
            if group.opened == len(consumers):
                ready_q.put(("ready", spec["id"], {}))
                if not go.wait(spec["start_timeout_s"]):
                    group.errors.append("no go within the start timeout")
                    _finish()
                    return
                group.cpu0 = _cpu()
                group.wait0 = _waited()
                group.progress = time.monotonic_ns()
                group.deadline = time.monotonic() + spec["deadline_s"]
                self.container.schedule(0.5, _Timer(_watch))
                if transacted:
                    for consumer in consumers:
                        consumer.declare()

        def declare(self) -> None:
            self.in_txn = 0
            self.container.declare_transaction(self.conn, handler=self)

        def on_transaction_declared(self, event: Any) -> None:
            self.txn = event.transaction
            self.receiver.flow(min(batch, expected - self.committed))

        def on_message(self, event: Any) -> None:
            now = time.monotonic_ns()
            if not group.first:
                group.first = now
            group.last = group.progress = now
            self.received += 1
            samples.add(event.message.body, now)
            if transacted:
                self.txn.accept(event.delivery)
                self.in_txn += 1
                if self.in_txn == min(batch, expected - self.committed):
                    self.txn.commit()
            elif self.received >= expected:
                self._done()

        def on_transaction_committed(self, event: Any) -> None:
            self.committed += self.in_txn
            group.last = group.progress = time.monotonic_ns()
            if self.committed >= expected:
                self._done()
            else:
                self.declare()

        def on_transaction_commit_failed(self, event: Any) -> None:
            group.errors.append(f"consumer {self.index}: commit failed")
            _finish()

        def _done(self) -> None:
            if not self.closed:
                self.closed = True
                group.done += 1
                if group.done == len(consumers):
                    _finish()

        def on_transport_error(self, event: Any) -> None:
            group.errors.append(f"transport error: {event.transport.condition}")
            _finish()

    class Starter(MessagingHandler):  # type: ignore[misc]
        def on_start(self, event: Any) -> None:
            group.container = event.container
            for consumer in consumers:
                consumer.open(event.container)

    def _watch() -> None:
        if group.finished:
            return
        idle = (time.monotonic_ns() - group.progress) / 1e9 > spec["idle_timeout_s"]
        if idle or time.monotonic() > group.deadline:
            group.timed_out = True
            _finish()
            return
        group.container.schedule(0.5, _Timer(_watch))

    def _finish() -> None:
        if group.finished:
            return
        group.finished = True
        group.cpu1 = _cpu()
        group.wait1 = _waited()
        for consumer in consumers:
            with contextlib.suppress(Exception):
                consumer.conn.close()
        group.container.stop()

    consumers.extend(Consumer(i) for i in range(spec["consumers"]))
    Container(Starter()).run()
    received = sum(c.committed if transacted else c.received for c in consumers)
    result_q.put(("result", spec["id"], {
        "kind": "consumer", "received": received,
        "per_consumer": [c.committed if transacted else c.received for c in consumers],
        "first_ns": group.first, "last_ns": group.last, "samples": samples.values,
        "cpu_s": (group.cpu1 - group.cpu0) if group.cpu0 else 0.0,
        "wait_s": (group.wait1 - group.wait0) if group.cpu0 else 0.0,
        "timed_out": group.timed_out, "errors": group.errors}))


# -- kittiwake.jms (blocking API) --------------------------------------------------------------


def _jms_destination(spec: dict[str, Any]) -> Any:
    from kittiwake import jms

    return jms.Queue(spec["destination"]) if spec["kind"] == "queue" else jms.Topic(
        spec["destination"])


def _jms_producer(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any) -> None:
    from kittiwake import jms

    count = spec["count"]
    batch = jms_workloads.COMMIT_EVERY
    transacted = spec["transacted"]
    factory = jms.ConnectionFactory(spec["url"])
    connection = factory.create_connection()
    errors: list[str] = []
    sent = acked = 0
    try:
        session = connection.create_session(transacted, jms.AUTO_ACKNOWLEDGE)
        producer = session.create_producer(_jms_destination(spec))
        producer.set_delivery_mode(jms.PERSISTENT if spec["persistent"] else jms.NON_PERSISTENT)
        ready_q.put(("ready", spec["id"], {}))
        if not go.wait(spec["start_timeout_s"]):
            raise TimeoutError("no go within the start timeout")
        cpu0 = _cpu()
        wait0 = _waited()
        first = time.monotonic_ns()
        end = time.monotonic() + spec["deadline_s"]
        timed_out = False
        body = jms_workloads.body
        while sent < count:
            producer.send(session.create_text_message(body(time.monotonic_ns())))
            sent += 1
            if transacted and (sent % batch == 0 or sent == count):
                session.commit()
                acked = sent
            elif spec["sync_send"]:
                acked = sent  # send() returned: the broker accepted it
            if sent % 256 == 0 and time.monotonic() > end:
                timed_out = True
                break
        producer.close()  # waits for the outcomes of asynchronous (NON_PERSISTENT) sends
        last = time.monotonic_ns()
        cpu1 = _cpu()
        wait1 = _waited()
    finally:
        with contextlib.suppress(Exception):
            connection.close()
    result_q.put(("result", spec["id"], {
        "kind": "producer", "sent": sent, "acked": acked if (transacted or spec["sync_send"])
        else None, "first_ns": first, "last_ns": last, "cpu_s": cpu1 - cpu0,
        "wait_s": wait1 - wait0,
        "timed_out": timed_out, "errors": errors}))


def _jms_consumers(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any) -> None:
    from kittiwake import jms

    expected = spec["count"]
    batch = jms_workloads.COMMIT_EVERY
    transacted = spec["transacted"]
    samples = _Samples(expected * spec["consumers"])
    factory = jms.ConnectionFactory(spec["url"], prefetch=spec["prefetch"])
    opened: list[tuple[Any, Any, Any]] = []
    counts = [0] * spec["consumers"]
    firsts = [0] * spec["consumers"]
    lasts = [0] * spec["consumers"]
    errors: list[str] = []
    timed_out = [False]
    try:
        mode = (jms.DUPS_OK_ACKNOWLEDGE if spec.get("jms_ack") == "dups_ok"
                else jms.AUTO_ACKNOWLEDGE)
        for _ in range(spec["consumers"]):
            connection = factory.create_connection()
            session = connection.create_session(transacted, mode)
            consumer = session.create_consumer(_jms_destination(spec))
            connection.start()
            opened.append((connection, session, consumer))
        ready_q.put(("ready", spec["id"], {}))
        if not go.wait(spec["start_timeout_s"]):
            raise TimeoutError("no go within the start timeout")
        cpu0 = _cpu()
        wait0 = _waited()
        end = time.monotonic() + spec["deadline_s"]
        lock = threading.Lock()  # only for the shared latency samples

        def consume(index: int) -> None:
            _, session, consumer = opened[index]
            idle_limit = spec["idle_timeout_s"]
            quiet_since = time.monotonic()
            n = 0
            try:
                while n < expected:
                    message = consumer.receive(0.5)
                    now = time.monotonic_ns()
                    if message is None:
                        t = time.monotonic()
                        if t - quiet_since > idle_limit or t > end:
                            timed_out[0] = True
                            break
                        continue
                    quiet_since = time.monotonic()
                    n += 1
                    if not firsts[index]:
                        firsts[index] = now
                    if transacted:
                        if n % batch == 0 or n == expected:
                            session.commit()
                            counts[index] = n
                            lasts[index] = time.monotonic_ns()
                    else:
                        counts[index] = n
                        lasts[index] = now
                    with lock:
                        samples.add(message.get_text(), now)
            except Exception as exc:
                errors.append(f"consumer {index}: {exc!r}")

        threads = [threading.Thread(target=consume, args=(i,), daemon=True)
                   for i in range(len(opened))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(spec["start_timeout_s"] + spec["deadline_s"] + 30)
        cpu1 = _cpu()
        wait1 = _waited()
    finally:
        for connection, _, _ in opened:
            with contextlib.suppress(Exception):
                connection.close()
    result_q.put(("result", spec["id"], {
        "kind": "consumer", "received": sum(counts), "per_consumer": counts,
        "first_ns": min((f for f in firsts if f), default=0), "last_ns": max(lasts),
        "samples": samples.values, "cpu_s": cpu1 - cpu0,
        "wait_s": wait1 - wait0, "timed_out": timed_out[0],
        "errors": errors}))


# -- the Java OpenWire client ------------------------------------------------------------------


def _java(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any) -> None:
    """Runs JmsBench in a JVM; relays READY, GO and RESULT (one JSON line)."""
    args = [f"{k}={spec[k]}" for k in ("role", "url", "kind", "destination", "persistent",
                                         "sync_send", "transacted", "consumers", "count",
                                         "idle_timeout_s", "deadline_s", "warmup")]
    cmd = [spec["java"], *spec.get("java_opts", []), "-cp", spec["classpath"], "JmsBench",
           *args]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    err_lines: list[str] = []
    drain = threading.Thread(target=lambda: err_lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    drain.start()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)

    def line_until(prefix: str, timeout: float) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not sel.select(timeout=min(0.5, max(0.01, end - time.monotonic()))):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                break
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        proc.kill()
        drain.join(2)
        raise RuntimeError(f"JmsBench gave no {prefix.strip()} line (exit {proc.poll()}): "
                           + "".join(err_lines[-15:]))

    try:
        line_until("READY", spec["start_timeout_s"])
        ready_q.put(("ready", spec["id"], {}))
        if not go.wait(spec["start_timeout_s"]):
            raise TimeoutError("no go within the start timeout")
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        result = json.loads(line_until("RESULT ", spec["start_timeout_s"] + spec["deadline_s"]
                                       + spec["idle_timeout_s"] + 10))
    finally:
        with contextlib.suppress(Exception):
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    result.setdefault("errors", [])
    result_q.put(("result", spec["id"], result))
