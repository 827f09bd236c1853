"""Pure parts of the client's engine glue and message stamping: the message id source and
the retired-wrapper sweep (objects only, no connection)."""

from __future__ import annotations

import os

from kittiwake.jms import messages
from kittiwake.jms.engine import _held_elsewhere


def test_message_ids_are_jms_ids_and_unique() -> None:
    ids = [messages.new_message_id() for _ in range(10_000)]
    assert all(i.startswith("ID:") for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_ids_of_its_own() -> None:
    before = messages.new_message_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave at once
        os.write(write, messages.new_message_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 1000).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child.startswith("ID:")
    assert child.rsplit(":", 1)[0] != before.rsplit(":", 1)[0]


class _Wrapper:
    pass


def test_the_sweep_keeps_what_something_else_holds() -> None:
    held = _Wrapper()
    retired = _held_elsewhere([_Wrapper(), held, _Wrapper()])
    assert retired == [held]
    del held  # now only the list holds it
    assert _held_elsewhere(retired) == []
