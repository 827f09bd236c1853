"""Runs one workload against one broker: spawns the worker processes, starts them together,
collects their counts and latency samples, and reads the broker's CPU/RSS from /proc."""

from __future__ import annotations

import itertools
import math
import multiprocessing as mp
import os
import queue
import time
from typing import Any

from kwbench import loadgen, wire
from kwbench.brokers import CLK_TCK, Broker
from kwbench.workloads import Workload

_run_ids = itertools.count(1)


class Options:
    def __init__(self, *, gen_procs: int, gen_cpus: set[int] | None, window: int, batch: int,
                 deadline_s: float, idle_timeout_s: float, idle_procs: int, nofile: int,
                 restart_for_idle: bool) -> None:
        self.gen_procs = gen_procs
        self.gen_cpus = gen_cpus
        self.window = window
        self.batch = batch
        self.deadline_s = deadline_s
        self.idle_timeout_s = idle_timeout_s
        self.idle_procs = idle_procs
        self.nofile = nofile
        self.restart_for_idle = restart_for_idle


def machine_busy_s() -> float:
    """CPU seconds all CPUs spent busy since boot (/proc/stat), to spot other load."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / CLK_TCK


def cpu_wait_seconds(pid: int) -> float:
    """Seconds the threads of a process spent runnable but waiting for a CPU (the second
    field of /proc/PID/task/TID/schedstat), 0 where the kernel does not keep it. CPU % alone
    cannot tell an idle process from one starved by other load; this can."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def _split(items: list[str], parts: int) -> list[list[str]]:
    parts = max(1, min(parts, len(items)))
    return [items[i::parts] for i in range(parts)]


