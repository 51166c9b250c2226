"""Start the Airflow and MLflow UIs on the data folder the demo used (``srifty ui``).

Airflow runs as the four processes ``airflow standalone`` would start (API server and UI,
scheduler, triggerer, DAG processor) against the demo's Airflow home, with one admin user
whose password is set here so it is known (the password file is the owner's alone, mode
0600); MLflow runs ``mlflow server`` on the demo's SQLite store and artifacts. Every
listener is on loopback only: the API server and MLflow bind 127.0.0.1, and the scheduler
and triggerer start without their log servers (which bind every interface; the UI reads
the task logs from the Airflow home's files on this host). Ctrl-C, SIGTERM or SIGHUP stops
every process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

from srifty_core import paths
from srifty_core.airflow_env import (
    ADMIN_USER,
    data_folder_environment,
    migrate_once,
    start_airflow,
    stop_process_groups,
    wait_healthy,
)
from srifty_core.atomic import replacing
from srifty_core.errors import SriftyError
from srifty_core.tracking.store import default_tracking_uri

DEFAULT_PASSWORD = "srifty-admin"
LOOPBACK = "127.0.0.1"
PASSWORD_FILE = "simple_auth_manager_passwords.json.generated"
"""Airflow's simple auth manager reads the passwords from this file in its home."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def airflow_components(port: int) -> dict[str, list[str]]:
    """What ``airflow standalone`` runs, each as its own ``airflow`` command: the scheduler
    and triggerer without their log servers (``--skip-serve-logs``: Airflow binds those on
    every interface, with no setting for the address)."""
    return {
        "api-server": ["api-server", "--host", LOOPBACK, "--port", str(port)],
        "scheduler": ["scheduler", "--skip-serve-logs"],
        "dag-processor": ["dag-processor"],
        "triggerer": ["triggerer", "--skip-serve-logs"],
    }


def write_password_file(home: Path, password: str) -> Path:
    """The admin's password for Airflow's simple auth manager, readable by the owner only
    (0600 from the start: written to a private temporary, then renamed over the file)."""
    path = home / PASSWORD_FILE
    with replacing(path) as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(json.dumps({ADMIN_USER: password}).encode())
    return path


