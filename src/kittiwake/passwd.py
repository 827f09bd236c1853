"""``kittiwake passwd FILE USER``: add a user, change a password, or delete a user (``-D``)
in a password file. Never takes a password on the command line (it would sit in the shell's
history and in every process listing): it asks with getpass, or reads one line from stdin when
stdin is not a terminal. The file is replaced atomically and readable by its owner only.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import sys
import tempfile
from pathlib import Path

from kittiwake.broker.authentication import (
    PasswordHash,
    check_user_name,
    format_password_file,
    parse_password_file,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the password file (created if missing)")
    parser.add_argument("user", help="the user name")
    parser.add_argument(
        "-D", "--delete", action="store_true", help="delete the user instead of setting a password"
    )


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        check_user_name(args.user)
        users = parse_password_file(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (ValueError, OSError) as exc:
        print(f"kittiwake passwd: {path}: {exc}", file=sys.stderr)
        return 2
    if args.delete:
        if users.pop(args.user, None) is None:
            print(f"kittiwake passwd: no user {args.user!r} in {path}", file=sys.stderr)
            return 1
        action = "deleted"
    else:
        password = _read_password(args.user)
        if password is None:
            return 1
        action = "changed" if args.user in users else "added"
        users[args.user] = PasswordHash.make(password)
    try:
        _write_atomically(path, format_password_file(users))
    except OSError as exc:
        print(f"kittiwake passwd: cannot write {path}: {exc.strerror}", file=sys.stderr)
        return 1
    print(
        f"user {args.user!r} {action} in {path}; a running broker reads it again on SIGHUP",
        file=sys.stderr,
    )
    return 0


def _read_password(user: str) -> str | None:
    if sys.stdin.isatty():
        first = getpass.getpass(f"Password for {user}: ")
        if getpass.getpass("Again: ") != first:
            print("kittiwake passwd: the passwords differ; nothing changed", file=sys.stderr)
            return None
        password = first
    else:
        password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    if not password:
        print("kittiwake passwd: an empty password is not allowed", file=sys.stderr)
        return None
    return password


def _write_atomically(path: Path, text: str) -> None:
    directory = path.resolve().parent
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
