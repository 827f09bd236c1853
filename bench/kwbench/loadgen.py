"""Load-generator worker processes: publishers, subscribers and idle-connection holders.

Each worker is a separate (spawned) process with raw non-blocking sockets and one selector.
The hot paths are C-speed where it matters: publishers ``send`` slices of one pre-built buffer
of PUBLISH frames (stamping a batch's send time into the payloads just before); subscribers
``recv_into`` one 256 KiB buffer and walk only fixed headers. In flood runs SO_RCVLOWAT makes
the kernel wake a subscriber per 32 KiB (QoS 0) or per quarter window (QoS 1 subscribers and
the publishers' PUBACKs) instead of per TCP segment, so the generator's cost does not depend
on how a broker chops its writes; a 1-2 ms select timeout sweeps up what stays below the mark.
Every loop is bounded by a count and by a deadline.

Protocol with the harness (all through multiprocessing queues/events):
    worker -> ready_q : ("ready", worker_id, info) or ("error", worker_id, text)
    harness -> go     : Event; the measured run starts when it is set
    worker -> result_q: ("result", worker_id, stats)  (idle workers also send "connected";
                        retained workers "published" before, "cleared" after)
    harness -> release: Event (idle workers: close the connections and finish; retained
                        workers: subscribe now)
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import selectors
import socket
import time
import traceback
from typing import Any

from kwbench import wire

RECV_SIZE = 1 << 18
PING_EVERY_S = 20.0  # client keepalive is 60 s; ping well within it on long runs
MAX_SAMPLES = 50_000  # latency samples one worker keeps (stride-sampled)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _prepare(spec: dict[str, Any]) -> None:
    nofile = spec.get("nofile")
    if nofile:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(nofile, hard), hard))
    cpus = spec.get("cpus")
    if cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)


def _mqtt_connect(host: str, port: int, client_id: str, *, clean: bool, timeout: float
                  ) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(wire.connect(client_id, keepalive=60, clean=clean))
    data = _recv_exact(sock, 4)
    rc = wire.read_connack(data)
    if rc != 0:
        sock.close()
        raise ConnectionError(f"{client_id}: CONNACK {data.hex()} (return code {rc})")
    return sock


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        data += chunk
    return data


def worker_main(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any, release: Any
                ) -> None:
    wid = spec["id"]
    try:
        _prepare(spec)
        kind = spec["kind"]
        if kind == "sub":
            _subscriber(spec, ready_q, go, result_q)
        elif kind == "pub":
            _publisher(spec, ready_q, go, result_q)
        elif kind == "idle":
            _idle(spec, ready_q, go, result_q, release)
        elif kind == "retained":
            _retained(spec, ready_q, go, result_q, release)
        else:
            raise ValueError(kind)
    except BaseException:
        text = traceback.format_exc()
        try:
            ready_q.put(("error", wid, text))
            result_q.put(("error", wid, text))
        except Exception:
            pass


# -- subscribers ---------------------------------------------------------------------------


class _SubConn:
    __slots__ = ("closed", "count", "expected", "first", "last", "next_sample", "out",
                 "pending", "samples", "sock", "stride", "writing")

    def __init__(self, sock: socket.socket, expected: int, stride: int) -> None:
        self.sock = sock
        self.expected = expected
        self.count = 0
        self.first = 0
        self.last = 0
        self.pending = b""  # the start of a frame the last read cut off
        self.out = bytearray()
        self.samples: list[int] = []
        self.stride = stride
        self.next_sample = 1
        self.writing = False
        self.closed = False

    def feed(self, data: bytearray, n: int, now: int) -> None:
        """Count the PUBLISH frames in ``data[:n]``; queue a PUBACK for each QoS 1 one."""
        i = 0
        count = self.count
        out = self.out
        samples = self.samples
        next_sample = self.next_sample
        stride = self.stride
        ts_from = wire.TS.unpack_from
        while i + 2 <= n:
            b0 = data[i]
            rl = data[i + 1]
            j = i + 2
            if rl & 0x80:  # multi-byte remaining length (never for 64-byte payloads)
                rl &= 0x7F
                shift = 7
                while True:
                    if j >= n:
                        rl = -1
                        break
                    b = data[j]
                    j += 1
                    rl |= (b & 0x7F) << shift
                    shift += 7
                    if not b & 0x80:
                        break
                if rl < 0:
                    break
            end = j + rl
            if end > n:
                break
            if b0 & 0xF0 == 0x30:
                count += 1
                p = j + 2 + ((data[j] << 8) | data[j + 1])
                if b0 & 0x06:
                    out += b"\x40\x02"
                    out += data[p:p + 2]
                    p += 2
                if count >= next_sample:
                    next_sample += stride
                    ts = ts_from(data, p)[0]
                    if ts:
                        samples.append(now - ts)
            i = end
        self.pending = bytes(data[i:n]) if i < n else b""
        if count != self.count:
            if not self.first:
                self.first = now
            self.last = now
        self.count = count
        self.next_sample = next_sample


def _subscribe_fleet(sock: socket.socket, client_id: str, span: tuple[int, int], filters: int,
                     qos: int) -> int:
    """Subscribe filters [first, last) of a fleet, 100 per SUBSCRIBE, all sent before the
    SUBACKs are read; returns the QoS granted."""
    first, last = span
    per_packet = 100
    packets = []
    answers = 0
    for pid, start in enumerate(range(first, last, per_packet), 1):
        names = [wire.fleet_filter(i, filters) for i in range(start, min(last, start + per_packet))]
        packets.append(wire.subscribe_many(pid, names, qos))
        answers += 4 + len(names)  # SUBACK: fixed header (2), packet id (2), one code each
    sock.sendall(b"".join(packets))
    subacks = _recv_exact(sock, answers)
    i = 0
    granted = qos
    while i < len(subacks):
        if subacks[i] != wire.SUBACK:
            raise ConnectionError(f"{client_id}: bad SUBACK {subacks[i:i + 8].hex()}")
        length = subacks[i + 1]
        codes = subacks[i + 4:i + 2 + length]
        if 0x80 in codes:
            raise ConnectionError(f"{client_id}: a filter was refused")
        granted = min(granted, min(codes))
        i += 2 + length
    return granted


def _subscriber(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any) -> None:
    host, port, qos = spec["host"], spec["port"], spec["qos"]
    expected = spec["expected_per_conn"]
    stride = max(1, expected * len(spec["client_ids"]) // MAX_SAMPLES)
    if spec.get("sample_all"):
        stride = 1
    # Flood runs: let the kernel gather data before waking us (SO_RCVLOWAT), so one recv takes
    # many frames whatever the broker's write pattern; a short select timeout sweeps up tails.
    lowat = spec.get("rcvlowat", 0)
    sweep_s = 0.002
    conns: list[_SubConn] = []
    granted = []
    ranges = spec.get("filter_ranges")
    expected_each = spec.get("expected_list") or [expected] * len(spec["client_ids"])
    subscribe_s = 0.0
    for n, client_id in enumerate(spec["client_ids"]):
        sock = _mqtt_connect(host, port, client_id, clean=spec.get("clean", True), timeout=10)
        if ranges:
            started = time.monotonic()
            granted.append(_subscribe_fleet(sock, client_id, ranges[n], spec["fleet_filters"], qos))
            subscribe_s += time.monotonic() - started
        else:
            sock.sendall(wire.subscribe(1, spec["topic"], qos))
            suback = _recv_exact(sock, 5)
            if suback[0] != wire.SUBACK or suback[4] == 0x80:
                raise ConnectionError(f"{client_id}: bad SUBACK {suback.hex()}")
            granted.append(suback[4])
        sock.setblocking(False)
        if lowat:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
        conns.append(_SubConn(sock, expected_each[n], stride))
    ready_q.put(("ready", spec["id"], {"granted_qos": granted, "subscribe_s": subscribe_s}))
    if not go.wait(spec["start_timeout_s"]):
        raise TimeoutError("no go signal")
    cpu0 = _cpu()
    t_go = time.monotonic()
    deadline = t_go + spec["deadline_s"]
    idle_timeout = spec["idle_timeout_s"]
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    remaining = sum(1 for c in conns if c.count < c.expected)
    last_data = t_go
    last_ping = t_go
    errors: list[str] = []
    timed_out = False
    mono_ns = time.monotonic_ns
    rbuf = bytearray(RECV_SIZE + 4096)
    rview = memoryview(rbuf)

    def read(c: _SubConn) -> bool:
        """One non-blocking read of ``c``; False when nothing was there."""
        nonlocal remaining, last_data
        pl = len(c.pending)
        if pl:
            rbuf[:pl] = c.pending
        try:
            nb = c.sock.recv_into(rview[pl:pl + RECV_SIZE])
        except BlockingIOError:
            return False
        except OSError as exc:
            nb = 0
            errors.append(f"recv: {exc}")
        if not nb:
            errors.append("connection closed by broker")
            sel.unregister(c.sock)
            c.closed = True
            if c.count < c.expected:
                remaining -= 1
            return False
        was_short = c.count < c.expected
        c.feed(rbuf, pl + nb, mono_ns())
        last_data = time.monotonic()
        if c.out:
            _flush(sel, c)
        if was_short and c.count >= c.expected:
            remaining -= 1
        return True

    while remaining:
        now_s = time.monotonic()
        if now_s >= deadline:
            timed_out = True
            break
        if now_s - last_data > idle_timeout:
            timed_out = True
            break
        if now_s - last_ping > PING_EVERY_S:
            last_ping = now_s
            for c in conns:
                if not c.closed:
                    c.out += wire.PINGREQ_BYTES
                    _flush(sel, c)
        events = sel.select(min(sweep_s if lowat else 0.5, deadline - now_s))
        for key, mask in events:
            c = key.data
            if mask & selectors.EVENT_WRITE:
                _flush(sel, c)
            if mask & selectors.EVENT_READ:
                read(c)
        if lowat and not events:
            for c in conns:  # below the low-water mark: take what is there
                if not c.closed and c.count < c.expected:
                    read(c)
    # Let the last PUBACKs leave before disconnecting.
    flush_deadline = time.monotonic() + 2.0
    for c in conns:
        if c.out and not c.closed:
            c.sock.setblocking(True)
            c.sock.settimeout(max(0.01, flush_deadline - time.monotonic()))
            with contextlib.suppress(OSError):
                c.sock.sendall(c.out)
    cpu1 = _cpu()
    samples: list[int] = []
    for c in conns:
        samples.extend(c.samples)
    firsts = [c.first for c in conns if c.first]
    lasts = [c.last for c in conns if c.last]
    stats = {
        "kind": "sub",
        "received": sum(c.count for c in conns),
        "expected": sum(expected_each),
        "per_conn": [c.count for c in conns],
        "first_ns": min(firsts) if firsts else 0,
        "last_ns": max(lasts) if lasts else 0,
        "samples": samples,
        "stride": stride,
        "cpu_s": cpu1 - cpu0,
        "timed_out": timed_out,
        "errors": errors[:10],
    }
    _close_all([c.sock for c in conns])
    result_q.put(("result", spec["id"], stats))


def _flush(sel: selectors.BaseSelector, c: Any) -> None:
    """Send what ``c.out`` holds without blocking; ask for EVENT_WRITE if some is left."""
    try:
        sent = c.sock.send(c.out)
    except BlockingIOError:
        sent = 0
    except OSError:
        c.out.clear()
        return
    if sent:
        del c.out[:sent]
    want_write = bool(c.out)
    if want_write != c.writing:
        c.writing = want_write
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
        sel.modify(c.sock, events, c)


def _close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        try:
            sock.setblocking(True)
            sock.settimeout(0.2)
            sock.send(wire.DISCONNECT_BYTES)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sock.close()


# -- publishers ----------------------------------------------------------------------------


class _PubConn:
    __slots__ = ("acked", "bytes_sent", "count", "done", "in_pending", "run", "sock",
                 "stamped", "total_bytes", "writing")

    def __init__(self, sock: socket.socket, run: wire.PublishRun) -> None:
        self.sock = sock
        self.run = run
        self.count = run.count
        self.stamped = 0  # messages [0, stamped) carry a timestamp and may be (partly) sent
        self.bytes_sent = 0
        self.total_bytes = run.count * run.frame_len
        self.acked = 0
        self.in_pending = b""
        self.done = False
        self.writing = False


def _publisher(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any) -> None:
    host, port, qos = spec["host"], spec["port"], spec["qos"]
    count = spec["count_per_conn"]
    window = spec["window"] if qos else 0
    batch = spec["batch"]
    rate = spec["rate"]  # messages/s per connection; 0 = as fast as the broker takes them
    conns: list[_PubConn] = []
    for client_id in spec["client_ids"]:
        sock = _mqtt_connect(host, port, client_id, clean=True, timeout=10)
        topics = None
        if spec.get("fleet_filters"):
            filters = spec["fleet_filters"]
            topics = [wire.fleet_topic(i, filters)
                      for i in wire.fleet_topic_indices(filters, spec["fleet_topics"])]
        conns.append(_PubConn(sock, wire.PublishRun(spec["topic"], qos, count, topics)))
    ack_lowat = spec.get("ack_lowat", 0) if qos and not rate else 0
    for c in conns:
        c.sock.setblocking(False)
        if ack_lowat:
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, ack_lowat)
    ready_q.put(("ready", spec["id"], {}))
    if not go.wait(spec["start_timeout_s"]):
        raise TimeoutError("no go signal")
    cpu0 = _cpu()
    t_go = time.monotonic()
    deadline = t_go + spec["deadline_s"]
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    mono_ns = time.monotonic_ns
    errors: list[str] = []
    timed_out = False
    first_send = 0
    active = len(conns)
    last_ping = t_go
    while active:
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        if now - last_ping > PING_EVERY_S:
            last_ping = now
            for c in conns:
                _blocking_send(c.sock, wire.PINGREQ_BYTES)
        progressed = False
        wait = 0.5
        for c in conns:
            if c.done:
                continue
            run = c.run
            flen = run.frame_len
            if c.bytes_sent == c.stamped * flen and c.stamped < c.count:
                # Everything stamped has left: stamp the next batch, as far as allowed.
                limit = c.count
                if window:
                    limit = min(limit, c.acked + window)
                if rate:
                    due = int((now - t_go) * rate) + 1
                    if due < limit:
                        limit = due
                        if due <= c.stamped:
                            wait = min(wait, (c.stamped / rate) - (now - t_go))
                limit = min(limit, c.stamped + batch)
                if limit > c.stamped:
                    run.stamp(c.stamped, limit, mono_ns())
                    c.stamped = limit
            end = c.stamped * flen
            if c.bytes_sent < end:
                try:
                    sent = c.sock.send(run.view[c.bytes_sent:end])
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    errors.append(f"send: {exc}")
                    c.done = True
                    active -= 1
                    continue
                if sent:
                    if not first_send:
                        first_send = mono_ns()
                    c.bytes_sent += sent
                    progressed = True
            want_write = c.bytes_sent < end
            if want_write != c.writing:
                c.writing = want_write
                sel.modify(c.sock, selectors.EVENT_READ
                           | (selectors.EVENT_WRITE if want_write else 0), c)
            if c.bytes_sent == c.total_bytes and (not qos or c.acked >= c.count):
                c.done = True
                active -= 1
        if not active:
            break
        if rate:
            # Paced: epoll's timeout has millisecond granularity, sleep() does not.
            events = sel.select(0)
            if not events and not progressed and wait > 0:
                time.sleep(min(wait, 0.002))
        elif ack_lowat:
            # Acks arrive in bunches (SO_RCVLOWAT); a short timeout sweeps up the rest.
            events = sel.select(0 if progressed else 0.001)
            if not events and not progressed:
                events = [(sel.get_key(c.sock), selectors.EVENT_READ) for c in conns
                          if not c.done and c.acked < c.stamped]
        else:
            events = sel.select(0 if progressed else max(0.0, min(wait, deadline - now)))
        for key, mask in events:
            if not mask & selectors.EVENT_READ:
                continue
            c = key.data
            try:
                data = c.sock.recv(RECV_SIZE)
            except BlockingIOError:
                continue
            except OSError as exc:
                data = b""
                errors.append(f"recv: {exc}")
            if not data:
                if not c.done:
                    errors.append("connection closed by broker")
                    c.done = True
                    active -= 1
                sel.unregister(c.sock)
                continue
            acks = _count_pubacks(c, data)
            if acks:
                c.acked += acks
                if qos and c.acked >= c.count and c.bytes_sent == c.total_bytes and not c.done:
                    c.done = True
                    active -= 1
    last_send = mono_ns()
    cpu1 = _cpu()
    stats = {
        "kind": "pub",
        "sent": sum(c.bytes_sent // c.run.frame_len for c in conns),
        "acked": sum(c.acked for c in conns),
        "planned": count * len(conns),
        "first_ns": first_send,
        "last_ns": last_send,
        "cpu_s": cpu1 - cpu0,
        "timed_out": timed_out,
        "errors": errors[:10],
    }
    _close_all([c.sock for c in conns])
    result_q.put(("result", spec["id"], stats))


def _count_pubacks(c: _PubConn, data: bytes) -> int:
    if c.in_pending:
        data = c.in_pending + data
    n = len(data)
    i = 0
    acks = 0
    while i + 2 <= n:
        end = i + 2 + data[i + 1]  # every packet a publisher receives is short
        if end > n:
            break
        if data[i] == wire.PUBACK:
            acks += 1
        i = end
    c.in_pending = data[i:] if i < n else b""
    return acks


def _blocking_send(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.send(data)


# -- idle connections ----------------------------------------------------------------------


def _idle(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any, release: Any) -> None:
    """Open many MQTT connections, prove each is alive with one PINGREQ, hold them."""
    host, port = spec["host"], spec["port"]
    ids = spec["client_ids"]
    max_pending = spec.get("max_pending", 64)
    ready_q.put(("ready", spec["id"], {}))
    if not go.wait(spec["start_timeout_s"]):
        raise TimeoutError("no go signal")
    cpu0 = _cpu()
    t0 = time.monotonic()
    deadline = t0 + spec["connect_timeout_s"]
    sel = selectors.DefaultSelector()
    # state per socket: 0 = TCP connecting, 1 = CONNECT sent, 2 = connected (CONNACK 0)
    state: dict[socket.socket, list[Any]] = {}
    connected: list[socket.socket] = []
    errors: list[str] = []
    nxt = 0
    pending = 0
    while (nxt < len(ids) or pending) and time.monotonic() < deadline:
        while nxt < len(ids) and pending < max_pending:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            rc = sock.connect_ex((host, port))
            if rc not in (0, errno.EINPROGRESS):
                errors.append(f"connect: {os.strerror(rc)}")
                sock.close()
                nxt += 1
                continue
            state[sock] = [0, ids[nxt], b""]
            sel.register(sock, selectors.EVENT_WRITE, sock)
            nxt += 1
            pending += 1
        for key, _mask in sel.select(0.2):
            sock = key.data
            st = state[sock]
            if st[0] == 0:
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    errors.append(f"connect: {os.strerror(err)}")
                    sel.unregister(sock)
                    sock.close()
                    del state[sock]
                    pending -= 1
                    continue
                sock.send(wire.connect(st[1], keepalive=60, clean=True))
                st[0] = 1
                sel.modify(sock, selectors.EVENT_READ, sock)
            elif st[0] == 1:
                try:
                    data = st[2] + sock.recv(64)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    data = b""
                    errors.append(f"recv: {exc}")
                if len(data) < 4:
                    if not data or len(data) == len(st[2]):
                        errors.append("closed before CONNACK")
                        sel.unregister(sock)
                        sock.close()
                        del state[sock]
                        pending -= 1
                    else:
                        st[2] = data
                    continue
                pending -= 1
                if wire.read_connack(data) != 0:
                    errors.append(f"CONNACK {data[:4].hex()}")
                    sel.unregister(sock)
                    sock.close()
                    del state[sock]
                    continue
                st[0] = 2
                st[2] = b""
                connected.append(sock)
    t_connected = time.monotonic()
    connect_cpu = _cpu() - cpu0
    # Every connection is now read-registered; ping each once and count the PINGRESPs.
    pings_ok = 0
    t_ping = time.monotonic()
    for sock in connected:
        try:
            sock.send(wire.PINGREQ_BYTES)
        except OSError as exc:
            errors.append(f"ping: {exc}")
    ping_deadline = t_ping + spec["ping_timeout_s"]
    pinged: set[socket.socket] = set()
    while len(pinged) < len(connected) and time.monotonic() < ping_deadline:
        for key, _mask in sel.select(0.2):
            sock = key.data
            try:
                data = sock.recv(64)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(sock)
                continue
            if wire.PINGRESP in data[::2] and sock not in pinged:
                pinged.add(sock)
    pings_ok = len(pinged)
    t_pinged = time.monotonic()
    result_q.put(("connected", spec["id"], {
        "kind": "idle",
        "requested": len(ids),
        "connected": len(connected),
        "pings_ok": pings_ok,
        "connect_s": t_connected - t0,
        "ping_s": t_pinged - t_ping,
        "connect_cpu_s": connect_cpu,
        "errors": errors[:10],
        "error_count": len(errors),
    }))
    # Hold: answer nothing, read whatever comes (a broker closing us counts as a drop).
    last_ping = time.monotonic()
    hold_deadline = time.monotonic() + spec["hold_timeout_s"]
    drops = 0
    while not release.is_set() and time.monotonic() < hold_deadline:
        if time.monotonic() - last_ping > PING_EVERY_S:
            last_ping = time.monotonic()
            for sock in connected:
                _blocking_send(sock, wire.PINGREQ_BYTES)
        for key, _mask in sel.select(0.2):
            sock = key.data
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                drops += 1
                sel.unregister(sock)
    cpu1 = _cpu()
    _close_idle(connected)
    result_q.put(("result", spec["id"], {
        "kind": "idle",
        "drops": drops,
        "cpu_s": cpu1 - cpu0,
    }))


def _close_idle(socks: list[socket.socket]) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.send(wire.DISCONNECT_BYTES)
        with contextlib.suppress(OSError):
            sock.close()


# -- retained messages ---------------------------------------------------------------------


def _send_and_ping(sock: socket.socket, data: bytes | memoryview, timeout: float) -> None:
    """Send ``data`` (publications), then a PINGREQ, and wait for its PINGRESP: a broker
    handles one connection's packets in order, so by then it has taken every publication."""
    sock.settimeout(timeout)
    sock.sendall(data)
    sock.sendall(wire.PINGREQ_BYTES)
    tail = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("connection closed by broker")
        tail = (tail + chunk)[-2:]
        if tail == bytes([wire.PINGRESP, 0]):
            return


