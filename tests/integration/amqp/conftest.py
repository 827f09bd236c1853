"""Fixtures for the AMQP tests: a module broker with an AMQP listener beside its MQTT one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from proton.utils import BlockingConnection

from ..brokerproc import BrokerProcess, amqp_module_broker, closing_all, live_amqp_url


@pytest.fixture(scope="module")
def amqp_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker (memory store) with AMQP and MQTT listeners for the whole module."""
    with amqp_module_broker(
        tmp_path_factory.mktemp("amqp-broker"), max_delivery_attempts=3
    ) as process:
        yield process


@pytest.fixture
def amqp_url(amqp_broker: BrokerProcess) -> str:
    return live_amqp_url(amqp_broker)


@pytest.fixture
def amqp(amqp_url: str) -> Iterator[Callable[..., BlockingConnection]]:
    """``amqp()``: a new BlockingConnection to the module broker, closed after the test."""

    def connect(**kwargs: Any) -> BlockingConnection:
        return BlockingConnection(amqp_url, timeout=10, **kwargs)

    with closing_all(connect) as tracked:
        yield tracked
