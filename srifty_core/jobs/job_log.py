"""The MLflow record of an orchestrated training job (experiment ``srifty-jobs``).

One run per job, created by its first plan: the request (params), the first plan
(predicted iteration time, total time and cost, the explanation). While a configuration
trains, the monitor's step logs the window's metrics to its run (``LiveMetrics``:
throughput, iteration time measured against predicted, loss, projection), so the run
updates live; once it ends, the monitor's decisions and the measured iteration time.
Each re-plan is a run nested under it (tag ``mlflow.parentRunId``) with the same content
for its configuration and the reason it was needed. When the job finishes, its run gets
the outcome (iterations, time, cost, configurations) and the timeline plot, and ends.

Every write is one ``log_batch`` (``tracking.runs.RunLog``), never a call per value; tags
follow ``tracking.runs.srifty_tags`` (``srifty.kind`` = ``job`` or ``replan``). The steps of
a job run in different processes (Airflow tasks), so runs are addressed by id
(``RunLog``) rather than through an active-run stack.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core.jobs.decisions import DECISIONS_FILE, read_decisions
from srifty_core.jobs.job import Resume
from srifty_core.jobs.outcome import OUTCOME_FILE, Outcome
from srifty_core.runs.progress import median_step_s, read_progress
from srifty_core.runs.timeline import plot_timeline
from srifty_core.tracking.runs import PARENT_RUN_TAG, MetricPoint, RunLog, srifty_tags
from srifty_core.tracking.store import reader

if TYPE_CHECKING:
    from srifty_core.jobs.job import JobPlan, JobSpec
    from srifty_core.simulator.calibration import Calibration

EXPERIMENT = "srifty-jobs"
log = logging.getLogger(__name__)


def _runs() -> RunLog:
    return RunLog.open(EXPERIMENT)


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def log_plan(spec: JobSpec, job: JobPlan, result: Mapping[str, Any], run_key: str) -> JobPlan:
    """Record a plan: the job's run for the first one, a nested run for a re-plan.
    Returns ``job`` with the run ids set."""
    runs = _runs()
    resume = spec.resume
    if resume is None or not resume.job_run_id:
        job_run_id = config_run_id = runs.create_run(
            f"job {run_key}", srifty_tags(kind="job", model=spec.model, airflow_run=run_key)
        )
        params: dict[str, object] = {
            "model": spec.model,
            "size": spec.size,
            "global_batch": spec.global_batch,
            "iterations": spec.target_iterations,
            "provider": spec.provider,
            "region": spec.region,
            "objective": spec.objective,
            "time_limit_s": spec.time_limit_s,
            "budget_usd": spec.budget_usd,
            "bandwidth": spec.bandwidth,
            "offers": json.dumps(list(spec.offers)),
        }
    else:
        job_run_id = resume.job_run_id
        config_run_id = runs.create_run(
            f"re-plan {job.config_id} at iteration {resume.iterations_done}",
            {
                PARENT_RUN_TAG: job_run_id,
                **srifty_tags(
                    kind="replan", model=spec.model, airflow_run=run_key,
                    parent_airflow_run=resume.parent_run_id,
                ),
            },
        )  # fmt: skip
        params = {
            "iterations_done": resume.iterations_done,
            "iterations_left": spec.iterations,
            "time_left_s": spec.time_limit_s,
            "budget_left_usd": spec.budget_usd,
            "depleted": ",".join(resume.depleted) or "-",
            "kept_allocations": ",".join(resume.allocations) or "-",
        }
    p = job.predicted
    metrics = {"usd_per_hour": job.usd_per_hour}
    for key in ("t_iter_s", "time_s", "cost_usd", "throughput", "exposed_comm_s"):
        x = _num(p.get(key))
        if x is not None:
            metrics[f"predicted_{key}"] = x
    runs.log_batch(
        config_run_id,
        params=params,
        metrics=metrics,
        tags=srifty_tags(
            config_id=job.config_id, configuration=p.get("label", ""), feasible=p.get("feasible")
        ),
    )
    plan_json = json.dumps(result, indent=2, default=str)
    runs.log_text(config_run_id, plan_json, f"{job.config_id}/plan.json")
    explanation = "\n".join(job.explanation) + "\n"
    runs.log_text(config_run_id, explanation, f"{job.config_id}/explanation.txt")
    return replace(job, job_run_id=job_run_id, config_run_id=config_run_id)


class LiveMetrics:
    """The monitor's per-step window metrics to the configuration's run, as it trains (one
    ``log_batch`` per step that saw new training steps). A failure to log is logged and
    never ends the monitor."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._runs: RunLog | None = None

    def __call__(self, metrics: Mapping[str, float], step: int, at: float) -> None:
        try:
            if self._runs is None:
                self._runs = _runs()
            self._runs.log_batch(self.run_id, metrics=metrics, step=step,
                                 timestamp_ms=int(at * 1000))  # fmt: skip
        except Exception:  # MLflow down: the job goes on, the next step tries again
            self._runs = None
            log.warning("could not log live metrics to MLflow run %s", self.run_id, exc_info=True)


