"""The monitor's step: one look at a running configuration, ``running``, ``finished`` or
``replan``.

A ``Monitor`` is made once per configuration and stepped every few seconds (by the Airflow
trigger, in the triggerer): it keeps the provider, the allocations and the progress log's
read position, so a step reads only the steps logged since the last one, the small state
file rank 0 replaces each step (the iteration the checkpoint holds: never the checkpoint
itself) and the provider's interruptions and exit codes. Workers that died without a
preemption raise ``TrainingFailed``; workers that logged no step for longer than their
step time allows (``monitor.StallWatch``: a hung script or rank) raise ``JobStalled``.
Every step is appended to the run folder's ``decisions.jsonl`` (``DecisionLog``: the run
folder may be a run-storage URI); with ``live`` set, each step that saw new training steps
reports the window's metrics (throughput, iteration time measured against predicted, loss)
to it, which ``job_log.LiveMetrics`` logs to the configuration's MLflow run while it trains.

Light: no torch import (importing this module, or stepping a monitor, never loads it).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from srifty_core.cloud import find_provider_class
from srifty_core.cloud.base import Allocation, Provider
from srifty_core.jobs import job_log
from srifty_core.jobs.cloud_watch import CloudView, observe
from srifty_core.jobs.decisions import (
    DECISIONS_FILE,
    DecisionLog,
    PollResult,
    append_decision,
    read_decisions,
)
from srifty_core.jobs.job import (
    FINISHED,
    REPLAN,
    RUNNING,
    JobPlan,
    JobSpec,
    TrainingFailed,
    item_key,
)
from srifty_core.jobs.monitor import Limits, Stall, StallWatch, decide
from srifty_core.jobs.provisioning import make_provider
from srifty_core.jobs.recalibration import Recalibrator
from srifty_core.planner.request import offer_key
from srifty_core.runs.progress import (
    ProgressRecord,
    ProgressTail,
    read_state,
    refused_report,
)
from srifty_core.worker.rendezvous import exit_markers

__all__ = [
    "DECISIONS_FILE",
    "WINDOW_S",
    "DecisionLog",
    "JobStalled",
    "LiveSink",
    "Monitor",
    "PollResult",
    "ReportRefused",
    "alternatives",
    "append_decision",
    "poll",
    "read_decisions",
    "window_metrics",
]

WINDOW_S = 300.0
LiveSink = Callable[[Mapping[str, float], int, float], None]
"""``(metrics, step, at)``: where a step's window metrics go (``job_log.LiveMetrics``)."""


class JobStalled(TrainingFailed):
    """The workers logged no step for longer than their step time allows (a hung script
    or rank); the job fails with this message, and its teardown stops the ranks."""


class ReportRefused(TrainingFailed):
    """The runtime refused what the training script reported (``worker.user``: an
    iteration out of order, a non-finite loss, the last iteration never reached or never
    checkpointed) and stopped its ranks; the job fails with the reason."""


