"""The blocking API's I/O thread runs uvloop's event loop where uvloop is installed (it is a
dependency of the package): a receive() with AUTO_ACKNOWLEDGE wakes that loop from the
caller's thread and has it write, once a message, and uvloop does both in C. Without uvloop
the API works the same on asyncio's own loop."""

from __future__ import annotations

import asyncio
import sys

import pytest

from kittiwake.jms import blocking


def test_the_io_thread_runs_uvloop_where_it_is_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    io = blocking._IOThread()
    try:
        assert isinstance(io.loop, uvloop.Loop)

        async def answer() -> int:
            await asyncio.sleep(0)
            return 42

        assert io.run(answer()) == 42
        done: list[bool] = []
        io.call_soon(lambda: done.append(True))  # a call from this thread, waited for
        assert done == [True]
    finally:
        io.stop()


def test_without_uvloop_the_io_thread_runs_asyncios_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    io = blocking._IOThread()
    try:
        assert type(io.loop).__module__.startswith("asyncio")

        async def answer() -> int:
            return 7

        assert io.run(answer()) == 7
    finally:
        io.stop()
