"""The operators' HTTP listener over real sockets: authentication like every other client,
/metrics with real MQTT and AMQP traffic, the admin API's views and actions (a paho MQTT 5
client sees DISCONNECT 0x98, a proton client's queue is purged)."""

from __future__ import annotations

import base64
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.client import MQTTv5
from prometheus_client.parser import text_string_to_metric_families
from proton import Message, Timeout
from proton.utils import BlockingConnection

from kittiwake.broker.authentication import PasswordHash, format_password_file

from .brokerproc import BrokerProcess
from .clients import unique

ACTION = {"X-Kittiwake-Action": "1"}


def call(
    process: BrokerProcess,
    path: str,
    *,
    method: str = "GET",
    user: tuple[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; an HTTP error status is an answer too."""
    request = urllib.request.Request(
        process.http_url + path, method=method, headers=dict(headers or {})
    )
    if user is not None:
        token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def get_json(process: BrokerProcess, path: str, **kwargs: Any) -> Any:
    status, _headers, body = call(process, path, **kwargs)
    assert status == 200, body
    return json.loads(body)


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition text, by (name, sorted labels)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def users_file(tmp_path: Path, users: dict[str, str]) -> str:
    path = tmp_path / "users"
    path.write_text(
        format_password_file(
            {name: PasswordHash.make(password, log2_n=4) for name, password in users.items()}
        ),
        encoding="utf-8",
    )
    return str(path)


@pytest.fixture
def secured(broker: Callable[..., BrokerProcess], tmp_path: Path) -> BrokerProcess:
    return broker(
        http=True, auth={"password_file": users_file(tmp_path, {"admin": "s3cret"})}
    )


def test_requests_need_valid_credentials_once_users_exist(secured: BrokerProcess) -> None:
    for user in (None, ("admin", "wrong"), ("nobody", "s3cret")):
        status, headers, body = call(secured, "/api/status", user=user)
        assert status == 401, (user, body)
        assert headers["WWW-Authenticate"].startswith("Basic ")
        assert "error" in json.loads(body)
    for path in ("/metrics", "/", "/console/console.js"):
        assert call(secured, path)[0] == 401, path
    assert call(secured, "/console/console.js", user=("admin", "s3cret"))[0] == 200
    status, _headers, body = call(secured, "/api/status", user=("admin", "s3cret"))
    assert status == 200
    assert json.loads(body)["version"]


def test_anonymous_requests_where_the_listener_allows_them(
    broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    process = broker(
        http={"allow_anonymous": True},
        auth={"password_file": users_file(tmp_path, {"admin": "s3cret"})},
    )
    assert call(process, "/api/status")[0] == 200
    # No users at all: open, as for MQTT (DESIGN.md section 5).
    assert call(broker(http=True), "/api/status")[0] == 200


def test_an_action_needs_the_action_header(broker: Callable[..., BrokerProcess]) -> None:
    process = broker(http=True, amqp=True, store={"backend": "memory"})
    status, _headers, body = call(process, "/api/queues/nothing/purge", method="POST")
    assert status == 403, body
    status, _headers, body = call(process, "/api/queues/nothing/purge", method="POST",
                                  headers=ACTION)
    assert status == 404
    assert "nothing" in json.loads(body)["error"]


def test_metrics_count_real_traffic_per_protocol(
    broker: Callable[..., BrokerProcess], paho: Callable[..., Any]
) -> None:
    process = broker(http=True, amqp=True)
    subscriber = paho(process.address)
    topic = unique("metrics")
    subscriber.subscribe(topic, qos=1)
    publisher = paho(process.address)
    for n in range(5):
        publisher.publish(topic, f"m{n}".encode(), qos=1)
    assert len(subscriber.get_many(5)) == 5
    amqp = BlockingConnection(process.amqp_url, timeout=10)
    try:
        queue = unique("mq")
        amqp.create_sender(queue).send(Message(body="to a queue", durable=True))

        def scrape() -> dict[Any, float]:
            status, headers, body = call(process, "/metrics")
            assert status == 200
            assert headers["Content-Type"].startswith("text/plain")
            return metric_values(body.decode())

        values = wait_for(
            lambda: (v := scrape())
            and v.get(("kittiwake_messages_received_total", (("protocol", "amqp"),)), 0) >= 1
            and v,
            what="the AMQP message counted",
        )
    finally:
        amqp.close()
    mqtt = (("protocol", "mqtt"),)
    assert values[("kittiwake_messages_received_total", mqtt)] >= 5
    assert values[("kittiwake_messages_sent_total", mqtt)] >= 5
    assert values[("kittiwake_bytes_received_total", mqtt)] > 0
    assert values[("kittiwake_bytes_sent_total", mqtt)] > 0
    assert values[("kittiwake_bytes_received_total", (("protocol", "amqp"),))] > 0
    assert values[("kittiwake_connections", mqtt)] == 2
    assert values[("kittiwake_queue_depth", (("kind", "queue"), ("queue", queue)))] == 1
    # The persistent publications were committed: the histogram saw them.
    assert values[("kittiwake_store_commit_seconds_count", ())] >= 1
    assert values[("kittiwake_store_commit_seconds_bucket", (("le", "+Inf"),))] == values[
        ("kittiwake_store_commit_seconds_count", ())
    ]
    for name in ("kittiwake_messages_dropped_total", "kittiwake_messages_expired_total",
                 "kittiwake_messages_dead_lettered_total"):
        assert (name, ()) in values


def test_views_show_clients_sessions_subscriptions_and_retained(
    broker: Callable[..., BrokerProcess], paho: Callable[..., Any]
) -> None:
    process = broker(http=True)
    client_id = unique("viewer")
    client = paho(process.address, client_id, protocol=MQTTv5)
    topic = unique("views")
    client.subscribe(f"{topic}/#", qos=1)
    client.publish(f"{topic}/kept", b"retained!", qos=1, retain=True)
    assert client.get().payload == b"retained!"

    clients = get_json(process, "/api/clients")
    (mine,) = [c for c in clients if c["client_id"] == client_id]
    assert mine["protocol"] == "mqtt 5"
    assert mine["peer"].startswith("127.0.0.1:")
    sessions = get_json(process, "/api/sessions")
    assert any(s["client_id"] == client_id and s["connected"] for s in sessions)
    subscriptions = get_json(process, "/api/subscriptions")
    assert {"client_id": client_id, "topic_filter": f"{topic}/#", "max_qos": 1}.items() <= next(
        s for s in subscriptions if s["client_id"] == client_id
    ).items()
    retained = get_json(process, "/api/retained")
    assert {"topic": f"{topic}/kept", "bytes": 9, "qos": 1}.items() <= next(
        r for r in retained if r["topic"] == f"{topic}/kept"
    ).items()
    status = get_json(process, "/api/status")
    assert status["connections"]["mqtt"] == 1
    assert status["retained_messages"] >= 1


def test_disconnect_tells_an_mqtt5_client_administrative_action(
    broker: Callable[..., BrokerProcess], paho: Callable[..., Any]
) -> None:
    process = broker(http=True)
    client_id = unique("kicked")
    client = paho(process.address, client_id, protocol=MQTTv5)
    status, _headers, body = call(
        process, f"/api/clients/{client_id}/disconnect", method="POST", headers=ACTION
    )
    assert status == 200, body
    assert json.loads(body) == {"client_id": client_id, "disconnected": 1}
    assert client.wait_disconnected().reason_code == 0x98
    assert call(process, f"/api/clients/{client_id}/disconnect", method="POST",
                headers=ACTION)[0] == 404


def test_purge_empties_a_queue_and_the_store(broker: Callable[..., BrokerProcess]) -> None:
    process = broker(http=True, amqp=True)
    queue = unique("purged")
    connection = BlockingConnection(process.amqp_url, timeout=10)
    try:
        sender = connection.create_sender(queue)
        for n in range(3):
            sender.send(Message(body=f"m{n}", durable=True))
        queues = get_json(process, "/api/queues")
        assert next(q for q in queues if q["name"] == queue)["depth"] == 3
        status, _headers, body = call(
            process, f"/api/queues/{queue}/purge", method="POST", headers=ACTION
        )
        assert status == 200, body
        assert json.loads(body) == {"queue": queue, "purged": 3}
    finally:
        connection.close()
    # Purged from the store too: nothing comes back after a restart.
    process.stop()
    process.restart()
    connection = BlockingConnection(process.amqp_url, timeout=10)
    try:
        receiver = connection.create_receiver(queue)
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.5)
    finally:
        connection.close()


def test_delete_session_removes_an_offline_persistent_session(
    broker: Callable[..., BrokerProcess], paho: Callable[..., Any]
) -> None:
    process = broker(http=True)
    client_id = unique("offline")
    client = paho(process.address, client_id, clean=False)
    client.subscribe(unique("t"), qos=1)
    status, _h, body = call(process, f"/api/sessions/{client_id}", method="DELETE",
                            headers=ACTION)
    assert status == 409, body  # connected: disconnect first
    client.disconnect()
    wait_for(
        lambda: any(
            s["client_id"] == client_id and not s["connected"]
            for s in get_json(process, "/api/sessions")
        ),
        what="the session to be offline",
    )
    status, _h, body = call(process, f"/api/sessions/{client_id}", method="DELETE",
                            headers=ACTION)
    assert status == 200, body
    assert all(s["client_id"] != client_id for s in get_json(process, "/api/sessions"))
    # Gone from the store: a reconnect finds no session.
    again = paho(process.address, client_id, clean=False, connect=False)
    assert again.connect().session_present is False


def test_only_admins_operate_the_broker_once_acls_exist(
    broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """A device's user must not purge queues: once ACL rules (or admins) are configured, only
    the users and groups named in auth.admins get the console, /metrics and the API."""
    process = broker(
        http=True,
        auth={
            "password_file": users_file(tmp_path, {"olga": "ops", "alice": "lamp"}),
            "groups": [{"name": "operators", "users": ["olga"]}],
            "admins": ["operators"],
            "acl": [{"users": ["alice"], "publish": ["devices/alice/#"]}],
        },
    )
    for path in ("/api/status", "/metrics", "/"):
        status, _headers, body = call(process, path, user=("alice", "lamp"))
        assert status == 403, (path, body)
        assert call(process, path, user=("olga", "ops"))[0] == 200, path
    assert "user alice is not an admin" in process.log_text()


def test_monitors_read_and_only_admins_act(
    broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """auth.monitors: the console, /metrics and the API's views, but no action (403, logged);
    anyone else gets nothing. SIGHUP re-reads both lists."""
    process = broker(
        http=True,
        auth={
            "password_file": users_file(
                tmp_path, {"olga": "ops", "mona": "watch", "alice": "lamp"}
            ),
            "admins": ["olga"],
            "monitors": ["mona"],
        },
    )
    purge = "/api/queues/orders/purge"
    for path in ("/api/status", "/api/queues", "/metrics", "/"):
        assert call(process, path, user=("mona", "watch"))[0] == 200, path
        assert call(process, path, user=("alice", "lamp"))[0] == 403, path
    status, _headers, body = call(
        process, purge, method="POST", user=("mona", "watch"), headers=ACTION
    )
    assert status == 403 and b"read-only" in body, body
    assert call(process, purge, method="POST", user=("olga", "ops"), headers=ACTION)[0] != 403
    assert "user mona is not an admin (read-only monitor)" in process.log_text()

    process.rewrite_config(
        auth={**process.sections["auth"], "admins": ["olga", "mona"], "monitors": []}
    )
    assert process.proc is not None
    process.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "authorisation rules reloaded" in process.log_text(), what="reload")
    status, _headers, body = call(
        process, purge, method="POST", user=("mona", "watch"), headers=ACTION
    )
    assert status != 403, body


def test_browsing_a_queue_shows_its_messages_in_delivery_order_and_takes_none(
    broker: Callable[..., BrokerProcess],
) -> None:
    """The console's and the admin command's browse: the queue's own read-only walk, in the
    order a consumer would get the messages (priority, then arrival), in-flight ones marked
    as such, payloads never shown; browsing twice takes nothing."""
    process = broker(http=True, amqp=True)
    queue = unique("browsed")
    connection = BlockingConnection(process.amqp_url, timeout=10)
    try:
        sender = connection.create_sender(queue)
        for body, priority in (("low", 1), ("high", 9), ("mid", 4), ("low2", 1)):
            sender.send(Message(body=body, durable=True, priority=priority))
        rows = get_json(process, f"/api/queues/{queue}/entries")
        assert [r["priority"] for r in rows] == [9, 4, 1, 1]
        assert [r["state"] for r in rows] == ["waiting"] * 4
        assert all(r["destination"] == queue and r["persistent"] for r in rows)
        first_low, second_low = rows[2]["message_id"], rows[3]["message_id"]
        assert 0 < first_low < second_low  # FIFO inside a priority
        assert all("payload" not in r for r in rows)
        again = get_json(process, f"/api/queues/{queue}/entries")
        without_age = [{k: v for k, v in r.items() if k != "age"} for r in rows]
        assert [{k: v for k, v in r.items() if k != "age"} for r in again] == without_age
        assert len(get_json(process, f"/api/queues/{queue}/entries?limit=2")) == 2
        # A consumer holding the first one without settling it: shown in flight, in its
        # place (the blocking client may have taken credit for one more meanwhile).
        receiver = connection.create_receiver(queue, credit=1)
        received = receiver.receive(timeout=10)
        assert received.body == "high"
        rows = get_json(process, f"/api/queues/{queue}/entries")
        assert [r["priority"] for r in rows] == [9, 4, 1, 1]
        assert rows[0]["state"] == "in flight"
        assert [r["state"] for r in rows[2:]] == ["waiting", "waiting"]
        assert call(process, f"/api/queues/{queue}/entries?limit=0")[0] == 400
        assert call(process, "/api/queues/no-such-queue/entries")[0] == 404
    finally:
        connection.close()