class Monitor:
    """The monitor of one configuration (see the module's doc)."""

    def __init__(
        self,
        job_path: Path | str,
        allocation_ids: Sequence[str],
        spec: JobSpec,
        started_at: float,
        *,
        provider: Provider | None = None,
        live: LiveSink | None = None,
        window_s: float = WINDOW_S,
        search: bool = True,
        stall: Stall | None = None,
    ) -> None:
        self.job = JobPlan.load(job_path)
        self.facts = self.job.facts
        self.spec = spec
        self.started_at = started_at
        self.provider = provider or make_provider(self.job)
        self.allocations = [self.provider.get_allocation(a) for a in allocation_ids]
        self.kind = find_provider_class(self.job.provider) or type(self.provider)
        """What the job's provider answers (its workers' exits, its interruptions, its
        start): asked of the job's provider class, as ``provider`` may stand in for it."""
        self.live = live
        self.window_s = window_s
        self._tail = ProgressTail(self.facts.progress_path)
        self._decisions = DecisionLog(self.facts.run_dir, self.facts.config_id)
        self._recent: list[ProgressRecord] = []
        self._last: ProgressRecord | None = None
        predicted = self.job.predicted.get("t_iter_s")
        planned = max(
            spec.step_sleep_s,
            float(predicted) if isinstance(predicted, (int, float)) else 0.0,
        )
        # on VMs the start (install, join) has its own timeout: judged from the first step
        startup = self.kind.starts_at_once
        self.stall = StallWatch(stall or Stall(), started_at, planned, startup=startup)
        # online recalibration; the factors go to the configuration's MLflow run at its end
        self.recal = Recalibrator(
            self.job, spec, window_s=window_s, log_factors=job_log.log_factors
        )

    def _read(self, now: float) -> tuple[list[ProgressRecord], bool]:
        """The steps of this configuration in the window (and the latest), and whether any
        arrived since the last step."""
        new = [r for r in self._tail.read() if r.wall_time >= self.started_at]
        self.stall.see(new, now)
        if new:
            self._last = new[-1]
        self._recent = [r for r in (*self._recent, *new) if r.wall_time > now - self.window_s]
        if not self._recent and self._last is not None:
            return [self._last], bool(new)
        return list(self._recent), bool(new)

    def step(self, now: float | None = None, cloud: CloudView | None = None) -> PollResult:
        """One look: the provider's interruptions, the workers, the monitor's decision.
        ``cloud``: the allocations' state already read (``cloud_watch.AsyncObserver``, in
        the trigger's event loop); read here through the provider when not given."""
        job, facts, spec, provider = self.job, self.facts, self.spec, self.provider
        now = provider.now().timestamp() if now is None else now  # simulated on an emulator
        prior_s = spec.resume.time_spent_s if spec.resume else 0.0
        prior_usd = spec.resume.cost_spent_usd if spec.resume else 0.0
        # A resumed run's conf carries what is left of the time and the budget.
        limits = Limits(
            iterations=facts.iterations,
            global_batch=facts.global_batch,
            time_limit_s=spec.time_limit_s,
            budget_usd=spec.budget_usd,
            usd_per_hour=job.usd_per_hour,
        )
        records, fresh = self._read(now)
        lost: dict[str, int] = {}
        interrupted: list[str] = []
        view = cloud if cloud is not None else observe(provider, self.allocations)
        for a in self.allocations:
            gone = view.interruptions.get(a.id, ())
            if gone:
                key = offer_key(a.spec.name, a.market)
                lost[key] = lost.get(key, 0) + len(gone)
                interrupted += [i.instance_id for i in gone]
        # Spot capacity taken back is depleted for the rest of the job (the method); a local
        # worker taken back only lowers the quota (the next plan runs on the survivors).
        depletes = self.kind.interruptions_deplete_spot
        preempted = [k for k in lost if depletes and k.endswith("/spot")]
        decision = decide(
            records, limits, now=now, started_at=self.started_at, preempted=preempted,
            window_s=self.window_s,
        )  # fmt: skip
        codes = [c for a in self.allocations for c in view.exit_codes.get(a.id, {}).values()]
        all_exited = bool(codes) and all(c is not None for c in codes)
        state = read_state(facts.state_path)
        checkpointed = state is not None and state.checkpoint_iteration >= facts.iterations
        own_exits = self.kind.reports_exit_codes  # else the VMs' exit markers
        finished = checkpointed and (all_exited or not own_exits)
        done = max(decision.iterations_done, spec.resume.iterations_done if spec.resume else 0)
        recal = self.recal.check(records, decision.elapsed_s, decision.spent_usd)
        hung = self.stall.hung(now)

        def result(status: str, reason: str) -> PollResult:
            return PollResult(
                status,
                reason,
                done,
                prior_s + decision.elapsed_s,
                prior_usd + decision.spent_usd,
                tuple(sorted({*(spec.resume.depleted if spec.resume else ()), *decision.depleted})),
                tuple(interrupted),
                lost,
                decision.optimistic_throughput,
                None if decision.projected_time_s is None else prior_s + decision.projected_time_s,
                job.config_id,
                now,
            )

        if finished:
            out = result(FINISHED, f"finished {facts.iterations} iterations")
        elif lost:
            taken = ", ".join(sorted(interrupted))
            why = decision.reason if decision.depleted else "the next plan runs on what is left"
            out = result(REPLAN, f"taken back by the provider: {taken}; {why}")
        elif decision.replan and alternatives(spec, job):
            out = result(REPLAN, decision.reason)
        elif recal is not None and recal.replan:
            out = result(REPLAN, recal.reason)
        elif decision.replan and hung is None:
            out = result(RUNNING, f"{decision.reason}; no other configuration to switch to")
        elif all_exited and provider.reports_exit_codes:
            _raise_if_refused(facts.run_dir, facts.config_id, self.started_at)
            logs = ", ".join(str(provider.log_dir(a)) for a in self.allocations)
            raise TrainingFailed(
                f"workers exited at iteration {done} of {facts.iterations} without a "
                f"preemption; see the logs in {logs}"
            )
        elif not own_exits and (failed := _failed_exits(facts.run_dir, facts.config_id)):
            _raise_if_refused(facts.run_dir, facts.config_id, self.started_at)
            raise TrainingFailed(
                f"VM(s) ended training at iteration {done} of {facts.iterations} without a "
                f"preemption (node: exit code) {failed}; see exit-*.json in {facts.run_dir}"
            )
        elif hung is not None:
            raise JobStalled(
                f"{hung}: the job looks hung at iteration {done} of {facts.iterations}: "
                f"stopping its ranks; see the workers' logs{_log_dirs(provider, self.allocations)}"
            )
        else:
            out = result(RUNNING, decision.reason)
        self._decisions.append(out)
        if out.status != RUNNING:  # the factors go to the next plan and the model's store
            self.recal.finish(records, decision.elapsed_s, decision.spent_usd)
        if fresh and self.live is not None:
            mine = [r for r in records if r.config_id == facts.config_id]
            metrics = window_metrics(mine, out, job.predicted, state.loss if state else None)
            self.live({**metrics, **(recal.metrics if recal else {})}, done, now)
        return out


