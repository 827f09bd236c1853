"""``make demo`` runs: examples/demo.py briefly on the Spark suite's session, with a small fleet
and short windows; its simulated sensors reach Spark through the broker and its results come
back as retained ``stats/<device>`` messages a subscriber finds. Marked ``spark``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from ..brokerproc import free_port

# Each Spark wait is bounded on its own (QUERY_TIMEOUT and the like); a test makes several, so
# the suite-wide 120 s per test is too short on a loaded machine (a driver start alone can take
# a minute there).
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

pytest.importorskip("pyspark", reason="needs the spark extra: make test-deps")
pytest.importorskip("paho.mqtt")

DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.py"
DEVICES = 20


def load_demo() -> Any:
    spec = importlib.util.spec_from_file_location("kittiwake_demo", DEMO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_demo_runs_end_to_end(spark: Any, tmp_path: Path) -> None:
    demo = load_demo()
    said: list[str] = []
    figures = demo.run(
        spark,
        seconds=120,  # at most: it stops once every device's first window came back
        devices=DEVICES,
        workdir=tmp_path,
        mqtt_port=free_port(),
        flight_port=free_port(),
        say=said.append,
        progress_every=1.0,
        window="2 seconds",
        lateness="1 second",
        enough=lambda stats: len(stats.topics) >= DEVICES,
        drain_timeout=90,
    )
    text = "\n".join(said)
    assert figures["rows_in"] > 0 and figures["batches"] > 0, text
    # Every reading the broker acknowledged was read once by the stats query.
    assert figures["rows_in"] == figures["published"], text
    assert figures["retained_devices"] == DEVICES, text
    assert "| rows in" in text and "| lag" in text
    assert "mosquitto_sub: stats/dev-" in text
    assert f"shows {DEVICES} retained stats" in text
