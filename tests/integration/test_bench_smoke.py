"""The benchmark must not rot: its smoke mode runs every workload against kittiwake with a few
hundred messages and must count every one of them. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "bench" / "run.py"


@pytest.mark.timeout(150)
def test_bench_smoke_counts_every_message(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--smoke", "--brokers", "kittiwake", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=140,
    )
    report = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    data = json.loads(out.read_text())
    results = data["results"]
    ran = {r["workload"] for r in results}
    expected_workloads = {w["name"] for w in data["meta"]["workloads"]}
    assert ran == expected_workloads, report
    assert {"qos0-1to1", "qos1-1to1", "qos0-10to1", "qos1-1to50", "paced-qos0",
            "idle-conns", "retained-100k"} <= ran
    for r in results:
        assert r["broker"] == "kittiwake"
        assert not r.get("errors"), (r["workload"], r["errors"])
        if r["kind"] == "idle":
            assert r["connected"] == r["requested"] > 0, r
            assert r["pings_ok"] == r["connected"], r
            assert r["drops"] == 0, r
        elif r["kind"] == "retained":
            # Every retained message reaches the new subscriber; its first one was timed.
            assert r["expected"] > 0, r
            assert r["received"] == r["expected"], r
            assert r["lost"] == 0 and r["duplicates"] == 0, r
            assert not r["timed_out"], r
            assert r["first_ms"] is not None and r["all_s"] is not None, r
            assert r["broker_cpu_s"] >= 0, r
        else:
            assert r["expected"] > 0, r
            assert r["received"] == r["expected"], r
            assert r["lost"] == 0 and r["duplicates"] == 0, r
            assert not r["timed_out"], r
            assert r["sent"] == r["pubs"] * r["count_per_pub"], r
            if r["qos"] == 1:
                assert r["acked"] == r["sent"], r
            assert r["latency_samples"] > 0, r
            assert r["broker_cpu_s"] >= 0, r
