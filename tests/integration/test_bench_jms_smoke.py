"""The JMS benchmark must not rot: its smoke mode runs the four JMS scenarios against kittiwake
through python-qpid-proton's client and through kittiwake.jms, and must count every message.
No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "bench" / "run_jms.py"


@pytest.mark.timeout(300)
def test_jms_bench_smoke_counts_every_message(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--smoke", "--brokers", "kittiwake", "--clients",
         "proton,jms", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=290,
    )
    report = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    data = json.loads(out.read_text())
    results = data["results"]
    scenarios = {s["name"] for s in data["meta"]["scenarios"]}
    assert scenarios == {"queue-persistent-sync", "queue-nonpersistent", "queue-persistent-tx",
                         "topic-nonpersistent-1to10"}
    ran = {(r["scenario"], r["client"]) for r in results}
    assert ran == {(s, c) for s in scenarios for c in ("proton", "jms")}, report
    for r in results:
        assert r["broker"] == "kittiwake"
        assert not r.get("errors"), (r["scenario"], r["client"], r["errors"])
        assert r["expected"] == r["count"] * r["consumers"] > 0, r
        assert r["sent"] == r["count"], r
        assert r["received"] == r["expected"], r
        assert r["per_consumer"] == [r["count"]] * r["consumers"], r
        assert r["lost"] == 0 and r["duplicates"] == 0, r
        assert not r["timed_out"], r
        if r["sync_send"] or r["transacted"]:
            assert r["acked"] == r["sent"], r
        if r["client"] == "proton":
            assert r["acked"] == r["sent"], r  # every outcome counted, asynchronous ones too
        if r["persistent"]:
            assert r["store"].startswith("SQLite kittiwake.db open"), r
        assert r["latency_samples"] > 0, r
        assert r["broker_cpu_s"] >= 0, r