def percentile(sorted_values: list[int], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * p
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


class _Workers:
    """A set of spawned load-generator processes sharing queues and events."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.ready_q = self.ctx.Queue()
        self.result_q = self.ctx.Queue()
        self.go = self.ctx.Event()
        self.release = self.ctx.Event()
        self.procs: list[Any] = []

    def start(self, spec: dict[str, Any]) -> None:
        p = self.ctx.Process(target=loadgen.worker_main, name=f"kwbench-{spec['id']}",
                             args=(spec, self.ready_q, self.go, self.result_q, self.release),
                             daemon=True)
        p.start()
        self.procs.append(p)

    def collect(self, q: Any, want: set[str], kinds: tuple[str, ...], timeout: float
                ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """Wait for one message of ``kinds`` from each worker id in ``want``."""
        got: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        end = time.monotonic() + timeout
        while len(got) + len(errors) < len(want) and time.monotonic() < end:
            try:
                kind, wid, payload = q.get(timeout=min(0.5, max(0.01, end - time.monotonic())))
            except queue.Empty:
                if not any(p.is_alive() for p in self.procs):
                    break
                continue
            if kind == "error":
                errors.append(f"{wid}: {payload.strip().splitlines()[-1]}")
                want = want - {wid}
            elif kind in kinds and wid in want:
                got[wid] = payload
        missing = want - set(got)
        if missing and not errors:
            errors.append(f"no answer from {sorted(missing)} within {timeout:.0f}s")
        return got, errors

    def finish(self) -> None:
        self.release.set()
        for p in self.procs:
            p.join(5)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(2)


def run_workload(broker: Broker, w: Workload, opt: Options) -> dict[str, Any]:
    """One run of ``w`` against ``broker``, whatever its kind."""
    if w.kind == "idle":
        return run_idle(broker, w, opt)
    if w.kind == "retained":
        return run_retained(broker, w, opt)
    return run_flow(broker, w, opt)


def run_flow(broker: Broker, w: Workload, opt: Options) -> dict[str, Any]:
    tag = f"r{next(_run_ids)}x{int(time.time() * 1000) % 100000}"
    topic = f"bench/{tag}/{w.name}"
    subs_count = w.subs
    fleet: dict[str, dict[str, Any]] = {}
    if w.filters:
        # Fleet: connection n holds filters [n * per, (n + 1) * per) and expects the
        # publications on the topics those match.
        per = wire.FLEET_FILTERS_PER_CONN
        subs_count = -(-w.filters // per)
        matched = [0] * subs_count
        indices = wire.fleet_topic_indices(w.filters, w.topics)
        rounds, rest = divmod(w.count * w.pubs, len(indices))
        for k, index in enumerate(indices):
            matched[index // per] += rounds + (1 if k < rest else 0)
        topic = wire.fleet_topic(indices[0], w.filters)
    sub_ids = [f"kwb-{tag}-s{i}" for i in range(subs_count)]
    if w.filters:
        for n, client_id in enumerate(sub_ids):
            fleet[client_id] = {"span": (n * per, min(w.filters, (n + 1) * per)),
                                "expected": matched[n]}
    pub_ids = [f"kwb-{tag}-p{i}" for i in range(w.pubs)]
    deadline_s = opt.deadline_s
    common = {"host": "127.0.0.1", "port": broker.port, "qos": w.qos, "topic": topic,
              "cpus": opt.gen_cpus, "start_timeout_s": 60.0, "deadline_s": deadline_s,
              "nofile": opt.nofile}
    workers = _Workers()
    specs = []
    for n, ids in enumerate(_split(sub_ids, opt.gen_procs)):
        specs.append({**common, "id": f"sub{n}", "kind": "sub", "client_ids": ids,
                      "clean": w.clean, "expected_per_conn": w.pubs * w.count,
                      "idle_timeout_s": opt.idle_timeout_s, "sample_all": bool(w.rate),
                      # Floods: wake the subscriber per 32 KiB (QoS 0) or per quarter
                      # in-flight window (QoS 1), not per TCP segment.
                      "rcvlowat": 0 if w.rate else 32768 if w.qos == 0
                      else 64 * max(1, opt.window // 4)})
        if fleet:
            specs[-1].update({"filter_ranges": [fleet[i]["span"] for i in ids],
                              "expected_list": [fleet[i]["expected"] for i in ids],
                              "fleet_filters": w.filters, "rcvlowat": 0})
    for n, ids in enumerate(_split(pub_ids, opt.gen_procs)):
        specs.append({**common, "id": f"pub{n}", "kind": "pub", "client_ids": ids,
                      "count_per_conn": w.count, "window": opt.window, "batch": opt.batch,
                      "rate": w.rate, "deadline_s": deadline_s,
                      # QoS 1 floods: wake the publisher per quarter window of PUBACKs.
                      "ack_lowat": 4 * max(1, opt.window // 4)})
        if fleet:
            specs[-1].update({"fleet_filters": w.filters, "fleet_topics": w.topics})
    broker.settle()
    result: dict[str, Any] = {"workload": w.name, "broker": broker.name, "kind": w.kind,
                              "qos": w.qos, "pubs": w.pubs, "subs": subs_count,
                              "count_per_pub": w.count, "rate": w.rate,
                              "expected": w.deliveries, "gen_procs": len(specs)}
    try:
        # Subscribers first: every SUBACK is in before a publisher is even started.
        for spec in specs:
            if spec["kind"] == "sub":
                workers.start(spec)
        subs = {s["id"] for s in specs if s["kind"] == "sub"}
        ready, errors = workers.collect(workers.ready_q, subs, ("ready",),
                                        60 + w.filters / 5000)
        if w.filters and not errors:
            # Subscribing ran in parallel over the generator's processes: the slowest one.
            slowest = max(r.get("subscribe_s", 0.0) for r in ready.values())
            result["filters_per_s"] = w.filters / slowest if slowest else None
        if not errors:
            for spec in specs:
                if spec["kind"] == "pub":
                    workers.start(spec)
            pubs = {s["id"] for s in specs if s["kind"] == "pub"}
            _, errors = workers.collect(workers.ready_q, pubs, ("ready",), 60)
        if errors:
            result["errors"] = errors
            return result
        cpu0 = broker.cpu_seconds()
        side0 = broker.side_thread_cpu_seconds()
        busy0 = machine_busy_s()
        t0 = time.monotonic()
        workers.go.set()
        results, errors = workers.collect(workers.result_q, {s["id"] for s in specs},
                                          ("result",), deadline_s + opt.idle_timeout_s + 20)
        t1 = time.monotonic()
        busy1 = machine_busy_s()
        cpu1 = broker.cpu_seconds() if broker.alive() else cpu0
        side1 = broker.side_thread_cpu_seconds() if broker.alive() else side0
        rss = broker.rss_kb() if broker.alive() else 0
    finally:
        workers.finish()
    subs_r = [r for r in results.values() if r["kind"] == "sub"]
    pubs_r = [r for r in results.values() if r["kind"] == "pub"]
    received = sum(r["received"] for r in subs_r)
    first = min((r["first_ns"] for r in subs_r if r["first_ns"]), default=0)
    last = max((r["last_ns"] for r in subs_r if r["last_ns"]), default=0)
    span = (last - first) / 1e9 if last > first else 0.0
    samples = sorted(s for r in subs_r for s in r["samples"])
    wall = t1 - t0
    sent = sum(r["sent"] for r in pubs_r)
    pub_first = min((r["first_ns"] for r in pubs_r if r["first_ns"]), default=0)
    pub_last = max((r["last_ns"] for r in pubs_r if r["last_ns"]), default=0)
    gen_cpu = sum(r["cpu_s"] for r in results.values())
    broker_cpu = cpu1 - cpu0
    result.update({
        "sent": sent,
        "acked": sum(r["acked"] for r in pubs_r),
        "received": received,
        "lost": max(0, w.deliveries - received) if len(subs_r) == len(subs) else None,
        "duplicates": max(0, received - w.deliveries),
        "timed_out": any(r.get("timed_out") for r in results.values()),
        "span_s": span,
        "msg_per_s": received / span if span else None,
        "pub_msg_per_s": sent / ((pub_last - pub_first) / 1e9) if pub_last > pub_first else None,
        "latency_samples": len(samples),
        "p50_ms": percentile(samples, 0.50) / 1e6 if samples else None,
        "p99_ms": percentile(samples, 0.99) / 1e6 if samples else None,
        "max_ms": samples[-1] / 1e6 if samples else None,
        "wall_s": wall,
        "broker_cpu_s": broker_cpu,
        "broker_cpu_pct": 100 * broker_cpu / wall if wall else None,
        "broker_cpu_us_per_msg": 1e6 * broker_cpu / received if received else None,
        # Of broker_cpu, what threads other than the event loop's spent (kittiwake's store).
        "broker_side_cpu_s": side1 - side0,
        "broker_side_cpu_pct": 100 * (side1 - side0) / wall if wall else None,
        "broker_rss_kb": rss,
        "gen_cpu_s": gen_cpu,
        "gen_cpu_pct": 100 * gen_cpu / wall if wall else None,
        # Everything else the machine did meanwhile (harness, other users): noise indicator.
        "other_cpu_pct": (100 * max(0.0, (busy1 - busy0) - broker_cpu - gen_cpu) / wall
                          if wall else None),
        "broker_alive": broker.alive(),
        "workers": {wid: {k: v for k, v in r.items() if k not in ("samples", "errors")}
                    for wid, r in sorted(results.items())},
        "errors": errors + [e for r in results.values() for e in r.get("errors", [])],
    })
    return result


def run_idle(broker: Broker, w: Workload, opt: Options) -> dict[str, Any]:
    tag = f"r{next(_run_ids)}x{int(time.time() * 1000) % 100000}"
    if opt.restart_for_idle:
        broker.restart()  # RSS from a fresh process, not one grown by the message workloads
    broker.settle()
    ids = [f"kwb-{tag}-i{i}" for i in range(w.conns)]
    nprocs = max(1, min(opt.idle_procs, math.ceil(w.conns / 500)))
    workers = _Workers()
    specs = []
    for n, chunk in enumerate(_split(ids, nprocs)):
        specs.append({"id": f"idle{n}", "kind": "idle", "host": "127.0.0.1",
                      "port": broker.port, "client_ids": chunk, "cpus": opt.gen_cpus,
                      "nofile": len(chunk) + 256, "start_timeout_s": 60.0,
                      "connect_timeout_s": opt.deadline_s, "ping_timeout_s": 30.0,
                      "hold_timeout_s": w.hold_s + 120.0, "max_pending": 16})
    result: dict[str, Any] = {"workload": w.name, "broker": broker.name, "kind": w.kind,
                              "requested": w.conns, "gen_procs": len(specs)}
    rss0 = broker.rss_kb()
    try:
        for spec in specs:
            workers.start(spec)
        all_ids = {s["id"] for s in specs}
        _, errors = workers.collect(workers.ready_q, all_ids, ("ready",), 60)
        if errors:
            result["errors"] = errors
            return result
        cpu0 = broker.cpu_seconds()
        t0 = time.monotonic()
        workers.go.set()
        conn_r, errors = workers.collect(workers.result_q, all_ids, ("connected",),
                                         opt.deadline_s + 60)
        t1 = time.monotonic()
        cpu1 = broker.cpu_seconds()
        rss1 = broker.rss_kb()
        time.sleep(w.hold_s)  # hold: the broker should be idle but for its keepalive timers
        cpu2 = broker.cpu_seconds()
        rss2 = broker.rss_kb()
        t2 = time.monotonic()
        workers.release.set()
        done_r, errors2 = workers.collect(workers.result_q, set(conn_r), ("result",), 60)
    finally:
        workers.finish()
    connected = sum(r["connected"] for r in conn_r.values())
    connect_s = max((r["connect_s"] for r in conn_r.values()), default=0.0)
    result.update({
        "connected": connected,
        "pings_ok": sum(r["pings_ok"] for r in conn_r.values()),
        "drops": sum(r.get("drops", 0) for r in done_r.values()),
        "connect_s": connect_s,
        "connects_per_s": connected / connect_s if connect_s else None,
        "ping_round_s": max((r["ping_s"] for r in conn_r.values()), default=0.0),
        "rss_before_kb": rss0,
        "rss_connected_kb": rss1,
        "rss_held_kb": rss2,
        "kb_per_conn": (rss2 - rss0) / connected if connected else None,
        "connect_phase_s": t1 - t0,
        "broker_cpu_connect_s": cpu1 - cpu0,
        "broker_cpu_hold_s": cpu2 - cpu1,
        "broker_cpu_hold_pct": 100 * (cpu2 - cpu1) / (t2 - t1) if t2 > t1 else None,
        "gen_cpu_s": sum(r.get("cpu_s", 0) for r in done_r.values()),
        "broker_alive": broker.alive(),
        "errors": errors + errors2 + [e for r in conn_r.values() for e in r["errors"]],
        "error_count": sum(r["error_count"] for r in conn_r.values()),
    })
    return result


def run_retained(broker: Broker, w: Workload, opt: Options) -> dict[str, Any]:
    """Retained messages to a new subscriber: ``w.count`` retained QoS 0 messages on distinct
    topics are published first (and taken: PINGREQ answered); then the broker's CPU is read
    and a new connection subscribes to the wildcard covering them. Time to the first and
    to the last retained message, counted from the SUBSCRIBE; what a broker does not deliver
    is reported, not waited for (an idle timeout ends the run)."""
    tag = f"r{next(_run_ids)}x{int(time.time() * 1000) % 100000}"
    spec = {"id": "retained", "kind": "retained", "host": "127.0.0.1", "port": broker.port,
            "client_ids": [f"kwb-{tag}-p0", f"kwb-{tag}-s0"], "count": w.count,
            "topic": f"bench/{tag}/retained", "cpus": opt.gen_cpus, "nofile": opt.nofile,
            "start_timeout_s": 60.0, "deadline_s": opt.deadline_s,
            "idle_timeout_s": opt.idle_timeout_s}
    result: dict[str, Any] = {"workload": w.name, "broker": broker.name, "kind": w.kind,
                              "qos": 0, "pubs": 1, "subs": 1, "count_per_pub": w.count,
                              "expected": w.deliveries, "gen_procs": 1}
    broker.settle()
    workers = _Workers()
    try:
        workers.start(spec)
        _, errors = workers.collect(workers.ready_q, {"retained"}, ("ready",), 60)
        if not errors:
            workers.go.set()
            published, errors = workers.collect(workers.result_q, {"retained"}, ("published",),
                                                opt.deadline_s + 20)
        if errors:
            result["errors"] = errors
            return result
        broker.settle()  # whatever publishing left behind (mosquitto's writes) is done
        cpu0 = broker.cpu_seconds()
        busy0 = machine_busy_s()
        t0 = time.monotonic()
        workers.release.set()
        results, errors = workers.collect(workers.result_q, {"retained"}, ("result",),
                                          opt.deadline_s + opt.idle_timeout_s + 20)
        t1 = time.monotonic()
        busy1 = machine_busy_s()
        cpu1 = broker.cpu_seconds() if broker.alive() else cpu0
        rss = broker.rss_kb() if broker.alive() else 0
        if not errors:
            _, cleared = workers.collect(workers.result_q, {"retained"}, ("cleared",),
                                         opt.deadline_s + 20)
            errors += [f"clearing the retained messages: {e}" for e in cleared]
    finally:
        workers.finish()
    if "retained" not in results:
        result["errors"] = errors
        return result
    r = results["retained"]
    received, start = r["received"], r["subscribed_ns"]
    wall = t1 - t0
    broker_cpu = cpu1 - cpu0
    # An idle timeout ended the wait, not the broker: the span is to the last message.
    span = (r["last_ns"] - start) / 1e9 if r["last_ns"] else None
    result.update({
        "sent": w.count,
        "acked": 0,
        "received": received,
        "lost": max(0, w.count - received),
        "duplicates": max(0, received - w.count),
        "timed_out": r["timed_out"],
        "publish_s": published["retained"]["publish_s"],
        "first_ms": (r["first_ns"] - start) / 1e6 if r["first_ns"] else None,
        "last_s": span,
        "all_s": span if received >= w.count else None,
        "msg_per_s": received / span if span else None,
        "wall_s": wall,
        "broker_cpu_s": broker_cpu,
        "broker_cpu_pct": 100 * broker_cpu / wall if wall else None,
        "broker_cpu_us_per_msg": 1e6 * broker_cpu / received if received else None,
        "broker_rss_kb": rss,
        "gen_cpu_s": r["cpu_s"],
        "gen_cpu_pct": 100 * r["cpu_s"] / wall if wall else None,
        "other_cpu_pct": (100 * max(0.0, (busy1 - busy0) - broker_cpu - r["cpu_s"]) / wall
                          if wall else None),
        "broker_alive": broker.alive(),
        "errors": errors + r.get("errors", []),
    })
    return result
