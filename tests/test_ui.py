"""`srifty ui` starts the Airflow and MLflow UIs for real, answers health checks with a
known admin password kept in a file only its owner reads, listens on loopback only, and
leaves nothing running when SIGTERM stops it."""

from __future__ import annotations

import contextlib
import json
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from srifty_core.lifetime import free_port

pytestmark = pytest.mark.airflow

LOOPBACK = {"127.0.0.1", "::1"}


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _listeners(procs: list[psutil.Process]) -> set[tuple[str, str, int]]:
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


def _alive(procs: list[psutil.Process], grace_s: float) -> list[int]:
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


def _healthy(port: int) -> bool:
    """The API server says the scheduler and the triggerer heartbeat: both have started
    whatever they start (a log server, once, before their first heartbeat)."""
    url = f"http://127.0.0.1:{port}/api/v2/monitor/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            health = json.loads(resp.read())
    except OSError:
        return False
    return all((health.get(k) or {}).get("status") == "healthy" for k in ("scheduler", "triggerer"))


@pytest.mark.alone
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_ui_listens_on_loopback_keeps_its_password_private_and_stops_on_sigterm(
    data_dir: Path,
) -> None:
    a_port, m_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "srifty_core.cli", "ui", "--airflow-port", str(a_port),
           "--mlflow-port", str(m_port), "--password", "pw-test"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    problems: list[str] = []
    tree: list[psutil.Process] = []
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("MLflow:"):
                break
        assert any(ln.startswith("Airflow:") for ln in lines), "".join(lines)
        # Airflow creates every DAG paused: the UI unpauses those one triggers (a triggered
        # run of a paused DAG would wait without a word), not those on a clock.
        (dags,) = [ln for ln in lines if ln.startswith("DAGs you trigger, unpaused:")]
        unpaused, paused = dags.split(";", 1)
        for dag_id in ("srifty_plan_and_train", "srifty_what_if", "srifty_profile_model"):
            assert dag_id in unpaused, dags
        assert "srifty_probe_sweep" in paused and "srifty_catalog_refresh" in paused, dags
        deadline = time.monotonic() + 120
        while not _healthy(a_port) and time.monotonic() < deadline:
            time.sleep(2)
        assert _healthy(a_port), "the scheduler and triggerer never reported healthy"
        pw = data_dir / "airflow" / "simple_auth_manager_passwords.json.generated"
        assert json.loads(pw.read_text()) == {"admin": "pw-test"}
        if stat.S_IMODE(pw.stat().st_mode) != 0o600:
            problems.append(f"password file mode {oct(stat.S_IMODE(pw.stat().st_mode))}")
        # A log server starts beside its component's first heartbeat: look a few times.
        listening: set[tuple[str, str, int]] = set()
        for _ in range(5):
            listening |= _listeners(_tree(proc.pid))
            time.sleep(1)
        assert {port for _, _, port in listening} >= {a_port, m_port}
        wide = sorted(x for x in listening if x[1] not in LOOPBACK)
        if wide:
            problems.append(f"listening beyond loopback: {wide}")
        tree = _tree(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            problems.append("`srifty ui` still runs 90 s after SIGTERM")
        left = _alive(tree, grace_s=10)
        if left:
            problems.append(f"processes left after SIGTERM: {left}")
        assert not problems, problems
        assert proc.returncode == 0
    finally:
        survivors = [*tree, *_tree(proc.pid)]  # whatever a failed run left
        proc.kill()
        proc.communicate()
        for p in survivors:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
