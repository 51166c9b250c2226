"""The planner puts a job's run folder on the deployment's run storage, and a re-plan's
resume conf may only point into a run folder there. A moto S3 server on loopback stands in
for S3 (see ``test_run_store``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from srifty_core import paths
from srifty_core.errors import ConfigError
from srifty_core.jobs import orchestrate as orc
from srifty_core.runs import store as run_store
from srifty_core.worker.checkpoint import save_checkpoint
from tests.runs.test_run_store import BUCKET, s3_endpoint  # noqa: F401  (the fixture)

PARAMS: dict[str, Any] = {
    "model": "dlrm",
    "size": "tiny",
    "global_batch": 16,
    "iterations": 20,
    "offers": [{"type": "local.cpu", "market": "on-demand", "quota": 2, "price": 0.1}],
    "objective": "time",
    "provider": "local",
    "budget_usd": 10.0,
    "checkpoint_every": 5,
}


def test_plans_and_a_replan_live_in_the_configured_run_storage(
    ready_to_plan: Path,
    s3_endpoint: str,  # noqa: F811  (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(paths.RUN_STORAGE_ENV, f"s3://{BUCKET}/deploy")
    job_uri = str(orc.plan_job(orc.JobSpec.from_params(PARAMS), "manual__s3", track=False))
    run_dir = f"s3://{BUCKET}/deploy/runs/manual__s3"
    assert job_uri == f"{run_dir}/job-c0.json"
    job = orc.JobPlan.load(job_uri)
    plan = job.train
    assert plan.run_dir == run_dir and job.facts.progress_path == f"{run_dir}/progress.jsonl"
    assert not (ready_to_plan / "runs").exists(), "nothing of the run on the local disk"
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(
        plan.checkpoint_path, model=model, optimizer=opt, iteration=5, global_batch=16,
        config_id="c0",
    )  # fmt: skip
    resume = {"checkpoint": f"{run_dir}/checkpoint.pt", "iterations_done": 5}
    child = str(
        orc.plan_job(orc.JobSpec.from_params({**PARAMS, "resume": resume}), "r2", track=False)
    )
    assert child == f"{run_dir}/job-c1.json"  # the same folder, the next configuration
    assert run_store.names(run_dir, "job-c*.json") == ["job-c0.json", "job-c1.json"]
    for bad in (f"s3://{BUCKET}/elsewhere/r/checkpoint.pt", str(ready_to_plan / "checkpoint.pt")):
        conf = {**PARAMS, "resume": {"checkpoint": bad, "iterations_done": 0}}
        with pytest.raises(ConfigError, match=r"resume\.checkpoint: must be in a run folder"):
            orc.plan_job(orc.JobSpec.from_params(conf), "r3", track=False)
