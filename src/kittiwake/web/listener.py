"""The HTTP listener (``protocol = "http"``): aiohttp on the broker's loop, every request
authenticated like any client (HTTP Basic against the broker's users, or over TLS the user a
verified client certificate names when ``tls.certificate_user`` says so; anonymous only where
the listener's policy allows it), serving the console, /metrics and the admin API.

Never blocks the loop: a password that must be hashed is checked on a worker thread.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from importlib import resources
from pathlib import Path

from aiohttp import web

from kittiwake.broker.authentication import Authentication, Credentials, Principal, Refusal
from kittiwake.config import ListenerConfig
from kittiwake.tls import certificate_user, server_context
from kittiwake.web.admin_api import ACTION_HEADER, AdminAPI, Handler, Operated, error

log = logging.getLogger(__name__)

REALM = 'Basic realm="kittiwake", charset="UTF-8"'
CONSOLE_DIRECTORY = Path(str(resources.files("kittiwake.web") / "console"))
# Methods that change nothing; every other one needs ACTION_HEADER.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def basic_credentials(header: str | None, address: str) -> Credentials | None:
    """The credentials of an ``Authorization: Basic`` header; None when there is none or it
    is malformed (then the request counts as anonymous)."""
    if not header:
        return Credentials(address=address)
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        text = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    username, colon, password = text.partition(":")
    if not colon:
        return None
    return Credentials(username, password, address=address)


class HTTPListener:
    """One HTTP listener; ``start`` binds, ``stop`` closes."""

    def __init__(
        self,
        listener: ListenerConfig,
        authentication: Authentication,
        operated: Operated,
    ) -> None:
        self.listener = listener
        self.authentication = authentication
        policy = listener.allow_anonymous
        self.allow_anonymous = None if policy == "auto" else bool(policy)
        self.operated = operated
        self.app = web.Application(middlewares=[self._authenticate])
        AdminAPI(operated).add_routes(self.app)
        self.app.router.add_get("/", self._console_index)
        self.app.router.add_static("/console/", CONSOLE_DIRECTORY)
        self._runner: web.AppRunner | None = None

    async def start(self) -> tuple[str, int]:
        listener = self.listener
        tls = server_context(listener.tls) if listener.tls.enabled else None
        # No access log: the console polls every second.
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, listener.host, listener.port, ssl_context=tls)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        log.info("HTTP%s listening on %s:%s", "S" if tls else "", host, port)
        return host, port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _console_index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(CONSOLE_DIRECTORY / "index.html")

    def _certificate_credentials(self, request: web.Request) -> Credentials | None:
        """The user a verified client certificate names, as MQTT's login takes it (the
        certificate wins over a Basic header); None when the listener does not map
        certificates or the client showed none."""
        mode = self.listener.tls.certificate_user
        if mode == "none" or request.transport is None:
            return None
        name = certificate_user(request.transport.get_extra_info("peercert"), mode)
        if name is None:
            return None
        return Credentials(certificate_name=name, address=request.remote or "")

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        credentials = self._certificate_credentials(request) or basic_credentials(
            request.headers.get("Authorization"), request.remote or ""
        )
        verdict: Principal | Refusal | None = Refusal.BAD_CREDENTIALS
        if credentials is not None:
            authentication = self.authentication
            verdict = authentication.check(credentials, self.allow_anonymous)
            if verdict is None:
                verdict = await asyncio.get_running_loop().run_in_executor(
                    None, authentication.verify, credentials
                )
        if verdict is None or isinstance(verdict, Refusal):
            verdict = verdict or Refusal.BAD_CREDENTIALS
            log.info(
                "http %s %s from %s refused: %s",
                request.method,
                request.path,
                request.remote,
                verdict.value,
            )
            response = error(401, verdict.value)
            response.headers["WWW-Authenticate"] = REALM
            return response
        authorizer = self.operated.broker.authorizer
        reading = request.method in SAFE_METHODS
        if not authorizer.may_administer(verdict.name):
            may_read = authorizer.may_monitor(verdict.name)
            if not reading or not may_read:
                log.info(
                    "http %s %s from %s refused: user %s is not %s",
                    request.method,
                    request.path,
                    request.remote,
                    verdict.name or "(anonymous)",
                    "an admin (read-only monitor)" if may_read else "an admin or monitor",
                )
                return error(
                    403,
                    "read-only user: actions need auth.admins"
                    if may_read
                    else "not an admin or monitor (auth.admins, auth.monitors)",
                )
        if not reading and ACTION_HEADER not in request.headers:
            return error(
                403, f"an action needs the header {ACTION_HEADER} (cross-site requests cannot)"
            )
        request["principal"] = verdict
        return await handler(request)
