"""The blocking API's I/O thread runs asyncio's own event loop and holds its connection's
engine lock at all times but while the loop waits for I/O, so a caller's thread that takes
the lock (``_IOThread.borrow``: an AUTO_ACKNOWLEDGE receive()'s acknowledgement) touches the
engine only while the loop is idle, without waking it."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from kittiwake.jms import blocking
from kittiwake.jms.exceptions import IllegalStateException


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

    idents: list[int] = []

    def borrower() -> None:
        idents.append(threading.get_ident())
        io.borrow(Engine, work)  # type: ignore[arg-type]

    try:
        thread = threading.Thread(target=borrower)
        thread.start()
        thread.join(10)
        assert ran == [(idents[0], True)]
    finally:
        io.stop()


class _Engine:
    """What borrow() asks of an engine: run the work, then write (here: nothing)."""

    def borrowed(self, function: object) -> bool:
        assert callable(function)
        function()
        return True

    def flush(self) -> None:
        """The loop's write (here: nothing)."""


def test_the_main_thread_hands_its_work_to_the_loop_so_a_signal_handler_may_call_jms() -> None:
    """Python runs a signal handler on the main thread between any two bytecodes (the signal
    may be taken by another thread for it): a JMS call from a handler run inside the locked
    region (close() on SIGTERM) would wait for the loop, which waits for the lock. So the main
    thread's work runs on the loop, and a handler's call while it waits goes through."""
    assert threading.current_thread() is threading.main_thread()
    io = blocking._IOThread()
    seen: list[object] = []

    def handler(signum: int, frame: object) -> None:
        seen.append("handler")
        io.call_soon(lambda: seen.append("the loop ran the handler's call"))

    def work() -> None:
        seen.append(threading.current_thread() is io.thread)
        os.kill(os.getpid(), signal.SIGUSR1)
        seen.append("work done")

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        io.borrow(_Engine, work)  # type: ignore[arg-type]
        deadline = 100
        while "the loop ran the handler's call" not in seen and deadline:
            io.call_soon(lambda: None)  # a check for pending handlers between calls
            deadline -= 1
        assert seen[0] is True  # ran on the loop's thread
        assert seen.index("work done") < seen.index("the loop ran the handler's call")
        assert seen.index("handler") < seen.index("the loop ran the handler's call")
    finally:
        signal.signal(signal.SIGUSR1, previous)
        io.stop()


def test_a_blocking_call_inside_a_borrow_is_refused_rather_than_waited_for() -> None:
    """Code the collector runs inside the region (a __del__ closing a session) would wait for
    a loop that waits for this thread's lock: refused with IllegalStateException."""
    io = blocking._IOThread()
    refused: list[bool] = []

    def work() -> None:
        with pytest.raises(IllegalStateException):
            io.call_soon(lambda: None)
        coroutine = asyncio.sleep(0)
        with pytest.raises(IllegalStateException):
            io.run(coroutine)
        refused.append(True)

    try:
        thread = threading.Thread(target=lambda: io.borrow(_Engine, work))  # type: ignore[arg-type]
        thread.start()
        thread.join(10)
        assert refused == [True]
        io.call_soon(lambda: None)  # out of the region: as ever
    finally:
        io.stop()


def test_a_call_to_a_loop_stopped_meanwhile_raises_instead_of_waiting_forever() -> None:
    """A call queued after the loop's last turn, before its close (receive() racing
    Connection.close() from another thread), never runs: the waiting thread hears that the
    loop is gone instead of waiting for ever."""
    io = blocking._IOThread()
    io.loop.call_soon_threadsafe(io.loop.stop)
    io.thread.join(10)
    assert not io.thread.is_alive()  # stopped, not closed yet
    try:
        with pytest.raises(RuntimeError):
            io.call_soon(lambda: None)
    finally:
        io.loop.close()
