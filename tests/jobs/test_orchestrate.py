"""The plan-and-train steps on local workers: plan, provision, start, poll, re-plan, release."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest

from srifty_core.cloud.local import LocalProvider, pid_alive
from srifty_core.errors import ConfigError
from srifty_core.jobs import orchestrate as orc
from srifty_core.runs.progress import read_progress
from srifty_core.worker.checkpoint import load_checkpoint

PARAMS: dict[str, Any] = {
    "model": "dlrm",
    "size": "tiny",
    "global_batch": 16,
    "iterations": 20,
    "offers": [{"type": "local.cpu", "market": "on-demand", "quota": 2, "price": 0.1}],
    "objective": "time",
    "provider": "local",
    "time_limit_s": None,
    "budget_usd": 10.0,
    "checkpoint_every": 5,
    "resume": None,
}


def test_job_spec_validates_and_fills_defaults() -> None:
    spec = orc.JobSpec.from_params(PARAMS)
    assert spec.time_limit_s == math.inf and spec.budget_usd == 10.0
    assert spec.target_iterations == 20 and spec.risk_quantile == 0.9
    assert orc.JobSpec.from_params({**PARAMS, "risk_quantile": 0.5}).risk_quantile == 0.5
    for bad in (0, 1.0, "0.9", True, math.nan):  # never silently the default
        with pytest.raises(ConfigError, match="risk_quantile"):
            orc.JobSpec.from_params({**PARAMS, "risk_quantile": bad})
    with pytest.raises(ConfigError, match="provider"):
        orc.JobSpec.from_params({**PARAMS, "provider": "gcp"})
    with pytest.raises(ConfigError, match="offers"):
        orc.JobSpec.from_params({**PARAMS, "offers": []})
    with pytest.raises(ConfigError, match="bandwidth"):
        orc.JobSpec.from_params({**PARAMS, "bandwidth": "guess"})
    with pytest.raises(ConfigError, match="global_batch: missing"):
        orc.JobSpec.from_params({k: v for k, v in PARAMS.items() if k != "global_batch"})
    with pytest.raises(ConfigError, match="checkpoint"):
        orc.JobSpec.from_params({**PARAMS, "resume": {"iterations_done": 3}})
    resumed = orc.JobSpec.from_params(
        {**PARAMS, "resume": {"checkpoint": "/x/checkpoint.pt", "iterations_done": 7}}
    )
    assert resumed.target_iterations == 27


def test_plan_splits_the_batch_over_local_workers(ready_to_plan: Path) -> None:
    params = dict(PARAMS)
    path = orc.plan_job(orc.JobSpec.from_params(params), "manual__2026/x", track=False)
    job = orc.JobPlan.load(path)
    plan = job.train
    assert plan.local_batches == (8, 8) and plan.iterations == 20
    assert job.predicted["risk_quantile"] == 0.9 and "time_at_risk_s" in job.predicted
    assert Path(plan.run_dir) == ready_to_plan / "runs" / "manual__2026_x"


def test_resume_without_a_checkpoint_names_the_field(tmp_path: Path) -> None:
    resume = {"checkpoint": str(tmp_path / "checkpoint.pt"), "iterations_done": 3}
    with pytest.raises(ConfigError, match=r"resume\.checkpoint"):
        orc.plan_job(orc.JobSpec.from_params({**PARAMS, "resume": resume}), "r")


@pytest.mark.parametrize(
    "where",
    [
        "/etc/checkpoint.pt",  # anywhere on the host
        "{runs}/../elsewhere/checkpoint.pt",  # out of the run folders by ..
        "{runs}/checkpoint.pt",  # the run folders' root, not a run folder
    ],
)
def test_a_resume_checkpoint_outside_the_run_folders_is_refused(
    ready_to_plan: Path, where: str
) -> None:
    """A trigger conf names the checkpoint; the run wrote plans, logs and a checkpoint beside
    it wherever it pointed. Now only a run folder under the data folder is accepted."""
    ck = where.format(runs=ready_to_plan / "runs")
    resume = {"checkpoint": ck, "iterations_done": 0}
    with pytest.raises(ConfigError, match=r"resume\.checkpoint: must be in a run folder"):
        orc.plan_job(orc.JobSpec.from_params({**PARAMS, "resume": resume}), "r", track=False)


def test_a_batch_the_offers_cannot_split_is_explained(ready_to_plan: Path) -> None:
    with pytest.raises(orc.NoFeasiblePlan, match="global_batch: 12 cannot be split"):
        orc.plan_job(orc.JobSpec.from_params({**PARAMS, "global_batch": 12}), "r", track=False)


def _wait(plan_path: Path, alloc: list[str], spec: orc.JobSpec, t0: float, p: LocalProvider) -> Any:
    end = time.monotonic() + 120
    while time.monotonic() < end:
        r = orc.poll(plan_path, alloc, spec, t0, provider=p)
        if r.status != orc.RUNNING:
            return r
        time.sleep(0.1)
    raise AssertionError("training did not finish")


@pytest.mark.slow
def test_train_then_preempt_then_resume(ready_to_plan: Path) -> None:
    provider = LocalProvider()
    params = {**PARAMS, "step_sleep_s": 0.05}
    spec = orc.JobSpec.from_params(params)
    plan_path = orc.plan_job(spec, "run1")
    plan = orc.JobPlan.load(plan_path).train
    assert plan.local_batches == (8, 8)
    alloc = orc.provision(plan_path, provider)
    kept: list[str] = []
    try:
        t0 = orc.start_training(plan_path, alloc, provider)
        end = time.monotonic() + 60
        while time.monotonic() < end and len(read_progress(plan.progress_path)) < 6:
            time.sleep(0.02)
        assert len(alloc) == 2  # one allocation per local worker
        instance = provider.get_allocation(alloc[1]).instance_ids[0]
        provider.interrupt(instance)
        result = _wait(plan_path, alloc, spec, t0, provider)
        assert result.status == orc.REPLAN and result.depleted == ()
        assert result.interrupted == (instance,) and result.lost == {"local.cpu/on-demand": 1}
        conf = orc.child_conf(params, plan_path, alloc, result.to_dict(), "parent-1")
        kept = conf["resume"]["allocations"]
    finally:
        orc.release(alloc, provider, except_ids=kept)
    pids = [p for a in alloc for p in provider.worker_pids(provider.get_allocation(a))]
    assert not any(pid_alive(p) for p in pids)  # stopped (they checkpointed)
    # The survivor's allocation is handed over; the one that lost its worker is released.
    assert conf["resume"]["allocations"] == [alloc[0]]
    ck = load_checkpoint(plan.checkpoint_path)
    assert ck is not None
    done = ck.iteration
    assert 0 < done < 20
    assert conf["offers"][0]["quota"] == 1 and conf["iterations"] == 20 - done
    assert conf["resume"]["iterations_done"] == done
    assert conf["resume"]["parent_run_id"] == "parent-1"
    assert conf["resume"]["depleted"] == []
    assert conf["resume"]["checkpoint"] == str(plan.checkpoint_path)
    spent = conf["resume"]["cost_spent_usd"]
    assert spent == pytest.approx(0.2 * result.elapsed_s / 3600)  # 2 workers at $0.1/h
    assert conf["budget_usd"] == pytest.approx(10.0 - spent)

    child = orc.JobSpec.from_params(conf)
    child_path = orc.plan_job(child, "ignored-when-resuming")
    child_plan = orc.JobPlan.load(child_path).train
    assert child_plan.run_dir == plan.run_dir and child_plan.local_batches == (16,)
    launched = set(provider.state_dir.glob("local-*.json"))
    alloc2 = orc.provision(child_path, provider, keep=orc.handed_over(child))
    assert alloc2 == [alloc[0]]  # kept across the re-plan: nothing launched
    assert set(provider.state_dir.glob("local-*.json")) == launched
    try:
        t1 = orc.start_training(child_path, alloc2, provider)
        result = _wait(child_path, alloc2, child, t1, provider)
        assert result.status == orc.FINISHED
    finally:
        orc.release(alloc2, provider)
    recs = read_progress(plan.progress_path)
    assert recs[-1].iteration == 20
    assert sorted({r.iteration for r in recs}) == list(range(1, 21))


def test_workers_that_die_without_a_preemption_fail_the_poll(ready_to_plan: Path) -> None:
    provider = LocalProvider()
    spec = orc.JobSpec.from_params({**PARAMS, "model": "dlrm"})
    plan_path = orc.plan_job(spec, "broken", track=False)
    alloc = orc.provision(plan_path, provider)
    try:
        allocs = [provider.get_allocation(a) for a in alloc]
        provider.run_group(allocs, ["python3", "-c", "raise SystemExit(1)"])
        end = time.monotonic() + 30
        while time.monotonic() < end and any(
            c is None for a in allocs for c in provider.exit_codes(a).values()
        ):
            time.sleep(0.05)
        with pytest.raises(orc.TrainingFailed, match="without a preemption"):
            orc.poll(plan_path, alloc, spec, time.time(), provider=orc.LocalProvider())
    finally:
        orc.release(alloc, provider)


def _provisioned_at(provider: LocalProvider, run: str, iteration: int) -> tuple[Path, list[str]]:
    """A planned, provisioned job of ``PARAMS`` whose checkpoint holds ``iteration``, no
    worker started: what a re-plan finds once it has stopped the workers."""
    import torch
    from torch import nn

    from srifty_core.worker.checkpoint import save_checkpoint

    plan_path = orc.plan_job(orc.JobSpec.from_params(PARAMS), run, track=False)
    plan = orc.JobPlan.load(plan_path).train
    alloc = orc.provision(plan_path, provider)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(plan.checkpoint_path, model=model, optimizer=opt, iteration=iteration,
                    global_batch=16, config_id="c0")  # fmt: skip
    return plan_path, alloc


def test_a_job_that_finished_before_its_replan_is_finished_not_failed(
    ready_to_plan: Path,
) -> None:
    # a preemption (or a re-plan decision) near the end: by the time the re-plan stops
    # the workers, the checkpoint holds the last iteration
    provider = LocalProvider()
    plan_path, alloc = _provisioned_at(provider, "run-late", iteration=20)
    result = {"status": "replan", "elapsed_s": 3.0, "spent_usd": 0.0001, "lost": {}}
    try:
        with pytest.raises(orc.JobFinished, match="finished its 20 iterations"):
            orc.child_conf(PARAMS, plan_path, alloc, result, "parent-1")
        assert orc.continue_or_finish(PARAMS, plan_path, alloc, result, "parent-1") is None
    finally:
        orc.release(alloc, provider)


def test_a_job_that_lost_every_instance_fails_naming_why(ready_to_plan: Path) -> None:
    # the method reads a preemption as its type's depletion: with every offer's quota
    # taken back there is nothing to re-plan on, and the re-plan says so instead of
    # planning an empty configuration
    provider = LocalProvider()
    plan_path, alloc = _provisioned_at(provider, "run-lost", iteration=5)
    lost = {"status": "replan", "elapsed_s": 3.0, "spent_usd": 0.0001,
            "lost": {"local.cpu/on-demand": 2}}  # fmt: skip
    try:
        with pytest.raises(orc.TrainingFailed, match="every instance was taken back"):
            orc.child_conf(PARAMS, plan_path, alloc, lost, "parent-1")
        # one of the two lost: the child plans on what is left, from the checkpoint
        one = {**lost, "lost": {"local.cpu/on-demand": 1}}
        conf = orc.child_conf(PARAMS, plan_path, alloc, one, "parent-1")
        assert conf["offers"][0]["quota"] == 1 and conf["iterations"] == 15
    finally:
        orc.release(alloc, provider)
