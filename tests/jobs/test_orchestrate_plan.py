"""plan_job: the real planner over the trigger's offers, with MLflow records of the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from srifty_core.errors import ConfigError
from srifty_core.jobs import orchestrate as orc

PARAMS: dict[str, Any] = {
    "model": "dlrm",
    "size": "tiny",
    "global_batch": 16,
    "iterations": 20,
    "provider": "local",
    "offers": [{"type": "local.cpu", "market": "on-demand", "quota": 2, "price": 0.1}],
    "objective": "time",
}

LOCAL_NO_PRICE = {"type": "local.cpu", "quota": 2}
A_GPU_TYPE = {"type": "p3.2xlarge", "quota": 2, "price": 1}


def _runs(experiment: str = "srifty-jobs") -> list[Any]:
    import mlflow

    from srifty_core.tracking.store import setup_experiment

    exp = setup_experiment(experiment)
    return list(mlflow.search_runs([exp], output_format="list"))


def test_local_plan_uses_the_planner_and_opens_the_jobs_run(ready_to_plan: Path) -> None:
    job_path = orc.plan_job(orc.JobSpec.from_params(PARAMS), "manual__1")
    job = orc.JobPlan.load(job_path)
    plan = job.train
    assert job.config_id == "c0" and plan.config_id == "c0"
    assert sum(plan.local_batches) == 16
    assert [x.instance_type for x in job.launches] == ["local.cpu"]
    assert plan.world_size == sum(x.count for x in job.launches) <= 2
    assert job.predicted["t_iter_s"] > 0 and job.predicted["feasible"]
    assert job.usd_per_hour == pytest.approx(0.1 * plan.world_size)
    (run,) = _runs()
    assert run.info.run_id == job.job_run_id == job.config_run_id
    assert run.data.params["model"] == "dlrm" and run.data.params["iterations"] == "20"
    assert run.data.metrics["predicted_t_iter_s"] == pytest.approx(job.predicted["t_iter_s"])
    assert run.data.tags["srifty.kind"] == "job"


def test_a_resumed_plan_is_a_nested_run_without_what_was_taken_back(ready_to_plan: Path) -> None:
    first = orc.JobPlan.load(orc.plan_job(orc.JobSpec.from_params(PARAMS), "manual__2"))
    ck = Path(first.train.run_dir) / "checkpoint.pt"
    resume = {
        "checkpoint": str(ck), "iterations_done": 0, "time_spent_s": 3.0,
        "cost_spent_usd": 0.001, "parent_run_id": "manual__2", "job_run_id": first.job_run_id,
    }  # fmt: skip
    params = {**PARAMS, "offers": [{**PARAMS["offers"][0], "quota": 1}], "resume": resume}
    job = orc.JobPlan.load(orc.plan_job(orc.JobSpec.from_params(params), "manual__3"))
    assert job.config_id == "c1" and job.train.local_batches == (16,)
    assert job.train.run_dir == first.train.run_dir
    nested = [r for r in _runs() if r.data.tags.get("mlflow.parentRunId") == first.job_run_id]
    assert [r.info.run_id for r in nested] == [job.config_run_id]
    assert nested[0].data.params["iterations_done"] == "0"


def test_missing_inputs_name_the_dag_that_makes_them(data_dir: Path, ready_to_plan: Path) -> None:
    with pytest.raises(Exception, match="srifty_profile_model"):
        orc.plan_job(orc.JobSpec.from_params({**PARAMS, "model": "vgg16"}), "x")
    import shutil

    shutil.rmtree(data_dir / "mlflow")
    with pytest.raises(ConfigError, match="srifty_model_refresh"):
        orc.plan_job(orc.JobSpec.from_params(PARAMS), "y")


def test_bad_offers_and_impossible_limits_are_explained(ready_to_plan: Path) -> None:
    with pytest.raises(ConfigError, match=r"offers\[0\]\.price"):
        orc.plan_job(orc.JobSpec.from_params({**PARAMS, "offers": [LOCAL_NO_PRICE]}), "a")
    with pytest.raises(ConfigError, match=r"offers\[0\]\.type"):
        orc.plan_job(orc.JobSpec.from_params({**PARAMS, "offers": [A_GPU_TYPE]}), "b")
    with pytest.raises(orc.NoFeasiblePlan, match="time"):
        orc.plan_job(orc.JobSpec.from_params({**PARAMS, "time_limit_s": 1e-3}), "c")
    with pytest.raises(ConfigError, match=r"ec2\.image_id"):
        orc.JobSpec.from_params({**PARAMS, "provider": "ec2"})


def test_a_failed_job_ends_its_runs_as_failed(ready_to_plan: Path) -> None:
    first = orc.plan_job(orc.JobSpec.from_params(PARAMS), "manual__f")
    orc.job_failed(first, "monitor failed: TrainingFailed: workers exited")
    (run,) = _runs()
    assert run.info.status == "FAILED" and run.data.tags["srifty.outcome"] == "failed"
    assert "TrainingFailed" in run.data.tags["srifty.reason"]


def test_a_resumed_plan_cuts_what_the_last_run_logged_past_its_checkpoint(
    ready_to_plan: Path,
) -> None:
    """A run that lost a rank between two checkpoints logged iterations its checkpoint
    does not hold; the run that resumes logs them again. Planning the resumed run moves
    them off the log first (``progress.rewind``), so the log holds each iteration once."""
    import torch

    from srifty_core.runs.progress import ProgressLog, ProgressRecord, read_progress
    from srifty_core.worker.checkpoint import save_checkpoint

    first = orc.JobPlan.load(orc.plan_job(orc.JobSpec.from_params(PARAMS), "manual__r"))
    run_dir = Path(first.train.run_dir)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ck = run_dir / "checkpoint.pt"
    save_checkpoint(ck, model=model, optimizer=opt, iteration=4, global_batch=16, config_id="c0")
    with ProgressLog(run_dir / "progress.jsonl") as log:
        for i in range(1, 8):
            log.append(ProgressRecord(i, float(i), 0.1, 16, "c0"))
    resume = {
        "checkpoint": str(ck), "iterations_done": 4, "time_spent_s": 3.0,
        "cost_spent_usd": 0.001, "parent_run_id": "manual__r", "job_run_id": first.job_run_id,
    }  # fmt: skip
    params = {**PARAMS, "iterations": 16, "resume": resume}
    orc.plan_job(orc.JobSpec.from_params(params), "manual__r2")
    assert [r.iteration for r in read_progress(run_dir / "progress.jsonl")] == [1, 2, 3, 4]
    assert len(list(run_dir.glob("progress.jsonl.after-4.*.old"))) == 1