def live_metrics(job: JobPlan) -> LiveMetrics | None:
    """The live sink for a configuration's monitor, or ``None`` when it is not tracked."""
    return LiveMetrics(job.config_run_id) if job.config_run_id else None


def log_configuration_end(job: JobPlan, result: Mapping[str, Any], *, outcome: str) -> None:
    """The configuration ended (``finished`` or ``replan``): the monitor's decisions, the
    measured iteration time beside the prediction, and why it ended."""
    if not job.config_run_id:
        return
    runs = _runs()
    rid = job.config_run_id
    facts = job.facts
    decisions = read_decisions(facts.run_dir, job.config_id)
    history = []
    for k, d in enumerate(decisions):
        step = int(d.get("iterations_done", k))
        ts = int(float(d.get("at") or 0) * 1000)
        for key in ("iterations_done", "elapsed_s", "spent_usd", "optimistic_throughput",
                    "projected_time_s"):  # fmt: skip
            x = _num(d.get(key))
            if x is not None:
                history.append(MetricPoint(f"monitor_{key}", x, ts, step))
    runs.log_history(rid, history)  # a 6-hour job: a few dozen calls, not 20,000
    metrics: dict[str, float] = {}
    measured = median_step_s(read_progress(facts.progress_path), job.config_id)
    if measured is not None:
        metrics["measured_t_iter_s"] = measured
        predicted = _num(job.predicted.get("t_iter_s"))
        if predicted:
            metrics["t_iter_error_pct"] = 100.0 * (predicted / measured - 1.0)
    tags = srifty_tags(outcome=outcome, reason=str(result.get("reason", "")))
    runs.log_batch(rid, metrics=metrics, tags=tags)
    if decisions:
        lines = "".join(json.dumps(d, default=str) + "\n" for d in decisions)
        runs.log_text(rid, lines, f"{job.config_id}/{DECISIONS_FILE}")
    if rid != job.job_run_id:
        runs.end(rid, "FINISHED")


def log_outcome(job: JobPlan, outcome: Outcome) -> None:
    """The job finished: its totals (``outcome.Outcome.metrics``, the numbers of its
    ``outcome.json``) and timeline go to the job's run, which ends."""
    if not job.job_run_id:
        return
    facts = job.facts
    records = read_progress(facts.progress_path)
    runs = _runs()
    rid = job.job_run_id
    runs.log_batch(rid, metrics=outcome.metrics(), tags=srifty_tags(outcome=outcome.status))
    runs.log_text(rid, json.dumps(outcome.to_dict(), indent=1) + "\n", OUTCOME_FILE)
    with tempfile.TemporaryDirectory() as tmp:
        png = plot_timeline(
            records, Path(tmp) / "timeline.png", target=facts.iterations,
            decisions=read_decisions(facts.run_dir),
        )  # fmt: skip
        runs.log_artifact(rid, png)
    runs.end(rid, "FINISHED")


def log_totals(job: JobPlan, outcome: Outcome) -> None:
    """The whole job's wall time and bill, known once everything is released (after
    ``log_outcome``), on the job's run: those metrics and ``outcome.json`` again."""
    if not job.job_run_id:
        return
    runs = _runs()
    totals = ("outcome_wall_s", "outcome_billed_usd")
    metrics = {k: v for k, v in outcome.metrics().items() if k in totals}
    runs.log_batch(job.job_run_id, metrics=metrics)
    runs.log_text(job.job_run_id, json.dumps(outcome.to_dict(), indent=1) + "\n", OUTCOME_FILE)


