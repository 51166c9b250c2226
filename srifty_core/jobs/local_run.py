"""Run a training plan on local worker processes, watch it and recover from preemptions.

``train_local`` launches one ``local.cpu`` instance per rank, starts the plan's rank on each
(``python -m srifty_core.worker.launch PLAN.json``: the built-in worker, or the plan's
``entrypoint``, your own script), then watches it every ``poll_s`` with the monitor the
DAG's sensor steps (``monitor_loop.watch`` over ``monitor_step.Monitor``: the throughput
rule, online recalibration of the plan's own configuration, ``decisions.jsonl``; the plan
file is its job, ``plan_file_job``). When the provider reports an interruption the monitor
asks for a re-plan; on this machine there is one instance type, so
the re-plan continues on the surviving capacity through the ``Replanner`` (the same one
the DAG and the preemption benchmark use): the survivors are stopped (they checkpoint on
SIGTERM), the change to the survivors' count is applied (the allocation that lost a worker
is released, one with a rank per survivor launched), and training resumes from the
checkpoint with the global batch split over the survivors (a plan file carries no model
of the hardware, so ``Replanner.survivors`` splits it evenly). The job ends when every
worker of the latest configuration exits with 0.

There is no wall-clock cap: a job runs as long as it makes progress (its limits are the
plan's iterations and what ``limits`` says). Workers that log no step for longer than their
step time allows (``monitor.Stall``) fail the job as hung, and their ranks are stopped.
The ranks are tied to this process (``lifetime.caller_env``): if it dies, however it dies,
the local provider's guard stops them (SIGTERM, then SIGKILL after a grace period) and
releases their allocation; a rerun on the same run folder first releases whatever a
killed run left launched (``RUN_ALLOCATIONS``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from srifty_core.atomic import write_text_atomic
from srifty_core.batches import micro_batches_for
from srifty_core.catalog.types import Market
from srifty_core.cloud.base import Allocation, InstanceState, LaunchRequest, ProviderError
from srifty_core.cloud.local import LOCAL_CPU, TERM_GRACE_S, LocalProvider
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.jobs import job_log, outcome
from srifty_core.jobs.decisions import PollResult
from srifty_core.jobs.job import FINISHED, RUNNING, JobPlan, JobSpec, Launch, TrainingFailed
from srifty_core.jobs.monitor import Limits, Stall
from srifty_core.jobs.monitor_loop import MonitorTimeout, watch
from srifty_core.jobs.monitor_step import JobStalled, Monitor, ReportRefused
from srifty_core.jobs.outcome import Outcome, rank_logs
from srifty_core.jobs.replanner import Replanner
from srifty_core.lifetime import caller_env
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs import store as run_store
from srifty_core.worker.checkpoint import check_resumable, checkpoint_iteration
from srifty_core.worker.launch import launch_argv


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
    decisions: tuple[PollResult, ...] = field(default_factory=tuple)
    """The monitor's results where its status changed (``monitor_step.PollResult``)."""
    outcome: Outcome | None = None
    """What the run folder's ``outcome.json`` says (``jobs.outcome``)."""

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
    timeout_s: float = math.inf,
    on_poll: Callable[[Allocation], None] | None = None,
    restart: bool = False,
    stall: Stall | None = None,
    track: bool = False,
) -> RunReport:
    """Train ``plan`` to its last iteration on local workers, re-planning on preemption.

    ``timeout_s``: a cap of wall time for a caller that wants one (none by default: a
    healthy job runs to its end; a hung one is stopped by ``stall``, ``monitor.Stall``'s
    defaults unless given). Resumes from the run folder's checkpoint; refuses a folder
    whose log shows progress without a checkpoint, unless ``restart``
    (``checkpoint.check_resumable``). One live job per run folder (``run_folder_lock``).
    Local workers train in a local run folder: a ``run_dir`` on run storage (an ``s3://``
    URI, for cloud VMs) is a ``ConfigError``. The ranks write their output into the run
    folder (``outcome.rank_logs``); the job's totals go to its ``outcome.json``; ``track``:
    the job is recorded in MLflow as a DAG run is (``job_log.ShellTracker``: a tracking
    store that fails never fails the job)."""
    if run_store.is_remote(plan.run_dir):
        raise ConfigError(
            f"run_dir {plan.run_dir}: local workers train in a local run folder; run "
            "storage (a URI) is for workers on cloud VMs. Give the plan a local run_dir"
        )
    with run_folder_lock(Path(plan.run_dir)):
        tracker = job_log.ShellTracker() if track else None
        return _train_local(
            plan, provider, limits, poll_s, timeout_s, on_poll, restart, stall, tracker
        )


