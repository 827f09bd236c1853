"""The journal's Arrow Flight service: ``do_get`` streams an exact offset range, actions give
the bounds, ``do_put`` takes the Spark sink's fenced writes. Runs on gRPC's threads: reads use
their own read connections (a range's rows come from the listener's reader process where one
runs, :mod:`kittiwake.flight.range_reads`); writes cross to the event loop only through
:class:`~kittiwake.flight.broker_writes.BrokerWrites`. Must never touch the broker's objects or
the store's writer itself.

Every refusal is a Flight error with a sentence the caller can act on; an unexpected failure
is logged and answered as an internal error, never allowed to stop the server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from kittiwake.broker.authorization import Authorizer
from kittiwake.broker.topics import quoted_topic
from kittiwake.config import LimitsConfig, TLSConfig
from kittiwake.flight.auth import (
    AuthenticationRefused,
    Authenticator,
    Caller,
    credentials_from_headers,
)
from kittiwake.flight.batches import record_batch
from kittiwake.flight.broker_writes import BrokerWrites, WriteFailed, WriteUnanswered
from kittiwake.flight.protocol import (
    ACTION_COMMIT_WRITES,
    ACTION_LATEST,
    ACTION_OFFSET_FOR_TIMESTAMP,
    ACTIONS,
    RangeRequest,
    RequestError,
    WriteAnswer,
    WriteRequest,
    latest_answer,
    offsets_answer,
    parse_commit_writes,
    parse_offset_for_timestamp,
    range_schema,
)
from kittiwake.flight.range_reads import RangeReads, WorkerRange
from kittiwake.flight.writes import WriteRefused, read_rows
from kittiwake.store.journal_range import JournalRange
from kittiwake.store.journal_reader import JournalError, JournalReader

log = logging.getLogger(__name__)

T = TypeVar("T")
_AUTH_MIDDLEWARE = "auth"


class _CallerMiddleware(flight.ServerMiddleware):  # type: ignore[misc]
    def __init__(
        self, caller: Caller | None, refusal: AuthenticationRefused | None = None
    ) -> None:
        # What the headers proved; on a listener that maps client certificates, a refusal
        # waits for the handler (a certificate may name the caller still).
        self.caller = caller
        self.refusal = refusal

    def sending_headers(self) -> dict[str, str] | None:
        # A login (Basic handshake) answers with its token, as Flight's basic-token flow
        # expects: FlightClient.authenticate_basic_token returns this header to send after.
        token = self.caller.issued_token if self.caller is not None else None
        return {"authorization": f"Bearer {token}"} if token is not None else None


class _AuthMiddlewareFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Checks every call's credentials before its handler runs (where client certificates
    name users, a refusal is left to the handler, which alone sees the certificate)."""

    def __init__(self, authenticator: Authenticator, certificates_name_users: bool) -> None:
        super().__init__()
        self._authenticator = authenticator
        self._defer_refusals = certificates_name_users

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> _CallerMiddleware:
        try:
            credentials = credentials_from_headers(headers)
            login = info.method == flight.FlightMethod.HANDSHAKE
            return _CallerMiddleware(self._authenticator.authenticate(credentials, login=login))
        except AuthenticationRefused as exc:
            if self._defer_refusals:
                return _CallerMiddleware(None, exc)
            raise flight.FlightUnauthenticatedError(str(exc)) from None


