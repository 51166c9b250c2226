"""Run a training plan on local worker processes, watch it and recover from preemptions.

``train_local`` launches one ``local.cpu`` instance per rank, starts the worker on each
(``python -m srifty_core.runtime.worker PLAN.json``), then polls the provider and the
progress log every ``poll_s``. When the provider reports an interruption the monitor marks
the type depleted and asks for a re-plan; on this machine there is one instance type, so
the re-plan continues on the surviving capacity: the survivors are stopped (they
checkpoint on SIGTERM), the allocation is released, and a new one with one rank per
surviving instance resumes from the checkpoint with the global batch re-split over it.
(On a cloud, ``runtime.replan.replan`` picks the next configuration from the remaining
offers.) The job ends when every worker of the latest configuration exits with 0.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from srifty_core.cloud.base import Allocation, LaunchRequest
from srifty_core.cloud.local import LOCAL_CPU, TERM_GRACE_S, LocalProvider
from srifty_core.errors import SriftyError
from srifty_core.lifetime import caller_env
from srifty_core.runtime.checkpoint import check_resumable, load_checkpoint
from srifty_core.runtime.monitor import Decision, Limits, decide
from srifty_core.runtime.progress import read_progress
from srifty_core.runtime.worker import TrainPlan, split_batch


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
    without a checkpoint, unless ``restart`` (``checkpoint.check_resumable``)."""
    check_resumable(plan.checkpoint_path, plan.progress_path, restart)
    limits = limits or Limits(iterations=plan.iterations, global_batch=plan.global_batch)
    run_dir = Path(plan.run_dir)
    started = time.time()
    deadline = time.monotonic() + timeout_s
    config = plan
    segments: list[Segment] = []
    decisions: list[Decision] = []
    while True:
        ck = load_checkpoint(config.checkpoint_path)
        start_iter = ck.iteration if ck else 0
        alloc = provider.launch(LaunchRequest(LOCAL_CPU, count=config.world_size))
        plan_path = config.save(run_dir / f"plan-{config.config_id}.json")
        try:
            provider.run(  # this loop waits for them: they end with it
                alloc,
                [sys.executable, "-m", "srifty_core.runtime.worker", str(plan_path)],
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
                    config = dataclasses.replace(
                        config,
                        local_batches=split_batch(config.global_batch, alive),
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
