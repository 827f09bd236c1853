"""The journal's Arrow Flight service: ``do_get`` streams an exact offset range, actions give
the bounds. Runs on gRPC's threads with its own read connections; must never touch the event
loop, the broker's objects or the store's writer.

Every refusal is a Flight error with a sentence the caller can act on; an unexpected failure
is logged and answered as an internal error, never allowed to stop the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pyarrow.flight as flight

from kittiwake.broker.authorization import Authorizer
from kittiwake.config import TLSConfig
from kittiwake.flight.auth import (
    AuthenticationRefused,
    Authenticator,
    credentials_from_headers,
)
from kittiwake.flight.batches import record_batch
from kittiwake.flight.protocol import (
    ACTION_LATEST,
    ACTION_OFFSET_FOR_TIMESTAMP,
    ACTIONS,
    RangeRequest,
    RequestError,
    latest_answer,
    offsets_answer,
    parse_offset_for_timestamp,
    range_schema,
)
from kittiwake.store.journal_reader import JournalError, JournalRange, JournalReader

log = logging.getLogger(__name__)

T = TypeVar("T")
_AUTH_MIDDLEWARE = "auth"


class _Principal(flight.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, name: str) -> None:
        self.name = name


class _AuthMiddlewareFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Checks every call's credentials before its handler runs."""

    def __init__(self, authenticator: Authenticator) -> None:
        super().__init__()
        self._authenticator = authenticator

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> _Principal:
        try:
            credentials = credentials_from_headers(headers)
            return _Principal(self._authenticator.authenticate(credentials))
        except AuthenticationRefused as exc:
            raise flight.FlightUnauthenticatedError(str(exc)) from None


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
    ) -> None:
        self.reader = reader
        self._authorizer = authorizer
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
        super().__init__(
            f"{scheme}://{address}:{port}",
            middleware={_AUTH_MIDDLEWARE: _AuthMiddlewareFactory(authenticator)},
            **options,
        )

    # -- handlers (on gRPC threads) ----------------------------------------------------------

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        def start() -> flight.FlightDataStream:
            request = RangeRequest.from_ticket(ticket.ticket)
            self._check_topics(request.topics)
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

    def _batches(self, journal_range: JournalRange, include_headers: bool) -> Iterator[Any]:
        try:
            for chunk in journal_range.chunks():
                yield record_batch(chunk, include_headers)
        except Exception as exc:
            log.exception("flight: a range read failed")
            raise flight.FlightInternalError(f"the journal read failed: {exc}") from None
        finally:
            journal_range.close()

    def do_action(self, context: Any, action: flight.Action) -> Iterator[flight.Result]:
        kind = action.type
        body = action.body.to_pybytes() if action.body is not None else b""

        def answer() -> list[flight.Result]:
            if kind == ACTION_LATEST:
                bounds = self.reader.bounds()
                return [flight.Result(latest_answer(bounds.earliest, bounds.high_water))]
            if kind == ACTION_OFFSET_FOR_TIMESTAMP:
                wall_time = parse_offset_for_timestamp(body)
                return [flight.Result(offsets_answer(self.reader.offset_for_time(wall_time)))]
            raise RequestError(f"unknown action {kind!r}; this service has {sorted(ACTIONS)}")

        return iter(_answered(f"action {kind!r}", answer))

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return sorted(ACTIONS.items())

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[flight.FlightInfo]:
        return iter(())

    def _check_topics(self, topics: tuple[str, ...]) -> None:
        refused = [t for t in topics if not self._authorizer.may_subscribe(t)]
        if refused:
            raise flight.FlightUnauthorizedError(
                f"reading {refused[0]!r} is not authorised (auth.subscribe_* rules)"
            )


def _answered(what: str, handler: Callable[[], T]) -> T:
    """Run a handler, turning every failure into a Flight error a client can read."""
    try:
        return handler()
    except flight.FlightError:
        raise
    except (RequestError, JournalError) as exc:
        raise flight.FlightServerError(str(exc)) from None
    except Exception as exc:
        log.exception("flight: %s failed", what)
        raise flight.FlightInternalError(f"{what} failed inside the broker: {exc}") from None

