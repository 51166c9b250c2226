"""End to end on this machine: two local workers, one preempted mid-run; the monitor
notices within a second, the job resumes from the checkpoint on the survivor and ends
after exactly N iterations with the parameters of a straight run."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from srifty_core.batches import micro_batches_for
from srifty_core.cloud.base import Allocation
from srifty_core.cloud.local import LocalProvider, pid_alive
from srifty_core.jobs import local_run, monitor_loop
from srifty_core.jobs.local_run import TrainingError, train_local
from srifty_core.jobs.monitor import Stall
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs.progress import read_progress
from srifty_core.worker.checkpoint import load_checkpoint
from srifty_core.worker.worker import train_single

N = 40


@pytest.fixture(scope="module")
def preempted_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A plan file on two local workers (4 and 8 samples, 2 micro-batches), the second
    worker's instance taken back once the log reaches iteration 10, tracked in MLflow as
    ``srifty train`` tracks it; in a data folder of its own (``data``), once for the tests
    that read it."""
    from srifty_core import paths

    root = tmp_path_factory.mktemp("preempted")
    data = root / "srifty-data"
    data.mkdir()
    plan = TrainPlan(
        model="dlrm", size="tiny", global_batch=12, iterations=N, local_batches=(4, 8),
        run_dir=str(root / "run"), dtype="float64", lr=0.05, checkpoint_every=5,
        step_sleep_s=0.05, micro_batches=2,
    )  # fmt: skip
    provider = LocalProvider(root / "cloud")
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

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(paths.ENV_VAR, str(data))
        mp.setenv("MLFLOW_TRACKING_URI", "")
        killer = threading.Thread(target=reclaim, daemon=True)
        killer.start()
        report = train_local(plan, provider, on_poll=remember, timeout_s=120, track=True)
        killer.join(timeout=5)
        yield {"plan": plan, "report": report, "interrupted_at": interrupted_at, "data": data}


@pytest.mark.slow
def test_preempted_worker_resumes_on_the_survivor(preempted_run: dict[str, Any]) -> None:
    """With micro-batches too: the survivor keeps the planned micro-batch size (12 samples
    in 3 micro-batches of 4) and still ends at a straight run's parameters. (A plan without
    micro-batches resumes without them: ``test_the_survivor_keeps_the_planned_micro_batch``
    here, and ``test_outcome``'s plan files train without them; the path to the survivor is
    the same.)"""
    plan, report = preempted_run["plan"], preempted_run["report"]
    interrupted_at = preempted_run["interrupted_at"]
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
    resumed = TrainPlan.load(next(Path(plan.run_dir).glob("plan-c0.r1*.json")))
    assert resumed.micro_batches == 3


def test_the_survivor_keeps_the_planned_micro_batch() -> None:
    """What ``train_local`` gives the survivor of the plan above (``micro_batches_for``):
    with 2 micro-batches the planned largest one (4 of 8) in 3 of its 12 samples; a plan
    without micro-batches (1) resumes without them."""
    assert micro_batches_for((4, 8), 2, (12,)) == 3
    assert micro_batches_for((4, 8), 1, (12,)) == 1


