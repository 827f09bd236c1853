"""Runs one JMS scenario against one broker through one client: spawns the consumer workers,
then the producer, starts them together, collects their counts and latency samples, and reads
the broker's CPU and disk writes from /proc."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from kwbench import jms_loadgen
from kwbench.brokers import Broker
from kwbench.jms_brokers import disk_write_bytes, io_calls
from kwbench.jms_workloads import Scenario
from kwbench.runner import _Workers, cpu_wait_seconds, machine_busy_s, percentile

_run_ids = itertools.count(1)

CLIENTS = {
    # client -> the brokers it speaks to
    "proton": ("kittiwake",),
    "jms": ("kittiwake",),
    "java": ("activemq",),
}
CLIENT_TITLES = {"proton": "python-qpid-proton", "jms": "kittiwake.jms",
                 "java": "OpenWire JMS (Java)"}


@dataclass
class Options:
    gen_procs: int
    gen_cpus: set[int] | None
    deadline_s: float
    idle_timeout_s: float
    prefetch: int
    java: str = "java"
    classpath: str = ""
    java_warmup: int = 0  # the Java client's JIT warm-up round trips before READY
    # kittiwake.jms consumers' acknowledgement mode outside transactions: "auto" (what the
    # tables report, as the other clients' rows) or "dups_ok" (batched acknowledgements).
    jms_ack: str = "auto"


class _JmsWorkers(_Workers):
    def start(self, spec: dict[str, Any]) -> None:
        p = self.ctx.Process(target=jms_loadgen.worker_main, name=f"kwbench-{spec['id']}",
                             args=(spec, self.ready_q, self.go, self.result_q, self.release),
                             daemon=True)
        p.start()
        self.procs.append(p)


def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_scenario(broker: Any, client: str, s: Scenario, opt: Options) -> dict[str, Any]:
    tag = f"r{next(_run_ids)}x{int(time.time() * 1000) % 100000}"
    destination = (f"kwbench.{tag}.{s.name}" if s.kind == "queue"
                   else f"kwbench/{tag}/{s.name}")
    common = {"client": client, "url": broker.url, "kind": s.kind, "destination": destination,
              "persistent": s.persistent, "sync_send": s.sync_send,
              "transacted": s.transacted, "count": s.count, "cpus": opt.gen_cpus,
              "start_timeout_s": 90.0 if client == "java" else 60.0,
              "deadline_s": opt.deadline_s, "idle_timeout_s": opt.idle_timeout_s,
              "prefetch": opt.prefetch, "java": opt.java, "classpath": opt.classpath,
              "warmup": opt.java_warmup, "jms_ack": opt.jms_ack}
    # Python clients spread several consumers over processes; a JVM runs them on threads.
    consumer_procs = 1 if client == "java" else opt.gen_procs
    specs = [{**common, "id": f"cons{n}", "role": "consumer", "consumers": k}
             for n, k in enumerate(_split(s.consumers, consumer_procs))]
    specs.append({**common, "id": "prod0", "role": "producer", "consumers": 1})
    result: dict[str, Any] = {"scenario": s.name, "broker": broker.name, "client": client,
                              "kind": s.kind, "persistent": s.persistent,
                              "sync_send": s.sync_send, "transacted": s.transacted,
                              "consumers": s.consumers, "count": s.count,
                              "expected": s.deliveries, "gen_procs": len(specs)}
    broker.settle()
    workers = _JmsWorkers()
    results: dict[str, dict[str, Any]] = {}
    try:
        for spec in specs[:-1]:
            workers.start(spec)
        consumers = {spec["id"] for spec in specs[:-1]}
        _, errors = workers.collect(workers.ready_q, consumers, ("ready",), 120)
        if not errors:
            workers.start(specs[-1])
            _, errors = workers.collect(workers.ready_q, {"prod0"}, ("ready",), 120)
        if errors:
            result["errors"] = errors
            return result
        cpu0 = broker.cpu_seconds()
        wait0 = cpu_wait_seconds(broker.pid)
        io0 = _disk_writes(broker)
        calls0 = io_calls(broker.pid)
        busy0 = machine_busy_s()
        t0 = time.monotonic()
        workers.go.set()
        results, errors = workers.collect(workers.result_q, {spec["id"] for spec in specs},
                                          ("result",), 2 * opt.deadline_s + 60)
        t1 = time.monotonic()
        busy1 = machine_busy_s()
        alive = broker.alive()
        cpu1 = broker.cpu_seconds() if alive else cpu0
        wait1 = cpu_wait_seconds(broker.pid) if alive else wait0
        io1 = _disk_writes(broker) if alive else io0
        calls1 = io_calls(broker.pid) if alive else calls0
        store = broker.store_check() if alive else "broker died"
    finally:
        workers.finish()
    cons = [r for r in results.values() if r["kind"] == "consumer"]
    prods = [r for r in results.values() if r["kind"] == "producer"]
    received = sum(r["received"] for r in cons)
    first = min((r["first_ns"] for r in cons if r["first_ns"]), default=0)
    last = max((r["last_ns"] for r in cons if r["last_ns"]), default=0)
    span = (last - first) / 1e9 if last > first else 0.0
    samples = sorted(x for r in cons for x in r["samples"])
    wall = t1 - t0
    gen_cpu = sum(r["cpu_s"] for r in results.values())
    broker_cpu = cpu1 - cpu0
    prod = prods[0] if prods else {}
    prod_span = ((prod.get("last_ns", 0) - prod.get("first_ns", 0)) / 1e9
                 if prod.get("last_ns") else 0.0)
    result.update({
        "sent": prod.get("sent"),
        "acked": prod.get("acked"),
        "received": received,
        "per_consumer": [n for r in cons for n in r.get("per_consumer", [])],
        "lost": max(0, s.deliveries - received) if len(cons) == len(specs) - 1 else None,
        "duplicates": max(0, received - s.deliveries),
        "timed_out": any(r.get("timed_out") for r in results.values()),
        "span_s": span,
        "msg_per_s": received / span if span else None,
        "send_msg_per_s": (prod.get("sent") or 0) / prod_span if prod_span else None,
        "latency_samples": len(samples),
        "p50_ms": percentile(samples, 0.50) / 1e6 if samples else None,
        "p99_ms": percentile(samples, 0.99) / 1e6 if samples else None,
        "wall_s": wall,
        "broker_cpu_s": broker_cpu,
        "broker_cpu_pct": 100 * broker_cpu / wall if wall else None,
        "broker_cpu_us_per_msg": 1e6 * broker_cpu / received if received else None,
        "broker_disk_write_bytes": io1 - io0,
        "disk_bytes_per_msg": (io1 - io0) / (prod.get("sent") or 1) if prod else None,
        # The broker's read and write system calls (sockets, and the store's files) per
        # delivery: how many socket reads and writes the clients' wire pattern costs it.
        "broker_reads_per_msg": (calls1[0] - calls0[0]) / received if received else None,
        "broker_writes_per_msg": (calls1[1] - calls0[1]) / received if received else None,
        "store": store,
        # Runnable but waiting for a CPU (other load, or processes sharing a pinned core):
        # low CPU % with a high wait % is a starved process, not an idle one.
        "broker_wait_pct": 100 * (wait1 - wait0) / wall if wall else None,
        "gen_wait_pct": (100 * sum(r.get("wait_s") or 0.0 for r in results.values()) / wall
                         if wall else None),
        "gen_cpu_s": gen_cpu,
        "gen_cpu_pct": 100 * gen_cpu / wall if wall else None,
        "other_cpu_pct": (100 * max(0.0, (busy1 - busy0) - broker_cpu - gen_cpu) / wall
                          if wall else None),
        "broker_alive": alive,
        "workers": {wid: {k: v for k, v in r.items() if k not in ("samples", "errors")}
                    for wid, r in sorted(results.items())},
        "errors": errors + [e for r in results.values() for e in r.get("errors", [])],
    })
    return result


def _disk_writes(broker: Broker) -> int:
    return disk_write_bytes(broker.pid)
