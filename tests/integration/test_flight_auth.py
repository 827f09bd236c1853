"""Who may use the Flight listener, over the network with pyarrow's own Flight client: Flight's
Basic login (``authenticate_basic_token``) issues a bearer token that later calls send; tokens
expire after auth.token_lifetime and end with their user's password; reads and writes follow
the caller's own ACLs; a verified client certificate names the caller where the listener says
so; the Spark client logs in once and again when its token is refused.

The broker runs in-process on a manual clock, so expiry is tested without sleeping.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

pa = pytest.importorskip("pyarrow")
flight = pytest.importorskip("pyarrow.flight")

from kittiwake.app import BrokerApp  # noqa: E402
from kittiwake.clock import ManualClock  # noqa: E402
from kittiwake.config import config_from_dict  # noqa: E402
from kittiwake.flight.protocol import (  # noqa: E402
    WRITE_SCHEMA,
    RangeRequest,
    WriteAnswer,
    WriteRequest,
    parse_latest_answer,
)
from kittiwake.spark import client as spark_client  # noqa: E402
from kittiwake.spark.client import JournalClient  # noqa: E402
from kittiwake.spark.options import SourceOptions  # noqa: E402

from .certificates import PKI, make_pki  # noqa: E402
from .test_users import kittiwake_passwd  # noqa: E402

T = TypeVar("T")
LIFETIME = 600.0
# spark may read sensors/# and publish out/#; nobody else gets anything (ACLs deny the rest).
ACL = [
    {"users": ["spark"], "subscribe": ["sensors/#"], "publish": ["out/#"]},
    {"users": ["alice"], "subscribe": ["alice/#"]},
]


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("flight-users") / "users"
    kittiwake_passwd(path, "spark", "executor")
    kittiwake_passwd(path, "viewer", "looking")
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("flight-pki"))


class Running:
    """An in-process broker with a flight listener, driven from the test's thread."""

    def __init__(self, app: BrokerApp, clock: ManualClock, loop: asyncio.AbstractEventLoop):
        self.app = app
        self.clock = clock
        self.loop = loop
        host, port = app.addresses[0]
        scheme = "grpc+tls" if app.config.listeners[0].tls.enabled else "grpc"
        self.url = f"{scheme}://{'localhost' if scheme == 'grpc+tls' else host}:{port}"


def run_app(
    config: dict[str, Any], body: Callable[[Running], Awaitable[None]]
) -> None:
    clock = ManualClock()

    async def main() -> None:
        app = BrokerApp(config_from_dict(config), clock=clock)
        await app.start()
        try:
            await asyncio.wait_for(body(Running(app, clock, asyncio.get_running_loop())), 60)
        finally:
            await app.stop()

    asyncio.run(main())


def base_config(tmp: Path, users: Path, **listener: Any) -> dict[str, Any]:
    return {
        "listeners": [{"protocol": "flight", "port": 0, **listener}, {"port": 0}],
        "auth": {"password_file": str(users), "token_lifetime": LIFETIME, "acl": ACL},
        "store": {"data_dir": str(tmp / "data")},
        "journal": {"retention_seconds": 3600},
        "sys": {"interval": 0},
    }


def call(function: Callable[..., T], *args: Any) -> Awaitable[T]:
    """A blocking Flight call, off the broker's loop (which must keep serving it)."""
    return asyncio.to_thread(function, *args)


def connect(url: str, **tls: Any) -> Any:
    return flight.connect(url, **tls)


def latest(url: str, headers: list[tuple[bytes, bytes]], **tls: Any) -> tuple[int, int]:
    client = connect(url, **tls)
    try:
        options = flight.FlightCallOptions(headers=headers)
        (result,) = list(client.do_action(flight.Action("latest", b""), options))
        return parse_latest_answer(result.body.to_pybytes())[0]
    finally:
        client.close()


def login(url: str, user: str, password: str) -> tuple[bytes, bytes]:
    client = connect(url)
    try:
        name, value = client.authenticate_basic_token(user, password)
        return bytes(name), bytes(value)
    finally:
        client.close()


def read(url: str, headers: list[tuple[bytes, bytes]], topics: tuple[str, ...], **tls: Any) -> int:
    client = connect(url, **tls)
    try:
        options = flight.FlightCallOptions(headers=headers)
        ticket = flight.Ticket(RangeRequest(1, 1, topics).to_ticket())  # empty, but checked
        return int(client.do_get(ticket, options).read_all().num_rows)
    finally:
        client.close()


