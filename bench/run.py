#!/usr/bin/env python3
"""Kittiwake's benchmark: the same MQTT workloads against kittiwake, mosquitto and amqtt.

    python3 bench/run.py                      # every workload, every installed broker
    python3 bench/run.py --smoke              # a few hundred messages a workload, kittiwake
    python3 bench/run.py --brokers kittiwake,mosquitto --workloads qos0-1to1,qos1-1to1
    python3 bench/run.py --profile qos0-1to1  # plus a py-spy profile of kittiwake

The peers come from ``bench/setup_peers.sh``. Results: markdown tables on stdout and a JSON
file under bench/results/ (timestamped) for comparing runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))  # spawned workers inherit sys.path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help="a few hundred messages per workload, 200 idle connections; kittiwake "
                        "only unless --brokers says otherwise")
    p.add_argument("--brokers", help="comma-separated: kittiwake,mosquitto,amqtt "
                                     "(default: all; with --smoke: kittiwake)")
    p.add_argument("--workloads", help="comma-separated workload names (default: all but "
                                       "pending ones); --list shows them")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    p.add_argument("--idle-conns", type=int, help="idle connections to open (default 10000)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per workload and broker, alternating brokers; the median is shown")
    p.add_argument("--deadline", type=float, help="seconds one run may take (default 60, "
                                                  "smoke 20)")
    p.add_argument("--gen-procs", type=int, default=2,
                   help="processes per side (publishers, subscribers) when a side has several "
                        "connections (default 2)")
    p.add_argument("--idle-procs", type=int, default=4, help="processes holding idle connections")
    p.add_argument("--window", type=int, default=100, help="QoS 1 in-flight window per publisher")
    p.add_argument("--batch", type=int, default=256,
                   help="PUBLISH frames stamped and handed to one send() (default 256)")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin the broker to CPU 0 and the load generator to the rest")
    p.add_argument("--include-pending", action="store_true",
                   help="also run workloads waiting for a kittiwake feature")
    p.add_argument("--no-restart-for-idle", action="store_true",
                   help="measure idle-connection RSS without restarting the broker first")
    p.add_argument("--kittiwake-store", choices=("sqlite", "memory"), default="sqlite",
                   help="kittiwake's store for the non-durable workloads (default: sqlite, "
                        "its own default)")
    p.add_argument("--kittiwake-python", default=sys.executable,
                   help="interpreter that runs kittiwake (default: this one)")
    p.add_argument("--kittiwake-baseline", type=Path, metavar="SRC",
                   help="also run another kittiwake checkout (its root or src/) as broker "
                        "'kittiwake-baseline' (before/after in one run)")
    p.add_argument("--out", type=Path, help="JSON result file (default bench/results/STAMP.json)")
    p.add_argument("--profile", help="comma-separated workloads to re-run on kittiwake under "
                                     "py-spy after the measured runs (not in the tables)")
    p.add_argument("--profile-scale", type=float, default=5.0,
                   help="message-count scale of the profiled runs (default 5: long enough "
                        "for a few thousand samples)")
    p.add_argument("--profile-dir", type=Path, default=BENCH_DIR / "results" / "profiles",
                   help="where py-spy's flame graphs and stacks go")
    return p.parse_args(argv)


def raise_nofile(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return soft
    if hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
        except (ValueError, OSError):
            want = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # `timeout` and kill send SIGTERM: report what ran and stop the brokers, as on Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupted)
    from kwbench import brokers as brokers_mod
    from kwbench import report, runner, workloads

    if args.list:
        for w in workloads.FULL:
            extra = f"  [pending: {w.pending}]" if w.pending else ""
            size = (f"{w.conns:,} connections" if w.kind == "idle"
                    else f"{w.deliveries:,} deliveries")
            print(f"{w.name:22} {w.title} ({size}){extra}")
        return 0

    chosen = workloads.select(args.workloads.split(",") if args.workloads else None,
                              smoke=args.smoke, scale=args.scale, idle_conns=args.idle_conns,
                              include_pending=args.include_pending)
    names = (args.brokers.split(",") if args.brokers
             else ["kittiwake"] if args.smoke else list(brokers_mod.BROKERS))
    if args.kittiwake_baseline is not None and "kittiwake-baseline" not in names:
        names.append("kittiwake-baseline")
    for n in names:
        if n not in brokers_mod.BROKERS and n != "kittiwake-baseline":
            raise SystemExit(f"unknown broker {n!r}; known: {', '.join(brokers_mod.BROKERS)}")
    deadline = args.deadline or (20.0 if args.smoke else 60.0)
    idle_max = max((w.conns for w in chosen if w.kind == "idle"), default=0)
    # The brokers (children of this process) inherit the limit: they hold every connection.
    nofile = raise_nofile(max(4096, idle_max + 2048))

    cpus = sorted(os.sched_getaffinity(0))
    broker_cpus: set[int] | None = None
    gen_cpus: set[int] | None = None
    if not args.no_pin and len(cpus) >= 2:
        broker_cpus = {cpus[0]}
        gen_cpus = set(cpus[1:])
        os.sched_setaffinity(0, gen_cpus)
    gen_cores = len(gen_cpus) if gen_cpus else len(cpus)

    opt = runner.Options(gen_procs=args.gen_procs, gen_cpus=gen_cpus, window=args.window,
                         batch=args.batch, deadline_s=deadline,
                         idle_timeout_s=3.0 if args.smoke else 5.0, idle_procs=args.idle_procs,
                         nofile=nofile, restart_for_idle=not args.no_restart_for_idle)
    workdir = brokers_mod.make_workdir()
    notes = [
        f"{len(cpus)} CPU(s); "
        + (f"broker pinned to CPU {sorted(broker_cpus)}, load generator to CPU(s) "
           f"{sorted(gen_cpus)}" if broker_cpus and gen_cpus else
           "no pinning: the load generator shares cores with the broker")
        + ". The load generator runs on the same machine as the broker.",
        "msg/s: messages received by all subscribers / (last - first receive). Latency: "
        "receive time - send timestamp in the payload (QoS 0/1 flood runs: latency under "
        "saturation, i.e. queueing; paced runs: every message).",
        "broker CPU: user+sys from /proc/PID/stat over the run; % of one core (all three "
        "brokers are single-threaded event loops; kittiwake's durable store also has a writer "
        "thread, shown as side-thread CPU %, part of broker CPU). gen CPU %: all load-generator "
        f"processes, % of one core ({gen_cores} core(s) available to them). other CPU %: the "
        "rest of the machine's busy time during the run (harness, kernel softirq, other "
        "users): high values mean the numbers are noisy. saturated: >= 85%.",
        "MQTT 3.1.1, clean sessions unless stated, no $SYS, warning-level logs, in-flight "
        "window 100 (publisher) / 100 (broker to subscriber). Clients and the asyncio brokers "
        "set TCP_NODELAY; mosquitto keeps its default (Nagle on).",
    ]
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:] if argv is None else argv,
        "smoke": args.smoke,
        "host": {"platform": platform.platform(), "cpus": len(cpus), "nproc": os.cpu_count(),
                 "python": platform.python_version(), "nofile": nofile},
        "broker_cpus": sorted(broker_cpus) if broker_cpus else None,
        "gen_cpus": sorted(gen_cpus) if gen_cpus else None,
        "options": {k: getattr(opt, k) for k in vars(opt) if k != "gen_cpus"},
        "workloads": [vars(w) | {"deliveries": w.deliveries} for w in chosen],
        "notes": notes,
        "brokers": {},
    }
    out = args.out or report.default_path(BENCH_DIR / "results", args.smoke)

    live: dict[str, brokers_mod.Broker] = {}
    failed = False
    for n in names:
        if n == "kittiwake-baseline":
            if args.kittiwake_baseline is None:
                sys.exit("kittiwake-baseline needs --kittiwake-baseline SRC")
            b = brokers_mod.KittiwakeBaseline(workdir, broker_cpus, args.kittiwake_baseline)
        else:
            b = brokers_mod.BROKERS[n](workdir, broker_cpus)  # type: ignore[call-arg]
        if isinstance(b, brokers_mod.Kittiwake):
            b.python = args.kittiwake_python
            b.store = args.kittiwake_store
        try:
            b.start()
        except brokers_mod.BrokerUnavailable as exc:
            print(f"skipping {n}: {exc}", file=sys.stderr)
            meta["brokers"][n] = {"name": n, "unavailable": str(exc)}
            failed = True
            continue
        live[n] = b
        meta["brokers"][n] = b.describe()
        print(f"{n} {b.version}: pid {b.pid}, 127.0.0.1:{b.port}", file=sys.stderr)

    results: list[dict[str, Any]] = []
    by: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    order = list(live)
    total = len(chosen) * args.repeat * len(order)
    k = 0
    t_start = time.monotonic()
    try:
        for w in chosen:
            for rep in range(args.repeat):
                rot = order[rep % len(order):] + order[:rep % len(order)] if order else []
                for n in rot:
                    b = live[n]
                    k += 1
                    if w.durable and not b.supports_durable:
                        r = {"workload": w.name, "broker": n, "kind": w.kind,
                             "skipped": f"{n} has no durable store"}
                        results.append(r)
                        by[w.name][n].append(r)
                        print(f"[{k}/{total}] {w.name} {n}: skipped ({r['skipped']})",
                              file=sys.stderr)
                        continue
                    if not b.alive():
                        print(f"{n} died; restarting: {b.log_tail(5)}", file=sys.stderr)
                        b.restart()
                    if b.durable != w.durable:
                        b.durable = w.durable  # its config changes: start it afresh
                        if not (w.kind == "idle" and opt.restart_for_idle):
                            b.restart()  # (run_idle restarts it anyway)
                    for other in live.values():
                        # A peer still working off its last run (amqtt can take seconds) would
                        # share the pinned core with this one.
                        if other is not b and other.alive():
                            other.settle()
                    t0 = time.monotonic()
                    r = runner.run_workload(b, w, opt)
                    r["repeat"] = rep
                    r["broker_durable"] = b.durable
                    if not b.alive():
                        r.setdefault("errors", []).append("broker died: " + b.log_tail(5))
                    results.append(r)
                    by[w.name][n].append(r)
                    took = time.monotonic() - t0
                    print(f"[{k}/{total}] {w.name} {n}: {summary(r)} ({took:.1f} s)",
                          file=sys.stderr, flush=True)
                    if r.get("errors") or (args.smoke and not complete(r)):
                        failed = True
    except KeyboardInterrupt:
        print("interrupted; reporting what ran", file=sys.stderr)
        failed = True
    finally:
        meta["elapsed_s"] = time.monotonic() - t_start
        for n in names:
            if n in live:
                meta["brokers"][n]["version"] = live[n].version

    print(f"# Kittiwake benchmark {meta['started']}{' (smoke)' if args.smoke else ''}\n")
    for note in notes:
        print(f"- {note}")
    print("- brokers: " + "; ".join(f"{n} {d.get('version', '?')}" if "unavailable" not in d
                                     else f"{n} unavailable" for n, d in meta["brokers"].items()))
    print()
    for w in chosen:
        if w.name in by:
            print(report.workload_table(w, by[w.name], gen_cores))
            print()

    if args.profile and "kittiwake" in live:
        meta["profiles"] = profile(live["kittiwake"], args, opt, workloads, runner)

    for b in live.values():
        b.stop()
    report.write_json(out, meta, results)
    print(f"results: {out}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def summary(r: dict[str, Any]) -> str:
    if r.get("kind") == "idle":
        if r.get("connected") is None:
            return "FAILED " + "; ".join(r.get("errors", []))
        return (f"{r['connected']:,}/{r['requested']:,} connected, "
                f"{(r['kb_per_conn'] or 0):.1f} KB/conn, errors {r['error_count']}")
    if r.get("received") is None:
        return "FAILED " + "; ".join(r.get("errors", []))
    if r.get("kind") == "retained":
        first = f"{r['first_ms']:.1f} ms" if r.get("first_ms") is not None else "-"
        last = f"{r['last_s']:.3f} s" if r.get("last_s") is not None else "-"
        return (f"first after {first}, last after {last}, {r['received']:,}/{r['expected']:,} "
                f"delivered (published in {r['publish_s']:.2f} s), broker CPU "
                f"{r['broker_cpu_s']:.2f} s" + (" TIMED OUT" if r.get("timed_out") else "")
                + (f" errors: {r['errors'][:3]}" if r.get("errors") else ""))
    rate = f"{r['msg_per_s']:,.0f} msg/s" if r.get("msg_per_s") else "- msg/s"
    p99 = f"p99 {r['p99_ms']:.2f} ms" if r.get("p99_ms") is not None else ""
    extra = " TIMED OUT" if r.get("timed_out") else ""
    errs = f" errors: {r['errors'][:3]}" if r.get("errors") else ""
    return (f"{rate}, {p99}, {r['received']:,}/{r['expected']:,} delivered, lost {r['lost']}, "
            f"broker CPU {r['broker_cpu_pct'] or 0:.0f}%, gen CPU {r['gen_cpu_pct'] or 0:.0f}%"
            f"{extra}{errs}")


def complete(r: dict[str, Any]) -> bool:
    if r.get("kind") == "idle":
        return r.get("connected") == r.get("requested") == r.get("pings_ok")
    return bool(r.get("received") == r.get("expected") and not r.get("timed_out"))


def profile(b: Any, args: argparse.Namespace, opt: Any, workloads: Any, runner: Any
            ) -> dict[str, Any]:
    """Re-run workloads on kittiwake under py-spy; print the hottest functions."""
    spy = shutil.which("py-spy") or str(BENCH_DIR / ".venv-tools" / "bin" / "py-spy")
    if not os.path.exists(spy):
        print("py-spy not found: pip install py-spy (or bench/setup_peers.sh --with-profiler)",
              file=sys.stderr)
        return {}
    out: dict[str, Any] = {}
    args.profile_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for w in workloads.select(args.profile.split(","), smoke=args.smoke,
                              scale=args.profile_scale, idle_conns=args.idle_conns,
                              include_pending=True):
        if b.durable != w.durable:
            b.durable = w.durable
            b.restart()
        raw = args.profile_dir / f"profile-{stamp}-{w.name}.txt"
        svg = args.profile_dir / f"profile-{stamp}-{w.name}.svg"
        # --gil: only the thread holding the GIL, i.e. where Python CPU time goes (an idle
        # store-writer thread blocked on its queue would otherwise fill half the samples).
        procs = [subprocess.Popen([spy, "record", "--pid", str(b.pid), "--rate", "400",
                                   "--gil", "--format", fmt, "-o", str(path)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for fmt, path in (("raw", raw), ("flamegraph", svg))]
        time.sleep(1.0)
        r = runner.run_workload(b, w, opt)
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        top = top_functions(raw)
        out[w.name] = {"run": summary(r), "raw": str(raw), "svg": str(svg), **top}
        print(f"### py-spy profile of kittiwake, {w.name} ({summary(r)})\n")
        print(f"flame graph: {svg}\n")
        print("| self % | inclusive % | function |")
        print("|------:|------------:|----------|")
        for fn, self_pct, incl_pct in top["top"]:
            print(f"| {self_pct:.1f} | {incl_pct:.1f} | {fn} |")
        print(f"\n{top['samples']:,} samples of the GIL-holding thread; hottest lines:\n")
        print("| self % | line |")
        print("|------:|------|")
        for line, pct in top["top_lines"][:12]:
            print(f"| {pct:.1f} | {line} |")
        print()
    return out


def _function(frame: str) -> str:
    """``name (file.py:123)`` -> ``name (file.py)``: aggregate a function's lines."""
    return re.sub(r":\d+\)$", ")", frame)


def top_functions(raw: Path, n: int = 25) -> dict[str, Any]:
    """Self and inclusive time per function from py-spy's collapsed stacks."""
    self_t: Counter[str] = Counter()
    incl_t: Counter[str] = Counter()
    line_t: Counter[str] = Counter()
    total = 0
    try:
        lines = raw.read_text().splitlines()
    except OSError:
        return {"top": [], "samples": 0}
    for line in lines:
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        lines_ = [f for f in stack.split(";") if f]
        if not lines_:
            continue
        line_t[lines_[-1]] += count
        frames = [_function(f) for f in lines_]
        total += count
        self_t[frames[-1]] += count
        for f in set(frames):
            incl_t[f] += count
    top = [(f, 100 * c / total, 100 * incl_t[f] / total) for f, c in self_t.most_common(n)]
    return {"top": top, "samples": total,
            "top_lines": [(f, 100 * c / total) for f, c in line_t.most_common(n)],
            "top_inclusive": [(f, 100 * c / total) for f, c in incl_t.most_common(n)]}


if __name__ == "__main__":
    sys.exit(main())