def log_failure(job: JobPlan, reason: str) -> None:
    """The job failed (a task gave up): its runs say why and end as FAILED."""
    ids = list(dict.fromkeys(r for r in (job.config_run_id, job.job_run_id) if r))
    if not ids:  # not tracked
        return
    runs = _runs()
    for rid in ids:
        runs.log_batch(rid, tags=srifty_tags(outcome="failed", reason=reason))
        runs.end(rid, "FAILED")


def log_factors(run_id: str, config_id: str, cal: Calibration) -> None:
    """The factors this configuration measured, on its MLflow run: metrics
    ``calibration.compute.<device>`` and ``calibration.comm.<type>`` (observed ones) and
    ``<config>/calibration.json``."""
    runs = _runs()
    metrics = {f"calibration.compute.{k}": f.scale for k, f in cal.compute.items() if f.windows}
    metrics.update({f"calibration.comm.{k}": f.scale for k, f in cal.comm.items() if f.windows})
    runs.log_batch(run_id, metrics=metrics)
    runs.log_text(run_id, json.dumps(cal.to_dict(), indent=1), f"{config_id}/calibration.json")


def log_deadline_missed(job: JobPlan, deadline: str, run_key: str) -> None:
    """The job's run and its current configuration's are past the job's time limit (the
    Airflow run ``run_key`` noticed, at ``deadline``): tags on both."""
    runs = _runs()
    tags = srifty_tags(deadline_missed=deadline, deadline_run=run_key)
    for rid in dict.fromkeys(r for r in (job.config_run_id, job.job_run_id) if r):
        runs.log_batch(rid, tags=tags)


class ShellTracker:
    """The MLflow record of a job run from the shell (``srifty train``), in ``srifty-jobs``
    as a DAG run's is: one run per job made by its first plan (``log_plan``), a run nested
    under it per later configuration, each configuration's decisions and factors, the
    outcome and the timeline. It never fails the job: the first error (MLflow unreachable,
    a store that refuses) is one warning, and the job goes on untracked."""

    def __init__(self) -> None:
        self.off: str | None = None
        """Why tracking stopped, or None."""
        self.job_run_id: str | None = None

    def attempt(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self.off is not None:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # tracking is a record, never a reason to stop training
            self.off = f"{type(exc).__name__}: {exc}"
            log.warning("MLflow: could not %s (%s); the job goes on untracked", what, self.off)
            return None

    def log_plan(self, spec: JobSpec, job: JobPlan, result: Mapping[str, Any], key: str) -> JobPlan:
        """``log_plan`` (a ``planning.PlanSink``); ``job`` untracked when it fails."""
        out: JobPlan | None = self.attempt("record the plan", log_plan, spec, job, result, key)
        if out is None:
            return job
        self.job_run_id = out.job_run_id
        return out

    def plan_file(
        self, spec: JobSpec, job: JobPlan, plan: Mapping[str, Any], key: str, done: int
    ) -> JobPlan:
        """A configuration of a plan file (``local_run.train_local``): the job's run for
        the first, a nested one for a later (``done`` iterations done before it)."""
        if self.job_run_id is not None:
            resume = Resume(checkpoint="", iterations_done=done, job_run_id=self.job_run_id)
            spec = replace(spec, iterations=max(spec.iterations - done, 1), resume=resume)
        return self.log_plan(spec, job, plan, key)

    def configuration_end(self, job: JobPlan, result: Mapping[str, Any], outcome: str) -> None:
        def end() -> None:
            log_configuration_end(job, result, outcome=outcome)

        self.attempt("record the configuration's end", end)

    def outcome(self, job: JobPlan, outcome: Outcome) -> None:
        self.attempt("record the outcome", log_outcome, job, outcome)

    def failed(self, job: JobPlan, reason: str) -> None:
        self.attempt("record the failure", log_failure, job, reason)


def recent_configurations(days: float = 30.0, limit: int = 1000) -> list[str]:
    """Configuration labels (``srifty.configuration``) of the plans and re-plans recorded in
    the last ``days``, newest first (what users ran: ``probing.mix_choice``); empty when
    the store has no job experiment yet."""
    client, _ = reader()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return []
    since_ms = int((time.time() - days * 86400.0) * 1000)
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"attributes.start_time > {since_ms}",
        max_results=limit,
        order_by=["attributes.start_time DESC"],
    )
    (tag,) = srifty_tags(configuration="")
    return [str(r.data.tags[tag]) for r in runs if r.data.tags.get(tag)]
