#!/usr/bin/env python3
"""Kittiwake's JMS benchmark: four JMS scenarios against kittiwake (AMQP 1.0, through
python-qpid-proton's own client and through kittiwake.jms) and ActiveMQ 5.17 (OpenWire,
through its Java JMS client), side by side in one run.

    python3 bench/run_jms.py                  # every scenario, both brokers, all clients
    python3 bench/run_jms.py --smoke          # a few hundred messages each, kittiwake only
    python3 bench/run_jms.py --scenarios queue-nonpersistent --clients proton,java --repeat 3

ActiveMQ comes from ``bench/setup_peers.sh --with-activemq``. Results: markdown tables on
stdout and a JSON file under bench/results/ (timestamped).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))  # spawned workers inherit sys.path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help="a few hundred messages per scenario; kittiwake only unless --brokers "
                        "says otherwise")
    p.add_argument("--brokers", help="comma-separated: kittiwake,activemq (default: both; with "
                                     "--smoke: kittiwake)")
    p.add_argument("--clients", help="comma-separated: proton,jms (kittiwake), java "
                                     "(activemq) (default: all)")
    p.add_argument("--scenarios", help="comma-separated scenario names (default: all); --list")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per scenario and client, rotating their order; the median "
                        "(by msg/s) is shown")
    p.add_argument("--deadline", type=float, help="seconds one run may take (default 300, "
                                                  "smoke 30)")
    p.add_argument("--gen-procs", type=int, default=2,
                   help="processes the Python clients spread several consumers over")
    p.add_argument("--prefetch", type=int, default=1000,
                   help="consumer credit of the Python clients (kittiwake.jms's default; "
                        "ActiveMQ's client keeps its own defaults: 1000 queue, 32766 topic)")
    p.add_argument("--jms-ack", choices=("auto", "dups_ok"), default="auto",
                   help="kittiwake.jms consumers' acknowledgement mode outside transactions "
                        "(default auto, as the other clients; dups_ok: batched, what the "
                        "broker pays without AUTO's acknowledgement per receive)")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the warm-up pass (every scenario at smoke size through every "
                        "client, not reported) and the Java client's in-JVM warm-up")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin the broker to CPU 0 and the clients to the rest")
    p.add_argument("--kittiwake-python", default=sys.executable,
                   help="interpreter that runs kittiwake (default: this one)")
    p.add_argument("--profile", help="comma-separated scenarios to re-run on kittiwake under "
                                     "py-spy after the measured runs (not in the tables)")
    p.add_argument("--profile-client", default="proton", choices=("proton", "jms"),
                   help="the client of the profiled runs (default proton)")
    p.add_argument("--profile-scale", type=float, default=1.0,
                   help="message-count scale of the profiled runs (default 1)")
    p.add_argument("--profile-dir", type=Path, default=BENCH_DIR / "results" / "profiles",
                   help="where py-spy's flame graphs and stacks go")
    p.add_argument("--out", type=Path, help="JSON result file (default bench/results/STAMP.json)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # `timeout` and kill send SIGTERM: report what ran and stop the brokers, as on Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupted)
    from kwbench import jms_brokers, jms_runner, jms_workloads, report
    from kwbench.brokers import BrokerUnavailable, make_workdir

    if args.list:
        for s in jms_workloads.FULL:
            print(f"{s.name:28} {s.title} ({s.deliveries:,} deliveries)")
        return 0
    scenarios = jms_workloads.select(args.scenarios.split(",") if args.scenarios else None,
                                     smoke=args.smoke, scale=args.scale)
    broker_names = (args.brokers.split(",") if args.brokers
                    else ["kittiwake"] if args.smoke else ["kittiwake", "activemq"])
    clients = args.clients.split(",") if args.clients else list(jms_runner.CLIENTS)
    for n in broker_names:
        if n not in ("kittiwake", "activemq"):
            raise SystemExit(f"unknown broker {n!r}; known: kittiwake, activemq")
    for c in clients:
        if c not in jms_runner.CLIENTS:
            raise SystemExit(f"unknown client {c!r}; known: {', '.join(jms_runner.CLIENTS)}")
    deadline = args.deadline or (30.0 if args.smoke else 300.0)

    cpus = sorted(os.sched_getaffinity(0))
    broker_cpus: set[int] | None = None
    gen_cpus: set[int] | None = None
    if not args.no_pin and len(cpus) >= 2:
        broker_cpus = {cpus[0]}
        gen_cpus = set(cpus[1:])
        os.sched_setaffinity(0, gen_cpus)
    gen_cores = len(gen_cpus) if gen_cpus else len(cpus)
    workdir = make_workdir()
    opt = jms_runner.Options(gen_procs=args.gen_procs, gen_cpus=gen_cpus, deadline_s=deadline,
                             idle_timeout_s=5.0 if args.smoke else 10.0, prefetch=args.prefetch,
                             java=shutil.which("java") or "java",
                             java_warmup=0 if args.smoke or args.no_warmup else 2000,
                             jms_ack=args.jms_ack)
    warmup = not (args.smoke or args.no_warmup)
    notes = [
        f"{len(cpus)} CPU(s); "
        + (f"broker pinned to CPU {sorted(broker_cpus)}, clients to CPU(s) {sorted(gen_cpus)}"
           if broker_cpus and gen_cpus else "no pinning: the clients share cores with the broker")
        + ". The clients run on the same machine as the broker.",
        "One producer connection; each consumer on a connection of its own (Python clients: "
        f"spread over {args.gen_procs} processes; Java: threads of one JVM). Consumers are "
        "subscribed before the producer starts. msg/s: messages (topic: deliveries) received "
        "by all consumers / (last - first receive; transacted: to the last commit). Latency: "
        "receive time - send time stamped in the body.",
        "Scenarios: PERSISTENT synchronous = each send waits for the broker's answer "
        "(proton: one unsettled delivery in flight); NON_PERSISTENT = asynchronous sends "
        "(proton: credit kept full, outcomes counted as they come; kittiwake.jms and the "
        "OpenWire client: JMS defaults); transacted = producer and consumer commit every "
        f"{jms_workloads.COMMIT_EVERY} messages. Consumers AUTO_ACKNOWLEDGE (proton: accept "
        "every message, the accepts of one read written together after it, as its Container "
        "does: a range a frame, where kittiwake.jms and OpenWire write one a receive) "
        f"with prefetch {args.prefetch} (OpenWire: its defaults)"
        + ("; kittiwake.jms consumers DUPS_OK_ACKNOWLEDGE (--jms-ack dups_ok)."
           if args.jms_ack == "dups_ok" else "."),
        "Stores: kittiwake SQLite (WAL, synchronous=full: an fsync per group commit); ActiveMQ "
        "KahaDB with its default journal disk syncs. Both brokers run with their store on for "
        "every scenario; disk KB/msg = bytes the broker process wrote to storage "
        "(/proc/PID/io) per message sent.",
        "broker CPU: user+sys of the broker process from /proc (all threads; ActiveMQ's JVM "
        "includes its JIT and GC threads); % of one core. gen CPU %: all client processes, "
        f"% of one core ({gen_cores} core(s) available to them). saturated: >= 85%.",
        ("Warm-up: before the measured runs every scenario ran once at smoke size through "
         "every client (not reported), and each JVM of the Java client makes 2,000 "
         "send/receive round trips on a queue of its own before it reports ready (its JIT; "
         "the Python clients have none)." if warmup else "No warm-up."),
    ]
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:] if argv is None else argv,
        "smoke": args.smoke,
        "host": {"platform": platform.platform(), "cpus": len(cpus), "nproc": os.cpu_count(),
                 "python": platform.python_version()},
        "broker_cpus": sorted(broker_cpus) if broker_cpus else None,
        "gen_cpus": sorted(gen_cpus) if gen_cpus else None,
        "options": {k: v for k, v in vars(opt).items() if k not in ("gen_cpus", "classpath")},
        "scenarios": [vars(s) | {"deliveries": s.deliveries} for s in scenarios],
        "notes": notes,
        "brokers": {},
    }
    out = args.out or report.default_path(BENCH_DIR / "results", args.smoke)

    live: dict[str, Any] = {}
    failed = False
    for n in broker_names:
        b: Any = (jms_brokers.KittiwakeAMQP(workdir, broker_cpus, python=args.kittiwake_python)
                  if n == "kittiwake" else jms_brokers.ActiveMQ(workdir, broker_cpus))
        try:
            if n == "activemq" and "java" in clients:
                opt.classpath = jms_brokers.compile_java_client(workdir / "classes")
            b.start()
        except BrokerUnavailable as exc:
            print(f"skipping {n}: {exc}", file=sys.stderr)
            meta["brokers"][n] = {"name": n, "unavailable": str(exc)}
            failed = True
            continue
        live[n] = b
        meta["brokers"][n] = b.describe()
        print(f"{n} {b.version}: pid {b.pid}, {b.url}", file=sys.stderr)

    rows = [(b, c) for c in clients for b in jms_runner.CLIENTS[c] if b in broker_names]
    results: list[dict[str, Any]] = []
    by: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    total = len(scenarios) * args.repeat * len(rows)
    k = 0
    t_start = time.monotonic()
    try:
        if warmup:
            for s in jms_workloads.select([s.name for s in scenarios], smoke=True, scale=1.0):
                for broker_name, client in rows:
                    if broker_name in live and live[broker_name].alive():
                        r = jms_runner.run_scenario(live[broker_name], client, s, opt)
                        print(f"[warm-up] {s.name} {broker_name} / {client}: {summary(r)}",
                              file=sys.stderr, flush=True)
        for s in scenarios:
            for rep in range(args.repeat):
                rot = rows[rep % len(rows):] + rows[:rep % len(rows)] if rows else []
                for broker_name, client in rot:
                    label = f"{broker_name} / {jms_runner.CLIENT_TITLES[client]}"
                    k += 1
                    if broker_name not in live:
                        r = {"scenario": s.name, "broker": broker_name, "client": client,
                             "unavailable": f"{broker_name} unavailable: "
                             + meta["brokers"][broker_name].get("unavailable", "")[:60]}
                        by[s.name][label].append(r)
                        results.append(r)
                        continue
                    b = live[broker_name]
                    if not b.alive():
                        print(f"{broker_name} died; restarting: {b.log_tail(5)}", file=sys.stderr)
                        b.restart()
                    for other in live.values():
                        if other is not b and other.alive():
                            other.settle()
                    t0 = time.monotonic()
                    r = jms_runner.run_scenario(b, client, s, opt)
                    r["repeat"] = rep
                    if not b.alive():
                        r.setdefault("errors", []).append("broker died: " + b.log_tail(5))
                    results.append(r)
                    by[s.name][label].append(r)
                    print(f"[{k}/{total}] {s.name} {label}: {summary(r)} "
                          f"({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)
                    if r.get("errors") or (args.smoke and not complete(r)):
                        failed = True
    except KeyboardInterrupt:
        print("interrupted; reporting what ran", file=sys.stderr)
        failed = True
    finally:
        meta["elapsed_s"] = time.monotonic() - t_start

    print(f"# Kittiwake JMS benchmark {meta['started']}{' (smoke)' if args.smoke else ''}\n")
    for note in notes:
        print(f"- {note}")
    print("- brokers: " + "; ".join(
        f"{n} {d.get('version', '?')}" if "unavailable" not in d else f"{n} unavailable"
        for n, d in meta["brokers"].items()))
    print()
    for s in scenarios:
        if s.name in by:
            print(report.jms_table(s, by[s.name], gen_cores))
            print()
    if args.profile and "kittiwake" in live:
        meta["profiles"] = profile(live["kittiwake"], args, opt)

    for b in live.values():
        b.stop()
    report.write_json(out, meta, results)
    print(f"results: {out}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def profile(b: Any, args: argparse.Namespace, opt: Any) -> dict[str, Any]:
    """Re-run scenarios on kittiwake under py-spy; print the hottest functions and lines."""
    import subprocess

    from kwbench import jms_runner, jms_workloads
    from run import top_functions

    spy = shutil.which("py-spy") or str(BENCH_DIR / ".venv-tools" / "bin" / "py-spy")
    if not os.path.exists(spy):
        print("py-spy not found: bench/setup_peers.sh --with-profiler", file=sys.stderr)
        return {}
    out: dict[str, Any] = {}
    args.profile_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for s in jms_workloads.select(args.profile.split(","), smoke=args.smoke,
                                  scale=args.profile_scale):
        raw = args.profile_dir / f"jms-{stamp}-{s.name}-{args.profile_client}.txt"
        svg = raw.with_suffix(".svg")
        # --gil: the thread holding the GIL, i.e. where the broker's Python time goes.
        procs = [subprocess.Popen([spy, "record", "--pid", str(b.pid), "--rate", "400",
                                   "--gil", "--format", fmt, "-o", str(path)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for fmt, path in (("raw", raw), ("flamegraph", svg))]
        time.sleep(1.0)
        r = jms_runner.run_scenario(b, args.profile_client, s, opt)
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        top = top_functions(raw)
        out[s.name] = {"run": summary(r), "raw": str(raw), "svg": str(svg), **top}
        print(f"### py-spy profile of kittiwake, {s.name} through {args.profile_client} "
              f"({summary(r)})\n\nflame graph: {svg}\n")
        print("| self % | inclusive % | function |")
        print("|------:|------------:|----------|")
        for fn, self_pct, incl_pct in top["top"]:
            print(f"| {self_pct:.1f} | {incl_pct:.1f} | {fn} |")
        print(f"\n{top['samples']:,} samples of the GIL-holding thread; hottest inclusive:\n")
        print("| inclusive % | function |")
        print("|------:|------|")
        for fn, pct in top.get("top_inclusive", [])[:25]:
            print(f"| {pct:.1f} | {fn} |")
        print()
    return out


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def summary(r: dict[str, Any]) -> str:
    if r.get("received") is None:
        return "FAILED " + "; ".join(r.get("errors", []))
    rate = f"{r['msg_per_s']:,.0f} msg/s" if r.get("msg_per_s") else "- msg/s"
    extra = " TIMED OUT" if r.get("timed_out") else ""
    errs = f" errors: {r['errors'][:3]}" if r.get("errors") else ""
    return (f"{rate}, {r['received']:,}/{r['expected']:,} delivered, lost {r['lost']}, "
            f"broker CPU {r['broker_cpu_pct'] or 0:.0f}%, gen CPU {r['gen_cpu_pct'] or 0:.0f}%"
            f" (waiting for a CPU: broker {r.get('broker_wait_pct') or 0:.0f}%, "
            f"gen {r.get('gen_wait_pct') or 0:.0f}%)"
            f"{_calls(r)}{extra}{errs}")


def _calls(r: dict[str, Any]) -> str:
    """The broker's read and write system calls per delivery, when the run counted them."""
    reads, writes = r.get("broker_reads_per_msg"), r.get("broker_writes_per_msg")
    if reads is None or writes is None:
        return ""
    return f", broker reads/writes per delivery {reads:.2f}/{writes:.2f}"


def complete(r: dict[str, Any]) -> bool:
    return bool(r.get("received") == r.get("expected") and not r.get("timed_out"))


if __name__ == "__main__":
    sys.exit(main())
