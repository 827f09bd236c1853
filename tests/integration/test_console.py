"""The web console in headless Chromium against a real broker with real clients: each page
opened behind HTTP Basic authentication, waited on until it shows the broker's data, saved as
a screenshot under test-output/console/ (git-ignored), and its actions (purge a queue,
disconnect a client, delete an offline session) done through it."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection

from kittiwake.broker.authentication import PasswordHash, format_password_file

from .brokerproc import BrokerProcess
from .chromium import CHROMIUM, Chromium
from .clients import MQTTv5, unique, wait_until
from .test_http import get_json

pytestmark = pytest.mark.skipif(not CHROMIUM, reason="chromium not installed (make browser-deps)")

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "console"


@pytest.fixture
def chromium() -> Iterator[Chromium]:
    browser = Chromium()
    yield browser
    browser.close()


def text_of(chromium: Chromium, selector: str) -> str:
    return str(chromium.evaluate(f"document.querySelector({json.dumps(selector)}).innerText"))


def open_page(chromium: Chromium, url: str, page: str) -> None:
    chromium.navigate(f"{url}/#{page}")
    chromium.wait_for(f"document.body.dataset.loaded === {json.dumps(page)}")


def row_of(table: str, client_id: str) -> str:
    """A JavaScript expression: the row of ``table`` whose first cell is ``client_id``
    (looked up afresh each time: the console redraws its tables every second)."""
    return (
        f"[...document.querySelectorAll('#{table} tbody tr')]"
        f".find(r => r.cells[0].innerText === {json.dumps(client_id)})"
    )


def click(chromium: Chromium, row: str, label: str) -> None:
    """Click the ``label`` button of ``row`` once it is shown, confirming its question."""
    button = f"[...({row}).querySelectorAll('button')].find(b => b.innerText === '{label}')"
    chromium.wait_for(f"!!({row}) && !!({button})")
    chromium.evaluate("window.confirm = () => true")
    chromium.evaluate(f"{button}.click()")


def admin_users(tmp_path: Path) -> str:
    """A password file with one user, admin / s3cret (cheap hashing: a test)."""
    users = tmp_path / "users"
    users.write_text(
        format_password_file({"admin": PasswordHash.make("s3cret", log2_n=4)}), encoding="utf-8"
    )
    return str(users)


def test_every_console_page_shows_the_broker(
    broker: Callable[..., BrokerProcess],
    paho: Callable[..., Any],
    chromium: Chromium,
    tmp_path: Path,
) -> None:
    process = broker(http=True, amqp=True, auth={"password_file": admin_users(tmp_path)})
    client_id = unique("console")
    topic = unique("console/topic")
    client = paho(process.address, client_id, username="admin", password="s3cret")
    client.subscribe(f"{topic}/#", qos=1)
    client.publish(f"{topic}/kept", b"retained for the console", qos=1, retain=True)
    queue = unique("console-queue")
    amqp = BlockingConnection(process.amqp_url, timeout=10, user="admin", password="s3cret")
    try:
        sender = amqp.create_sender(queue)
        for n in range(3):
            sender.send(Message(body=f"m{n}", durable=True))
    finally:
        amqp.close()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    url = process.http_url

    # (Without credentials the console is refused like any client: see test_http.py.)
    chromium.call(
        "Emulation.setDeviceMetricsOverride",
        width=1280,
        height=900,
        deviceScaleFactor=1,
        mobile=False,
    )
    token = base64.b64encode(b"admin:s3cret").decode()
    chromium.call("Network.enable")
    chromium.call("Network.setExtraHTTPHeaders", headers={"Authorization": f"Basic {token}"})

    open_page(chromium, url, "overview")
    # The throughput ring fills once a second: wait until the graph has a few samples.
    chromium.wait_for("document.getElementById('graph-messages').dataset.samples >= 3")
    overview = text_of(chromium, "#status")
    assert "Sessions" in overview and "Messages received" in overview
    # The "in" line is drawn (its colour is on the canvas).
    assert chromium.evaluate(
        "(() => { const d = document.getElementById('graph-messages').getContext('2d')"
        ".getImageData(0, 0, 900, 200).data; for (let i = 0; i < d.length; i += 4)"
        " if (d[i] === 31 && d[i + 1] === 119 && d[i + 2] === 180) return true; return false; })()"
    )
    chromium.screenshot(SCREENSHOTS / "overview.png")

    open_page(chromium, url, "clients")
    chromium.wait_for(f"document.getElementById('clients-table').innerText.includes('{client_id}')")
    assert "mqtt 3.1.1" in text_of(chromium, "#clients-table")
    chromium.screenshot(SCREENSHOTS / "clients.png")

    open_page(chromium, url, "sessions")
    subscriptions = text_of(chromium, "#subscriptions-table")
    assert f"{topic}/#" in subscriptions and client_id in subscriptions
    assert client_id in text_of(chromium, "#sessions-table")
    chromium.screenshot(SCREENSHOTS / "sessions.png")

    open_page(chromium, url, "retained")
    assert f"{topic}/kept" in text_of(chromium, "#retained-table")
    chromium.screenshot(SCREENSHOTS / "retained.png")

    open_page(chromium, url, "queues")
    row = row_of("queues-table", queue)
    assert chromium.wait_for(f"{row} && {row}.cells[2].innerText") == "3"
    chromium.screenshot(SCREENSHOTS / "queues.png")

    # Browsing the queue lists its messages, taking none.
    click(chromium, row, "Browse")
    entries = "document.querySelectorAll('#entries-table tbody tr')"
    assert chromium.wait_for(f"{entries}.length === 3 && {entries}[0].cells.length > 1")
    assert text_of(chromium, "#entries-table").count("waiting") == 3
    assert chromium.wait_for(f"{row} && {row}.cells[2].innerText") == "3"
    chromium.screenshot(SCREENSHOTS / "queues-browsed.png")
    # The purge action, confirmed as an operator would.
    click(chromium, row, "Purge")
    chromium.wait_for("document.getElementById('message').innerText.includes('3 messages purged')")
    assert chromium.wait_for(f"{row} && {row}.cells[2].innerText === '0'")
    chromium.screenshot(SCREENSHOTS / "queues-purged.png")


def test_disconnect_and_delete_session_from_the_console(
    broker: Callable[..., BrokerProcess],
    paho: Callable[..., Any],
    chromium: Chromium,
    tmp_path: Path,
) -> None:
    """An operator disconnects a connected client and deletes an offline persistent session
    with the console's buttons: the page says so and drops the rows, the API agrees, the
    client was told why (MQTT 5: 0x98) and the session is gone when its client comes back."""
    process = broker(http=True, auth={"password_file": admin_users(tmp_path)})
    admin = ("admin", "s3cret")
    login = {"username": "admin", "password": "s3cret"}
    online_id, offline_id = unique("console-online"), unique("console-offline")
    online = paho(process.address, online_id, protocol=MQTTv5, **login)
    topic = unique("console/kept-for")
    offline = paho(process.address, offline_id, clean=False, **login)
    offline.subscribe(topic, qos=1)
    offline.disconnect()
    online.publish(topic, b"waits in the offline session", qos=1)
    assert wait_until(
        lambda: any(
            s["client_id"] == offline_id and not s["connected"] and s["queued"] == 1
            for s in get_json(process, "/api/sessions", user=admin)
        ),
        timeout=10,
        interval=0.1,
    ), get_json(process, "/api/sessions", user=admin)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    token = base64.b64encode(b"admin:s3cret").decode()
    chromium.call("Network.enable")
    chromium.call("Network.setExtraHTTPHeaders", headers={"Authorization": f"Basic {token}"})
    url = process.http_url

    open_page(chromium, url, "clients")
    online_row = row_of("clients-table", online_id)
    click(chromium, online_row, "Disconnect")
    chromium.wait_for(
        "document.getElementById('message').innerText"
        f".includes({json.dumps(f'{online_id}: 1 connection(s) closed')})"
    )
    chromium.wait_for(f"!({online_row})")
    chromium.screenshot(SCREENSHOTS / "clients-disconnected.png")
    assert online.wait_disconnected().reason_code == 0x98  # administrative action
    assert all(c["client_id"] != online_id for c in get_json(process, "/api/clients", user=admin))

    open_page(chromium, url, "sessions")
    offline_row = row_of("sessions-table", offline_id)
    click(chromium, offline_row, "Delete")
    chromium.wait_for(
        "document.getElementById('message').innerText"
        f".includes({json.dumps(f'session {offline_id} deleted')})"
    )
    chromium.wait_for(f"!({offline_row})")
    chromium.screenshot(SCREENSHOTS / "sessions-deleted.png")
    sessions = get_json(process, "/api/sessions", user=admin)
    assert all(s["client_id"] != offline_id for s in sessions)
    # Its client finds no session and no message waiting for it.
    back = paho(process.address, offline_id, clean=False, **login)
    assert not back.session_present
    back.no_message()
