"""Reliability tests run real broker processes; make ``tests.integration`` importable however
pytest was started (the helpers there start the broker and speak raw MQTT)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "src"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