def put(url: str, headers: list[tuple[bytes, bytes]], topic: str, writer: str) -> WriteAnswer:
    client = connect(url)
    try:
        options = flight.FlightCallOptions(headers=headers)
        descriptor = flight.FlightDescriptor.for_command(
            WriteRequest(writer, 0, 0).to_descriptor()
        )
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([topic]),
                pa.array([b"x"], pa.binary()),
                pa.array([1], pa.int32()),
                pa.array([False]),
                pa.nulls(1, WRITE_SCHEMA.field("properties").type),
            ],
            schema=WRITE_SCHEMA,
        )
        writer_stream, answers = client.do_put(descriptor, WRITE_SCHEMA, options)
        try:
            writer_stream.write_batch(batch)
            writer_stream.done_writing()
            answer = answers.read()
        finally:
            writer_stream.close()
        return WriteAnswer.from_bytes(answer.to_pybytes())
    finally:
        client.close()


def basic(user: str, password: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", b"Basic " + base64.b64encode(f"{user}:{password}".encode()))]


def test_a_basic_login_issues_a_bearer_token_that_later_calls_send(
    tmp_path: Path, users: Path
) -> None:
    async def body(broker: Running) -> None:
        name, value = await call(login, broker.url, "spark", "executor")
        assert name == b"authorization" and value.startswith(b"Bearer ")
        assert await call(latest, broker.url, [(name, value)]) == (1, 1)
        with pytest.raises(flight.FlightUnauthenticatedError, match="bad user name or password"):
            await call(login, broker.url, "spark", "wrong")
        forged = [(b"authorization", b"Bearer " + base64.urlsafe_b64encode(b"x" * 32))]
        with pytest.raises(flight.FlightUnauthenticatedError, match="not one this broker issued"):
            await call(latest, broker.url, forged)
        with pytest.raises(flight.FlightUnauthenticatedError):  # users exist: no anonymous
            await call(latest, broker.url, [])
        # Basic on every call keeps working (older clients), and issues nothing.
        issued = len(broker.app.flight_tokens)
        assert issued == 1  # the login above
        assert await call(latest, broker.url, basic("spark", "executor")) == (1, 1)
        assert len(broker.app.flight_tokens) == issued

    run_app(base_config(tmp_path, users), body)


def test_a_token_expires_after_the_configured_lifetime(tmp_path: Path, users: Path) -> None:
    async def body(broker: Running) -> None:
        header = [await call(login, broker.url, "spark", "executor")]
        broker.clock.advance(LIFETIME - 1)
        assert await call(latest, broker.url, header) == (1, 1)
        broker.clock.advance(2)
        with pytest.raises(flight.FlightUnauthenticatedError, match="expired"):
            await call(latest, broker.url, header)
        again = [await call(login, broker.url, "spark", "executor")]
        assert again != header
        assert await call(latest, broker.url, again) == (1, 1)

    run_app(base_config(tmp_path, users), body)


def test_a_changed_password_or_a_removed_user_ends_its_tokens(tmp_path: Path) -> None:
    path = tmp_path / "users"
    kittiwake_passwd(path, "spark", "executor")
    kittiwake_passwd(path, "viewer", "looking")

    async def body(broker: Running) -> None:
        spark = [await call(login, broker.url, "spark", "executor")]
        viewer = [await call(login, broker.url, "viewer", "looking")]
        await call(kittiwake_passwd, path, "spark", "changed")
        await call(kittiwake_passwd, path, "viewer", None)
        await broker.app.reload_users()
        with pytest.raises(flight.FlightUnauthenticatedError, match="changed its password"):
            await call(latest, broker.url, spark)
        with pytest.raises(flight.FlightUnauthenticatedError, match="removed"):
            await call(latest, broker.url, viewer)
        assert await call(latest, broker.url, [await call(login, broker.url, "spark", "changed")])

    run_app(base_config(tmp_path, path), body)


@pytest.mark.parametrize("how", ["token", "basic"])
def test_reads_and_writes_follow_the_callers_own_acls(
    tmp_path: Path, users: Path, how: str
) -> None:
    """The rules naming the user apply to a journal read as to any subscriber, and to a put as
    to any publisher; another user gets nothing."""

    async def headers(url: str, user: str, password: str) -> list[tuple[bytes, bytes]]:
        if how == "basic":
            return basic(user, password)
        return [await call(login, url, user, password)]

    async def body(broker: Running) -> None:
        spark = await headers(broker.url, "spark", "executor")
        viewer = await headers(broker.url, "viewer", "looking")
        assert await call(read, broker.url, spark, ("sensors/#",)) == 0
        with pytest.raises(flight.FlightUnauthorizedError, match="not authorised"):
            await call(read, broker.url, spark, ("#",))
        with pytest.raises(flight.FlightUnauthorizedError, match="not authorised"):
            await call(read, broker.url, viewer, ("sensors/#",))
        answer = await call(put, broker.url, spark, "out/a", "acl-writer-1")
        assert answer.rows == 1 and not answer.already_committed
        with pytest.raises(flight.FlightUnauthorizedError, match="not authorised"):
            await call(put, broker.url, spark, "sensors/a", "acl-writer-2")
        with pytest.raises(flight.FlightUnauthorizedError, match="not authorised"):
            await call(put, broker.url, viewer, "out/a", "acl-writer-3")

    run_app(base_config(tmp_path, users), body)


def test_refused_reads_and_writes_are_logged_with_user_address_and_topic(
    tmp_path: Path, users: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One log line per refusal: the user, the caller's address, the topic, and for a write
    the writer id (what names a Flight client; a read carries none)."""
    import logging

    async def body(broker: Running) -> None:
        spark = basic("spark", "executor")
        with pytest.raises(flight.FlightUnauthorizedError):
            await call(read, broker.url, spark, ("secret/#",))
        with pytest.raises(flight.FlightUnauthorizedError):
            await call(put, broker.url, spark, "sensors/a", "logged-writer")

    with caplog.at_level(logging.INFO, "kittiwake.flight.server"):
        run_app(base_config(tmp_path, users), body)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    [read_line] = [line for line in lines if "reading" in line]
    assert "user 'spark', ipv4:127.0.0.1:" in read_line and "'secret/#'" in read_line
    [write_line] = [line for line in lines if "publishing" in line]
    assert "user 'spark', writer 'logged-writer', ipv4:127.0.0.1:" in write_line
    assert "'sensors/a'" in write_line


@pytest.fixture
def fresh_logins() -> Iterator[None]:
    """The Spark client's per-process tokens, emptied around the test."""
    spark_client._LOGINS.clear()
    yield
    spark_client._LOGINS.clear()


def test_the_spark_client_logs_in_once_and_again_when_its_token_is_refused(
    tmp_path: Path, users: Path, fresh_logins: None
) -> None:
    async def body(broker: Running) -> None:
        options = SourceOptions.parse(
            {"url": broker.url, "username": "spark", "password": "executor", "topics": "sensors/#"}
        )
        tokens = broker.app.flight_tokens
        assert await call(JournalClient(options).bounds) == (1, 1)
        assert await call(JournalClient(options).bounds) == (1, 1)
        assert len(tokens) == 1, "one login per process, not one per call"
        (first,) = spark_client._LOGINS.values()
        broker.clock.advance(LIFETIME + 1)
        assert await call(JournalClient(options).bounds) == (1, 1)
        (second,) = spark_client._LOGINS.values()
        assert second != first and second[1].startswith(b"Bearer ")
        assert await call(lambda: list(JournalClient(options).read(1, 1))) == []

        wrong = SourceOptions.parse({"url": broker.url, "username": "spark", "password": "no"})
        with pytest.raises(flight.FlightUnauthenticatedError):
            await call(JournalClient(wrong).bounds)

    run_app(base_config(tmp_path, users), body)


def test_a_client_certificate_names_the_caller_where_the_listener_says_so(
    tmp_path: Path, users: Path, pki: PKI
) -> None:
    """tls.certificate_user = "cn" on a flight listener: the verified certificate's name is
    the user (no password asked, anonymous off), and that user's ACLs apply."""
    tls = {
        "certificate": str(pki.server.certificate),
        "key": str(pki.server.key),
        "ca": str(pki.ca),
        "require_client_certificate": True,
        "certificate_user": "cn",
    }
    client_tls = {
        "tls_root_certs": pki.ca.read_bytes(),
        "cert_chain": pki.alice.certificate.read_bytes(),
        "private_key": pki.alice.key.read_bytes(),
    }

    async def body(broker: Running) -> None:
        assert await call(lambda: latest(broker.url, [], **client_tls)) == (1, 1)
        assert await call(lambda: read(broker.url, [], ("alice/#",), **client_tls)) == 0
        with pytest.raises(flight.FlightUnauthorizedError, match="not authorised"):
            await call(lambda: read(broker.url, [], ("sensors/#",), **client_tls))
        # The certificate wins over a password, as on MQTT listeners.
        with pytest.raises(flight.FlightUnauthorizedError, match="not authorised"):
            await call(
                lambda: read(broker.url, basic("spark", "executor"), ("sensors/#",), **client_tls)
            )

    config = base_config(tmp_path, users, tls=tls, allow_anonymous=False)
    run_app(config, body)
