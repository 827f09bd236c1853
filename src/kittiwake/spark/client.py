"""The data source's side of the Flight conversation: bounds and exact range reads, and the
sink's fenced puts and commits, retried while the broker restarts. Runs on the driver (bounds,
commits) and on executors (reads, puts); knows no Spark.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from kittiwake.flight.protocol import (
    ACTION_COMMIT_WRITES,
    ACTION_LATEST,
    ACTION_OFFSET_FOR_TIMESTAMP,
    PARTITION,
    WRITE_SCHEMA,
    RangeRequest,
    WriteAnswer,
    WriteRequest,
    commit_writes_body,
    lost_range,
    parse_latest_answer,
    parse_offsets_answer,
)
from kittiwake.spark.options import ConnectionOptions, SinkOptions, SourceOptions

log = logging.getLogger(__name__)

T = TypeVar("T")
# Errors that mean "the broker is not there right now" (restarting): worth another try.
_TRANSIENT = (flight.FlightUnavailableError, flight.FlightTimedOutError)
_RETRY_PAUSE = 0.25


class DataLossError(RuntimeError):
    """Offsets the query must read were dropped by the journal's retention."""


def data_loss_message(lost: tuple[int, int]) -> str:
    return (
        f"offsets [{lost[0]}, {lost[1]}) of partition {PARTITION} were dropped by the journal's "
        "retention before they were read. Raise journal.retention_seconds / retention_bytes on "
        "the broker, or set failOnDataLoss=false to skip what is gone."
    )


# Tokens this process got by logging in, per (url, user, password digest): a Spark
# executor's Python worker runs task after task and logs in once, not once per call.
_LOGINS: dict[tuple[str, str, bytes], tuple[bytes, bytes]] = {}
_LOGINS_LOCK = threading.Lock()


class _FlightCaller:
    """Calls to the flight listener with the options' credentials, each on a connection of its
    own, retried while the broker is unreachable; cheap to make, never shared across threads.

    A ``token`` is sent as given. A user name and password log in once (Flight's Basic
    handshake, ``authenticate_basic_token``) and the bearer token the broker issues is sent
    instead of the password; when the broker refuses it (expired, or the broker restarted),
    the caller logs in again once and repeats the call.
    """

    def __init__(self, options: ConnectionOptions) -> None:
        self._url = options.url
        self._retry_timeout_ms = options.retry_timeout_ms
        self._fixed: flight.FlightCallOptions | None = None
        self._login: tuple[str, str] | None = None
        # The last call's credentials came from a login it made itself (so a refusal is the
        # password's, not an old token's: logging in again would not help).
        self._logged_in_now = False
        if options.token is not None:
            header = (b"authorization", f"Bearer {options.token}".encode())
            self._fixed = flight.FlightCallOptions(headers=[header])
        elif options.username is not None:
            self._login = (options.username, options.password or "")
        else:
            self._fixed = flight.FlightCallOptions()

    def _login_key(self) -> tuple[str, str, bytes]:
        assert self._login is not None
        user, password = self._login
        return self._url, user, hashlib.sha256(password.encode("utf-8")).digest()

    def _call_options(self, connection: Any) -> flight.FlightCallOptions:
        """The options a call sends: the token, or the bearer token of this process's login
        (logging in on ``connection`` first when there is none yet)."""
        if self._fixed is not None:
            return self._fixed
        key = self._login_key()
        with _LOGINS_LOCK:
            header = _LOGINS.get(key)
        self._logged_in_now = header is None
        if header is None:
            user, password = self._login or ("", "")
            try:
                name, value = connection.authenticate_basic_token(user, password)
            except NotImplementedError:
                name, value = b"", b""  # a listener that takes no logins
            if name and value:
                header = (bytes(name), bytes(value))
            else:
                # No token issued: send Basic on every call instead.
                pair = base64.b64encode(f"{user}:{password}".encode())
                header = (b"authorization", b"Basic " + pair)
            with _LOGINS_LOCK:
                _LOGINS[key] = header
        return flight.FlightCallOptions(headers=[header])

    def _forget_login(self) -> bool:
        """Drop this process's token so the next call logs in again; False when that cannot
        help (a fixed token, no credentials, or a refusal of the login itself)."""
        if self._login is None or self._logged_in_now:
            return False
        with _LOGINS_LOCK:
            _LOGINS.pop(self._login_key(), None)
        return True

    def _retried(self, call: Callable[[Any, flight.FlightCallOptions], T]) -> T:
        deadline = time.monotonic() + self._retry_timeout_ms / 1000
        logged_in_again = False
        while True:
            try:
                connection = flight.connect(self._url)
                try:
                    return call(connection, self._call_options(connection))
                finally:
                    connection.close()
            except flight.FlightUnauthenticatedError:
                if logged_in_again or not self._forget_login():
                    raise
                logged_in_again = True
                log.info("kittiwake at %s refused the login's token; logging in again", self._url)
            except _TRANSIENT as exc:
                if time.monotonic() >= deadline:
                    raise
                log.info("kittiwake at %s unreachable (%s); retrying", self._url, exc)
                time.sleep(_RETRY_PAUSE)


