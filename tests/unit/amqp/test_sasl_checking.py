"""SASL PLAIN whose credential check answers later (the password is hashed off the loop): the
outcome waits for the answer, and what the client pipelined meanwhile is kept, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from proton import Described, symbol, ulong

from kittiwake.amqp.frames import AMQP_HEADER, FRAME_TYPE_SASL, FramingError, encode_frame
from kittiwake.amqp.sasl import MAX_PIPELINED_WHILE_CHECKING, SaslServer

INIT = encode_frame(
    FRAME_TYPE_SASL, 0, Described(ulong(0x41), [symbol("PLAIN"), b"\x00carol\x00secret"])
)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def pending_server(loop: asyncio.AbstractEventLoop) -> tuple[SaslServer, asyncio.Future[bool]]:
    answer: asyncio.Future[bool] = loop.create_future()
    server = SaslServer(allow_anonymous=False, check=lambda user, password: answer)
    server.start()
    return server, answer


@pytest.mark.parametrize("accepted", [True, False])
def test_the_outcome_waits_for_the_check_and_pipelined_bytes_are_kept(
    accepted: bool, loop: asyncio.AbstractEventLoop
) -> None:
    server, answer = pending_server(loop)
    assert server.receive(INIT + AMQP_HEADER[:3]) == b""
    assert server.checking is answer and not server.done
    assert server.receive(AMQP_HEADER[3:]) == b""
    outcome = server.finish_check(accepted)
    assert outcome.endswith(b"\x50\x00" if accepted else b"\x50\x01")
    assert server.done and server.checking is None
    assert (server.principal is not None) is accepted
    if accepted:
        assert server.principal is not None and server.principal.username == "carol"
    assert server.rest == AMQP_HEADER


def test_a_flood_while_checking_is_a_framing_error(loop: asyncio.AbstractEventLoop) -> None:
    server, _ = pending_server(loop)
    server.receive(INIT)
    with pytest.raises(FramingError):
        server.receive(b"\x00" * (MAX_PIPELINED_WHILE_CHECKING + 1))
