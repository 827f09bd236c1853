"""A database the broker cannot trust stops ``kittiwake serve``: non-zero exit, the file named
on stderr, nothing listening, and the file left as it was (never silently started empty)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_harness import BrokerCtl

from tests.integration.brokerproc import SRC_DIR, free_port, to_toml

DB = "kittiwake.db"


def serve(workdir: Path, data_dir: Path, timeout: float = 15.0) -> tuple[int, str, int]:
    """Run ``python -m kittiwake serve`` until it exits (or is killed after ``timeout``);
    returns the exit status, stderr and the port it was told to listen on."""
    port = free_port()
    config = workdir / "kittiwake.toml"
    config.write_text(to_toml({
        "log_level": "info",
        "uvloop": False,
        "store": {"data_dir": str(data_dir)},
        "listeners": [{"protocol": "mqtt", "host": "127.0.0.1", "port": port}],
    }))
    env = dict(os.environ, PYTHONPATH=str(SRC_DIR))
    proc = subprocess.Popen(
        [sys.executable, "-m", "kittiwake", "serve", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=workdir,
    )
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate(timeout=10)
        pytest.fail(f"kittiwake kept running on a broken database:\n{err.decode(errors='replace')}")
    return proc.returncode, err.decode(errors="replace"), port


def a_real_database(data_dir: Path, tmp_path: Path) -> None:
    """A store with sessions and queued messages, written by a real broker."""
    ctl = BrokerCtl(tmp_path / "writer", store={"data_dir": str(data_dir)})
    try:
        ctl.start()
        from tests.integration.rawclient import RawClient

        with RawClient(ctl.address, 4) as c:  # type: ignore[arg-type]
            c.connect("sub", clean_start=False)
            c.subscribe("t/#", 1)
        with RawClient(ctl.address, 4) as c:  # type: ignore[arg-type]
            c.connect("pub")
            for n in range(300):
                c.publish(f"t/{n}", os.urandom(2000), 1)
        assert ctl.terminate() == 0
    finally:
        ctl.shutdown()
    assert (data_dir / DB).stat().st_size > 500_000


def assert_refused(tmp_path: Path, data_dir: Path) -> str:
    before = (data_dir / DB).read_bytes() if (data_dir / DB).is_file() else None
    code, err, port = serve(tmp_path, data_dir)
    assert code != 0, f"kittiwake started on a broken database:\n{err}"
    assert str(data_dir / DB) in err, f"stderr does not name the database file:\n{err}"
    # Never listened, not even briefly (the process has exited, so probing the port now would
    # only say whether another test worker's broker took it meanwhile).
    assert "listening on" not in err, f"kittiwake opened a listener on port {port}:\n{err}"
    if before is not None:
        assert (data_dir / DB).read_bytes() == before, "the broken file was modified"
    return err


def test_random_bytes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / DB).write_bytes(os.urandom(100_000))
    assert_refused(tmp_path, data)


def test_truncated_database(tmp_path: Path) -> None:
    data = tmp_path / "data"
    a_real_database(data, tmp_path)
    with open(data / DB, "r+b") as f:
        f.truncate((data / DB).stat().st_size // 3)
    assert_refused(tmp_path, data)


def test_smashed_pages(tmp_path: Path) -> None:
    data = tmp_path / "data"
    a_real_database(data, tmp_path)
    with open(data / DB, "r+b") as f:
        f.seek(4096 * 4)
        f.write(os.urandom(4096 * 32))
    assert_refused(tmp_path, data)


def test_newer_schema_version(tmp_path: Path) -> None:
    data = tmp_path / "data"
    a_real_database(data, tmp_path)
    connection = sqlite3.connect(data / DB)
    connection.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    connection.commit()
    connection.close()
    err = assert_refused(tmp_path, data)
    assert "99" in err and "schema" in err


def test_undecodable_stored_message(tmp_path: Path) -> None:
    """Damage inside rows (here: the property blob of every queued message) passes SQLite's
    page checks; the start-up must still stop with a message, not a traceback."""
    data = tmp_path / "data"
    a_real_database(data, tmp_path)
    connection = sqlite3.connect(data / DB)
    damaged = connection.execute(
        "UPDATE queue_entries SET properties=x'ff' WHERE topic IS NOT NULL"
    ).rowcount
    connection.commit()
    connection.close()
    assert damaged > 0
    err = assert_refused(tmp_path, data)
    assert "Traceback" not in err, f"a traceback instead of a message:\n{err}"


def test_a_sound_database_starts(tmp_path: Path) -> None:
    """The control: the same database, undamaged, starts and stops cleanly."""
    data = tmp_path / "data"
    a_real_database(data, tmp_path)
    ctl = BrokerCtl(tmp_path / "again", store={"data_dir": str(data)})
    try:
        ctl.start()
        assert ctl.terminate() == 0
        assert "recovered 1 sessions" in ctl.log_text(1)
    finally:
        ctl.shutdown()
