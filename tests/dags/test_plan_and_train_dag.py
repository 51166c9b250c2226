"""Run srifty_plan_and_train for real with dag.test() on local workers with a tiny model."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from srifty_core.cloud.local import LocalProvider, pid_alive
from srifty_core.runs.progress import read_progress
from tests.dags.services import check_trigger, fresh

pytestmark = pytest.mark.airflow

DAG_ID = "srifty_plan_and_train"
N = 30
CONF: dict[str, Any] = {
    "model": "dlrm",
    "size": "tiny",
    "global_batch": 16,
    "iterations": N,
    "offers": [{"type": "local.cpu", "market": "on-demand", "quota": 2, "price": 0.1}],
    "objective": "time",
    "provider": "local",
    "checkpoint_every": 5,
}


def _job_runs() -> list[Any]:
    import mlflow

    from srifty_core.jobs.job_log import EXPERIMENT
    from srifty_core.tracking.store import setup_experiment

    return list(mlflow.search_runs([setup_experiment(EXPERIMENT)], output_format="list"))


def _allocations(provider: LocalProvider) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(provider.state_dir.glob("local-*.json"))]


def _nothing_left_running(provider: LocalProvider, handed_over: Sequence[str] = ()) -> None:
    """No worker runs, and no instance but those of allocations handed to a child run."""
    states = _allocations(provider)
    assert states, "nothing was provisioned"
    for s in states:
        if s["allocation"]["id"] not in handed_over:
            assert all(v != "running" for v in s["instances"].values()), s["instances"]
        assert not any(pid_alive(p["pid"], p["start_ticks"]) for p in s["processes"])


def _runs_dirs(data_dir: Path) -> list[Path]:
    return sorted(p for p in (data_dir / "runs").iterdir() if p.is_dir())


def test_plan_and_train_runs_to_the_last_iteration(dagbag: Any, ready_to_plan: Path) -> None:
    run = fresh(dagbag, DAG_ID).test(run_conf=CONF)
    assert run.state == "success"
    (run_dir,) = _runs_dirs(ready_to_plan)
    recs = read_progress(run_dir / "progress.jsonl")
    assert [r.iteration for r in recs] == list(range(1, N + 1))
    assert {r.config_id for r in recs} == {"c0"}
    _nothing_left_running(LocalProvider())
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["finished"] == "success" and states["release"] == "success"
    assert states["child_conf"] == "skipped" and states["trigger_replan"] == "skipped"
    (job,) = _job_runs()
    assert job.info.status == "FINISHED" and job.data.tags["srifty.outcome"] == "finished"
    assert job.data.metrics["outcome_iterations"] == N
    # the run folder's outcome.json holds the numbers the run got (no wall time or bill:
    # the DAG's steps are separate tasks, none of which saw the whole job)
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["iterations"] == N and outcome["wall_s"] is None
    assert job.data.metrics["outcome_training_s"] == pytest.approx(outcome["training_s"])
    assert job.data.metrics["measured_t_iter_s"] > 0
    assert "predicted_t_iter_s" in job.data.metrics
    import mlflow

    client = mlflow.MlflowClient()
    names = {a.path for a in client.list_artifacts(job.info.run_id)}
    assert {"timeline.png", "c0"} <= names
    c0 = {a.path for a in client.list_artifacts(job.info.run_id, "c0")}
    assert {"c0/plan.json", "c0/explanation.txt", "c0/decisions.jsonl"} <= c0


def test_missing_profiles_fail_the_plan_naming_the_dag(dagbag: Any, data_dir: Path) -> None:
    run = fresh(dagbag, DAG_ID).test(run_conf=CONF)
    assert run.state == "failed"
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["plan"] == "failed" and states["provision"] == "upstream_failed"


def test_the_trigger_checks_types_and_ranges_with_the_models_schema(dagbag: Any) -> None:
    """The Params' JSON schemas come from ``planner.schema.job_conf.JobConf``: the trigger form and
    the API refuse a wrong type or range before a run is created."""
    import copy

    from airflow.sdk.exceptions import ParamValidationError

    params = dagbag.get_dag(DAG_ID).params
    copy.deepcopy(params).update(CONF)
    for bad in (
        {"global_batch": True},
        {"iterations": 0},
        {"time_limit_s": -1},
        {"model": "vgg17"},
        {"offers": [{"type": "local.cpu", "qouta": 2}]},
    ):
        with pytest.raises(ParamValidationError):
            copy.deepcopy(params).update(bad)


def test_a_bad_conf_fails_the_plan_at_once_naming_the_field(
    dagbag: Any, data_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Airflow keeps a top-level typo as a new param; the plan task rejects it (the conf is
    checked before anything is looked up) and fails without a retry."""
    dag = fresh(dagbag, DAG_ID)
    assert dag.task_dict["plan"].retries == 1
    t0 = time.monotonic()
    run = dag.test(run_conf={**CONF, "gloabl_batch": 16})
    assert run.state == "failed" and time.monotonic() - t0 < 30  # no 30 s retry delay
    ti = run.get_task_instance("plan")
    assert ti.state == "failed" and ti.try_number == 1
    logged = "".join(capfd.readouterr())
    assert "gloabl_batch: unknown conf field 'gloabl_batch'; did you mean 'global_batch'?" in logged


