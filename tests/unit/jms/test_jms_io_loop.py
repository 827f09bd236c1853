"""The blocking API's I/O thread runs asyncio's own event loop and holds its connection's
engine lock at all times but while the loop waits for I/O, so a caller's thread that takes
the lock (``_IOThread.borrow``: an AUTO_ACKNOWLEDGE receive()'s acknowledgement) touches the
engine only while the loop is idle, without waking it."""

from __future__ import annotations

import asyncio
import threading

from kittiwake.jms import blocking


def test_the_io_thread_runs_asyncios_loop() -> None:
    io = blocking._IOThread()
    try:
        assert type(io.loop).__module__.startswith("asyncio")

        async def answer() -> int:
            await asyncio.sleep(0)
            return 42

        assert io.run(answer()) == 42
        done: list[bool] = []
        io.call_soon(lambda: done.append(True))  # a call from this thread, waited for
        assert done == [True]
    finally:
        io.stop()


def test_the_loop_holds_the_lock_while_it_runs_and_lets_go_while_it_waits() -> None:
    io = blocking._IOThread()
    running = threading.Event()
    release = threading.Event()

    def callback() -> None:
        running.set()
        release.wait(10)

    try:
        io.loop.call_soon_threadsafe(callback)
        assert running.wait(10)
        assert not io.lock.acquire(blocking=False)  # the loop is running a callback
        release.set()
        io.call_soon(lambda: None)  # the callback has returned
        # Back in its selector's wait: the lock is free (blocks only until the loop is).
        assert io.lock.acquire(timeout=10)
        io.lock.release()
    finally:
        release.set()
        io.stop()


def test_a_borrow_runs_on_the_callers_thread_under_the_lock() -> None:
    io = blocking._IOThread()

    class Engine:
        """What borrow() asks of an engine: run the work, then write (here: nothing)."""

        def borrowed(self, function: object) -> bool:
            assert callable(function)
            function()
            return True

    ran: list[tuple[int, bool]] = []

    def work() -> None:
        ran.append((threading.get_ident(), io.lock.locked()))

    try:
        io.borrow(Engine(), work)  # type: ignore[arg-type]
        assert ran == [(threading.get_ident(), True)]
    finally:
        io.stop()