def _raise_if_refused(run_dir: str, config_id: str, since: float) -> None:
    """``ReportRefused`` with the reason, where the script's ranks were stopped for what
    it reported since ``since`` (``progress.refused_report``)."""
    refused = refused_report(run_dir, config_id, since)
    if refused:
        raise ReportRefused(f"the training script was stopped: {refused}")


def _log_dirs(provider: Provider, allocations: Sequence[Allocation]) -> str:
    dirs = [provider.log_dir(a) for a in allocations]
    if all(d is None for d in dirs):  # not on this machine
        return ""
    return " in " + ", ".join(map(str, dirs))


def _failed_exits(run_dir: str, config_id: str) -> dict[str, int]:
    """The non-zero exit markers of the configuration's VMs (``rendezvous.exit_markers``)."""
    return {n: c for n, c in exit_markers(run_dir, config_id).items() if c != 0}


def window_metrics(
    records: Sequence[ProgressRecord],
    result: PollResult,
    predicted: Mapping[str, Any],
    loss: float | None,
) -> dict[str, float]:
    """What the job's MLflow run shows live: the window's throughput and iteration time
    against the prediction, the loss, and the monitor's projection."""
    out: dict[str, float] = {
        "live_iterations_done": float(result.iterations_done),
        "live_elapsed_s": result.elapsed_s,
        "live_spent_usd": result.spent_usd,
    }
    timed = [r for r in records if r.step_s > 0]
    if timed:
        t_iter = statistics.median(r.step_s for r in timed)
        out["live_t_iter_s"] = t_iter
        out["live_throughput"] = statistics.fmean(r.samples / r.step_s for r in timed)
        p = predicted.get("t_iter_s")
        if isinstance(p, (int, float)) and p > 0:
            out["live_t_iter_error_pct"] = 100.0 * (float(p) / t_iter - 1.0)
    if loss is not None:
        out["live_loss"] = loss
    if result.projected_time_s is not None:
        out["live_projected_time_s"] = result.projected_time_s
    return out


def poll(
    job_path: Path | str,
    allocation_ids: Sequence[str],
    spec: JobSpec,
    started_at: float,
    *,
    provider: Provider | None = None,
    now: float | None = None,
) -> PollResult:
    """One step of a fresh ``Monitor`` (it reads the progress log from its start)."""
    return Monitor(job_path, allocation_ids, spec, started_at, provider=provider).step(now)


def alternatives(spec: JobSpec, job: JobPlan) -> bool:
    """Is there capacity this configuration does not use (another offer, or quota left)?
    Without any, a re-plan for falling behind could only choose the same VMs again."""
    used = Counter[str]()
    for x in job.launches:
        used[x.key] += x.count
    gone = set(spec.resume.depleted) if spec.resume else set()
    for o in spec.offers:
        key = item_key(o)
        if key not in gone and int(o.get("quota", 0)) > used[key]:
            return True
    return False