@pytest.mark.slow
def test_a_preemption_triggers_a_resuming_child_run(dagbag: Any, ready_to_plan: Path) -> None:
    data_dir = ready_to_plan
    provider = LocalProvider()
    seen: list[str] = []

    def reclaim() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            runs = (data_dir / "runs").glob("*/progress.jsonl")
            if any(len(read_progress(p)) >= 5 for p in runs):
                _, second = _allocations(provider)  # one allocation per local worker
                iid = second["allocation"]["instance_ids"][0]
                provider.interrupt(iid)
                seen.append(iid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=reclaim, daemon=True)
    killer.start()
    dag = fresh(dagbag, DAG_ID)
    run = dag.test(run_conf={**CONF, "step_sleep_s": 0.3, "budget_usd": 5.0})
    killer.join(timeout=5)
    assert seen, "the job ended before it could be interrupted"
    assert run.state == "success"
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["trigger_replan"] == "success" and states["finished"] == "skipped"
    assert states["release"] == "success"

    from airflow.models.dagrun import DagRun

    children = [r for r in DagRun.find(dag_id=DAG_ID) if (r.conf or {}).get("resume")]
    children = [r for r in children if r.conf["resume"]["parent_run_id"] == run.run_id]
    assert len(children) == 1
    child = children[0]
    conf = child.conf
    (run_dir,) = _runs_dirs(data_dir)
    done = conf["resume"]["iterations_done"]
    assert 5 <= done < N and conf["iterations"] == N - done
    assert conf["offers"][0]["quota"] == 1 and 4.99 < conf["budget_usd"] < 5.0
    assert conf["resume"]["checkpoint"] == str(run_dir / "checkpoint.pt")
    assert conf["resume"]["depleted"] == []
    (job,) = _job_runs()
    assert conf["resume"]["job_run_id"] == job.info.run_id
    # The worker that was not taken back keeps its allocation: handed over, left running.
    survivor = [a["allocation"]["id"] for a in _allocations(provider)
                if seen[0] not in a["allocation"]["instance_ids"]]  # fmt: skip
    assert conf["resume"]["allocations"] == survivor
    _nothing_left_running(provider, handed_over=survivor)
    (kept,) = [a for a in _allocations(provider) if a["allocation"]["id"] == survivor[0]]
    assert set(kept["instances"].values()) == {"running"}

    # Run the triggered child (dag.test replaces the queued run of that logical date with
    # one it runs in this process): it plans again on the survivor and finishes the job.
    assert child.logical_date is not None
    second = dag.test(logical_date=child.logical_date, run_conf=conf)
    assert second.state == "success"
    # The child trained on the kept allocation and launched nothing new.
    assert second.get_task_instance("provision").xcom_pull(task_ids="provision") == survivor
    assert len(_allocations(provider)) == 2
    recs = read_progress(run_dir / "progress.jsonl")
    assert sorted({r.iteration for r in recs}) == list(range(1, N + 1))
    assert {r.config_id for r in recs} == {"c0", "c1"}
    assert [r.config_id for r in recs if r.iteration > done] == ["c1"] * (N - done)
    _nothing_left_running(provider)
    runs = {r.info.run_id: r for r in _job_runs()}
    job = runs[job.info.run_id]
    (nested,) = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId")]
    assert nested.data.tags["mlflow.parentRunId"] == job.info.run_id
    assert nested.data.tags["srifty.outcome"] == "finished"
    assert job.data.tags["srifty.outcome"] == "finished" and job.info.status == "FINISHED"
    assert job.data.metrics["outcome_configurations"] == 2


def test_bad_trigger_names_the_field(dagbag: Any) -> None:
    """One bad trigger through ``dag.test``, the others through the step of it that refuses
    them (``check_trigger``)."""
    from airflow.sdk.exceptions import ParamValidationError

    dag = fresh(dagbag, DAG_ID)
    with pytest.raises(ParamValidationError, match="provider"):
        dag.test(run_conf={**CONF, "provider": "gcp"})
    check_trigger(dag, CONF)  # the good conf passes
    for field, bad in (
        ("quota", {"offers": [{"type": "local.cpu", "quota": -1}]}),
        ("global_batch", {"global_batch": 0}),
        ("resume", {"resume": {"iterations_done": 3}}),
    ):
        with pytest.raises(ParamValidationError, match=field):
            check_trigger(dag, {**CONF, **bad})
