"""The CeleryExecutor for real: a DAG run through the scheduler, its tasks run by a Celery worker.

As in ``docker/compose.yaml``, but as local processes: a fresh Postgres database (metadata DB
and Celery result backend), the local Redis as broker, and ``airflow api-server``,
``scheduler``, ``dag-processor`` and ``celery worker``, each in its own session with its log in
``tmp_path``. The test triggers ``srifty_catalog_refresh``, waits for the run to finish, and
checks it succeeded and that every task went through Celery: each task instance's
``external_executor_id`` (the Celery task id the executor hands out) has a ``SUCCESS`` row in
Celery's result table, written by the worker. Every process is stopped and the database
dropped afterwards; a failure shows the tails of the logs.

Parallel runs on one Redis don't meet: each run has its own queue (``[operators]
default_queue``, which is also Celery's default exchange), which only its worker consumes.

Run it alone:  .venv/bin/python -m pytest tests/dags/test_celery_executor.py -v
Skipped, saying why, when Postgres (127.0.0.1:5432) or Redis (127.0.0.1:6379) does not answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from srifty_core.airflow_env import (
    airflow_environment,
    migrate,
    run_airflow,
    start_airflow,
    stop_process_groups,
    wait_healthy,
)
from srifty_core.lifetime import free_port
from tests.dags.services import REDIS_DB, REDIS_HOST, REDIS_PORT, PostgresDB

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(480)]

DAG_ID = "srifty_catalog_refresh"
CONF = {"regions": ["us-east-1"], "fail_on_error": True}
STARTUP_TIMEOUT_S = 150.0
RUN_TIMEOUT_S = 240.0
LOG_TAIL_CHARS = 3000


@dataclass
class CeleryAirflow:
    """The Airflow processes of one test, with their environment and logs."""

    env: dict[str, str]
    logs: Path
    queue: str
    api_port: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        proc = start_airflow(args, self.env, self.logs / f"{name}.log")
        self.procs[name] = proc
        return proc

    def check_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        assert not dead, f"Airflow processes exited early: {dead}\n{self.log_tails()}"

    def log_tails(self) -> str:
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            text = log.read_text(errors="replace")
            tail = text[-LOG_TAIL_CHARS:]
            parts.append(f"----- {log.name} (last {LOG_TAIL_CHARS} chars)\n{tail}")
        return "\n".join(parts)


@pytest.fixture()
def celery_airflow(
    postgres_db: PostgresDB, redis_server: Any, tmp_path: Path
) -> Iterator[CeleryAirflow]:
    """Airflow with the CeleryExecutor on ``postgres_db`` and the local Redis, migrated and
    started; every process stopped (and the run's Redis keys deleted) afterwards, before the
    database is dropped."""
    tag = uuid.uuid4().hex[:10]
    queue = f"srifty-test-{tag}"
    api_port = free_port()
    env = {
        **airflow_environment(tmp_path / "airflow-home", sql_alchemy_conn=postgres_db.url),
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}",
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql://{postgres_db.address}",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
        "AIRFLOW__OPERATORS__DEFAULT_QUEUE": queue,
        # Airflow 3: workers report to the API server's execution API, never to the DB.
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API__WORKERS": "1",
        # Only the run the test triggers: no scheduled run once the DAG is unpaused.
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        # Each DAG file parsed once: no re-parse every 30 s (seconds of CPU) while it runs.
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
    }
    cluster = CeleryAirflow(env=env, logs=tmp_path / "logs", queue=queue, api_port=api_port)
    migrate(env)
    try:
        cluster.start("api-server", ["api-server", "--port", str(api_port)])
        cluster.start("scheduler", ["scheduler"])
        cluster.start("dag-processor", ["dag-processor"])
        worker_args = [
            "celery",
            "worker",
            "--queues",
            queue,
            "--concurrency",
            "1",
            "--celery-hostname",
            f"{queue}@%h",
            "--skip-serve-logs",  # its log server's fixed port would clash between runs
            "--without-mingle",
            "--without-gossip",
        ]
        cluster.start("celery-worker", worker_args)
        yield cluster
    finally:
        stop_process_groups(cluster.procs.values())
        leftovers = list(redis_server.scan_iter(match=f"*{queue}*"))
        if leftovers:
            redis_server.delete(*leftovers)


def _wait_for(what: str, check: Any, cluster: CeleryAirflow, timeout_s: float) -> Any:
    """Poll ``check()`` until it returns something truthy, while every process is alive."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cluster.check_alive()
        if result := check():
            return result
        time.sleep(2.0)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s\n{cluster.log_tails()}")


def test_catalog_refresh_runs_on_a_celery_worker(
    celery_airflow: CeleryAirflow, postgres_db: PostgresDB
) -> None:
    cluster = celery_airflow
    started = time.monotonic()
    try:
        wait_healthy(
            f"http://127.0.0.1:{cluster.api_port}/api/v2/monitor/health",
            cluster.procs["api-server"],
            STARTUP_TIMEOUT_S,
        )
    except Exception as exc:
        pytest.fail(f"API server: {exc}\n{cluster.log_tails()}")
    _wait_for(
        f"{DAG_ID} parsed by the DAG processor",
        lambda: postgres_db.query("SELECT 1 FROM serialized_dag WHERE dag_id = %s", (DAG_ID,)),
        cluster,
        STARTUP_TIMEOUT_S,
    )
    assert postgres_db.query("SELECT is_paused FROM dag WHERE dag_id = %s", (DAG_ID,)) == [(False,)]

    run_id = f"celery_test_{uuid.uuid4().hex[:8]}"
    try:
        run_airflow(
            ["dags", "trigger", DAG_ID, "--run-id", run_id, "-c", json.dumps(CONF)],
            cluster.env,
            quiet=True,
        )
    except Exception as exc:
        pytest.fail(f"trigger: {exc}\n{cluster.log_tails()}")

    def finished() -> str | None:
        rows = postgres_db.query(
            "SELECT state FROM dag_run WHERE dag_id = %s AND run_id = %s", (DAG_ID, run_id)
        )
        state = rows[0][0] if rows else None
        return state if state in ("success", "failed") else None

    state = _wait_for(f"run {run_id} finished", finished, cluster, RUN_TIMEOUT_S)
    print(f"run {run_id}: {state} {time.monotonic() - started:.0f} s after the API server started")

    tis = postgres_db.query(
        "SELECT task_id, state, queue, external_executor_id FROM task_instance"
        " WHERE dag_id = %s AND run_id = %s ORDER BY task_id",
        (DAG_ID, run_id),
    )
    assert state == "success", f"run {run_id}: {state}; tasks {tis}\n{cluster.log_tails()}"
    assert [(t[0], t[1], t[2]) for t in tis] == [
        ("gate", "success", cluster.queue),
        ("validate_catalog", "success", cluster.queue),
    ], tis

    # Through Celery: the worker stored a SUCCESS result for each task's Celery task id. It
    # stores it when the task's supervisor returns, which may be just after the task reported
    # its state to the API server (and so after the run is marked done): wait for it.
    celery_ids = [t[3] for t in tis]
    assert all(celery_ids), f"task instances without a Celery task id: {tis}"

    def celery_results() -> dict[str, str] | None:
        rows = postgres_db.query(
            "SELECT task_id, status FROM celery_taskmeta WHERE task_id = ANY(%s)", (celery_ids,)
        )
        done = {r[0]: r[1] for r in rows if r[1] in ("SUCCESS", "FAILURE", "REVOKED")}
        return done if len(done) == len(celery_ids) else None

    results = _wait_for("Celery results of the run's tasks", celery_results, cluster, 60)
    assert results == dict.fromkeys(celery_ids, "SUCCESS"), (
        f"Celery results {results} for {tis}\n{cluster.log_tails()}"
    )
    worker_log = (cluster.logs / "celery-worker.log").read_text(errors="replace")
    assert all(cid in worker_log for cid in celery_ids), cluster.log_tails()