class JournalClient(_FlightCaller):
    """Bounds and exact range reads of the journal."""

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        self.options = options

    def bounds(self) -> tuple[int, int]:
        """(earliest, high_water) of the journal now."""

        def ask(connection: Any, call_options: flight.FlightCallOptions) -> tuple[int, int]:
            (result,) = list(connection.do_action(flight.Action(ACTION_LATEST, b""), call_options))
            return parse_latest_answer(result.body.to_pybytes())[PARTITION]

        return self._retried(ask)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        body = f'{{"timestamp_ms": {int(timestamp_ms)}}}'.encode()

        def ask(connection: Any, call_options: flight.FlightCallOptions) -> int:
            (result,) = list(
                connection.do_action(flight.Action(ACTION_OFFSET_FOR_TIMESTAMP, body), call_options)
            )
            return parse_offsets_answer(result.body.to_pybytes())[PARTITION]

        return self._retried(ask)

    def read(self, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """The rows of [start, end) on the option's topics, as record batches.

        A broker restart mid-read resumes after the last offset received. A part the
        retention dropped fails the read (failOnDataLoss) or is skipped with a warning.
        """
        options = self.options
        deadline = time.monotonic() + options.retry_timeout_ms / 1000
        logged_in_again = False
        next_start = start
        while next_start < end:
            request = RangeRequest(
                next_start, end, options.topics, PARTITION, options.include_headers
            )
            try:
                connection = flight.connect(options.url)
                try:
                    reader = connection.do_get(
                        flight.Ticket(request.to_ticket()), self._call_options(connection)
                    )
                    lost = lost_range(reader.schema.metadata)
                    if lost is not None:
                        if options.fail_on_data_loss:
                            raise DataLossError(data_loss_message(lost))
                        log.warning("skipping: %s", data_loss_message(lost))
                    for chunk in reader:
                        batch = chunk.data
                        if batch.num_rows:
                            next_start = batch.column(2)[-1].as_py() + 1
                            yield batch.replace_schema_metadata(None)
                    return
                finally:
                    connection.close()
            except flight.FlightUnauthenticatedError:
                if logged_in_again or not self._forget_login():
                    raise
                logged_in_again = True  # the read resumes after its last row, as below
                log.info("kittiwake at %s refused the login's token; logging in again", options.url)
            except _TRANSIENT as exc:
                if time.monotonic() >= deadline:
                    raise
                log.info("kittiwake at %s unreachable (%s); retrying", options.url, exc)
                time.sleep(_RETRY_PAUSE)


class SinkClient(_FlightCaller):
    """The sink's fenced puts (executors) and batch commits (driver).

    A put is retried whole, on a new connection, while the broker is unreachable or has not
    confirmed it: the unit is fenced, so a put the broker had applied before the failure is
    answered "already committed" and publishes nothing the second time.
    """

    def __init__(self, options: SinkOptions) -> None:
        super().__init__(options)

    def put(self, request: WriteRequest, batches: Iterable[pa.RecordBatch]) -> WriteAnswer:
        """Send ``batches`` as one unit, streamed as they come (the broker converts them while
        Spark still produces the rest); the answer comes once the unit is committed. The
        batches sent are kept, so a retry sends the unit again whole."""
        descriptor = flight.FlightDescriptor.for_command(request.to_descriptor())
        source = iter(batches)
        sent: list[pa.RecordBatch] = []

        def every_batch() -> Iterator[pa.RecordBatch]:
            yield from list(sent)
            for batch in source:
                sent.append(batch)
                yield batch

        def send(connection: Any, call_options: flight.FlightCallOptions) -> WriteAnswer:
            writer, answers = connection.do_put(descriptor, WRITE_SCHEMA, call_options)
            try:
                for batch in every_batch():
                    writer.write_batch(batch)
                writer.done_writing()
                answer = answers.read()
            finally:
                writer.close()
            if answer is None:
                raise flight.FlightInternalError("the broker answered the put with nothing")
            return WriteAnswer.from_bytes(answer.to_pybytes())

        return self._retried(send)

    def commit(self, writer: str, batch: int, *, finished: bool = False) -> None:
        body = commit_writes_body(writer, batch, finished)
        action = flight.Action(ACTION_COMMIT_WRITES, body)

        def send(connection: Any, call_options: flight.FlightCallOptions) -> None:
            list(connection.do_action(action, call_options))

        self._retried(send)
