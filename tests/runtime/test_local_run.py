"""End to end on this machine: two local workers, one preempted mid-run; the monitor
notices within a second, the job resumes from the checkpoint on the survivor and ends
after exactly N iterations with the parameters of a straight run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from srifty_core.cloud.base import Allocation
from srifty_core.cloud.local import LocalProvider
from srifty_core.runtime.checkpoint import load_checkpoint
from srifty_core.runtime.local_run import train_local
from srifty_core.runtime.progress import read_progress
from srifty_core.runtime.worker import TrainPlan, train_single

N = 40


@pytest.mark.slow
def test_preempted_worker_resumes_on_the_survivor(tmp_path: Path) -> None:
    plan = TrainPlan(
        model="dlrm", size="tiny", global_batch=12, iterations=N, local_batches=(4, 8),
        run_dir=str(tmp_path / "run"), dtype="float64", lr=0.05, checkpoint_every=5,
        step_sleep_s=0.05,
    )  # fmt: skip
    provider = LocalProvider(tmp_path / "cloud")
    first: list[Allocation] = []
    interrupted_at: list[int] = []

    def remember(alloc: Allocation) -> None:
        if not first:
            first.append(alloc)

    def reclaim() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            recs = read_progress(plan.progress_path)
            if recs and recs[-1].iteration >= 10 and first:
                interrupted_at.append(recs[-1].iteration)
                provider.interrupt(first[0].instance_ids[1])
                return
            time.sleep(0.02)

    killer = threading.Thread(target=reclaim, daemon=True)
    killer.start()
    report = train_local(plan, provider, on_poll=remember, timeout_s=120)
    killer.join(timeout=5)

    assert interrupted_at and interrupted_at[0] < N
    pre, post = report.segments
    assert pre.outcome == "preempted" and pre.local_batches == (4, 8)
    assert pre.detect_s is not None and 0 <= pre.detect_s < 1.0
    # the monitor's step (monitor_step) saw the worker taken back and asked for a re-plan
    assert report.decisions and any(
        d.status == "replan" and d.interrupted for d in report.decisions
    )
    assert post.outcome == "finished" and post.local_batches == (12,)
    assert post.start_iteration == pre.end_iteration >= 10
    assert report.iterations == N
    ck = load_checkpoint(plan.checkpoint_path)
    assert ck is not None and ck.iteration == N and ck.samples == N * 12
    recs = read_progress(plan.progress_path)
    assert recs[-1].iteration == N and {r.config_id for r in recs} == {"c0", "c0.r1"}
    assert sorted({r.iteration for r in recs}) == list(range(1, N + 1))
    straight = train_single(plan)
    assert all(torch.allclose(ck.model[k], straight[k], atol=1e-10) for k in straight)
