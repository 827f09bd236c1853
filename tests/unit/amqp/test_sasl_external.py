"""SASL EXTERNAL (RFC 4422 appendix A): offered, first, only when the client showed a verified
certificate that names a user (the listener's tls.certificate_user); the principal is that
name, and the client may not ask to act as anyone else."""

from __future__ import annotations

import pytest
from proton import Described, symbol, ulong

from kittiwake.amqp.frames import FRAME_TYPE_SASL, encode_frame
from kittiwake.amqp.sasl import SaslServer


def init(mechanism: str, response: bytes = b"") -> bytes:
    return encode_frame(FRAME_TYPE_SASL, 0, Described(ulong(0x41), [symbol(mechanism), response]))


def test_external_is_offered_first_only_with_a_certificate_name() -> None:
    assert SaslServer(allow_anonymous=True).mechanisms == ["PLAIN", "ANONYMOUS"]
    assert SaslServer(allow_anonymous=False, certificate_name="alice").mechanisms == [
        "EXTERNAL",
        "PLAIN",
    ]


@pytest.mark.parametrize("response", [b"", b"alice"])
def test_external_authenticates_as_the_certificate_name(response: bytes) -> None:
    server = SaslServer(allow_anonymous=False, certificate_name="alice")
    server.start()
    assert server.receive(init("EXTERNAL", response)).endswith(b"\x50\x00")
    assert server.principal is not None
    assert (server.principal.mechanism, server.principal.username) == ("EXTERNAL", "alice")


@pytest.mark.parametrize(("certificate_name", "response"), [(None, b""), ("alice", b"mallory")])
def test_external_is_refused_without_a_certificate_or_for_another_identity(
    certificate_name: str | None, response: bytes
) -> None:
    server = SaslServer(allow_anonymous=True, certificate_name=certificate_name)
    server.start()
    assert server.receive(init("EXTERNAL", response)).endswith(b"\x50\x01")
    assert server.done and server.principal is None
