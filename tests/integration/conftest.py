"""Fixtures for the integration suite: real broker processes and real clients, all cleaned up.

* ``broker(**sections)`` starts a broker with config overrides (one dict per TOML table, e.g.
  ``broker(limits={"max_packet_size": 1024}, sys={"interval": 0.5})``) and returns a
  :class:`BrokerProcess`, which unpacks as ``(host, port)``.
* ``module_broker`` is one default broker shared by a test module; a module can override
  the ``module_broker_config`` fixture to configure it.
* ``paho``, ``raw`` and ``mosquitto_sub`` create clients that are closed on teardown.

When a test fails, the log of every broker it used is attached to the report.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    import kittiwake  # noqa: F401
except ImportError:  # run without PYTHONPATH=src or an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from .brokerproc import BrokerProcess
from .clients import MosquittoSub, PahoClient, unique
from .rawclient import RawClient


class _BrokerFactory:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.started: list[BrokerProcess] = []

    def __call__(
        self, *, flight: bool = False, listener: dict[str, Any] | None = None, **sections: Any
    ) -> BrokerProcess:
        process = BrokerProcess(
            self.base / f"broker{len(self.started)}", flight=flight, listener=listener, **sections
        )
        self.started.append(process)
        return process.start()

    def stop_all(self) -> None:
        for process in self.started:
            process.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Start a dedicated broker with the given config sections (stopped after the test)."""
    factory = _BrokerFactory(tmp_path)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def module_broker_config() -> dict[str, Any]:
    """Config sections for ``module_broker``; override in a test module to change them."""
    return {}


@pytest.fixture(scope="module")
def module_broker(
    tmp_path_factory: pytest.TempPathFactory, module_broker_config: dict[str, Any]
) -> Iterator[BrokerProcess]:
    """One broker for the whole module, for tests that do not depend on global state."""
    process = BrokerProcess(tmp_path_factory.mktemp("broker"), **module_broker_config)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def address(module_broker: BrokerProcess) -> tuple[str, int]:
    """The shared broker's (host, port); fails the test at once if the broker died."""
    assert module_broker.alive(), f"the module broker died:\n{module_broker.log_text()[-5000:]}"
    return module_broker.address


@pytest.fixture
def paho() -> Iterator[Callable[..., PahoClient]]:
    """``paho(address, client_id=None, protocol=MQTTv311, clean=True, connect=True, **kw)``."""
    made: list[PahoClient] = []

    def make(
        addr: tuple[str, int], client_id: str | None = None, *, protocol: int = 4,
        clean: bool = True, connect: bool = True, manual_ack: bool = False, **connect_kwargs: Any,
    ) -> PahoClient:
        client = PahoClient(
            tuple(addr),  # type: ignore[arg-type]
            unique("paho") if client_id is None else client_id,
            protocol=protocol, clean=clean, manual_ack=manual_ack,
        )
        made.append(client)
        if connect:
            client.connect(**connect_kwargs)
        return client

    yield make
    for client in made:
        with contextlib.suppress(Exception):  # teardown must reach every client
            client.stop()


@pytest.fixture
def raw() -> Iterator[Callable[..., RawClient]]:
    """``raw(address, version=4, tls=None)``: an unconnected :class:`RawClient`."""
    made: list[RawClient] = []

    def make(
        addr: tuple[str, int], version: int = 4, timeout: float = 5.0, **kwargs: Any
    ) -> RawClient:
        client = RawClient(tuple(addr), version, timeout, **kwargs)  # type: ignore[arg-type]
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def mosquitto_sub() -> Iterator[Callable[..., MosquittoSub]]:
    """``mosquitto_sub(address, topics, version=..., qos=..., extra=[...])``, not yet waited on."""
    made: list[MosquittoSub] = []

    def make(addr: tuple[str, int], topics: list[str], **kwargs: Any) -> MosquittoSub:
        sub = MosquittoSub(tuple(addr), topics, **kwargs)  # type: ignore[arg-type]
        made.append(sub)
        return sub

    yield make
    for sub in made:
        sub.stop()


class Bystander:
    """A subscriber and a publisher connected before a test misbehaves on another connection;
    :meth:`check` proves they still work, i.e. one client's punishment stayed its own."""

    def __init__(self, address: tuple[str, int], paho: Callable[..., PahoClient]) -> None:
        from .clients import MQTTv5

        self.topic = unique("bystander")
        self.sub = paho(address)
        self.pub = paho(address, protocol=MQTTv5)
        self.sub.subscribe(self.topic, 1)
        self.checks = 0

    def check(self) -> None:
        self.checks += 1
        payload = f"unaffected {self.checks}".encode()
        self.pub.publish(self.topic, payload, 1)
        message = self.sub.get()
        assert message.payload == payload, "the bystander's subscription was disturbed"
        assert self.sub.client.is_connected() and self.pub.client.is_connected()


@pytest.fixture
def bystander(address: tuple[str, int], paho: Callable[..., PahoClient]) -> Bystander:
    """Two well-behaved clients on the module broker, connected for the whole test."""
    return Bystander(address, paho)


def _brokers_of(item: pytest.Item) -> list[BrokerProcess]:
    found: list[BrokerProcess] = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, BrokerProcess):
            found.append(value)
        elif isinstance(value, _BrokerFactory):
            found.extend(value.started)
    if "address" in getattr(item, "funcargs", {}):
        module = item.funcargs.get("module_broker")
        if isinstance(module, BrokerProcess) and module not in found:
            found.append(module)
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and call.when in ("setup", "call"):
        for process in _brokers_of(item):
            text = process.log_text()
            if len(text) > 30_000:
                text = "...\n" + text[-30_000:]
            report.sections.append((f"kittiwake broker log (port {process.port})", text))
