"""The ``kittiwake`` command: ``kittiwake serve [--config FILE]``, ``kittiwake passwd FILE
USER`` (users and passwords), the admin commands against a running broker (``kittiwake status``,
``clients``, ``queues``, ``purge QUEUE``...; see admin_commands.py) and ``kittiwake --version``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from kittiwake import __version__, admin_commands, passwd
from kittiwake.app import serve
from kittiwake.config import ConfigError, load_config
from kittiwake.flight.listener import FlightUnavailable
from kittiwake.logs import configure_logging
from kittiwake.store.sqlite import StoreError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kittiwake", description="The Kittiwake message broker")
    parser.add_argument("--version", action="version", version=f"kittiwake {__version__}")
    commands = parser.add_subparsers(dest="command")
    serve_parser = commands.add_parser("serve", help="run the broker")
    serve_parser.add_argument("--config", "-c", help="TOML configuration file")
    passwd.add_arguments(
        commands.add_parser(
            "passwd",
            help="add a user, change a password or delete a user (-D) in a password file",
        )
    )
    admin_commands.add_commands(commands)
    args = parser.parse_args(argv)
    if args.command == "passwd":
        return passwd.run(args)
    if admin_commands.is_admin_command(args.command):
        return admin_commands.run(args)
    if args.command != "serve":
        parser.print_help()
        return 2
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"kittiwake: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_format)
    try:
        _run(serve(config, args.config), use_uvloop=config.uvloop)
    except (OSError, StoreError, FlightUnavailable, ConfigError) as exc:
        logging.getLogger("kittiwake").error("cannot start: %s", exc)
        return 1
    return 0


def _run(main_coroutine: Coroutine[Any, Any, None], *, use_uvloop: bool) -> None:
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            logging.getLogger("kittiwake").info("uvloop not installed; using asyncio's loop")
        else:
            uvloop.run(main_coroutine)
            return
    asyncio.run(main_coroutine)


if __name__ == "__main__":
    sys.exit(main())
