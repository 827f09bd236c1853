"""The layout rules of DESIGN.md section 3, checked on the source: ``broker/`` (the protocol-free
core) imports no protocol front end, no store implementation and nothing above it; codecs and
the MQTT connection's state machine import no asyncio, socket or ssl."""

from __future__ import annotations

import ast
from pathlib import Path

import kittiwake

PACKAGE = Path(kittiwake.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any level (TYPE_CHECKING blocks included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
    return found


def test_the_core_imports_no_front_end_and_no_store_implementation() -> None:
    # selector/ is a part the core may use (JMS selectors on bindings and browsers).
    allowed = ("kittiwake.broker", "kittiwake.clock", "kittiwake.config", "kittiwake.selector")
    offenders = {}
    for path in sorted((PACKAGE / "broker").glob("*.py")):
        outside = {
            m
            for m in imported_modules(path)
            if (m == "kittiwake" or m.startswith("kittiwake.")) and not m.startswith(allowed)
        }
        outside.discard("kittiwake")  # the package itself, for __version__
        if outside:
            offenders[path.name] = sorted(outside)
    assert offenders == {}


IO_MODULES = ("asyncio", "socket", "selectors", "ssl")


def io_imports(path: Path) -> set[str]:
    """The modules of ``path`` that do I/O or need an event loop."""
    return {m for m in imported_modules(path) if m.split(".")[0] in IO_MODULES}


def test_codecs_are_sans_io() -> None:
    for name in ("codec.py", "packets.py", "properties.py", "packet_ids.py"):
        assert io_imports(PACKAGE / "mqtt" / name) == set(), name


def test_the_mqtt_state_machine_is_sans_io() -> None:
    """The connection and its login are driven with bytes alone: only the shell (server.py,
    websocket.py) knows the loop and the socket, and hands in what needs them."""
    shell = {"kittiwake.mqtt.server", "kittiwake.mqtt.websocket"}
    for name in ("connection.py", "login.py", "answers.py", "errors.py", "reason_codes.py"):
        path = PACKAGE / "mqtt" / name
        assert io_imports(path) == set(), name
        assert imported_modules(path) & shell == set(), name
