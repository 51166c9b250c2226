"""The plan-and-train job in steps, for an orchestrator (the ``srifty_plan_and_train`` DAG).

``train_local`` runs a whole job in one process; an orchestrator instead runs it as separate
tasks, each of which may run in another process or on another machine, and which pass
only paths and ids to each other:

1. ``plan_job`` turns the trigger's parameters into a ``TrainPlan`` saved as JSON.
   For the ``local`` provider the plan is simple: ``workers`` local CPU workers with the
   global batch split evenly (the catalog planner plans EC2 types, not this machine).
   A ``resume`` block (set by a re-plan) continues an earlier run from its checkpoint.
2. ``provision`` launches the instances; ``start_training`` starts one worker per rank.
3. ``poll`` is the monitor's step: ``running``, ``finished`` or ``replan`` (a preemption,
   or the monitor projects a broken limit); workers that died otherwise raise.
4. ``child_conf`` stops the workers (they checkpoint on SIGTERM) and builds the trigger
   conf of the follow-up run: the remaining iterations, time and budget, the checkpoint,
   the depleted types and the parent run id.
5. ``release`` gives back what ``provision`` launched, whatever happened (a teardown).

Light: no torch import (the workers import it in their own processes).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.cloud.base import LaunchRequest
from srifty_core.cloud.local import LOCAL_CPU, LocalProvider
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.runtime.checkpoint import CHECKPOINT_FILE, load_checkpoint
from srifty_core.runtime.monitor import Limits, decide
from srifty_core.runtime.progress import read_progress
from srifty_core.runtime.worker import TrainPlan, split_batch

PROVIDERS = ("local",)
RUNNING = "running"
FINISHED = "finished"
REPLAN = "replan"


class TrainingFailed(SriftyError):
    """Workers exited without finishing and without a preemption; the message names the logs."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Where an earlier run of the job stopped."""

    checkpoint: str
    iterations_done: int
    time_spent_s: float = 0.0
    cost_spent_usd: float = 0.0
    depleted: tuple[str, ...] = ()
    parent_run_id: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Resume:
        try:
            return cls(
                checkpoint=str(d["checkpoint"]),
                iterations_done=int(d["iterations_done"]),
                time_spent_s=float(d.get("time_spent_s", 0.0)),
                cost_spent_usd=float(d.get("cost_spent_usd", 0.0)),
                depleted=tuple(str(t) for t in d.get("depleted", ())),
                parent_run_id=d.get("parent_run_id"),
            )
        except KeyError as exc:
            raise ConfigError(f"resume: field {exc.args[0]!r} missing") from exc


@dataclass(frozen=True, slots=True)
class JobSpec:
    """The trigger's parameters, validated."""

    model: str
    size: str
    global_batch: int
    iterations: int
    """Iterations this run should do (after ``resume.iterations_done``, if resuming)."""
    workers: int
    provider: str = "local"
    time_limit_s: float = math.inf
    budget_usd: float = math.inf
    objective: str = "cost"
    checkpoint_every: int = 10
    step_sleep_s: float = 0.0
    seed: int = 0
    resume: Resume | None = None

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ConfigError(f"provider: {self.provider!r} is not one of {list(PROVIDERS)}")
        if self.iterations < 1 or self.global_batch < 1:
            raise ConfigError("iterations and global_batch: must be >= 1")
        if self.workers < 1 or self.workers > self.global_batch:
            raise ConfigError(f"workers: need 1..global_batch, got {self.workers}")

    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> JobSpec:
        resume = p.get("resume")
        return cls(
            model=str(p["model"]),
            size=str(p["size"]),
            global_batch=int(p["global_batch"]),
            iterations=int(p["iterations"]),
            workers=int(p["workers"]),
            provider=str(p.get("provider", "local")),
            time_limit_s=_limit(p.get("time_limit_s")),
            budget_usd=_limit(p.get("budget_usd")),
            objective=str(p.get("objective", "cost")),
            checkpoint_every=int(p.get("checkpoint_every", 10)),
            step_sleep_s=float(p.get("step_sleep_s", 0.0)),
            seed=int(p.get("seed", 0)),
            resume=Resume.from_dict(resume) if resume else None,
        )

    @property
    def target_iterations(self) -> int:
        """The absolute iteration the job ends at (the checkpoint counts from the start)."""
        return self.iterations + (self.resume.iterations_done if self.resume else 0)


