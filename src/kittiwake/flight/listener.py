"""Starts and stops the journal's Flight service for the broker app; must never import pyarrow
before a flight listener is configured (so the broker runs without the ``flight`` extra).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from kittiwake.broker.authentication import Authentication
from kittiwake.broker.authorization import Authorizer
from kittiwake.broker.fenced_writes import FencedWrites
from kittiwake.clock import MonotonicClock
from kittiwake.config import LimitsConfig, TLSConfig
from kittiwake.flight.auth import (
    DEFAULT_TOKEN_LIFETIME,
    Authenticator,
    BearerTokens,
    UsersAuthenticator,
)
from kittiwake.flight.broker_writes import BrokerWrites
from kittiwake.store.journal_reader import JournalReader
from kittiwake.store.journal_selection import JournalSelection

if TYPE_CHECKING:
    from kittiwake.flight.range_reads import RangeReads
    from kittiwake.flight.server import JournalFlightServer

log = logging.getLogger(__name__)


class FlightUnavailable(RuntimeError):
    """A flight listener cannot start; the message says what to install or configure."""


def require_pyarrow() -> None:
    if importlib.util.find_spec("pyarrow") is None:
        raise FlightUnavailable(
            "a flight listener is configured but pyarrow is not installed: "
            "pip install 'kittiwake[flight]' (or remove the [[listeners]] protocol = \"flight\")"
        )


class FlightListener:
    """One Flight server; binding and shutting down run off the event loop."""

    def __init__(
        self,
        host: str,
        port: int,
        data_dir: str | Path,
        selection: JournalSelection,
        authorizer: Authorizer,
        authentication: Authentication | None = None,
        allow_anonymous: bool | None = None,
        authenticator: Authenticator | None = None,
        tls: TLSConfig | None = None,
        *,
        fenced_writes: FencedWrites | None = None,
        limits: LimitsConfig | None = None,
        tokens: BearerTokens | None = None,
    ) -> None:
        require_pyarrow()
        self.host = host
        self.port = port
        self._reader = JournalReader(data_dir, selection)
        self._authorizer = authorizer
        # The bearer tokens logins issue; the app shares one table between its flight
        # listeners, so a token from one is good on the others.
        # (Not ``tokens or ...``: an empty table is falsy.)
        if tokens is None:
            tokens = BearerTokens(DEFAULT_TOKEN_LIFETIME, MonotonicClock().now)
        self.tokens = tokens
        self._authenticator = authenticator or UsersAuthenticator(
            authentication or Authentication(), allow_anonymous, self.tokens
        )
        self._tls = tls
        # The core's fenced writes (the Spark sink's puts); None: puts are refused.
        self._fenced_writes = fenced_writes
        self._limits = limits or LimitsConfig()
        self._server: JournalFlightServer | None = None
        self._range_reads: RangeReads | None = None

    def _start_range_reads(self) -> RangeReads | None:
        """The reader process serving range reads, where ADBC's SQLite driver is installed
        (the ``flight`` extra has it); without it ranges are read on gRPC's threads."""
        if importlib.util.find_spec("adbc_driver_sqlite") is None:
            return None
        from kittiwake.flight.range_reads import RangeReads

        reader = self._reader
        range_reads = RangeReads(reader.path, reader.selection, reader.busy_timeout_ms)
        range_reads.start()
        return range_reads

    async def start(self) -> tuple[str, int]:
        from kittiwake.flight.server import JournalFlightServer

        writes = None
        if self._fenced_writes is not None:
            # Puts are applied on this loop, the broker's.
            writes = BrokerWrites(asyncio.get_running_loop(), self._fenced_writes)

        def bind() -> JournalFlightServer:
            self._range_reads = self._start_range_reads()
            return JournalFlightServer(
                self.host,
                self.port,
                self._reader,
                self._authenticator,
                self._authorizer,
                self._tls,
                writes,
                self._limits,
                self._range_reads,
            )

        try:
            self._server = await asyncio.to_thread(bind)
        except Exception as exc:  # pyarrow reports a taken port as a generic error
            await asyncio.to_thread(self._stop_range_reads)
            raise OSError(f"flight listener on {self.host}:{self.port}: {exc}") from exc
        self.port = int(self._server.port)
        scheme = "grpc+tls" if self._tls is not None and self._tls.enabled else "grpc"
        # Says which read path serves do_get: operators comparing read speeds need to know
        # whether the ADBC reader process is there or the slower in-process fallback.
        if self._range_reads is not None:
            reads = f"range reads in reader process {self._range_reads.pid}"
        else:
            reads = "range reads in-process (adbc-driver-sqlite not installed)"
        log.info("Flight listening on %s://%s:%s; %s", scheme, self.host, self.port, reads)
        return self.host, self.port

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            # Waits for calls in progress; a stuck client cannot hold the broker's stop forever.
            try:
                await asyncio.wait_for(asyncio.to_thread(server.shutdown), 30)
            finally:
                await asyncio.to_thread(self._stop_range_reads)

    def _stop_range_reads(self) -> None:
        range_reads, self._range_reads = self._range_reads, None
        if range_reads is not None:
            range_reads.stop()
