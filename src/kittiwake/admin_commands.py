"""The ``kittiwake`` admin commands (status, clients, sessions, subscriptions, queues, retained,
purge, disconnect, delete-session): requests to a running broker's HTTP listener, answers
printed as tables or, with --json, as the API's JSON.

A password never comes from the command line (other users see it in the process list): it
comes from KITTIWAKE_PASSWORD or a prompt.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from kittiwake.text_tables import format_table

DEFAULT_URL = "http://127.0.0.1:9080"
URL_VARIABLE = "KITTIWAKE_URL"
USER_VARIABLE = "KITTIWAKE_USER"
PASSWORD_VARIABLE = "KITTIWAKE_PASSWORD"
# Sent with every action (see kittiwake.web.admin_api.ACTION_HEADER).
ACTION_HEADER = "X-Kittiwake-Action"
TIMEOUT = 10.0


class AdminError(Exception):
    """The command cannot do what was asked; the message says why and what to do."""


# command -> (help, method, path pattern, argument name or None)
_Request = tuple[str, str, str | None]
COMMANDS: dict[str, tuple[str, _Request]] = {
    "status": ("the broker's version, uptime and totals", ("GET", "/api/status", None)),
    "clients": ("connected clients", ("GET", "/api/clients", None)),
    "sessions": ("sessions, connected or not", ("GET", "/api/sessions", None)),
    "subscriptions": ("subscriptions of every session", ("GET", "/api/subscriptions", None)),
    "queues": ("queues with their depth and consumers", ("GET", "/api/queues", None)),
    "retained": ("topics with a retained message", ("GET", "/api/retained", None)),
    "browse": (
        "the first 100 messages of a queue, in delivery order, without taking any",
        ("GET", "/api/queues/{}/entries", "queue"),
    ),
    "purge": (
        "remove every waiting message from a queue",
        ("POST", "/api/queues/{}/purge", "queue"),
    ),
    "disconnect": (
        "disconnect a client (MQTT client id or AMQP container id)",
        ("POST", "/api/clients/{}/disconnect", "client_id"),
    ),
    "delete-session": (
        "delete a session without a connection (a JMS durable subscription, say)",
        ("DELETE", "/api/sessions/{}", "client_id"),
    ),
}


def add_commands(commands: Any) -> None:
    """Add every admin command to the ``kittiwake`` command's subparsers."""
    for name, (text, (_method, _path, argument)) in COMMANDS.items():
        parser = commands.add_parser(name, help=text, description=f"Show or do: {text}.")
        if argument is not None:
            parser.add_argument(argument)
        parser.add_argument(
            "--url",
            default=os.environ.get(URL_VARIABLE, DEFAULT_URL),
            help=f"the broker's HTTP listener (default ${URL_VARIABLE} or {DEFAULT_URL})",
        )
        parser.add_argument(
            "--user",
            default=os.environ.get(USER_VARIABLE),
            help=f"user name (default ${USER_VARIABLE}); the password comes from "
            f"${PASSWORD_VARIABLE} or a prompt",
        )
        parser.add_argument("--json", action="store_true", help="print the API's JSON")
        parser.add_argument(
            "--cafile", help="CA certificate (PEM) to check an https:// broker against"
        )


def is_admin_command(name: str | None) -> bool:
    return name in COMMANDS


