"""The task policy every DAG follows (read from the parsed DAGs and the metadata DB):
timeouts, tz-aware dates, one probe-store Asset, the local host's pool, deterministic
errors without retries, and the plan-and-train job's deadline alert from its time limit."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from srifty_core import paths
from srifty_core.airflow_env import LOCAL_HOST_POOL, POOLS
from srifty_core.errors import ConfigError
from tests.dags.services import fresh

pytestmark = pytest.mark.airflow

TRAIN = "srifty_plan_and_train"


@pytest.fixture()
def policy(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import importlib

    monkeypatch.syspath_prepend(str(paths.PLUGINS_DIR))
    return importlib.import_module("srifty_policy")


def test_every_task_has_a_timeout_and_every_dag_a_tz_aware_start(dagbag: Any) -> None:
    for dag_id, dag in dagbag.dags.items():
        for task in dag.tasks:
            assert task.start_date is not None and task.start_date.tzinfo is not None, task
            if task.task_id == "monitor":  # the sensor: bounded by its deferral timeout
                assert task.timeout > 0
            else:
                assert task.execution_timeout is not None, f"{dag_id}.{task.task_id}"
    assert dagbag.get_dag(TRAIN).dagrun_timeout is not None


def test_one_probe_store_asset_for_the_producer_and_the_consumer(dagbag: Any, policy: Any) -> None:
    (outlet,) = dagbag.get_dag("srifty_probe_sweep").get_task("publish").outlets
    refresh = dagbag.get_dag("srifty_model_refresh")
    assert outlet == policy.PROBE_STORE
    # Scheduled on the Asset alone: one refresh per new data, never a timed second one.
    assert refresh.timetable.asset_condition == policy.PROBE_STORE
    assert type(refresh.timetable).__name__ == "AssetTriggeredTimetable"


def test_local_host_tasks_share_one_pool_that_the_metadata_db_holds(dagbag: Any) -> None:
    from airflow.models.pool import Pool

    pooled = {
        (dag_id, t.task_id)
        for dag_id, dag in dagbag.dags.items()
        for t in dag.tasks
        if t.pool == LOCAL_HOST_POOL
    }
    assert pooled == {
        ("srifty_probe_sweep", "on_allocation.sweep"),
        ("srifty_profile_model", "profile_on"),
        ("srifty_profile_model", "reference"),  # a CPU reference profile for cloud profiling
    }
    used = {t.pool for dag in dagbag.dags.values() for t in dag.tasks}
    assert used <= {Pool.DEFAULT_POOL_NAME, *POOLS}
    pool = Pool.get_pool(LOCAL_HOST_POOL)
    assert pool is not None and pool.slots == 1 and pool.include_deferred


def test_deterministic_errors_fail_at_once_and_transient_ones_retry(policy: Any) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    @policy.fails_fast
    def bad_conf() -> None:
        raise ConfigError("iterations: must be > 0")

    @policy.fails_fast
    def flaky() -> None:
        raise TimeoutError("the provider's API")

    with pytest.raises(AirflowFailException, match="ConfigError: iterations"):
        bad_conf()
    with pytest.raises(TimeoutError):
        flaky()


def test_the_deadline_alert_comes_from_the_jobs_time_limit(
    dagbag: Any, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with a time limit gets a deadline at its queue time plus the limit plus the
    margin (the runs below fail at their plan, no profiles: a failed run keeps its deadline
    row, and Airflow 3.3.2's dag.test() cannot finish a successful run with one); a run
    without a limit gets none."""
    from airflow.models.deadline import Deadline
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from srifty_core.airflow_env import DEADLINE_ALERTS_ENV

    assert not dagbag.get_dag(TRAIN).deadline  # off where dag.test() runs the DAGs
    monkeypatch.setenv(DEADLINE_ALERTS_ENV, "1")  # as in a deployment
    dag = fresh(dagbag, TRAIN)
    (alert,) = dag.deadline
    assert type(alert.reference).__name__ == "JobTimeLimitDeadline"
    assert alert.interval == timedelta(minutes=10)
    conf = {"iterations": 4, "provider": "local", "time_limit_s": 3600}
    limited = dag.test(run_conf=conf)
    unlimited = fresh(dagbag, TRAIN).test(run_conf={"iterations": 4, "provider": "local"})
    assert limited.state == unlimited.state == "failed"
    with create_session() as session:
        rows = {
            dagrun_id: deadline_time
            for dagrun_id, deadline_time in session.execute(
                select(Deadline.dagrun_id, Deadline.deadline_time).where(
                    Deadline.dagrun_id.in_([limited.id, unlimited.id])
                )
            )
        }
    start = limited.queued_at or limited.run_after
    assert rows == {limited.id: start + timedelta(seconds=3600 + 600)}


def test_the_deadline_callback_tags_the_jobs_mlflow_runs(
    ready_to_plan: Path, airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    import mlflow

    from srifty_core.jobs import orchestrate as orc
    from srifty_core.jobs.job_log import EXPERIMENT
    from srifty_core.tracking.store import setup_experiment

    monkeypatch.syspath_prepend(str(paths.PLUGINS_DIR))
    deadline = importlib.import_module("srifty_deadline")
    conf = {
        "model": "dlrm",
        "size": "tiny",
        "global_batch": 4,
        "iterations": 3,
        "offers": [{"type": "local.cpu", "market": "on-demand", "quota": 1, "price": 0.1}],
    }
    job_path = orc.plan_job(orc.JobSpec.from_params(conf), "manual__late")
    context = {
        "dag_run": {"run_id": "manual__late", "conf": conf},
        "deadline": {"id": "d", "deadline_time": "2026-01-01T01:10:00+00:00"},
    }
    asyncio.run(deadline.job_over_time_limit(context))
    job = orc.JobPlan.load(job_path)
    runs = mlflow.search_runs([setup_experiment(EXPERIMENT)], output_format="list")
    tagged = {r.info.run_id for r in runs if "srifty.deadline_missed" in r.data.tags}
    assert tagged == {job.job_run_id, job.config_run_id} and None not in tagged
    # A conf pointing outside the data folder's runs finds nothing and writes nothing.
    outside = {"resume": {"checkpoint": "/etc/checkpoint.pt"}}
    assert orc.deadline_missed("manual__late", outside, "t") is None
    assert orc.deadline_missed("no-such-run", {}, "t") is None
