"""Start the Airflow and MLflow UIs on the data folder the demo used (``srifty ui``).

Airflow runs as ``airflow standalone`` (API server and UI, scheduler, triggerer, DAG
processor) against the demo's Airflow home, with one admin user whose password is set here
so it is known; MLflow runs ``mlflow server`` on the demo's SQLite store and artifacts. Both
listen on loopback only. Ctrl-C (or SIGTERM) stops both process groups.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from srifty_core import paths
from srifty_core.airflow_env import (
    DEADLINE_ALERTS_ENV,
    airflow_environment,
    migrate,
    stop_process_groups,
    wait_healthy,
)
from srifty_core.errors import SriftyError
from srifty_core.tracking import default_tracking_uri

ADMIN_USER = "admin"
DEFAULT_PASSWORD = "srifty-admin"


def run_ui(
    data_dir: Path | None = None,
    *,
    airflow_port: int = 8080,
    mlflow_port: int = 5001,
    password: str = DEFAULT_PASSWORD,
    once: bool = False,
) -> int:
    """Start both UIs and wait for Ctrl-C. ``once``: stop as soon as both answer (tests)."""
    root = paths.data_dir(data_dir)
    home = paths.airflow_home(root)
    env = {
        **os.environ,
        **airflow_environment(home),
        DEADLINE_ALERTS_ENV: "1",  # a real scheduler runs the DAGs here (no dag.test())
        paths.ENV_VAR: str(root),
        "AIRFLOW__API__PORT": str(airflow_port),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        # `airflow standalone` starts its components as `airflow ...` from PATH
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
    }
    (home / "simple_auth_manager_passwords.json.generated").write_text(
        json.dumps({ADMIN_USER: password})
    )
    migrate(env)
    artifacts = (paths.mlflow_dir(root) / "artifacts").resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    logs = home / "ui-logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with (logs / "airflow.log").open("ab") as a_log, (logs / "mlflow.log").open("ab") as m_log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "airflow", "standalone"],
                    env=env,
                    stdout=a_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            procs.append(
                subprocess.Popen(
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
                        "127.0.0.1",
                        "--port",
                        str(mlflow_port),
                    ],
                    env=env,
                    stdout=m_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        print("starting Airflow and MLflow (20-40 s) ...", flush=True)
        wait_healthy(f"http://127.0.0.1:{mlflow_port}/health", procs[1], 120)
        wait_healthy(f"http://127.0.0.1:{airflow_port}/api/v2/monitor/health", procs[0], 180)
        print(
            f"Airflow: http://127.0.0.1:{airflow_port}  (user {ADMIN_USER}, password {password})\n"
            f"MLflow:  http://127.0.0.1:{mlflow_port}\n"
            f"data folder {root}; logs in {logs}. Ctrl-C stops both.",
            flush=True,
        )
        if once:
            return 0
        while all(p.poll() is None for p in procs):
            time.sleep(1.0)
        raise SriftyError(f"a server stopped; see {logs}")
    except KeyboardInterrupt:
        return 0
    finally:
        stop_process_groups(procs)