def run(args: argparse.Namespace, *, prompt: Callable[[str], str] = getpass.getpass) -> int:
    method, pattern, argument = COMMANDS[args.command][1]
    path = pattern
    if argument is not None:
        path = pattern.format(urllib.parse.quote(getattr(args, argument), safe=""))
    try:
        answer = request(
            args.url, method, path, user=args.user, cafile=args.cafile, prompt=prompt
        )
    except AdminError as exc:
        print(f"kittiwake {args.command}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(render(args.command, answer))
    return 0


def request(
    url: str,
    method: str,
    path: str,
    *,
    user: str | None = None,
    cafile: str | None = None,
    prompt: Callable[[str], str] = getpass.getpass,
) -> Any:
    """The decoded JSON answer, or AdminError with a sentence a user can act on."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise AdminError(f"--url {url!r}: give an http:// or https:// URL")
    headers = {"Accept": "application/json"}
    if user is not None:
        password = os.environ.get(PASSWORD_VARIABLE)
        if password is None:
            password = prompt(f"Password for {user}: ")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        headers["Authorization"] = f"Basic {token}"
    if method != "GET":
        headers[ACTION_HEADER] = "1"
    context = ssl.create_default_context(cafile=cafile) if base.startswith("https") else None
    prepared = urllib.request.Request(base + path, method=method, headers=headers)
    try:
        with urllib.request.urlopen(prepared, timeout=TIMEOUT, context=context) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        reason = _error_text(exc)
        if exc.code == 401:
            hint = (
                f"give --user and set {PASSWORD_VARIABLE} (or answer the prompt)"
                if user is None
                else "check the user name and password"
            )
            raise AdminError(f"the broker refused the login: {reason} (HTTP 401); {hint}") from None
        if exc.code == 403:
            who = user or "anonymous"
            raise AdminError(
                f"the broker refused {method} {path} to {who}: {reason} (HTTP 403)"
            ) from None
        raise AdminError(f"{reason} (HTTP {exc.code})") from None
    except urllib.error.URLError as exc:
        raise AdminError(
            f"cannot reach the broker at {base}: {exc.reason}; is it running with an "
            'http listener ([[listeners]] protocol = "http")? (--url or $KITTIWAKE_URL)'
        ) from None
    except (OSError, ValueError) as exc:
        raise AdminError(f"no usable answer from {base}: {exc}") from None


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.load(exc)
    except (OSError, ValueError):
        return str(exc.reason)
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return str(exc.reason)


# -- tables -----------------------------------------------------------------------------------


def _size(value: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024  # type: ignore[assignment]
    return f"{value:.1f} GiB"


def render(command: str, answer: Any) -> str:
    """An answer as the table (or lines) a person reads."""
    if command == "status":
        connections = ", ".join(f"{k} {v}" for k, v in sorted(answer["connections"].items()))
        rows = [
            ("version", answer["version"]),
            ("uptime", f"{answer['uptime_seconds']:.0f} s"),
            ("connections", connections or "0"),
            ("sessions", answer["sessions"]),
            ("subscriptions", answer["subscriptions"]),
            ("queues", answer["queues"]),
            ("retained messages", answer["retained_messages"]),
            ("messages received", answer["messages_received"]),
            ("messages sent", answer["messages_sent"]),
            ("messages dropped", answer["messages_dropped"]),
            ("bytes received", _size(answer["bytes_received"])),
            ("bytes sent", _size(answer["bytes_sent"])),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)
    if command == "clients":
        return format_table(
            ["CLIENT ID", "PROTOCOL", "PEER", "USER", "KEEPALIVE", "IN FLIGHT"],
            [
                (c["client_id"], c["protocol"], c["peer"], c["user"], c["keepalive"],
                 c["in_flight"])
                for c in answer
            ],
        )
    if command == "sessions":
        return format_table(
            ["CLIENT ID", "CONNECTED", "PERSISTENT", "SUBSCRIPTIONS", "QUEUED", "IN FLIGHT"],
            [
                (s["client_id"], s["connected"], s["persistent"], s["subscriptions"],
                 s["queued"], s["in_flight"])
                for s in answer
            ],
        )
    if command == "subscriptions":
        return format_table(
            ["CLIENT ID", "FILTER", "QOS", "DURABLE", "CONNECTED", "SHARE GROUP"],
            [
                (s["client_id"], s["topic_filter"], s["max_qos"], s["durable"],
                 s["connected"], s["shared_group"])
                for s in answer
            ],
        )
    if command == "queues":
        return format_table(
            ["QUEUE", "KIND", "DEPTH", "BYTES", "IN FLIGHT", "CONSUMERS", "EXPIRED", "DLQ'D"],
            [
                (q["name"], q["kind"], q["depth"], q["bytes"], q["in_flight"],
                 q["consumers"], q["expired"], q["dead_lettered"])
                for q in answer
            ],
        )
    if command == "retained":
        return format_table(
            ["TOPIC", "BYTES", "QOS", "PERSISTENT", "EXPIRES IN (S)"],
            [
                (r["topic"], r["bytes"], r["qos"], r["persistent"], r["expires_in"])
                for r in answer
            ],
        )
    if command == "browse":
        return format_table(
            ["MESSAGE ID", "DESTINATION", "STATE", "PRIORITY", "BYTES", "DELIVERIES",
             "AGE (S)", "EXPIRES IN (S)"],
            [
                (e["message_id"], e["destination"], e["state"], e["priority"], e["bytes"],
                 e["delivery_count"], e["age"], e["expires_in"])
                for e in answer
            ],
        )
    if command == "purge":
        return f"queue {answer['queue']}: {answer['purged']} messages purged"
    if command == "disconnect":
        return f"client {answer['client_id']}: {answer['disconnected']} connection(s) closed"
    if command == "delete-session":
        return f"session {answer['session']} deleted"
    return json.dumps(answer, indent=2)
