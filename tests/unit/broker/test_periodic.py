"""run_every: periodic core work keeps running after a failing run, and stops when cancelled."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kittiwake.broker.periodic import run_every


def test_a_failing_run_is_logged_and_the_next_runs_still_come(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    def action() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("first run fails")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        cancel = run_every(loop, 0.0, action, "test sweep")
        for _ in range(1000):  # bounded: each turn of the loop runs at most one call
            if len(calls) >= 3:
                break
            await asyncio.sleep(0)
        cancel()

    with caplog.at_level(logging.ERROR, logger="kittiwake.broker.periodic"):
        asyncio.run(main())
    assert len(calls) >= 3
    assert any("test sweep failed" in r.getMessage() for r in caplog.records)


def test_cancel_stops_further_runs() -> None:
    calls: list[int] = []

    async def main() -> int:
        loop = asyncio.get_running_loop()
        cancel = run_every(loop, 0.0, lambda: calls.append(1), "test sweep")
        for _ in range(1000):
            if calls:
                break
            await asyncio.sleep(0)
        cancel()
        seen = len(calls)
        for _ in range(20):
            await asyncio.sleep(0)
        return seen

    seen = asyncio.run(main())
    assert seen >= 1
    assert len(calls) == seen
