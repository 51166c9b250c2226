"""The runtime checks what a training script reports (``worker.user``): iterations one
more than the last each step, counted from the checkpoint; the plan's last iteration
reached and checkpointed before the job is "finished"; a non-finite loss stops the job
before it is checkpointed. Each refusal fails ``srifty train`` with the reason (before:
every one of these scripts ended "finished", exit 0).

A job of two local ranks proves the paths: a script that reports properly finishes, one
that exits 0 without a report fails the job (``local_run``'s check of the exit codes), and
a refusal on the ranks (a non-finite loss) fails it with the reason. Every other refusal
is decided on each rank by ``worker.user`` alone, the ranks agreeing on it by an
all-reduce: the same script runs as one rank in this process (a gloo group of one), and
the test checks the error and the reason recorded for the monitor, which fails the job
with it (``monitor_step.ReportRefused``)."""

from __future__ import annotations

import math
import signal
import sys
from pathlib import Path

import pytest
import torch

from srifty_core.cloud.local import LocalProvider
from srifty_core.jobs.local_run import TrainingError, train_local
from srifty_core.lifetime import free_port
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs.progress import read_progress, refused_report
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


def _plan(tmp_path: Path, mode: str, local_batches: tuple[int, ...] = (4, 4)) -> TrainPlan:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return TrainPlan(
        model="dlrm", size="tiny", global_batch=8, iterations=N, local_batches=local_batches,
        run_dir=str(tmp_path / "run"), checkpoint_every=2, step_sleep_s=0.0, threads=1,
        precision="bf16", entrypoint=(sys.executable, str(script), mode),
    )  # fmt: skip


def _train(tmp_path: Path, mode: str) -> TrainPlan:
    plan = _plan(tmp_path, mode)
    train_local(plan, LocalProvider(tmp_path / "cloud"), poll_s=0.1, timeout_s=120)
    return plan


def _run_one_rank_here(plan: TrainPlan, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """SCRIPT as the one rank of ``plan`` (one local batch) in this process, with the
    environment the launcher gives a rank (``launch.rank_env``); what it changes in this
    process (the process group, ``worker.user``'s state, the SIGTERM handler, torch's
    threads and random state) is undone after it."""
    import torch.distributed as dist

    from srifty_core.worker import launch, user

    env = launch.rank_env(plan, str(plan.save(Path(plan.run_dir).parent / "plan.json")), 0)
    for k, v in (env | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, "argv", ["script.py", mode])
    monkeypatch.setattr(user, "_state", user._State())
    term, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    user.plan.cache_clear()
    try:
        with torch.random.fork_rng(devices=[]):
            exec(compile(SCRIPT, "script.py", "exec"), {"__name__": "__main__"})
    finally:
        user.plan.cache_clear()
        if user._state.log is not None:
            user._state.log.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        signal.signal(signal.SIGTERM, term)
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_a_script_that_reports_properly_finishes(tmp_path: Path) -> None:
    plan = _train(tmp_path, "ok")
    assert [r.iteration for r in read_progress(plan.progress_path)] == list(range(1, N + 1))
    ck = load_checkpoint(plan.checkpoint_path)
    assert ck is not None and ck.iteration == N


@pytest.mark.slow
def test_a_script_that_exits_0_without_reporting_fails_the_job(tmp_path: Path) -> None:
    """Neither a report nor ``finish()``: the ranks exit 0, and ``train_local`` fails the
    job, since no checkpoint holds the last iteration."""
    error = rf"workers exited with 0 at iteration 0 of {N}, and no checkpoint"
    with pytest.raises(TrainingError, match=error):
        _train(tmp_path, "exit-0-quietly")


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("exit-0", rf"^finish: the script reported iteration 0 of {N}"),
        ("no-checkpoint", rf"^finish: no checkpoint holds the last iteration {N}"),
        ("tripled", r"^report: iteration 3, expected 1 \(after the start"),
        ("zero", r"^report: iteration 0, expected 1"),
        ("decreasing", rf"^report: iteration {N}, expected 1"),
        ("twice", r"^report: iteration 1, expected 2 \(after iteration 1\)"),
    ],
)
def test_what_a_script_reports_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, error: str
) -> None:
    from srifty_core.worker.user import ReportError

    plan = _plan(tmp_path, mode, local_batches=(8,))
    with pytest.raises(ReportError, match=error) as err:
        _run_one_rank_here(plan, monkeypatch, mode)
    # the reason the monitor fails the job with ("the training script was stopped: ...")
    assert refused_report(plan.run_dir, plan.config_id, since=0.0) == str(err.value)


@pytest.mark.slow
def test_a_non_finite_loss_stops_the_job_before_it_is_checkpointed(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match=r"the loss at iteration 3 is nan \(not finite\)"):
        _train(tmp_path, "nan-loss")
    ck = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert ck is not None and ck.iteration == 2
    assert all(math.isfinite(float(v.abs().sum())) for v in ck.model.values())
