"""The broker runs without the ``flight`` and ``spark`` extras: nothing it imports to serve
MQTT pulls in pyarrow or pyspark (a flight listener asks for them only when configured)."""

from __future__ import annotations

import subprocess
import sys


def test_serving_mqtt_imports_neither_pyarrow_nor_pyspark() -> None:
    code = (
        "import sys, kittiwake.cli, kittiwake.app\n"
        "print(sorted(m for m in ('pyarrow', 'pyspark') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
