"""A whole job on the emulated EC2 from the shell (``jobs.emulated_job``): planned with
the real planner from the store's T4 profile and the champion bandwidth model, provisioned
on the emulator, trained as its clock runs, one spot VM taken back, re-planned without the
depleted type, finished after exactly N iterations, every VM released; and no wall time
spent waiting on the simulated clock."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from srifty_core.cloud.base import InstanceState
from srifty_core.errors import ConfigError
from srifty_core.jobs.emulated_job import make_provider, parse_preemption
from srifty_core.jobs.job_run import run_job
from srifty_core.runs.progress import read_progress

SPOT, ON_DEMAND = "g4dn.xlarge", "g4dn.12xlarge"
PARAMS: dict[str, Any] = {
    "model": "dlrm", "size": "tiny", "global_batch": 256, "iterations": 300,
    "offers": [
        {"type": SPOT, "market": "spot", "quota": 2},
        {"type": ON_DEMAND, "market": "on-demand", "quota": 1},
    ],
    "objective": "cost", "provider": "ec2-emulated", "budget_usd": 20.0, "checkpoint_every": 10,
}  # fmt: skip
PREEMPT = f"{SPOT}@2"


def _released(provider: Any) -> None:
    allocs = provider.allocations()
    assert allocs
    for a in allocs:
        states = {i.state for i in provider.describe(a)}
        assert states <= {InstanceState.TERMINATED, InstanceState.INTERRUPTED}, (a.id, states)


def test_an_emulated_job_replans_on_a_preemption_and_releases_everything(
    ready_to_plan: Path,
) -> None:
    provider = make_provider(PARAMS, [PREEMPT])
    t0 = time.monotonic()
    run = run_job(PARAMS, run_key="emu", provider=provider, poll_s=5.0, timeout_s=300)
    wall = time.monotonic() - t0
    first, second = run.configurations
    assert first.status == "replan" and "taken back" in first.reason, first
    assert any(SPOT in x and "spot" in x for x in first.launches), first.launches
    assert second.status == "finished"
    assert not any(SPOT in x for x in second.launches), second.launches
    recs = read_progress(ready_to_plan / "runs" / "emu" / "progress.jsonl")
    assert {r.config_id for r in recs} == {"c0", "c1"}
    assert sorted({r.iteration for r in recs}) == list(range(1, 301))
    assert max(r.iteration for r in recs if r.config_id == "c0") < 300
    assert [r.iteration for r in recs if r.config_id == "c1"][-1] == 300
    assert all(r.compute_s and r.exchange_s is not None for r in recs)
    assert run.outcome["iterations"] == 300 and run.outcome["configurations"] == ["c0", "c1"]
    assert run.outcome["training_usd"] > 0 and run.outcome["training_s"] > 0, run.outcome
    _released(provider)
    # simulated time: minutes on the emulator's clock, seconds of wall time
    simulated = recs[-1].wall_time - recs[0].wall_time
    assert simulated > wall, (simulated, wall)
    decisions = [
        json.loads(line)
        for line in (ready_to_plan / "runs" / "emu" / "decisions.jsonl").read_text().splitlines()
    ]
    assert [d["status"] for d in decisions if d["status"] != "running"] == ["replan", "finished"]
    assert decisions[-1]["depleted"] == [f"{SPOT}/spot"]


def test_a_preemption_is_type_at_seconds() -> None:
    assert parse_preemption("g4dn.xlarge@120") == ("g4dn.xlarge", 120.0)
    for bad in ("g4dn.xlarge", "@5", "g4dn.xlarge@-1", "g4dn.xlarge@soon"):
        with pytest.raises(ConfigError, match="TYPE@SECONDS"):
            parse_preemption(bad)


def test_the_dag_conf_refuses_the_emulated_provider() -> None:
    """The emulated EC2 lives in one process: the DAG's conf stays local or ec2."""
    from srifty_core.planner.schema.job_conf import JobConf, ShellJobConf

    with pytest.raises(ConfigError, match="provider"):
        JobConf.parse(PARAMS)
    assert ShellJobConf.parse({**PARAMS, "provider": "emulated"}).provider == "ec2-emulated"


def test_a_fresh_data_folder_runs_an_emulated_job_on_estimates_and_public_bandwidth(
    data_dir: Path,
) -> None:
    """Nothing profiled, no champion: the plan estimates the g4dn types' T4 from the
    model's census (the shipped ResNet-50 H200 profile scaled) and takes the bus bandwidth
    from the shipped public nccl-tests tables; the job runs to its last iteration through
    the preemption and releases everything."""
    params = {**PARAMS, "model": "resnet50", "size": "full", "iterations": 40}
    provider = make_provider(params, [PREEMPT])
    run = run_job(params, run_key="fresh", provider=provider, poll_s=5.0, timeout_s=300)
    assert run.outcome["iterations"] == 40
    job = json.loads((data_dir / "runs" / "fresh" / "job-c0.json").read_text())
    assert "T4: scaled from H200" in json.dumps(job)  # the plan says what it estimated
    _released(provider)