RUN_LOCK = ".srifty-run.lock"
RUN_OWNER = ".srifty-run.owner"
RUN_ALLOCATIONS = ".srifty-run.allocations"
"""The allocations the job holding the run folder launched (with the provider's state
folder), removed once it released them: one left behind is a killed job's, released by
the next job on the folder before its ranks start (``release_left_behind``)."""


def record_allocations(run_dir: Path, provider: LocalProvider, ids: list[str]) -> None:
    text = json.dumps({"state_dir": str(provider.state_dir), "allocations": ids})
    write_text_atomic(run_dir / RUN_ALLOCATIONS, text + "\n")


def release_left_behind(run_dir: Path, provider: LocalProvider) -> list[str]:
    """Release the allocations a killed job on this run folder left launched (its ranks,
    if any still run, are stopped: SIGTERM, then SIGKILL); the ids that still had running
    instances. Call it holding the run folder's lock."""
    path = run_dir / RUN_ALLOCATIONS
    try:
        d = json.loads(path.read_text())
        state_dir = Path(d["state_dir"])
        ids = [str(a) for a in d["allocations"]]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError):
        print(f"train: {path} is damaged; ignored", file=sys.stderr)
        path.unlink(missing_ok=True)
        return []
    owner = provider if state_dir == provider.state_dir else LocalProvider(state_dir)
    released: list[str] = []
    for alloc_id in ids:
        try:
            alloc = owner.get_allocation(alloc_id)
            running = any(i.state is InstanceState.RUNNING for i in owner.describe(alloc))
            owner.release(alloc_id)
        except (ProviderError, ConfigError):
            continue
        if running:
            released.append(alloc_id)
            print(
                f"train: released {alloc_id}, left launched by a killed job on {run_dir}",
                file=sys.stderr,
            )
    path.unlink(missing_ok=True)
    return released


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


def plan_file_job(
    plan: TrainPlan, plan_path: Path | str, limits: Limits
) -> tuple[JobSpec, JobPlan]:
    """The job a plan file is, as the monitor sees it: the plan's own configuration on
    ``local.cpu`` workers (one launch per run of equal local batches), the limits and the
    configuration's price (``limits``); no prediction (no planner ran)."""
    per_worker = limits.usd_per_hour / plan.world_size
    offer = {"type": LOCAL_CPU, "market": "on-demand", "quota": plan.world_size,
             "price": per_worker}  # fmt: skip
    spec = JobSpec(
        model=plan.model, size=plan.size, global_batch=plan.global_batch,
        iterations=plan.iterations, offers=(offer,), provider="local",
        time_limit_s=limits.time_limit_s, budget_usd=limits.budget_usd,
        checkpoint_every=plan.checkpoint_every, step_sleep_s=plan.step_sleep_s, seed=plan.seed,
        precision=plan.precision, optimizer=plan.optimizer, compile=plan.compile,
        channels_last=plan.channels_last, tf32=plan.tf32, entrypoint=plan.entrypoint,
    )  # fmt: skip
    runs = [(b, len(list(g))) for b, g in itertools.groupby(plan.local_batches)]
    launches = tuple(Launch(LOCAL_CPU, "on-demand", n, 1, b) for b, n in runs)
    job = JobPlan(
        config_id=plan.config_id, provider="local", region=spec.region,
        train_plan=str(plan_path), launches=launches, usd_per_hour=limits.usd_per_hour,
        predicted={}, explanation=(f"plan file: local batches {list(plan.local_batches)}",),
    )  # fmt: skip
    return spec, job


