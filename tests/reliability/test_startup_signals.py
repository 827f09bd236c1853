"""A stop signal is graceful at every moment of start-up: ``kittiwake serve`` exits 0 and its
store is closed, however early SIGTERM or SIGINT arrives.

Each test runs the real command in a child process whose start-up sends the signal to itself at
one chosen step (the first listener just bound, recovery still running): deterministic, no race
with a timer in the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.brokerproc import SRC_DIR, free_port, to_toml

# Runs ``kittiwake serve`` with one start-up step wrapped so that the process signals itself
# the moment that step is done (argv: config path, step, signal number).
_CHILD = textwrap.dedent(
    """
    import os, sys

    from kittiwake.broker.broker import Broker
    from kittiwake.cli import main
    from kittiwake.mqtt.server import MQTTServer

    config, step, signum = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if step == "listening":
        listen = MQTTServer.listen

        async def listen_then_signal(self, host, port, **options):
            address = await listen(self, host, port, **options)
            os.kill(os.getpid(), signum)
            return address

        MQTTServer.listen = listen_then_signal
    elif step == "recovering":
        recover = Broker.recover

        def recover_then_signal(self):
            os.kill(os.getpid(), signum)
            recover(self)

        Broker.recover = recover_then_signal
    sys.exit(main(["serve", "--config", config]))
    """
)


def run_serve_signalled(
    tmp_path: Path, step: str, signum: int, *, uvloop: bool, attempts: int = 3
) -> str:
    """Run the child until it exits; fail unless it exited 0. Returns its log. A port taken
    by another test worker between our probe and the child's bind is tried again, fresh."""
    data = tmp_path / "data"
    config = tmp_path / "kittiwake.toml"
    env = dict(os.environ, PYTHONPATH=str(SRC_DIR))
    for _attempt in range(attempts):
        config.write_text(
            to_toml(
                {
                    "log_level": "info",
                    "uvloop": uvloop,
                    "store": {"data_dir": str(data)},
                    "listeners": [
                        {"protocol": "mqtt", "host": "127.0.0.1", "port": free_port()}
                    ],
                }
            )
        )
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(config), step, str(signum)],
            capture_output=True,
            env=env,
            cwd=tmp_path,
            timeout=30,
        )
        log = proc.stderr.decode(errors="replace")
        if proc.returncode == 0 or "in use" not in log.lower():
            break
    assert proc.returncode == 0, (
        f"signal {signal.Signals(signum).name} while {step}: exit status {proc.returncode}\n{log}"
    )
    return log


@pytest.mark.parametrize("uvloop", [False, True], ids=["asyncio", "uvloop"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_the_moment_the_listener_opens_stops_gracefully(
    tmp_path: Path, signum: int, uvloop: bool
) -> None:
    log = run_serve_signalled(tmp_path, "listening", signum, uvloop=uvloop)
    assert "kittiwake stopping" in log, log


def test_a_signal_during_recovery_stops_gracefully(tmp_path: Path) -> None:
    log = run_serve_signalled(tmp_path, "recovering", signal.SIGTERM, uvloop=False)
    assert "kittiwake stopping" in log, log
