"""The web console in headless Chromium against a real broker with real clients: each page
opened behind HTTP Basic authentication, waited on until it shows the broker's data, saved as
a screenshot under test-output/console/ (git-ignored), and an action (purge) done through it."""

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
from .clients import unique

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


def test_every_console_page_shows_the_broker(
    broker: Callable[..., BrokerProcess],
    paho: Callable[..., Any],
    chromium: Chromium,
    tmp_path: Path,
) -> None:
    users = tmp_path / "users"
    users.write_text(
        format_password_file({"admin": PasswordHash.make("s3cret", log2_n=4)}), encoding="utf-8"
    )
    process = broker(http=True, amqp=True, auth={"password_file": str(users)})
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
    row = (
        "[...document.querySelectorAll('#queues-table tbody tr')]"
        f".find(r => r.cells[0].innerText === '{queue}')"
    )
    assert chromium.wait_for(f"{row} && {row}.cells[2].innerText") == "3"
    chromium.screenshot(SCREENSHOTS / "queues.png")

    def button(label: str) -> str:
        return f"[...{row}.querySelectorAll('button')].find(b => b.innerText === '{label}')"

    # Browsing the queue lists its messages, taking none.
    chromium.evaluate(f"{button('Browse')}.click()")
    entries = "document.querySelectorAll('#entries-table tbody tr')"
    assert chromium.wait_for(f"{entries}.length === 3 && {entries}[0].cells.length > 1")
    assert text_of(chromium, "#entries-table").count("waiting") == 3
    assert chromium.wait_for(f"{row} && {row}.cells[2].innerText") == "3"
    chromium.screenshot(SCREENSHOTS / "queues-browsed.png")
    # The purge action, confirmed as an operator would.
    chromium.evaluate("window.confirm = () => true")
    chromium.evaluate(f"{button('Purge')}.click()")
    chromium.wait_for("document.getElementById('message').innerText.includes('3 messages purged')")
    assert chromium.wait_for(f"{row} && {row}.cells[2].innerText === '0'")
    chromium.screenshot(SCREENSHOTS / "queues-purged.png")