def _limit(v: Any) -> float:
    return math.inf if v is None else float(v)


def runs_dir(root: Path | None = None) -> Path:
    """Run folders of orchestrated jobs (checkpoint, progress log, plans)."""
    return (root or paths.data_dir()) / "runs"


def plan_job(spec: JobSpec, run_key: str) -> Path:
    """The local plan (``workers`` ranks, the global batch split evenly), saved as JSON.

    A fresh job gets the run folder ``runs/<run_key>``; a resumed one keeps the folder of
    its checkpoint, so every configuration of the job shares one checkpoint and log.
    """
    if spec.resume is not None:
        ck = Path(spec.resume.checkpoint)
        if ck.name != CHECKPOINT_FILE:
            raise ConfigError(f"resume.checkpoint: expected a path ending in {CHECKPOINT_FILE}")
        run_dir = ck.parent
        if load_checkpoint(ck) is None:
            raise ConfigError(f"resume.checkpoint: no checkpoint at {ck}")
    else:
        run_dir = runs_dir() / _safe(run_key)
    plan = TrainPlan(
        model=spec.model,
        size=spec.size,
        global_batch=spec.global_batch,
        iterations=spec.target_iterations,
        local_batches=split_batch(spec.global_batch, spec.workers),
        run_dir=str(run_dir),
        config_id="c0" if spec.resume is None else f"r{spec.resume.iterations_done}",
        seed=spec.seed,
        checkpoint_every=spec.checkpoint_every,
        step_sleep_s=spec.step_sleep_s,
    )
    return plan.save(run_dir / f"plan-{plan.config_id}.json")


def _safe(key: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    if not out.strip("._"):
        raise ConfigError(f"run key {key!r} gives no usable folder name")
    return out


def provision(plan_path: Path | str, provider: LocalProvider | None = None) -> str:
    """Launch one local CPU instance per rank; returns the allocation id."""
    plan = TrainPlan.load(plan_path)
    provider = provider or LocalProvider()
    return provider.launch(LaunchRequest(LOCAL_CPU, count=plan.world_size)).id


def start_training(
    plan_path: Path | str, allocation_id: str, provider: LocalProvider | None = None
) -> float:
    """Start the workers on the allocation; returns the start time (Unix seconds)."""
    provider = provider or LocalProvider()
    alloc = provider.get_allocation(allocation_id)
    provider.run(alloc, [sys.executable, "-m", "srifty_core.runtime.worker", str(plan_path)])
    return time.time()


@dataclass(frozen=True, slots=True)
class PollResult:
    status: str
    """``running``, ``finished`` or ``replan``."""
    reason: str
    iterations_done: int
    elapsed_s: float
    spent_usd: float
    depleted: tuple[str, ...] = ()
    interrupted: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "iterations_done": self.iterations_done,
            "elapsed_s": self.elapsed_s,
            "spent_usd": self.spent_usd,
            "depleted": list(self.depleted),
            "interrupted": list(self.interrupted),
        }


