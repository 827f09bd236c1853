"""Helpers for python-qpid-proton's blocking client where a test needs two of its connections
at work at once (the blocking API runs a connection only inside its own calls)."""

from __future__ import annotations

import contextlib
import itertools
import threading

from proton import Timeout
from proton.utils import BlockingReceiver

_probes = itertools.count(1)


def grant_credit(receiver: BlockingReceiver, credit: int) -> None:
    """Give ``receiver`` ``credit`` more and return once the broker has it: a link attached on
    the same connection afterwards is answered only after the broker read the flow before it
    (frames keep their order on a connection)."""
    receiver.link.flow(credit)
    probe = receiver.connection.create_sender(f"credit-probe-{next(_probes)}")
    probe.close()


def accept_one_in_background(receiver: BlockingReceiver, got: list[object]) -> threading.Thread:
    """A started thread that receives one message on ``receiver`` (with the credit it has; one
    more if none), appends its body to ``got``
    and accepts it, then runs the connection a moment longer so the acceptance is written (the
    blocking client writes only while one of its calls runs)."""

    def accept_one() -> None:
        got.append(receiver.receive(timeout=10).body)
        receiver.accept()
        with contextlib.suppress(Timeout):
            receiver.receive(timeout=1)

    thread = threading.Thread(target=accept_one, daemon=True)
    thread.start()
    return thread
