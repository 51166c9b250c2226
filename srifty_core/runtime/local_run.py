"""Run a training plan on local worker processes, watch it and recover from preemptions.

``train_local`` launches one ``local.cpu`` instance per rank, starts the plan's rank on each
(``python -m srifty_core.runtime.launch PLAN.json``: the built-in worker, or the plan's
``entrypoint``, your own script), then polls the provider and the
progress log every ``poll_s``. When the provider reports an interruption the monitor marks
the type depleted and asks for a re-plan; on this machine there is one instance type, so
the re-plan continues on the surviving capacity through the ``Replanner`` (the same one
the DAG and the preemption benchmark use): the survivors are stopped (they checkpoint on
SIGTERM), the change to the survivors' count is applied (the allocation that lost a worker
is released, one with a rank per survivor launched), and training resumes from the
checkpoint with the global batch split over the survivors (a plan file carries no model
of the hardware, so ``Replanner.survivors`` splits it evenly). The job ends when every
worker of the latest configuration exits with 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from srifty_core.catalog.types import Market
from srifty_core.cloud.base import Allocation, LaunchRequest
from srifty_core.cloud.local import LOCAL_CPU, TERM_GRACE_S, LocalProvider
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.lifetime import caller_env
from srifty_core.runtime import run_store
from srifty_core.runtime.checkpoint import check_resumable, load_checkpoint
from srifty_core.runtime.launch import launch_argv
from srifty_core.runtime.monitor import Decision, Limits, decide
from srifty_core.runtime.progress import read_progress
from srifty_core.runtime.replanner import Replanner
from srifty_core.runtime.train_plan import TrainPlan


class TrainingError(SriftyError):
    """Workers failed for a reason other than a preemption; the message names the logs."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One configuration's share of the run."""

    config_id: str
    local_batches: tuple[int, ...]
    allocation_id: str
    start_iteration: int
    end_iteration: int
    outcome: str
    """``finished`` or ``preempted``."""
    detect_s: float | None = None
    """From the provider's interruption record to the monitor noticing it."""


@dataclass(frozen=True)
class RunReport:
    plan: TrainPlan
    segments: tuple[Segment, ...]
    decisions: tuple[Decision, ...] = field(default_factory=tuple)

    @property
    def iterations(self) -> int:
        return self.segments[-1].end_iteration if self.segments else 0


def _next_id(config_id: str, k: int) -> str:
    return f"{config_id.split('.r')[0]}.r{k}"


def train_local(
    plan: TrainPlan,
    provider: LocalProvider,
    *,
    limits: Limits | None = None,
    poll_s: float = 0.05,
    timeout_s: float = 600.0,
    on_poll: Callable[[Allocation], None] | None = None,
    restart: bool = False,
) -> RunReport:
    """Train ``plan`` to its last iteration on local workers, re-planning on preemption.

    Resumes from the run folder's checkpoint; refuses a folder whose log shows progress
    without a checkpoint, unless ``restart`` (``checkpoint.check_resumable``). One live job
    per run folder (``run_folder_lock``). Local workers train in a local run folder: a
    ``run_dir`` on run storage (an ``s3://`` URI, for cloud VMs) is a ``ConfigError``."""
    if run_store.is_remote(plan.run_dir):
        raise ConfigError(
            f"run_dir {plan.run_dir}: local workers train in a local run folder; run "
            "storage (a URI) is for workers on cloud VMs. Give the plan a local run_dir"
        )
    with run_folder_lock(Path(plan.run_dir)):
        return _train_local(plan, provider, limits, poll_s, timeout_s, on_poll, restart)


RUN_LOCK = ".srifty-run.lock"
RUN_OWNER = ".srifty-run.owner"


