"""kittiwake.jms is a client library: it talks to the broker only over AMQP, so it imports no
broker, front-end or store module (it must work against any AMQP 1.0 JMS-mapping broker). The
one exception is vm.py, which starts an in-process broker (kittiwake.embedded) when a vm://
URL asks for one; the bytes still go through the AMQP engine on both sides. It shares two
neutral modules with the broker: kittiwake.amqp_values, the AMQP value decoder (bytes in,
values out), and kittiwake.proton_calls, python-qpid-proton's C engine calls."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kittiwake.jms

PACKAGE = Path(kittiwake.jms.__file__).parent
SHARED = frozenset(("kittiwake.amqp_values", "kittiwake.proton_calls"))


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
                if node.module == "kittiwake":  # from kittiwake import x: the module kittiwake.x
                    names = [f"kittiwake.{alias.name}" for alias in node.names]
            for name in names:
                if path.name == "vm.py" and name == "kittiwake.embedded":
                    continue
                if name in SHARED or name.startswith("kittiwake.jms"):
                    continue
                if name.startswith("kittiwake."):
                    offenders.setdefault(path.name, []).append(name)
    assert offenders == {}


def test_typed_marker_ships() -> None:
    assert (PACKAGE / "py.typed").is_file()


@pytest.mark.parametrize("module", sorted(SHARED))
def test_the_shared_modules_import_nothing_of_kittiwake(module: str) -> None:
    """kittiwake.amqp_values (pure code over bytes and proton's types) and
    kittiwake.proton_calls (proton's C calls) stay neutral."""
    path = PACKAGE.parent / f"{module.rsplit('.', 1)[1]}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert [name for name in imported if name and name.startswith("kittiwake")] == []
