"""The runtime checks what a training script reports (``worker.user``): iterations one
more than the last each step, counted from the checkpoint; the plan's last iteration
reached and checkpointed before the job is "finished"; a non-finite loss stops the job
before it is checkpointed. Each refusal fails ``srifty train`` with the reason (before:
every one of these scripts ended "finished", exit 0)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from srifty_core.cloud.local import LocalProvider
from srifty_core.jobs.local_run import TrainingError, train_local
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs.progress import read_progress
from srifty_core.worker.checkpoint import load_checkpoint

N = 6
SCRIPT = """\
import sys

import torch

from srifty_core.worker import user as srifty

mode = sys.argv[1]
srifty.init()
assert srifty.precision() == "fp32", srifty.precision()  # a bf16 plan computes in fp32 on a CPU
if mode == "exit-0":  # finish() without a report
    srifty.finish()
    sys.exit(0)
if mode == "exit-0-quietly":  # neither report nor finish()
    sys.exit(0)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = srifty.load_checkpoint(model.module, opt)
n = srifty.iterations()
for it in range(start, n):
    opt.zero_grad()
    with srifty.autocast():  # nothing on a CPU
        loss = model(torch.randn(srifty.local_batch(), 4)).pow(2).mean() * srifty.loss_scale()
    if mode == "nan-loss" and it >= 2:
        loss = loss * float("nan")
    loss.backward()
    opt.step()
    done = it + 1
    number = {"tripled": 3 * done, "zero": 0, "decreasing": n - it}.get(mode, done)
    keep = {} if mode == "no-checkpoint" else {"model": model.module, "optimizer": opt}
    srifty.report(number, loss, **keep)
    if mode == "twice":
        srifty.report(done, loss, **keep)
srifty.finish()
"""


def _train(tmp_path: Path, mode: str) -> TrainPlan:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    plan = TrainPlan(
        model="dlrm", size="tiny", global_batch=8, iterations=N, local_batches=(4, 4),
        run_dir=str(tmp_path / "run"), checkpoint_every=2, step_sleep_s=0.0, threads=1,
        precision="bf16", entrypoint=(sys.executable, str(script), mode),
    )  # fmt: skip
    train_local(plan, LocalProvider(tmp_path / "cloud"), poll_s=0.1, timeout_s=120)
    return plan


@pytest.mark.slow
def test_a_script_that_reports_properly_finishes(tmp_path: Path) -> None:
    plan = _train(tmp_path, "ok")
    assert [r.iteration for r in read_progress(plan.progress_path)] == list(range(1, N + 1))
    ck = load_checkpoint(plan.checkpoint_path)
    assert ck is not None and ck.iteration == N


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("exit-0", rf"stopped: finish: the script reported iteration 0 of {N}"),
        ("exit-0-quietly", rf"workers exited with 0 at iteration 0 of {N}, and no checkpoint"),
        ("no-checkpoint", rf"finish: no checkpoint holds the last iteration {N}"),
        ("tripled", r"report: iteration 3, expected 1 \(after the start"),
        ("zero", r"report: iteration 0, expected 1"),
        ("decreasing", rf"report: iteration {N}, expected 1"),
        ("twice", r"report: iteration 1, expected 2 \(after iteration 1\)"),
    ],
)
def test_what_a_script_reports_is_checked(tmp_path: Path, mode: str, error: str) -> None:
    with pytest.raises(TrainingError, match=error):
        _train(tmp_path, mode)


@pytest.mark.slow
def test_a_non_finite_loss_stops_the_job_before_it_is_checkpointed(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match=r"the loss at iteration 3 is nan \(not finite\)"):
        _train(tmp_path, "nan-loss")
    ck = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert ck is not None and ck.iteration == 2
    assert all(math.isfinite(float(v.abs().sum())) for v in ck.model.values())