@contextlib.contextmanager
def run_folder_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run folder for this process: a second job on the same folder (a rerun
    beside a live one) fails at once, naming the holder, instead of training beside it.
    An OS file lock (``filelock``): released when the holder exits, however it exits, so a
    killed job never leaves a stale lock. The holder's pid and start time are written
    beside it for the message."""
    from filelock import FileLock, Timeout

    run_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(run_dir / RUN_LOCK)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            owner = (run_dir / RUN_OWNER).read_text().strip()
        except OSError:
            owner = "another process"
        raise TrainingError(
            f"run folder {run_dir} is in use by {owner}: wait for that job, or stop it "
            "(one job per run folder)"
        ) from None
    try:
        (run_dir / RUN_OWNER).write_text(
            f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"
        )
        yield
    finally:
        lock.release()


def _train_local(
    plan: TrainPlan,
    provider: LocalProvider,
    limits: Limits | None,
    poll_s: float,
    timeout_s: float,
    on_poll: Callable[[Allocation], None] | None,
    restart: bool,
) -> RunReport:
    check_resumable(plan.checkpoint_path, plan.progress_path, restart)
    limits = limits or Limits(iterations=plan.iterations, global_batch=plan.global_batch)
    run_dir = Path(plan.run_dir)
    started = time.time()
    deadline = time.monotonic() + timeout_s
    config = plan
    segments: list[Segment] = []
    decisions: list[Decision] = []
    alloc = provider.launch(LaunchRequest(LOCAL_CPU, count=config.world_size))
    try:
        while True:
            ck = load_checkpoint(config.checkpoint_path)
            start_iter = ck.iteration if ck else 0
            plan_path = config.save(run_dir / f"plan-{config.config_id}.json")
            provider.run(  # this loop waits for them: they end with it
                alloc,
                launch_argv(str(plan_path)),
                caller_env(),
            )
            exited_at: float | None = None
            while True:
                if time.monotonic() > deadline:
                    raise TrainingError(f"training did not finish within {timeout_s:.0f} s")
                if on_poll is not None:
                    on_poll(alloc)
                interrupted = provider.interruptions(alloc)
                if interrupted:
                    noticed = provider.now()
                    decision = decide(
                        read_progress(config.progress_path), limits, now=time.time(),
                        started_at=started, preempted=[alloc.spec.name],
                    )  # fmt: skip
                    decisions.append(decision)
                    provider.stop(alloc)  # survivors checkpoint on SIGTERM and exit
                    ck = load_checkpoint(config.checkpoint_path)
                    gone = {i.instance_id for i in interrupted}
                    alive = alloc.count - len(gone)
                    segments.append(
                        Segment(
                            config.config_id, config.local_batches, alloc.id, start_iter,
                            ck.iteration if ck else 0, "preempted",
                            (noticed - interrupted[0].at).total_seconds(),
                        )
                    )  # fmt: skip
                    if alive < 1:
                        raise TrainingError("every instance was preempted; nothing to resume on")
                    (alloc,), _ = Replanner.apply(
                        provider, [alloc], {(LOCAL_CPU, Market.ON_DEMAND): alive}
                    )
                    config = dataclasses.replace(
                        config,
                        local_batches=Replanner.survivors(config.global_batch, alive),
                        config_id=_next_id(plan.config_id, len(segments)),
                    )
                    break
                codes = provider.exit_codes(alloc)
                if codes and all(c == 0 for c in codes.values()):
                    ck = load_checkpoint(config.checkpoint_path)
                    end = ck.iteration if ck else 0
                    segments.append(
                        Segment(
                            config.config_id, config.local_batches, alloc.id, start_iter, end,
                            "finished",
                        )
                    )  # fmt: skip
                    return RunReport(plan, tuple(segments), tuple(decisions))
                if codes and all(c is not None for c in codes.values()):
                    # Exited without finishing: wait briefly for an interruption record.
                    exited_at = exited_at or time.monotonic()
                    if time.monotonic() - exited_at > TERM_GRACE_S + 1.0:
                        raise TrainingError(
                            f"workers exited with {codes}; see the logs in "
                            f"{provider.log_dir(alloc)}"
                        )
                else:
                    d = decide(
                        read_progress(config.progress_path), limits, now=time.time(),
                        started_at=started,
                    )  # fmt: skip
                    if not decisions or decisions[-1].action != d.action:
                        decisions.append(d)
                time.sleep(poll_s)
    finally:
        provider.release(alloc)
