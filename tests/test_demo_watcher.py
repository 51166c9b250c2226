"""The demo's DAG runs (a run that does not succeed stops it) and its preemption watcher
(it reclaims a worker of the job the demo runs, never because of an earlier run's log in the
same data folder)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from srifty_core.airflow_env import AirflowSession
from srifty_core.cloud.base import LaunchRequest, Market
from srifty_core.cloud.local import LocalProvider
from srifty_core.demo import PREEMPT_AT, _preempt_when_running, run_dag
from srifty_core.errors import SriftyError
from srifty_core.runs.progress import PROGRESS_FILE, ProgressLog, ProgressRecord


def _log(run: Path, steps: int) -> None:
    run.mkdir(parents=True)
    log = ProgressLog(run / PROGRESS_FILE)
    for i in range(1, steps + 1):
        log.append(ProgressRecord(i, 1000.0 + i, 0.1, 8, "c0"))
    log.close()


def test_the_watcher_waits_for_this_jobs_log_not_an_earlier_one(data_dir: Path) -> None:
    _log(data_dir / "runs" / "earlier", 40)  # a finished run of a previous demo
    p = LocalProvider()
    a = p.launch(LaunchRequest("local.cpu", count=2, market=Market.SPOT))
    p.run(a, [sys.executable, "-c", "import time; time.sleep(120)"])
    stop = threading.Event()
    try:
        taken = _preempt_when_running(data_dir, stop)
        time.sleep(1.0)  # 20 polls
        assert taken == []
        _log(data_dir / "runs" / "this-job", PREEMPT_AT)
        deadline = time.monotonic() + 20
        while not taken and time.monotonic() < deadline:
            time.sleep(0.05)
        assert taken == [a.instance_ids[1]]
    finally:
        stop.set()
        p.release(a)


def test_a_dag_that_does_not_succeed_stops_the_demo_naming_it_and_its_logs(
    airflow_home: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k.startswith("AIRFLOW")}
    with (
        AirflowSession(env) as airflow,
        pytest.raises(SriftyError, match=r"srifty_no_such_dag failed; task logs: .*logs"),
    ):
        run_dag(airflow, "srifty_no_such_dag", {}, airflow_home)
