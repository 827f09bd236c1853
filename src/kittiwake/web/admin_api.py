"""The admin JSON API under /api/ (what the console and the ``kittiwake`` admin commands use)
and /metrics: read-only views of the core as JSON, and the operators' actions (purge a queue,
delete a session or durable subscription, disconnect a client) through the core's methods.

Handlers run on the broker's loop and never block it: each view is one pass over in-memory
state; an action's answer waits for its store commit.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from kittiwake.amqp.server import AMQPServer
from kittiwake.broker import inspection
from kittiwake.broker.broker import Broker
from kittiwake.broker.queue_destinations import QueueDestinations
from kittiwake.mqtt.server import MQTTServer
from kittiwake.store.commit_times import CommitTimes
from kittiwake.web import clients, metrics
from kittiwake.web.throughput import Throughput

# A request that changes something must carry this header: a browser sends a custom header
# cross-origin only after a CORS preflight, which this listener never grants, so another
# site's page cannot make a logged-in operator's browser purge a queue.
ACTION_HEADER = "X-Kittiwake-Action"

# Rows a queue browse returns unless asked, and at most.
BROWSE_DEFAULT = 100
BROWSE_MAX = 10_000

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(slots=True)
class Operated:
    """The parts of a running broker the operators' listener reads and acts on."""

    broker: Broker
    destinations: QueueDestinations | None
    mqtt: MQTTServer
    amqp: AMQPServer
    throughput: Throughput | None = None

    def connections(self) -> dict[str, int]:
        return {"mqtt": len(self.mqtt.connections), "amqp": len(self.amqp.connections)}

    def commit_times(self) -> CommitTimes | None:
        times = getattr(self.broker.store, "commit_times", None)
        return times if isinstance(times, CommitTimes) else None


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=_dumps)


def _dumps(data: Any) -> str:
    return json.dumps(data, default=_plain, separators=(",", ":"))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def error(status: int, message: str) -> web.Response:
    """An error a user can act on: ``{"error": "..."}`` with the status."""
    return _json({"error": message}, status=status)


class AdminAPI:
    """The routes of /api/ and /metrics."""

    def __init__(self, operated: Operated) -> None:
        self.operated = operated

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/api/status", self.status)
        app.router.add_get("/api/clients", self.clients)
        app.router.add_get("/api/sessions", self.sessions)
        app.router.add_get("/api/subscriptions", self.subscriptions)
        app.router.add_get("/api/queues", self.queues)
        app.router.add_get("/api/retained", self.retained)
        app.router.add_get("/api/throughput", self.throughput)
        app.router.add_get("/api/queues/{name:.+}/entries", self.entries)
        app.router.add_post("/api/queues/{name:.+}/purge", self.purge)
        app.router.add_delete("/api/sessions/{client_id:.+}", self.delete_session)
        app.router.add_post("/api/clients/{client_id:.+}/disconnect", self.disconnect)

    # -- views ----------------------------------------------------------------------------

    async def metrics(self, request: web.Request) -> web.Response:
        operated = self.operated
        figures = metrics.snapshot(
            operated.broker,
            operated.destinations,
            operated.connections(),
            operated.commit_times(),
        )
        response = web.Response(body=metrics.render(figures))
        response.headers["Content-Type"] = metrics.CONTENT_TYPE_LATEST
        return response

    async def status(self, request: web.Request) -> web.Response:
        broker = self.operated.broker
        stats = broker.stats
        return _json(
            {
                "version": broker.version,
                "uptime_seconds": round(broker.clock.now() - broker.started_at, 3),
                "connections": self.operated.connections(),
                "sessions": len(broker.sessions),
                "subscriptions": broker.subscription_count,
                "retained_messages": len(broker.retained),
                "queues": 0
                if self.operated.destinations is None
                else len(self.operated.destinations.router.queues),
                "messages_received": stats.messages_received,
                "messages_sent": stats.messages_sent,
                "messages_dropped": stats.messages_dropped,
                "bytes_received": stats.bytes_received,
                "bytes_sent": stats.bytes_sent,
            }
        )

    async def clients(self, request: web.Request) -> web.Response:
        return _json(clients.clients(self.operated.mqtt, self.operated.amqp))

    async def sessions(self, request: web.Request) -> web.Response:
        return _json(inspection.sessions(self.operated.broker))

    async def subscriptions(self, request: web.Request) -> web.Response:
        return _json(inspection.subscriptions(self.operated.broker))

    async def queues(self, request: web.Request) -> web.Response:
        # Sessions' queues only on request: a broker with many clients has one each.
        with_sessions = request.query.get("sessions", "") in ("1", "true", "yes")
        return _json(
            inspection.queues(
                self.operated.broker, self.operated.destinations, session_queues=with_sessions
            )
        )

    async def entries(self, request: web.Request) -> web.Response:
        """Browse a queue: its first ``limit`` entries (default 100, at most 10,000: one
        pass on the loop stays short)."""
        name = request.match_info["name"]
        try:
            limit = int(request.query.get("limit", BROWSE_DEFAULT))
        except ValueError:
            return error(400, "limit must be a whole number")
        if not 1 <= limit <= BROWSE_MAX:
            return error(400, f"limit must be between 1 and {BROWSE_MAX}")
        broker = self.operated.broker
        queue = inspection.find_queue(broker, self.operated.destinations, name)
        if queue is None:
            return error(404, f"no queue {name!r}")
        return _json(inspection.browse(queue, broker.clock.now(), limit))

    async def retained(self, request: web.Request) -> web.Response:
        return _json(inspection.retained(self.operated.broker))

    async def throughput(self, request: web.Request) -> web.Response:
        sampler = self.operated.throughput
        return _json([] if sampler is None else list(sampler.samples))

    # -- actions --------------------------------------------------------------------------

    async def purge(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        destinations = self.operated.destinations
        purged = None if destinations is None else destinations.purge(name)
        if purged is None:
            return error(404, f"no queue {name!r}")
        await _committed(self.operated.broker)
        return _json({"queue": name, "purged": purged})

    async def delete_session(self, request: web.Request) -> web.Response:
        client_id = request.match_info["client_id"]
        deleted = self.operated.broker.delete_session(client_id)
        if deleted is False:
            return error(404, f"no session {client_id!r}")
        if deleted is None:
            return error(
                409, f"session {client_id!r} has a connection: disconnect the client first"
            )
        await _committed(self.operated.broker)
        return _json({"session": client_id, "deleted": True})

    async def disconnect(self, request: web.Request) -> web.Response:
        client_id = request.match_info["client_id"]
        count = clients.disconnect(self.operated.mqtt, self.operated.amqp, client_id)
        if not count:
            return error(404, f"no connected client {client_id!r}")
        return _json({"client_id": client_id, "disconnected": count})


async def _committed(broker: Broker) -> None:
    """Wait until what an action changed in the store is durable (raises if it failed)."""
    completion = broker.store.commit()
    if completion is not None:
        await completion
