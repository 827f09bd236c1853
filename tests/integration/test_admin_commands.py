"""The ``kittiwake`` admin commands run as subprocesses against a real broker: tables, --json,
the password from the environment, and clear errors when the broker is unreachable or
refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection

from kittiwake.broker.authentication import PasswordHash, format_password_file

from .brokerproc import SRC_DIR, BrokerProcess, refusing_port
from .clients import unique


def kittiwake(*args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KITTIWAKE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC_DIR), env.get("PYTHONPATH")) if p)
    if password is not None:
        env["KITTIWAKE_PASSWORD"] = password
    return subprocess.run(
        [sys.executable, "-m", "kittiwake", *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


@pytest.fixture
def secured(broker: Callable[..., BrokerProcess], tmp_path: Path) -> BrokerProcess:
    users = tmp_path / "users"
    users.write_text(
        format_password_file({"admin": PasswordHash.make("s3cret", log2_n=4)}), encoding="utf-8"
    )
    return broker(http=True, amqp=True, auth={"password_file": str(users)})


def test_tables_and_json_against_a_running_broker(
    secured: BrokerProcess, paho: Callable[..., Any]
) -> None:
    url = secured.http_url
    client_id = unique("cli")
    client = paho(secured.address, client_id, username="admin", password="s3cret")
    topic = unique("cli/retained")
    client.publish(topic, b"hello", qos=1, retain=True)
    queue = unique("cliq")
    connection = BlockingConnection(
        secured.amqp_url, timeout=10, user="admin", password="s3cret"
    )
    try:
        sender = connection.create_sender(queue)
        sender.send(Message(body="one", durable=True))
        sender.send(Message(body="two", durable=True))
    finally:
        connection.close()

    common = ("--url", url, "--user", "admin")
    status = kittiwake("status", *common, password="s3cret")
    assert status.returncode == 0, status.stderr
    assert "version" in status.stdout and "connections" in status.stdout

    clients = kittiwake("clients", *common, password="s3cret")
    assert clients.returncode == 0, clients.stderr
    header, _rule, *rows = clients.stdout.splitlines()
    assert header.split()[:2] == ["CLIENT", "ID"]
    assert any(row.split()[0] == client_id for row in rows)

    retained = kittiwake("retained", *common, "--json", password="s3cret")
    assert retained.returncode == 0, retained.stderr
    assert {"topic": topic, "bytes": 5}.items() <= next(
        r for r in json.loads(retained.stdout) if r["topic"] == topic
    ).items()

    queues = kittiwake("queues", *common, password="s3cret")
    assert queues.returncode == 0, queues.stderr
    (line,) = [row for row in queues.stdout.splitlines() if row.startswith(queue + " ")]
    assert line.split()[1:3] == ["queue", "2"]

    browse = kittiwake("browse", queue, *common, password="s3cret")
    assert browse.returncode == 0, browse.stderr
    header, _rule, *rows = browse.stdout.splitlines()
    assert header.split()[:3] == ["MESSAGE", "ID", "DESTINATION"]
    assert [row.split()[1:3] for row in rows] == [[queue, "waiting"], [queue, "waiting"]]

    purge = kittiwake("purge", queue, *common, password="s3cret")
    assert purge.returncode == 0, purge.stderr
    assert purge.stdout.strip() == f"queue {queue}: 2 messages purged"

    subscriptions = kittiwake("subscriptions", *common, "--json", password="s3cret")
    assert subscriptions.returncode == 0
    assert isinstance(json.loads(subscriptions.stdout), list)


def test_a_refused_login_and_an_unknown_queue_are_explained(secured: BrokerProcess) -> None:
    url = secured.http_url
    anonymous = kittiwake("status", "--url", url)
    assert anonymous.returncode == 1
    assert "HTTP 401" in anonymous.stderr and "--user" in anonymous.stderr
    wrong = kittiwake("status", "--url", url, "--user", "admin", password="wrong")
    assert wrong.returncode == 1
    assert "bad user name or password" in wrong.stderr
    missing = kittiwake("purge", "no-such-queue", "--url", url, "--user", "admin",
                        password="s3cret")
    assert missing.returncode == 1
    assert "no queue 'no-such-queue'" in missing.stderr and "HTTP 404" in missing.stderr


def test_an_unreachable_broker_is_explained() -> None:
    with refusing_port() as port:
        url = f"http://127.0.0.1:{port}"
        result = kittiwake("queues", "--url", url)
    assert result.returncode == 1
    assert f"cannot reach the broker at {url}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_monitor_reads_and_is_told_clearly_it_may_not_act(
    broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    users = tmp_path / "users"
    users.write_text(
        format_password_file({"mona": PasswordHash.make("watch", log2_n=4)}), encoding="utf-8"
    )
    process = broker(http=True, auth={"password_file": str(users), "monitors": ["mona"]})
    url = process.http_url
    status = kittiwake("status", "--url", url, "--user", "mona", password="watch")
    assert status.returncode == 0, status.stderr
    purge = kittiwake("purge", "orders", "--url", url, "--user", "mona", password="watch")
    assert purge.returncode == 1
    assert "HTTP 403" in purge.stderr and "read-only" in purge.stderr, purge.stderr
    assert "mona" in purge.stderr and "Traceback" not in purge.stderr
