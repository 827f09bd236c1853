"""The Flight service's range reads, served by a reader process of its own
(:mod:`kittiwake.flight.range_worker`): the broker keeps the call (authentication, the
request's checks, the stream to gRPC), the worker reads the rows with ADBC's SQLite, which
fills Arrow in C without the broker's GIL, and streams them back as Arrow IPC over a pipe.
ADBC links its own SQLite, which must never open the journal in the broker's process (see
:mod:`kittiwake.store.journal_range_adbc`); in another process it reads beside the writer as
any reader does.

One worker process, reading each request on a thread of its own. A request goes over a
socket (its parameters, pickled, and the write end of a fresh pipe); the answer comes on the
pipe: a header frame (the bounds the read's transaction saw, or the refusal), the IPC stream
of the data source's batches, then a trailer frame saying the stream is whole. A worker that
died is started again and the read asked once more (reads change nothing); a stream cut short
is an error, never a short answer.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

import kittiwake
from kittiwake.store.journal_reader import JournalError, JournalRangeError
from kittiwake.store.journal_selection import JournalSelection

log = logging.getLogger(__name__)

# A frame: its length (4 bytes, big-endian), then that much JSON.
_FRAME_LENGTH = struct.Struct(">I")
_MAX_FRAME = 1 << 20
# Largest request message (its topic filters, pickled): well within a socket's default send
# buffer, which bounds one SOCK_SEQPACKET message. A larger one is not sent (read() says so).
MAX_REQUEST_BYTES = 1 << 16
# Linux's F_SETPIPE_SZ: a bigger pipe, fewer switches between the two processes per batch.
_F_SETPIPE_SZ = 1031
_PIPE_BYTES = 1 << 20
# How long a stopping worker may take to exit before it is killed.
_STOP_SECONDS = 5


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What a worker is started with (sent pickled on its socket, first)."""

    path: str
    selection: JournalSelection
    busy_timeout_ms: int


@dataclass(frozen=True, slots=True)
class RangeAsk:
    """One range read, as the broker asks it."""

    start: int
    end: int
    topics: tuple[str, ...]
    include_headers: bool


def write_frame(fd: int, answer: dict[str, Any]) -> None:
    data = json.dumps(answer).encode()
    write_all(fd, _FRAME_LENGTH.pack(len(data)) + data)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_frame(read: Callable[[int], bytes]) -> dict[str, Any] | None:
    """The next frame ``read`` gives (at most n bytes per call, b"" at the end of file),
    None at the end of file (the worker is gone)."""
    head = _read_exactly(read, _FRAME_LENGTH.size)
    if head is None:
        return None
    (length,) = _FRAME_LENGTH.unpack(head)
    if length > _MAX_FRAME:
        raise JournalError(f"the range reader sent a frame of {length} bytes")
    body = _read_exactly(read, length)
    if body is None:
        return None
    answer: dict[str, Any] = json.loads(body)
    return answer


def _read_exactly(read: Callable[[int], bytes], size: int) -> bytes | None:
    parts: list[bytes] = []
    left = size
    while left:
        part = read(left)
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


class WorkerRange:
    """One answered read: its bounds and lost part, then its batches (once)."""

    def __init__(self, fd: int, header: dict[str, Any]) -> None:
        self.earliest = int(header["earliest"])
        self.high_water = int(header["high_water"])
        lost = header.get("lost")
        self.lost: tuple[int, int] | None = (int(lost[0]), int(lost[1])) if lost else None
        try:
            # A buffered file reads whole messages (a pipe's reads may come short); a batch is
            # a couple of reads, not a call per row. It owns the pipe: a range gRPC drops
            # unread closes it when collected, and its worker's thread stops at its next write.
            self._file = open(fd, "rb")  # noqa: SIM115 - closed by close()
        except Exception:
            os.close(fd)
            raise
        try:
            self._reader = pa.ipc.open_stream(pa.PythonFile(self._file, "r"))
        except Exception as exc:
            self._file.close()
            raise JournalError(f"the range reader's answer is unreadable: {exc}") from exc
        self.schema: pa.Schema = self._reader.schema

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The read's batches; raises JournalError when the stream was cut short."""
        try:
            try:
                yield from self._reader
            except (pa.ArrowException, OSError) as exc:
                raise JournalError(f"the range reader's stream broke: {exc}") from exc
            # From the buffered file: it may hold the trailer already.
            trailer = read_frame(self._file.read)
            if trailer is None:
                raise JournalError("the range reader stopped before the end of the range")
            if "error" in trailer:
                raise JournalError(str(trailer["error"]))
        finally:
            self.close()

    def close(self) -> None:
        """Closing before the end stops the worker's read (its next write fails)."""
        self._file.close()


