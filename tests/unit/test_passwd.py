"""``kittiwake passwd FILE USER``: create, change, delete; the password comes from stdin (or
getpass on a terminal), never from the command line."""

from __future__ import annotations

import io
import stat
from pathlib import Path

import pytest

from kittiwake.broker.authentication import parse_password_file
from kittiwake.cli import main


def passwd(monkeypatch: pytest.MonkeyPatch, *argv: str, stdin: str = "") -> int:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return main(["passwd", *argv])


def test_create_change_delete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "users"
    assert passwd(monkeypatch, str(path), "alice", stdin="first secret\n") == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "first secret" not in path.read_text()
    assert parse_password_file(path.read_text())["alice"].matches("first secret")
    assert passwd(monkeypatch, str(path), "bob", stdin="bobs\n") == 0
    assert passwd(monkeypatch, str(path), "alice", stdin="second secret\n") == 0
    users = parse_password_file(path.read_text())
    assert sorted(users) == ["alice", "bob"]
    assert users["alice"].matches("second secret") and users["bob"].matches("bobs")
    assert passwd(monkeypatch, str(path), "-D", "bob") == 0
    assert sorted(parse_password_file(path.read_text())) == ["alice"]
    assert passwd(monkeypatch, str(path), "-D", "bob") == 1


def test_no_password_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit):
        passwd(monkeypatch, str(tmp_path / "users"), "alice", "secret")
    assert not (tmp_path / "users").exists()


@pytest.mark.parametrize("user", ["", "a:b", "line\nbreak", " padded"])
def test_bad_user_names_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str
) -> None:
    assert passwd(monkeypatch, str(tmp_path / "users"), user, stdin="pw\n") == 2


def test_an_empty_password_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert passwd(monkeypatch, str(tmp_path / "users"), "alice", stdin="\n") == 1
    assert not (tmp_path / "users").exists()


def test_a_broken_file_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "users"
    path.write_text("not a user line\n")
    assert passwd(monkeypatch, str(path), "alice", stdin="pw\n") == 2
    assert path.read_text() == "not a user line\n"
