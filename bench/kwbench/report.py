"""Tables (markdown, so they paste into issues) and the JSON result file."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from kwbench.workloads import Workload


def _f(value: Any, fmt: str = "{:,.0f}", none: str = "-") -> str:
    if value is None:
        return none
    if isinstance(value, float) and value != value:  # NaN
        return none
    return fmt.format(value)


def _ratio(a: Any, b: Any) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:.2f}x"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + " |"
    sep = "|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":"
                         for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def pick(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The median run (by ``key``) of repeated runs of one workload on one broker."""
    ok = [r for r in runs if r.get(key) is not None and not r.get("skipped")]
    if not ok:
        return runs[-1]
    ok.sort(key=lambda r: r[key])
    return ok[(len(ok) - 1) // 2]


def saturated(r: dict[str, Any], gen_cores: int) -> str:
    who = []
    if (r.get("broker_cpu_pct") or 0) >= 85:
        who.append("broker")
    if (r.get("gen_cpu_pct") or 0) >= 85 * gen_cores:
        who.append("generator")
    return "+".join(who) or "-"


def workload_table(w: Workload, runs: dict[str, list[dict[str, Any]]], gen_cores: int) -> str:
    if w.kind == "idle":
        return _idle_table(w, runs)
    if w.kind == "retained":
        return _retained_table(w, runs)
    paced = bool(w.rate)
    chosen = {b: pick(rs, "p99_ms" if paced else "msg_per_s") for b, rs in runs.items()}
    kw = chosen.get("kittiwake")
    header = ["broker", "msg/s", "p50 ms", "p99 ms", "delivered", "lost",
              "broker CPU s", "broker CPU %", "side-thread CPU %", "CPU us/msg", "gen CPU %",
              "other CPU %",
              "saturated",
              ("kw/peer p99" if paced else "kw/peer msg/s"), "kw/peer CPU/msg"]
    rows = []
    for name, r in chosen.items():
        if r.get("skipped"):
            rows.append([name, "skipped: " + r["skipped"]] + [""] * (len(header) - 2))
            continue
        if r.get("received") is None:
            rows.append([name, "failed: " + "; ".join(r.get("errors", []))[:80]]
                        + [""] * (len(header) - 2))
            continue
        delivered = f"{r['received']:,}/{r['expected']:,}"
        lost = _f(r["lost"]) + (" (timed out)" if r.get("timed_out") else "")
        if kw is None or name == "kittiwake" or kw.get("received") is None:
            ratio = ratio_cpu = "-"
        else:
            ratio = (_ratio(kw.get("p99_ms"), r.get("p99_ms")) if paced
                     else _ratio(kw.get("msg_per_s"), r.get("msg_per_s")))
            ratio_cpu = _ratio(kw.get("broker_cpu_us_per_msg"), r.get("broker_cpu_us_per_msg"))
        rows.append([
            name, _f(r["msg_per_s"]), _f(r["p50_ms"], "{:.2f}"), _f(r["p99_ms"], "{:.2f}"),
            delivered, lost, _f(r["broker_cpu_s"], "{:.2f}"), _f(r["broker_cpu_pct"], "{:.0f}"),
            _f(r.get("broker_side_cpu_pct"), "{:.0f}"), _f(r["broker_cpu_us_per_msg"], "{:.1f}"),
            _f(r["gen_cpu_pct"], "{:.0f}"),
            _f(r.get("other_cpu_pct"), "{:.0f}"), saturated(r, gen_cores), ratio, ratio_cpu,
        ])
    title = f"### {w.name}: {w.title} ({w.deliveries:,} deliveries, 64-byte payloads)"
    table = title + "\n\n" + _table(header, rows)
    if w.filters:
        # Fleet runs: how fast the filters went in, and the broker's memory holding them.
        extra = [[name, _f(r.get("filters_per_s")), _f((r.get("broker_rss_kb") or 0) / 1024,
                  "{:.1f}"), _f((r.get("broker_rss_kb") or 0) * 1024 / w.filters, "{:,.0f}")]
                 for name, r in chosen.items() if not r.get("skipped")]
        table += "\n\n" + _table(["broker", "filters/s", "RSS MB", "RSS bytes/filter"], extra)
    return table


def _retained_table(w: Workload, runs: dict[str, list[dict[str, Any]]]) -> str:
    """The median run (by time to the first message) of each broker, with the range of that
    time over the repeats, and kittiwake's ratios to each peer."""
    chosen = {b: pick(rs, "first_ms") for b, rs in runs.items()}
    kw = chosen.get("kittiwake")
    header = ["broker", "first ms", "first ms (min-max)", "last s", "delivered", "msg/s",
              "published in s", "broker CPU s", "CPU us/msg", "RSS MB", "other CPU %",
              "kw/peer first", "kw/peer last"]
    rows = []
    for name, r in chosen.items():
        if r.get("received") is None:
            rows.append([name, "failed: " + "; ".join(r.get("errors", []))[:80]]
                        + [""] * (len(header) - 2))
            continue
        firsts = [x["first_ms"] for x in runs[name] if x.get("first_ms") is not None]
        spread = f"{min(firsts):.1f}-{max(firsts):.1f}" if firsts else "-"
        delivered = f"{r['received']:,}/{r['expected']:,}"
        if r.get("timed_out"):
            delivered += " (timed out)"
        if kw is None or name == "kittiwake" or kw.get("received") is None:
            ratio_first = ratio_last = "-"
        else:
            ratio_first = _ratio(kw.get("first_ms"), r.get("first_ms"))
            ratio_last = _ratio(kw.get("last_s"), r.get("last_s"))
        rows.append([
            name, _f(r["first_ms"], "{:.1f}"), spread, _f(r["last_s"], "{:.3f}"), delivered,
            _f(r["msg_per_s"]), _f(r["publish_s"], "{:.2f}"), _f(r["broker_cpu_s"], "{:.2f}"),
            _f(r["broker_cpu_us_per_msg"], "{:.1f}"),
            _f((r.get("broker_rss_kb") or 0) / 1024, "{:.1f}"),
            _f(r.get("other_cpu_pct"), "{:.0f}"), ratio_first, ratio_last,
        ])
    title = (f"### {w.name}: {w.count:,} retained QoS 0 messages on distinct topics, then a "
             "new QoS 0 subscriber to the wildcard over them (64-byte payloads; times from "
             "its SUBSCRIBE; last s: to the last message received, whether or not all came)")
    return title + "\n\n" + _table(header, rows)


def _idle_table(w: Workload, runs: dict[str, list[dict[str, Any]]]) -> str:
    chosen = {b: pick(rs, "kb_per_conn") for b, rs in runs.items()}
    kw = chosen.get("kittiwake")
    header = ["broker", "connected", "pings ok", "connect/s", "RSS before MB", "RSS held MB",
              "KB/conn", "connect CPU s", "hold CPU %", "dropped", "kw/peer KB/conn"]
    rows = []
    for name, r in chosen.items():
        if r.get("connected") is None:
            rows.append([name, "failed: " + "; ".join(r.get("errors", []))[:80]]
                        + [""] * (len(header) - 2))
            continue
        ratio = "-" if name == "kittiwake" or kw is None else _ratio(
            kw.get("kb_per_conn"), r.get("kb_per_conn"))
        rows.append([
            name, f"{r['connected']:,}/{r['requested']:,}", _f(r["pings_ok"]),
            _f(r["connects_per_s"]), _f(r["rss_before_kb"] / 1024, "{:.1f}"),
            _f(r["rss_held_kb"] / 1024, "{:.1f}"), _f(r["kb_per_conn"], "{:.1f}"),
            _f(r["broker_cpu_connect_s"], "{:.2f}"), _f(r["broker_cpu_hold_pct"], "{:.1f}"),
            _f(r["drops"]), ratio,
        ])
    title = f"### {w.name}: {w.conns:,} {w.title}, held {w.hold_s:g} s"
    return title + "\n\n" + _table(header, rows)


def write_json(path: Path, meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    slim = []
    for r in results:
        r = dict(r)
        slim.append(r)
    path.write_text(json.dumps({"meta": meta, "results": slim}, indent=1, default=str) + "\n")


def default_path(results_dir: Path, smoke: bool) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return results_dir / f"{stamp}{'-smoke' if smoke else ''}.json"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def jms_table(s: Any, runs: dict[str, list[dict[str, Any]]], gen_cores: int) -> str:
    """One JMS scenario: a row per broker and client (median of the repeats by msg/s), with
    kittiwake's ratios to ActiveMQ's row from the same run."""
    chosen = {row: pick(rs, "msg_per_s") for row, rs in runs.items()}
    peer = next((r for row, r in chosen.items() if row.startswith("activemq")), None)
    header = ["broker / client", "msg/s", "p50 ms", "p99 ms", "delivered", "lost",
              "broker CPU s", "broker CPU %", "CPU us/msg", "disk KB/msg", "gen CPU %",
              "other CPU %", "saturated", "kw/AMQ msg/s", "kw/AMQ CPU/msg"]
    rows = []
    for row, r in chosen.items():
        if r.get("received") is None:
            text = r.get("unavailable") or "failed: " + "; ".join(r.get("errors", []))[:80]
            rows.append([row, text] + [""] * (len(header) - 2))
            continue
        lost = _f(r["lost"]) + (" (timed out)" if r.get("timed_out") else "")
        if row.startswith("kittiwake") and peer is not None and peer.get("received"):
            ratio = _ratio(r.get("msg_per_s"), peer.get("msg_per_s"))
            ratio_cpu = _ratio(r.get("broker_cpu_us_per_msg"),
                               peer.get("broker_cpu_us_per_msg"))
        else:
            ratio = ratio_cpu = "-"
        disk = r.get("disk_bytes_per_msg")
        rows.append([
            row, _f(r["msg_per_s"]), _f(r["p50_ms"], "{:.2f}"), _f(r["p99_ms"], "{:.2f}"),
            f"{r['received']:,}/{r['expected']:,}", lost, _f(r["broker_cpu_s"], "{:.2f}"),
            _f(r["broker_cpu_pct"], "{:.0f}"), _f(r["broker_cpu_us_per_msg"], "{:.1f}"),
            _f(disk / 1024 if disk is not None else None, "{:.2f}"),
            _f(r["gen_cpu_pct"], "{:.0f}"), _f(r.get("other_cpu_pct"), "{:.0f}"),
            saturated(r, gen_cores), ratio, ratio_cpu,
        ])
    unit = "deliveries" if s.consumers > 1 else "messages"
    title = (f"### {s.name}: {s.title} ({s.deliveries:,} {unit}, 100-byte text messages; "
             f"msg/s = {unit}/s)")
    stores = sorted({f"{row.split(' / ')[0]}: {r['store']}" for row, r in chosen.items()
                     if r.get("store")})
    note = ("\n\nstores: " + "; ".join(stores)) if s.persistent and stores else ""
    return title + "\n\n" + _table(header, rows) + note
