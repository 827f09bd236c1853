"""The SASL layer of an AMQP connection (AMQP 1.0 section 5.3), server side, in Python: the
PyPI build of python-qpid-proton has no Cyrus SASL, and its built-in server offers neither PLAIN
nor a way to check credentials. Sans-IO: bytes in, bytes out; never decides who may do what
beyond "who is this" (the credential check is a hook, which may answer later: a password hash
must never run on the event loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from proton import UNDESCRIBED, Array, Data, Described, symbol, ubyte, ulong

from kittiwake.amqp.frames import (
    FRAME_HEADER,
    FRAME_TYPE_SASL,
    MIN_FRAME_SIZE,
    SASL_INIT,
    SASL_MECHANISMS,
    SASL_OUTCOME,
    FramingError,
    decode_performative,
    encode_frame,
)

if TYPE_CHECKING:
    import asyncio

# Largest SASL frame accepted; the spec's floor for any frame before open (section 5.3.1).
MAX_SASL_FRAME_SIZE = 512
# Bytes a client may send after its sasl-init while the credentials are being checked (a
# pipelining client's AMQP header, open, begin, attach...); more is a framing error.
MAX_PIPELINED_WHILE_CHECKING = 64 * 1024

PLAIN = "PLAIN"
ANONYMOUS = "ANONYMOUS"
# The identity the TLS layer proved (RFC 4422 appendix A): offered only when the listener maps
# client certificates to users (tls.certificate_user) and the client showed a verified one.
EXTERNAL = "EXTERNAL"

# Checks a username and password; True = authenticated, or a future of that when the answer
# needs slow work (hashing a password, off the loop). The one hook for the authentication
# service (DESIGN.md section 5); None accepts any PLAIN credentials (no users configured).
CredentialCheck = Callable[[str, str], "bool | asyncio.Future[bool]"]


class SaslCode(Enum):
    """sasl-code (section 5.3.3.6)."""

    OK = 0
    AUTH = 1
    SYS = 2
    SYS_PERM = 3
    SYS_TEMP = 4


@dataclass(frozen=True, slots=True)
class Principal:
    """Who authenticated, and how; ``username`` is None for ANONYMOUS."""

    mechanism: str
    username: str | None


class SaslServer:
    """Offers mechanisms, reads the client's sasl-init, answers with an outcome.

    Feed it the bytes after the SASL protocol header with :meth:`receive`; it returns what to
    send. Once :attr:`done`, :attr:`principal` says who (None: refused) and :attr:`rest` holds
    the bytes that followed the exchange (the start of the AMQP layer).
    """

    __slots__ = (
        "_buffer",
        "_check",
        "_checked_user",
        "allow_anonymous",
        "certificate_name",
        "checking",
        "done",
        "principal",
        "rest",
    )

    def __init__(
        self,
        *,
        allow_anonymous: bool,
        check: CredentialCheck | None = None,
        certificate_name: str | None = None,
    ) -> None:
        self.allow_anonymous = allow_anonymous
        # The user the client's verified TLS certificate names (EXTERNAL); None: no such.
        self.certificate_name = certificate_name
        self._check = check
        self._buffer = b""
        self.done = False
        self.principal: Principal | None = None
        self.rest = b""
        # The credential check's answer while it is being worked out (see finish_check).
        self.checking: asyncio.Future[bool] | None = None
        self._checked_user = ""

    @property
    def mechanisms(self) -> list[str]:
        offered = [PLAIN, ANONYMOUS] if self.allow_anonymous else [PLAIN]
        # First: a client that can use the certificate it already showed picks it.
        return [EXTERNAL, *offered] if self.certificate_name is not None else offered

    def start(self) -> bytes:
        """The server's first frame: sasl-mechanisms."""
        symbols = [symbol(m) for m in self.mechanisms]
        offered = Array(UNDESCRIBED, Data.SYMBOL, *symbols)  # type: ignore[arg-type]
        return encode_frame(FRAME_TYPE_SASL, 0, Described(ulong(SASL_MECHANISMS), [offered]))

    def receive(self, data: bytes) -> bytes:
        """Follow the client's frames; returns the bytes to send (the outcome, once)."""
        if self.done or self.checking is not None:
            self.rest += data
            if self.checking is not None and len(self.rest) > MAX_PIPELINED_WHILE_CHECKING:
                raise FramingError("too much data before the SASL outcome")
            return b""
        self._buffer += data
        if len(self._buffer) < MIN_FRAME_SIZE:
            return b""
        size, offset, frame_type, _channel = FRAME_HEADER.unpack_from(self._buffer)
        if frame_type != FRAME_TYPE_SASL:
            raise FramingError(f"expected a SASL frame, got frame type {frame_type}")
        if not MIN_FRAME_SIZE <= size <= MAX_SASL_FRAME_SIZE or offset < 2 or offset * 4 > size:
            raise FramingError(f"bad SASL frame header (size {size}, data offset {offset})")
        if len(self._buffer) < size:
            return b""
        body = self._buffer[offset * 4 : size]
        self.rest = self._buffer[size:]
        self._buffer = b""
        performative = decode_performative(body)
        if performative.descriptor not in (SASL_INIT, symbol("amqp:sasl-init:list")):
            raise FramingError(f"expected sasl-init, got {performative.descriptor!r}")
        value = performative.value
        assert isinstance(value, list)  # decode_performative checked it
        fields = [*value, None, None, None]
        mechanism, response = fields[0], fields[1]
        initial = response if isinstance(response, bytes) else b""
        principal = self._authenticate(str(mechanism or ""), initial)
        if self.checking is not None:
            return b""  # the outcome comes from finish_check
        return self._outcome(principal)

    def finish_check(self, accepted: bool) -> bytes:
        """The credential check that was :attr:`checking` answered: the outcome to send."""
        self.checking = None
        return self._outcome(Principal(PLAIN, self._checked_user) if accepted else None)

    def _outcome(self, principal: Principal | None) -> bytes:
        self.principal = principal
        self.done = True
        code = SaslCode.OK if principal is not None else SaslCode.AUTH
        return encode_frame(FRAME_TYPE_SASL, 0, Described(ulong(SASL_OUTCOME), [ubyte(code.value)]))

    def _authenticate(self, mechanism: str, response: bytes) -> Principal | None:
        if mechanism == EXTERNAL:
            # The response is an authorisation identity to act as: none, or the certificate's
            # own name (acting as someone else is not offered).
            name = self.certificate_name
            if name is None or response not in (b"", name.encode("utf-8")):
                return None
            return Principal(EXTERNAL, name)
        if mechanism == ANONYMOUS:
            return Principal(ANONYMOUS, None) if self.allow_anonymous else None
        if mechanism != PLAIN:
            return None
        # RFC 4616: [authzid] NUL authcid NUL passwd, UTF-8.
        parts = response.split(b"\x00")
        if len(parts) != 3:
            return None
        try:
            username, password = parts[1].decode("utf-8"), parts[2].decode("utf-8")
        except UnicodeDecodeError:
            return None
        if not username:
            return None
        if self._check is not None:
            answer = self._check(username, password)
            if not isinstance(answer, bool):
                self.checking = answer
                self._checked_user = username
                return None
            if not answer:
                return None
        return Principal(PLAIN, username)
