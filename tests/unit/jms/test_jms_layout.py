"""kittiwake.jms is a client library: it talks to the broker only over AMQP, so it imports no
broker, front-end or store module (it must work against any AMQP 1.0 JMS-mapping broker). The
one exception is vm.py, which starts an in-process broker (kittiwake.embedded) when a vm://
URL asks for one; the bytes still go through the AMQP engine on both sides."""

from __future__ import annotations

import ast
from pathlib import Path

import kittiwake.jms

PACKAGE = Path(kittiwake.jms.__file__).parent


def test_the_client_imports_nothing_of_the_broker() -> None:
    offenders: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module]
            for name in names:
                if path.name == "vm.py" and name == "kittiwake.embedded":
                    continue
                if name.startswith("kittiwake.") and not name.startswith("kittiwake.jms"):
                    offenders.setdefault(path.name, []).append(name)
    assert offenders == {}


def test_typed_marker_ships() -> None:
    assert (PACKAGE / "py.typed").is_file()