def _train_local(
    plan: TrainPlan,
    provider: LocalProvider,
    limits: Limits | None,
    poll_s: float,
    timeout_s: float,
    on_poll: Callable[[Allocation], None] | None,
    restart: bool,
    stall: Stall | None,
    tracker: job_log.ShellTracker | None = None,
) -> RunReport:
    run_dir = Path(plan.run_dir)
    release_left_behind(run_dir, provider)  # before anything reads the checkpoint
    check_resumable(plan.checkpoint_path, plan.progress_path, restart)
    limits = limits or Limits(iterations=plan.iterations, global_batch=plan.global_batch)
    started = time.time()
    deadline = time.monotonic() + timeout_s
    config = plan
    segments: list[Segment] = []
    decisions: list[PollResult] = []
    alloc = provider.launch(LaunchRequest(LOCAL_CPU, count=config.world_size))
    record_allocations(run_dir, provider, [alloc.id])
    job: JobPlan | None = None
    try:
        while True:
            start_iter = checkpoint_iteration(config.checkpoint_path) or 0
            plan_path = config.save(run_dir / f"plan-{config.config_id}.json")
            spec, job = plan_file_job(config, plan_path, limits)
            if tracker is not None:
                job = tracker.plan_file(spec, job, config.to_dict(), run_dir.name, start_iter)
            job_path = job.save(run_dir / f"job-{config.config_id}.json")
            provider.run(  # this loop waits for them: they end with it
                alloc,
                launch_argv(str(plan_path)),
                caller_env(),
                log_dir=rank_logs(run_dir, config.config_id),
            )
            # The one monitor (monitor_step): the throughput rule, online recalibration
            # (the plan's own configuration only: no search), the decisions log.
            live = job_log.live_metrics(job) if tracker is not None else None
            monitor = Monitor(
                job_path, [alloc.id], spec, started, provider=provider, search=False, stall=stall,
                live=live,
            )  # fmt: skip
            step = _LocalStep(monitor, provider, alloc, decisions, on_poll)
            try:
                result = watch(step, poll_s=poll_s, timeout_s=max(deadline - time.monotonic(), 0))
            except MonitorTimeout:
                raise TrainingError(f"training did not finish within {timeout_s:.0f} s") from None
            end = checkpoint_iteration(config.checkpoint_path) or 0  # either kind
            if result.status == FINISHED and end < config.iterations:  # the state file lied
                raise TrainingError(
                    f"the workers' state file claims a checkpoint of iteration "
                    f"{config.iterations}, but {config.checkpoint_path} holds "
                    f"{end or 'no iteration'}: the job did not finish"
                )
            if result.status == FINISHED:
                segments.append(
                    Segment(
                        config.config_id, config.local_batches, alloc.id, start_iter, end,
                        "finished",
                    )
                )  # fmt: skip
                out = outcome.with_totals(
                    outcome.of_result(job, result.to_dict()), time.time() - started
                )
                out.save()
                if tracker is not None:
                    tracker.configuration_end(job, result.to_dict(), "finished")
                    tracker.outcome(job, out)
                return RunReport(plan, tuple(segments), tuple(decisions), out)
            # A re-plan: workers were taken back (a plan file has no other configuration).
            if tracker is not None:
                tracker.configuration_end(job, result.to_dict(), "replan")
            interrupted = provider.interruptions(alloc)
            provider.stop(alloc)  # survivors checkpoint on SIGTERM and exit
            stopped_at = checkpoint_iteration(config.checkpoint_path) or 0
            alive = alloc.count - len(set(result.interrupted))
            detect_s = result.at - interrupted[0].at.timestamp() if interrupted else None
            segments.append(
                Segment(
                    config.config_id, config.local_batches, alloc.id, start_iter,
                    stopped_at, "preempted", detect_s,
                )
            )  # fmt: skip
            if alive < 1:
                raise TrainingError("every instance was preempted; nothing to resume on")
            (alloc,), _ = Replanner.apply(provider, [alloc], {(LOCAL_CPU, Market.ON_DEMAND): alive})
            record_allocations(run_dir, provider, [alloc.id])
            survivors = Replanner.survivors(config.global_batch, alive)
            config = config.replace(
                local_batches=survivors,
                # each rank's micro-batch as planned: more of them on the larger batches
                micro_batches=micro_batches_for(
                    config.local_batches, config.micro_batches, survivors
                ),
                ranks_per_vm=0,  # the survivors share this one host
                config_id=_next_id(plan.config_id, len(segments)),
            )
    except BaseException as exc:
        if tracker is not None and job is not None:
            tracker.failed(job, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        provider.release(alloc)
        (run_dir / RUN_ALLOCATIONS).unlink(missing_ok=True)


def describe_exits(codes: Mapping[int, int | None]) -> str:
    """How the ranks ended, grouped: ``rank 2 was killed by SIGKILL, ranks 0, 1 exited
    with 1``."""
    ranks: dict[str, list[int]] = {}
    for rank, code in sorted(codes.items()):
        if code is None:
            how = "still ran"
        elif code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exited with {code}"
        ranks.setdefault(how, []).append(rank)
    parts = []
    for how, r in ranks.items():
        who = f"rank {r[0]}" if len(r) == 1 else f"ranks {', '.join(map(str, r))}"
        verb = ("was " if len(r) == 1 else "were ") if how.startswith("killed") else ""
        parts.append(f"{who} {verb}{how}")
    return ", ".join(parts)


@dataclass
class _LocalStep:
    """One look at local workers: the monitor's step, and what local workers need beside
    it: ``on_poll`` first; workers that all exited 0 before a checkpoint held the plan's last
    iteration fail the job (the monitor's ``finished`` needs one); a script the runtime
    refused fails it with the reason (``monitor_step.ReportRefused``); workers that exited
    otherwise get ``TERM_GRACE_S`` for an interruption record before the job fails. Keeps
    each change of status in ``decisions``."""

    monitor: Monitor
    provider: LocalProvider
    alloc: Allocation
    decisions: list[PollResult]
    on_poll: Callable[[Allocation], None] | None
    exited_at: float | None = None

    def __call__(self) -> PollResult:
        if self.on_poll is not None:
            self.on_poll(self.alloc)
        try:
            result = self.monitor.step(time.time())
        except (JobStalled, ReportRefused) as exc:  # ``train_local`` releases: ranks stop
            raise TrainingError(str(exc)) from None
        except TrainingFailed:
            codes = self.provider.exit_codes(self.alloc)
            if codes and all(c == 0 for c in codes.values()):  # not "finished": no checkpoint
                n = self.monitor.facts.iterations
                raise TrainingError(
                    f"workers exited with 0 at iteration {self.monitor.recal.last_iteration} "
                    f"of {n}, and no checkpoint holds iteration {n}: a training script "
                    "reports every iteration up to iterations() and keeps a checkpoint of "
                    "the last (report(..., model=...)), then calls finish(); see the logs in "
                    f"{self.provider.log_dir(self.alloc)}"
                ) from None
            else:
                self.exited_at = self.exited_at or time.monotonic()
                if time.monotonic() - self.exited_at > TERM_GRACE_S + 1.0:
                    raise TrainingError(
                        f"{describe_exits(codes)}, with no preemption notice: a rank that dies "
                        "so ends the job (only workers the provider takes back are re-planned "
                        "on the survivors); run the same plan again to resume from its last "
                        f"checkpoint; see the logs in {self.provider.log_dir(self.alloc)}"
                    ) from None
                result = PollResult(
                    RUNNING, "workers exited: waiting for an interruption record", 0, 0.0, 0.0,
                    config_id=self.monitor.job.config_id, at=time.time(),
                )  # fmt: skip
        if not self.decisions or self.decisions[-1].status != result.status:
            self.decisions.append(result)
        return result
