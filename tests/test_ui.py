"""`srifty ui`: the admin's password file, and the helpers that look at what a running UI
left listening or running. The UI itself starts for real in the README walk-through test
(`tests/test_demo.py`), which checks its listeners, its password file and SIGTERM there:
one start of Airflow and MLflow instead of two."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from pathlib import Path

import psutil

from srifty_core.ui import ADMIN_USER, PASSWORD_FILE, write_password_file

LOOPBACK = {"127.0.0.1", "::1"}


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def listeners(procs: list[psutil.Process]) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every listening socket of ``procs``."""
    out = set()
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.add((" ".join(p.cmdline()[:4]), c.laddr.ip, c.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def alive(procs: list[psutil.Process], grace_s: float) -> list[int]:
    """The pids of ``procs`` still running (zombies aside) after at most ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        left = []
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_the_password_file_is_the_owners_alone_and_replaced_whole(tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    old = home / PASSWORD_FILE
    old.write_text("{}")
    old.chmod(0o644)
    path = write_password_file(home, "pw-test")
    assert path == old
    assert json.loads(path.read_text()) == {ADMIN_USER: "pw-test"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in home.iterdir()] == [PASSWORD_FILE]  # no temporary left


def test_a_listener_set_names_the_process_and_the_address() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        found = listeners(tree(os.getpid()))
    assert any(addr == "127.0.0.1" and p == port for _, addr, p in found), found
    assert alive([psutil.Process(os.getpid())], grace_s=0) == [os.getpid()]