def _retained(spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any, release: Any) -> None:
    """Publish ``count`` retained QoS 0 messages on distinct topics (phase one), then, when
    the harness says so, subscribe a new connection to the wildcard covering them and time
    its first and last retained message (phase two); finally clear them again.

    Phase two's clock starts as the SUBSCRIBE is sent; a blocking ``recv_into`` (no
    SO_RCVLOWAT) sees the first message as soon as it arrives. A broker that delivers fewer
    than ``count`` ends the phase after ``idle_timeout_s`` without data (counted, not lost
    time: ``last_ns`` is its last message)."""
    host, port, count = spec["host"], spec["port"], spec["count"]
    prefix = spec["topic"]
    payload = wire.filler_payload()  # never stamped: no latency samples here
    topics = [f"{prefix}/{i:07d}" for i in range(count)]
    frames = b"".join(wire.publish(t, payload, 0, retain=True) for t in topics)
    clears = b"".join(wire.publish(t, b"", 0, retain=True) for t in topics)
    timeout = spec["deadline_s"]
    publisher = _mqtt_connect(host, port, spec["client_ids"][0], clean=True, timeout=10)
    ready_q.put(("ready", spec["id"], {}))
    if not go.wait(spec["start_timeout_s"]):
        raise TimeoutError("no go signal")
    t_pub = time.monotonic_ns()
    _send_and_ping(publisher, frames, timeout)
    publish_ns = time.monotonic_ns() - t_pub
    result_q.put(("published", spec["id"], {"publish_s": publish_ns / 1e9}))
    if not release.wait(spec["start_timeout_s"]):
        raise TimeoutError("no signal to subscribe")
    cpu0 = _cpu()
    sock = _mqtt_connect(host, port, spec["client_ids"][1], clean=True, timeout=10)
    conn = _SubConn(sock, count, stride=count + 1)
    rbuf = bytearray(RECV_SIZE + 4096)
    rview = memoryview(rbuf)
    errors: list[str] = []
    timed_out = False
    subscribe = wire.subscribe(1, f"{prefix}/#", 0)
    t0 = time.monotonic_ns()
    sock.sendall(subscribe)
    deadline = time.monotonic() + timeout
    sock.settimeout(spec["idle_timeout_s"])
    while conn.count < count:
        if time.monotonic() >= deadline:
            timed_out = True
            break
        pl = len(conn.pending)
        if pl:
            rbuf[:pl] = conn.pending
        try:
            nb = sock.recv_into(rview[pl:pl + RECV_SIZE])
        except TimeoutError:
            break  # nothing more is coming: the broker delivered what it delivers
        except OSError as exc:
            errors.append(f"recv: {exc}")
            break
        if not nb:
            errors.append("connection closed by broker")
            break
        conn.feed(rbuf, pl + nb, time.monotonic_ns())
    cpu1 = _cpu()
    _close_all([sock])
    stats = {
        "kind": "retained",
        "received": conn.count,
        "expected": count,
        "publish_s": publish_ns / 1e9,
        "subscribed_ns": t0,
        "first_ns": conn.first,
        "last_ns": conn.last,
        "cpu_s": cpu1 - cpu0,
        "timed_out": timed_out,
        "errors": errors[:10],
    }
    result_q.put(("result", spec["id"], stats))
    # Leave the broker as it was: a zero-length retained publication clears the topic.
    _send_and_ping(publisher, clears, timeout)
    _close_all([publisher])
    result_q.put(("cleared", spec["id"], {}))
