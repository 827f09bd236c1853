"""MQTT over WebSockets from a real browser: MQTT.js (npm, tests/browser) in headless
Chromium on a page served from 127.0.0.1, talking to a Kittiwake WebSocket listener while a
paho-mqtt client (websocket transport) exchanges messages with it both ways. A screenshot of
the page is left in the test's directory."""

from __future__ import annotations

import functools
import http.server
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from .brokerproc import BrokerProcess
from .chromium import CHROMIUM, Chromium
from .clients import MQTTv5, PahoClient, unique

BROWSER_DIR = Path(__file__).resolve().parents[1] / "browser"
MQTT_JS = BROWSER_DIR / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"

pytestmark = [
    pytest.mark.skipif(not CHROMIUM, reason="chromium not installed (make browser-deps)"),
    pytest.mark.skipif(not MQTT_JS.exists(), reason="MQTT.js not installed (make browser-deps)"),
]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def page_server() -> Iterator[str]:
    """tests/browser over HTTP on a free loopback port."""
    handler = functools.partial(_QuietHandler, directory=str(BROWSER_DIR))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def chromium() -> Iterator[Chromium]:
    browser = Chromium()
    yield browser
    browser.close()


@pytest.mark.parametrize("version", [4, 5])
def test_mqtt_js_in_chromium_over_websockets(
    broker, page_server: str, chromium: Chromium, tmp_path: Path, version: int
) -> None:
    address: BrokerProcess = broker(listener={"protocol": "websockets"})
    inbox, outbox = unique("browser/inbox"), unique("browser/outbox")
    python = PahoClient(address.address, unique("paho-ws"), protocol=MQTTv5, transport="websockets")
    try:
        python.connect()
        python.subscribe(outbox, 1)
        query = urllib.parse.urlencode(
            {
                "url": f"ws://127.0.0.1:{address.port}/mqtt",
                "version": version,
                "inbox": inbox,
                "outbox": outbox,
            }
        )
        chromium.navigate(f"{page_server}/index.html?{query}")
        assert chromium.wait_for("window.subscribed || window.result") is True, chromium.console
        message = python.get(10)
        assert (message.topic, message.payload) == (outbox, b"hello from chromium")
        python.publish(inbox, b"hello from python", 1)
        received = chromium.wait_for("window.received.length && window.received")
        assert received == [{"topic": inbox, "payload": "hello from python"}]
        shot = chromium.screenshot(tmp_path / f"mqtt-js-v{version}.png")
        assert shot.stat().st_size > 1000
    finally:
        python.stop()