class _HandshakeInMiddleware(flight.ServerAuthHandler):  # type: ignore[misc]
    """The Handshake call itself: the middleware has checked its credentials (and issued the
    token) before this runs, so there is nothing left to exchange. Without a handler gRPC
    answers every Handshake "unimplemented"."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""  # the legacy per-call token (auth-token-bin) is not used: headers are


class JournalFlightServer(flight.FlightServerBase):  # type: ignore[misc]
    """Binds at construction (``port`` is then the real port); ``shutdown`` stops it."""

    def __init__(
        self,
        host: str,
        port: int,
        reader: JournalReader,
        authenticator: Authenticator,
        authorizer: Authorizer,
        tls: TLSConfig | None = None,
        writes: BrokerWrites | None = None,
        limits: LimitsConfig | None = None,
        range_reads: RangeReads | None = None,
    ) -> None:
        self.reader = reader
        # The reader process that serves range reads; None: they are read on gRPC's threads.
        self._range_reads = range_reads
        self._authorizer = authorizer
        # None: this service takes no writes (puts are refused).
        self._writes = writes
        self._limits = limits or LimitsConfig()
        # Bounds the memory puts hold: a put past it is refused at once (its sender retries).
        self._put_slots = threading.BoundedSemaphore(self._limits.max_concurrent_puts)
        address = f"[{host}]" if ":" in host else host  # an IPv6 literal goes in brackets
        options: dict[str, Any] = {}
        scheme = "grpc"
        if tls is not None and tls.enabled:
            scheme = "grpc+tls"
            certificate = Path(tls.certificate).read_bytes()
            key = Path(tls.key).read_bytes() if tls.key else certificate
            options["tls_certificates"] = [flight.CertKeyPair(certificate, key)]
            if tls.ca:
                options["root_certificates"] = Path(tls.ca).read_bytes()
                options["verify_client"] = tls.require_client_certificate
        # A verified client certificate names the caller (tls.certificate_user = "cn"): gRPC
        # gives its name to a call as the peer identity, but only while no auth handler is
        # installed, and without one a Handshake (a Basic login) is answered "unimplemented".
        # So such a listener takes certificates, Basic on each call and bearer tokens, but
        # issues no tokens; every other listener issues them.
        self._certificates_name_users = (
            tls is not None
            and tls.enabled
            and tls.certificate_user == "cn"
            and tls.require_client_certificate
        )
        if not self._certificates_name_users:
            options["auth_handler"] = _HandshakeInMiddleware()
        factory = _AuthMiddlewareFactory(authenticator, self._certificates_name_users)
        super().__init__(
            f"{scheme}://{address}:{port}",
            middleware={_AUTH_MIDDLEWARE: factory},
            **options,
        )

    # -- handlers (on gRPC threads) ----------------------------------------------------------

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        def start() -> flight.FlightDataStream:
            caller = self._caller(context)
            request = RangeRequest.from_ticket(ticket.ticket)
            self._check_topics(caller, request.topics, context)
            if self._range_reads is not None:
                worker_range = self._range_reads.read(
                    request.start, request.end, request.topics, request.include_headers
                )
                if worker_range is not None:
                    return self._from_worker(worker_range)
            journal_range = self.reader.read(request.start, request.end, request.topics)
            schema = range_schema(
                request.include_headers,
                journal_range.bounds.earliest,
                journal_range.bounds.high_water,
                journal_range.lost,
            )
            if journal_range.lost is not None:
                log.info(
                    "flight: offsets [%d, %d) of a read were dropped by the journal's retention",
                    *journal_range.lost,
                )
            return flight.GeneratorStream(
                schema, self._batches(journal_range, request.include_headers)
            )

        return _answered("do_get", start)

    def _from_worker(self, worker_range: WorkerRange) -> flight.FlightDataStream:
        """The read answered by the reader process: its batches pass through as they are."""
        if worker_range.lost is not None:
            log.info(
                "flight: offsets [%d, %d) of a read were dropped by the journal's retention",
                *worker_range.lost,
            )
        return flight.GeneratorStream(worker_range.schema, self._worker_batches(worker_range))

    def _worker_batches(self, worker_range: WorkerRange) -> Iterator[Any]:
        try:
            yield from worker_range.batches()
        except Exception as exc:
            log.exception("flight: a range read failed")
            raise flight.FlightInternalError(f"the journal read failed: {exc}") from None
        finally:
            worker_range.close()

    def _batches(self, journal_range: JournalRange, include_headers: bool) -> Iterator[Any]:
        try:
            for chunk in journal_range.chunks():
                yield record_batch(chunk, include_headers)
        except Exception as exc:
            log.exception("flight: a range read failed")
            raise flight.FlightInternalError(f"the journal read failed: {exc}") from None
        finally:
            journal_range.close()

    def do_put(
        self,
        context: Any,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        """One fenced unit: every row of the put is published, with its fence, in one commit;
        or, when the unit was taken before, nothing is (the answer says which)."""

        def put() -> None:
            caller = self._caller(context)
            writes = self._require_writes()
            if descriptor.descriptor_type != flight.DescriptorType.CMD:
                raise RequestError("a put's descriptor must be a command (a write request)")
            request = WriteRequest.from_descriptor(descriptor.command)
            if not self._put_slots.acquire(blocking=False):
                raise flight.FlightUnavailableError(
                    f"the broker is taking {self._limits.max_concurrent_puts} puts already "
                    "(limits.max_concurrent_puts); retry"
                )
            try:
                apply(writes, request, caller)
            except WriteRefused as exc:
                log.info(
                    "flight user %s, writer %s, %s: publishing to %s refused: not authorised",
                    _user_text(caller),
                    quoted_topic(request.writer),
                    context.peer(),
                    quoted_topic(exc.topic),
                )
                raise
            finally:
                self._put_slots.release()

        def apply(writes: BrokerWrites, request: WriteRequest, caller: Caller) -> None:
            limits = self._limits
            # The caller's own publish rights (its ACLs), as for any publishing client.
            permissions = self._authorizer.permissions(caller.user, "")
            rows = read_rows(
                (chunk.data for chunk in reader),
                reader.schema,
                permissions.may_publish,
                limits.max_put_rows,
                limits.max_put_bytes,
                limits.max_topic_levels,
            )
            already = writes.write(request.writer, request.batch, request.partition, rows)
            if already:
                log.info(
                    "flight: writer %s batch %d partition %d was committed before; "
                    "nothing published",
                    request.writer,
                    request.batch,
                    request.partition,
                )
            writer.write(pa.py_buffer(WriteAnswer(len(rows), already).to_bytes()))

        _answered("do_put", put)

    def _require_writes(self) -> BrokerWrites:
        if self._writes is None:
            raise RequestError("this flight service takes no writes")
        return self._writes

    def do_action(self, context: Any, action: flight.Action) -> Iterator[flight.Result]:
        kind = action.type
        body = action.body.to_pybytes() if action.body is not None else b""

        def answer() -> list[flight.Result]:
            self._caller(context)
            if kind == ACTION_COMMIT_WRITES:
                writer_id, batch, finished = parse_commit_writes(body)
                self._require_writes().commit(writer_id, batch, finished=finished)
                return [flight.Result(b"{}")]
            if kind == ACTION_LATEST:
                bounds = self.reader.bounds()
                return [flight.Result(latest_answer(bounds.earliest, bounds.high_water))]
            if kind == ACTION_OFFSET_FOR_TIMESTAMP:
                wall_time = parse_offset_for_timestamp(body)
                return [flight.Result(offsets_answer(self.reader.offset_for_time(wall_time)))]
            raise RequestError(f"unknown action {kind!r}; this service has {sorted(ACTIONS)}")

        return iter(_answered(f"action {kind!r}", answer))

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        self._caller(context)
        return sorted(ACTIONS.items())

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[flight.FlightInfo]:
        self._caller(context)
        return iter(())

    def _caller(self, context: Any) -> Caller:
        """Who the call acts as: the name its verified client certificate proves, where the
        listener says certificates name users (that wins, as on MQTT); else what its headers
        proved in the middleware."""
        if self._certificates_name_users:
            identity = context.peer_identity()
            if identity:
                return Caller(bytes(identity).decode("utf-8", "replace"))
        middleware = context.get_middleware(_AUTH_MIDDLEWARE)
        if middleware is None:  # pragma: no cover - the middleware runs on every call
            raise flight.FlightUnauthenticatedError("the call was not authenticated")
        if middleware.refusal is not None:
            raise flight.FlightUnauthenticatedError(str(middleware.refusal))
        caller: Caller = middleware.caller
        return caller

    def _check_topics(self, caller: Caller, topics: tuple[str, ...], context: Any) -> None:
        """A journal read cannot be filtered per message: every topic a filter can match must
        be readable by the caller (its own ACLs, as for any subscriber). A refusal is logged
        with the user and address (a read names no client id)."""
        permissions = self._authorizer.permissions(caller.user, "")
        refused = [t for t in topics if not permissions.may_subscribe_wholly(t)]
        if refused:
            log.info(
                "flight user %s, %s: reading %s refused: not authorised",
                _user_text(caller),
                context.peer(),
                quoted_topic(refused[0]),
            )
            raise flight.FlightUnauthorizedError(
                f"reading {refused[0]!r} is not authorised (auth.subscribe_* rules, ACLs)"
            )


def _user_text(caller: Caller) -> str:
    return quoted_topic(caller.user) if caller.user is not None else "(anonymous)"


def _answered(what: str, handler: Callable[[], T]) -> T:
    """Run a handler, turning every failure into a Flight error a client can read."""
    try:
        return handler()
    except flight.FlightError:
        raise
    except WriteRefused as exc:
        raise flight.FlightUnauthorizedError(str(exc)) from None
    except (RequestError, JournalError) as exc:
        raise flight.FlightServerError(str(exc)) from None
    except WriteUnanswered as exc:
        raise flight.FlightTimedOutError(f"{exc}; retry the write (it is fenced)") from None
    except WriteFailed as exc:
        raise flight.FlightUnavailableError(f"{exc}; retry the write (it is fenced)") from None
    except Exception as exc:
        log.exception("flight: %s failed", what)
        raise flight.FlightInternalError(f"{what} failed inside the broker: {exc}") from None

