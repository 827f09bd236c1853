"""How `make test` spreads the suite over pytest-xdist workers (``-n 2 --dist loadgroup``).

Most of the suite's time is spent waiting on brokers, clients and Spark's JVM rather than on
a core, so two workers nearly halve it. Each test file stays on one worker (its module
fixtures start once, its tests keep their order), and the Spark package is one group: it
shares one local Spark session, and starting a second JVM would cost more than it saves.
The Spark group is collected first because it is the longest: started last, it would run
alone at the end.
"""

from __future__ import annotations

import pytest

SPARK_PACKAGE = "tests/integration/spark/"


def _group(item: pytest.Item) -> str:
    path = item.nodeid.split("::", 1)[0]
    return "spark" if path.startswith(SPARK_PACKAGE) else path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    items.sort(key=lambda item: _group(item) != "spark")  # stable: file order otherwise kept