class StopSignals:
    """Inside ``with StopSignals() as stop:``, SIGTERM and SIGHUP stop the UI as Ctrl-C
    does (a ``KeyboardInterrupt`` in the main thread, so the servers are stopped on the way
    out); once ``stop.stopping`` is set (the first signal sets it), later signals are
    ignored rather than cutting the stop short. The previous handlers come back after the
    block. Outside the main thread nothing changes."""

    def __init__(self) -> None:
        self.stopping = False
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping:
            self.stopping = True
            raise KeyboardInterrupt

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def _api(base: str, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
    """One call of Airflow's REST API (loopback), its JSON answer."""
    req = urllib.request.Request(
        base + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
    )
    with urllib.request.urlopen(req, timeout=30) as resp:  # loopback only
        return json.loads(resp.read() or b"null")


def unpause_on_demand_dags(
    base: str, password: str, parser: subprocess.Popen[bytes], timeout_s: float = 180.0
) -> tuple[list[str], list[str]]:
    """Unpause the DAGs that run only when triggered or when data arrives (the plan-and-
    train, what-if and profiling DAGs; the model refresh after a sweep): Airflow creates
    every DAG paused, and a triggered run of a paused DAG waits without a word. The DAGs
    on a clock (the nightly probe sweep, the weekly catalog refresh) stay as they are: the
    user turns them on. Waits until the DAG processor (``parser``) has stored every DAG
    file's DAG; returns (unpaused, periodic and paused)."""
    expected = {f.stem for f in paths.DAGS_DIR.glob("srifty_*.py")}
    token = _api(base, "POST", "/auth/token", {"username": ADMIN_USER, "password": password})[
        "access_token"
    ]
    deadline = time.monotonic() + timeout_s
    while True:
        dags = _api(base, "GET", "/api/v2/dags?limit=100&dag_id_pattern=srifty_", token=token)
        found = {d["dag_id"]: d for d in dags["dags"]}
        if expected <= found.keys():
            break
        if parser.poll() is not None or time.monotonic() > deadline:
            missing = ", ".join(sorted(expected - found.keys()))
            raise SriftyError(f"the DAG processor did not load {missing} (see its log)")
        time.sleep(2.0)
    on, paused = [], []
    for dag_id, d in sorted(found.items()):
        if not d["timetable_periodic"]:
            if d["is_paused"]:
                _api(base, "PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False}, token)
            on.append(dag_id)
        elif d["is_paused"]:
            paused.append(dag_id)
    return on, paused


def run_ui(
    data_dir: Path | None = None,
    *,
    airflow_port: int = 8080,
    mlflow_port: int = 5001,
    password: str = DEFAULT_PASSWORD,
    once: bool = False,
) -> int:
    """Start both UIs and wait for Ctrl-C or SIGTERM. ``once``: stop as soon as both answer
    (tests)."""
    with StopSignals() as stop:
        try:
            return _run_ui(data_dir, airflow_port, mlflow_port, password, once, stop)
        except KeyboardInterrupt:
            return 0


def _run_ui(
    data_dir: Path | None,
    airflow_port: int,
    mlflow_port: int,
    password: str,
    once: bool,
    stop: StopSignals,
) -> int:
    root = paths.data_dir(data_dir)
    home = paths.airflow_home(root)
    env = {
        **os.environ,
        **data_folder_environment(root),
        "AIRFLOW__API__PORT": str(airflow_port),
        # where tasks reach the execution API (Airflow's default: localhost:8080, whatever
        # port the API server listens on)
        "AIRFLOW__API__BASE_URL": f"http://{LOOPBACK}:{airflow_port}",
        # the task logs say what was planned, launched, decided and released
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    }
    write_password_file(home, password)
    migrate_once(env)
    artifacts = (paths.mlflow_dir(root) / "artifacts").resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    logs = home / "ui-logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, args in airflow_components(airflow_port).items():
            procs[name] = start_airflow(args, env, logs / f"airflow-{name}.log")
        with (logs / "mlflow.log").open("ab") as m_log:
            procs["mlflow"] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mlflow",
                    "server",
                    "--backend-store-uri",
                    default_tracking_uri(root),
                    "--default-artifact-root",
                    artifacts.as_uri(),
                    "--host",
                    LOOPBACK,
                    "--port",
                    str(mlflow_port),
                ],
                env=env,
                stdout=m_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        print("starting Airflow and MLflow (20-40 s) ...", flush=True)
        wait_healthy(f"http://{LOOPBACK}:{mlflow_port}/health", procs["mlflow"], 120)
        wait_healthy(
            f"http://{LOOPBACK}:{airflow_port}/api/v2/monitor/health", procs["api-server"], 180
        )
        api = f"http://{LOOPBACK}:{airflow_port}"
        on, paused = unpause_on_demand_dags(api, password, procs["dag-processor"])
        print(
            f"DAGs you trigger, unpaused: {', '.join(on) or 'none'}; scheduled DAGs, paused "
            f"until you unpause them (`srifty airflow dags unpause DAG_ID`): "
            f"{', '.join(paused) or 'none'}",
            flush=True,
        )
        print(
            f"Airflow: http://{LOOPBACK}:{airflow_port}  (user {ADMIN_USER}, password "
            f"{password})\n"
            f"MLflow:  http://{LOOPBACK}:{mlflow_port}\n"
            f"data folder {root}; logs in {logs}. Ctrl-C stops both.",
            flush=True,
        )
        if once:
            return 0
        while all(p.poll() is None for p in procs.values()):
            time.sleep(1.0)
        stopped = ", ".join(n for n, p in procs.items() if p.poll() is not None)
        raise SriftyError(f"a server stopped ({stopped}); see {logs}")
    finally:
        stop.stopping = True  # a signal now would cut the stop short
        if procs:
            print("stopping Airflow and MLflow ...", flush=True)
        stop_process_groups(procs.values())
