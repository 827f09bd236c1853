"""The Flight service's range-reader process (``python -m kittiwake.flight.range_worker FD``),
started by :class:`~kittiwake.flight.range_reads.RangeReads`: reads journal ranges with ADBC's
SQLite, read-only, and writes them back as Arrow IPC, each on a thread of its own (the driver
and Arrow's writer run without the GIL). It never opens the journal with Python's sqlite3
(two SQLite copies in one process break each other's locks) and never writes to it.

Exits when its socket ends (the broker closed it, or died).
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import sys
import threading

import pyarrow as pa

from kittiwake.flight.batches import record_batch
from kittiwake.flight.protocol import range_schema
from kittiwake.flight.range_reads import (
    MAX_REQUEST_BYTES,
    RangeAsk,
    WorkerSettings,
    write_frame,
)
from kittiwake.store.journal_range_adbc import AdbcJournalRange
from kittiwake.store.journal_reader import JournalError, JournalRangeError, TopicFilterSet

log = logging.getLogger("kittiwake.flight.range_worker")


def serve(settings: WorkerSettings, ask: RangeAsk, fd: int) -> None:
    """Answer one read on ``fd`` (the write end of its pipe), then close it."""
    try:
        try:
            journal_range = AdbcJournalRange(
                settings.path,
                ask.start,
                ask.end,
                TopicFilterSet(ask.topics),
                settings.selection,
                settings.busy_timeout_ms,
            )
        except JournalRangeError as exc:
            write_frame(fd, {"error": "range", "message": str(exc)})
            return
        except JournalError as exc:
            write_frame(fd, {"error": "journal", "message": str(exc)})
            return
        with journal_range:
            _stream(journal_range, ask, fd)
    except OSError:
        pass  # the broker stopped reading (its client went away): the pipe is closed
    except Exception:
        log.exception("range reader: reading [%d, %d) failed", ask.start, ask.end)
    finally:
        os.close(fd)


def _stream(journal_range: AdbcJournalRange, ask: RangeAsk, fd: int) -> None:
    bounds = journal_range.bounds
    write_frame(
        fd,
        {
            "earliest": bounds.earliest,
            "high_water": bounds.high_water,
            "lost": list(journal_range.lost) if journal_range.lost else None,
        },
    )
    schema = range_schema(
        ask.include_headers, bounds.earliest, bounds.high_water, journal_range.lost
    )
    failure: str | None = None
    sink = open(fd, "wb", closefd=False)  # noqa: SIM115 - the with below closes it
    with sink, pa.ipc.new_stream(pa.PythonFile(sink, "w"), schema) as writer:
        try:
            for chunk in journal_range.chunks():
                writer.write_batch(record_batch(chunk, ask.include_headers))
        except OSError:
            raise  # the pipe: nobody is reading any more
        except Exception as exc:  # the stream still ends well-formed, then says why
            log.exception("range reader: reading [%d, %d) failed", ask.start, ask.end)
            failure = f"the journal read failed: {exc}"
    write_frame(fd, {"error": failure} if failure is not None else {"ok": True})


def main(argv: list[str]) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s range reader: %(message)s"
    )
    control = socket.socket(fileno=int(argv[1]))
    settings: WorkerSettings = pickle.loads(control.recv(MAX_REQUEST_BYTES))
    while True:
        message, fds, _flags, _address = socket.recv_fds(control, MAX_REQUEST_BYTES, 1)
        if not message:
            break  # the broker closed its end, or is gone
        ask: RangeAsk = pickle.loads(message)
        for extra in fds[1:]:
            os.close(extra)
        if not fds:
            continue
        threading.Thread(target=serve, args=(settings, ask, fds[0]), daemon=True).start()
    os._exit(0)  # reads still running end with the process (their pipes close)


if __name__ == "__main__":
    main(sys.argv)