class _Worker:
    def __init__(self, settings: WorkerSettings) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        # The worker imports this very kittiwake, however the broker found it.
        source = str(Path(kittiwake.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kittiwake.flight.range_worker", str(child.fileno())],
                pass_fds=[child.fileno()],
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.socket = parent
        self.lock = threading.Lock()
        # A worker that died at once is seen at the first read, and started again.
        with contextlib.suppress(OSError):
            parent.sendall(pickle.dumps(settings))

    def ask(self, ask: bytes, fd: int) -> None:
        with self.lock:
            socket.send_fds(self.socket, [ask], [fd])

    def stop(self) -> None:
        self.socket.close()  # the worker exits at the end of its socket
        try:
            self.process.wait(_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class RangeReads:
    """The reader worker of one Flight listener: started by :meth:`start`, started again
    when it dies, stopped by :meth:`stop`."""

    def __init__(self, path: str | Path, selection: JournalSelection, busy_timeout_ms: int):
        self._settings = WorkerSettings(str(path), selection, busy_timeout_ms)
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._stopped = False

    def start(self) -> None:
        self._current()

    @property
    def pid(self) -> int | None:
        """The worker's process id (None before the first start)."""
        worker = self._worker
        return worker.process.pid if worker is not None else None

    def read(
        self, start: int, end: int, topics: tuple[str, ...], include_headers: bool
    ) -> WorkerRange | None:
        """Offsets [start, end) on these filters; raises JournalRangeError when ``end`` is past
        the committed high-water mark, JournalError when the journal cannot be read. None when
        the filters are too long to send (the caller reads the range itself)."""
        if start < 0 or end < start:
            raise JournalRangeError(f"[{start}, {end}) is not a range of offsets")
        ask = pickle.dumps(RangeAsk(start, end, topics, include_headers))
        if len(ask) > MAX_REQUEST_BYTES:
            return None
        for _attempt in range(2):
            worker = self._current()
            readable, writable = os.pipe()
            try:
                # Where the system's limit is lower, the default pipe works.
                with contextlib.suppress(OSError):
                    fcntl.fcntl(writable, _F_SETPIPE_SZ, _PIPE_BYTES)
                try:
                    worker.ask(ask, writable)
                finally:
                    os.close(writable)
                # Exact reads on the pipe itself: nothing after the header is taken.
                header = read_frame(functools.partial(os.read, readable))
            except OSError:
                header = None
            if header is None:
                os.close(readable)
                log.warning("flight: the range reader process ended; starting it again")
                self._replace(worker)
                continue
            if "error" in header:
                os.close(readable)
                refused = JournalRangeError if header["error"] == "range" else JournalError
                raise refused(str(header["message"]))
            return WorkerRange(readable, header)
        raise JournalError("the range reader process ended twice while reading; see its log")

    def _current(self) -> _Worker:
        with self._lock:
            if self._stopped:
                raise JournalError("the flight service is stopping")
            if self._worker is None:
                self._worker = _Worker(self._settings)
            return self._worker

    def _replace(self, failed: _Worker) -> None:
        with self._lock:
            if self._worker is failed:
                self._worker = None
        failed.process.kill()
        failed.stop()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()