def poll(
    plan_path: Path | str,
    allocation_id: str,
    spec: JobSpec,
    started_at: float,
    *,
    provider: LocalProvider | None = None,
    now: float | None = None,
) -> PollResult:
    """One look at the running job: the provider's interruptions, the workers, the monitor."""
    provider = provider or LocalProvider()
    plan = TrainPlan.load(plan_path)
    alloc = provider.get_allocation(allocation_id)
    now = time.time() if now is None else now
    prior_s = spec.resume.time_spent_s if spec.resume else 0.0
    prior_usd = spec.resume.cost_spent_usd if spec.resume else 0.0
    # A resumed run's conf carries what is left of the time and the budget.
    limits = Limits(
        iterations=plan.iterations,
        global_batch=plan.global_batch,
        time_limit_s=spec.time_limit_s,
        budget_usd=spec.budget_usd,
    )
    records = read_progress(plan.progress_path)
    interrupted = provider.interruptions(alloc)
    decision = decide(
        records,
        limits,
        now=now,
        started_at=started_at,
        preempted=[alloc.spec.name] if interrupted else [],
    )
    done = decision.iterations_done
    codes = provider.exit_codes(alloc)
    all_exited = bool(codes) and all(c is not None for c in codes.values())
    ck = load_checkpoint(plan.checkpoint_path)
    finished = all_exited and ck is not None and ck.iteration >= plan.iterations

    def result(status: str, reason: str) -> PollResult:
        return PollResult(
            status,
            reason,
            done,
            prior_s + decision.elapsed_s,
            prior_usd + decision.spent_usd,
            tuple(sorted({*(spec.resume.depleted if spec.resume else ()), *decision.depleted})),
            tuple(i.instance_id for i in interrupted),
        )

    if finished:
        return result(FINISHED, f"finished {plan.iterations} iterations")
    if decision.replan and interrupted:
        return result(REPLAN, decision.reason)
    if decision.replan:
        # One instance type here: a re-plan would choose this same configuration again.
        why = f"{decision.reason}; the local provider has no other configuration, continuing"
        return result(RUNNING, why)
    if all_exited:
        raise TrainingFailed(
            f"workers exited at iteration {done} of {plan.iterations} without a preemption; "
            f"see the logs in {provider.log_dir(alloc)}"
        )
    return result(RUNNING, decision.reason)


def child_conf(
    params: Mapping[str, Any],
    plan_path: Path | str,
    allocation_id: str,
    result: Mapping[str, Any],
    parent_run_id: str,
    *,
    provider: LocalProvider | None = None,
) -> dict[str, Any]:
    """Stop the workers (they checkpoint) and build the conf of the run that continues the job.

    On the local provider the follow-up runs on the instances that were not interrupted.
    """
    provider = provider or LocalProvider()
    plan = TrainPlan.load(plan_path)
    alloc = provider.get_allocation(allocation_id)
    provider.stop(alloc)
    ck = load_checkpoint(plan.checkpoint_path)
    done = ck.iteration if ck else 0
    if ck is None:
        raise TrainingFailed(f"no checkpoint at {plan.checkpoint_path} to resume from")
    remaining = plan.iterations - done
    if remaining < 1:
        raise TrainingFailed("the job already finished; nothing to re-plan")
    alive = alloc.count - len(set(result.get("interrupted", ())))
    if alive < 1:
        raise TrainingFailed("every instance was preempted; nothing to resume on")
    conf = {k: v for k, v in params.items() if k != "resume"}
    conf["iterations"] = remaining
    conf["workers"] = min(alive, int(params["workers"]))
    elapsed, spent = float(result["elapsed_s"]), float(result["spent_usd"])
    prior = params.get("resume") or {}
    prior_s = float(prior.get("time_spent_s", 0.0))
    prior_usd = float(prior.get("cost_spent_usd", 0.0))
    for key, used in (("time_limit_s", elapsed - prior_s), ("budget_usd", spent - prior_usd)):
        if params.get(key) is not None:
            conf[key] = max(float(params[key]) - used, 0.0)
    conf["resume"] = {
        "checkpoint": str(plan.checkpoint_path),
        "iterations_done": done,
        "time_spent_s": elapsed,
        "cost_spent_usd": spent,
        "depleted": list(result.get("depleted", ())),
        "parent_run_id": parent_run_id,
    }
    return conf


def release(allocation_id: str, provider: LocalProvider | None = None) -> None:
    """Give back the allocation and stop anything still running on it (idempotent)."""
    (provider or LocalProvider()).release(allocation_id)