@pytest.mark.slow
def test_a_plan_file_preempted_is_one_job_run_with_its_replan_nested(
    preempted_run: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(``jobs.outcome``) The preempted plan file above, tracked: one outcome in its run
    folder, and one MLflow job run with its re-plan's run nested in it."""
    from mlflow.tracking import MlflowClient

    from srifty_core import paths
    from srifty_core.jobs.job_log import EXPERIMENT
    from srifty_core.jobs.outcome import OUTCOME_FILE
    from srifty_core.tracking.store import setup_experiment

    plan, report = preempted_run["plan"], preempted_run["report"]
    monkeypatch.setenv(paths.ENV_VAR, str(preempted_run["data"]))  # its MLflow store
    assert report.outcome is not None and report.outcome.configurations == ("c0", "c0.r1")
    assert json.loads((Path(plan.run_dir) / OUTCOME_FILE).read_text()) == report.outcome.to_dict()
    client = MlflowClient()
    exp = setup_experiment(EXPERIMENT)
    (job,) = client.search_runs([exp], "tags.`srifty.kind` = 'job'")
    nested = client.search_runs(
        [job.info.experiment_id], f"tags.`mlflow.parentRunId` = '{job.info.run_id}'"
    )
    assert [r.data.tags["srifty.kind"] for r in nested] == ["replan"]
    assert nested[0].data.tags["srifty.config_id"] == "c0.r1"
    assert job.info.status == "FINISHED" and job.data.metrics["outcome_configurations"] == 2


STEPS_THEN = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from srifty_core.runs.progress import ProgressLog, ProgressRecord

    steps, then = int(sys.argv[1]), sys.argv[2]  # then: "exit" or "hang"
    if then == "hang":  # a hung script ignores SIGTERM too
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank, run_dir = os.environ["SRIFTY_PLAN_RANK"], os.environ["SRIFTY_RUN_DIR"]
    Path(run_dir, f"rank-{rank}.pid").write_text(str(os.getpid()))
    if rank == "0":
        with ProgressLog(Path(run_dir) / "progress.jsonl") as log:
            for i in range(1, steps + 1):
                time.sleep(0.2)
                log.append(ProgressRecord(i, time.time(), 0.2, 2, os.environ["SRIFTY_CONFIG_ID"]))
        if then == "exit":  # a finished job keeps a checkpoint of its last iteration
            import torch
            from srifty_core.worker.checkpoint import save_checkpoint
            from srifty_core.runs.progress import TrainState, write_state

            net, config = torch.nn.Linear(1, 1), os.environ["SRIFTY_CONFIG_ID"]
            save_checkpoint(os.environ["SRIFTY_CHECKPOINT"], model=net, iteration=steps,
                            optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                            global_batch=2, config_id=config)
            write_state(Path(run_dir) / "state.json", TrainState(steps, time.time(), config, steps))
    else:
        time.sleep(0.2 * steps)
    if then == "hang":
        time.sleep(3600)
    """
)


def _steps_then(tmp_path: Path, steps: int, then: str) -> TrainPlan:
    script = tmp_path / "steps.py"
    script.write_text(STEPS_THEN)
    return TrainPlan(
        model="dlrm", size="tiny", global_batch=2, iterations=steps, local_batches=(1, 1),
        run_dir=str(tmp_path / "run"), entrypoint=(sys.executable, str(script), str(steps), then),
    )  # fmt: skip


def test_a_hung_script_fails_the_job_within_a_few_windows_and_its_ranks_stop(
    tmp_path: Path,
) -> None:
    """Issue 48: a hung script ran until a fixed 600 s cap, the monitor logging "too few
    steps". The monitor sees no step for longer than the window its step time sets (20
    steps of 0.2 s here, with a lowered minimum), fails the job with a clear message, and
    the ranks (which ignore SIGTERM) are stopped."""
    plan = _steps_then(tmp_path, 3, "hang")
    provider = LocalProvider(tmp_path / "cloud")
    started = time.monotonic()
    with pytest.raises(TrainingError, match=r"no training step for \d+ s \(the window: 4 s: "):
        train_local(plan, provider, poll_s=0.2, stall=Stall(min_s=1.0, startup_s=120))
    assert time.monotonic() - started < 120  # bounded; about 10 s on a quiet machine
    pids = [int(p.read_text()) for p in Path(plan.run_dir).glob("rank-*.pid")]
    assert len(pids) == 2 and not any(pid_alive(p) for p in pids)
    for f in (tmp_path / "cloud").glob("*.json"):
        assert set(json.loads(f.read_text())["instances"].values()) == {"terminated"}


def test_no_wall_clock_cap_ends_a_healthy_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 48: `srifty train PLAN` ended every job at 600 s (``train_local``'s default
    cap, which the command left as it was). The loops' clock runs 1000 times fast here, so
    this 3 s job lasts over 3,000 s by it: no fixed cap applies (the stall rule, on the
    wall clock, does not fire either: the job keeps logging steps)."""
    fast = types.SimpleNamespace(
        **{k: getattr(time, k) for k in dir(time) if not k.startswith("_")}
    )
    fast.monotonic = lambda: time.monotonic() * 1000.0
    monkeypatch.setattr(local_run, "time", fast)
    monkeypatch.setattr(monitor_loop, "time", fast)
    plan = _steps_then(tmp_path, 15, "exit")
    report = train_local(plan, LocalProvider(tmp_path / "cloud"), poll_s=0.2)
    assert [s.outcome for s in report.segments] == ["finished"]
    assert len(read_progress(plan.progress_path)) == 15
