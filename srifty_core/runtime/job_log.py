"""The MLflow record of an orchestrated training job (experiment ``srifty-jobs``).

One run per job, created by its first plan: the request (params), the first plan
(predicted iteration time, total time and cost, the explanation, the frontier plot) and,
once that configuration ends, the monitor's decisions and the measured iteration time.
Each re-plan is a run nested under it (tag ``mlflow.parentRunId``) with the same content
for its configuration and the reason it was needed. When the job finishes, its run gets
the outcome (iterations, time, cost, configurations) and the timeline plot, and ends.

The steps of a job run in different processes (Airflow tasks), so runs are addressed by
id through ``MlflowClient`` rather than through an active-run stack.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core.tracking import setup_experiment

if TYPE_CHECKING:
    from srifty_core.runtime.orchestrate import JobPlan, JobSpec

EXPERIMENT = "srifty-jobs"


def _client() -> tuple[Any, str]:
    experiment_id = setup_experiment(EXPERIMENT)
    from mlflow.tracking import MlflowClient

    return MlflowClient(), experiment_id


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def log_plan(spec: JobSpec, job: JobPlan, result: Mapping[str, Any], run_key: str) -> JobPlan:
    """Record a plan: the job's run for the first one, a nested run for a re-plan.
    Returns ``job`` with the run ids set."""
    client, exp = _client()
    resume = spec.resume
    if resume is None or not resume.job_run_id:
        run = client.create_run(
            exp,
            run_name=f"job {run_key}",
            tags={"srifty.kind": "job", "srifty.model": spec.model, "srifty.airflow_run": run_key},
        )
        job_run_id = config_run_id = run.info.run_id
        params = {
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
            "offers": json.dumps(list(spec.offers))[:6000],
        }
        for k, v in params.items():
            client.log_param(job_run_id, k, v)
    else:
        job_run_id = resume.job_run_id
        run = client.create_run(
            exp,
            run_name=f"re-plan {job.config_id} at iteration {resume.iterations_done}",
            tags={
                "mlflow.parentRunId": job_run_id,
                "srifty.kind": "replan",
                "srifty.airflow_run": run_key,
                "srifty.parent_airflow_run": str(resume.parent_run_id),
            },
        )
        config_run_id = run.info.run_id
        for k, v in {
            "iterations_done": resume.iterations_done,
            "iterations_left": spec.iterations,
            "time_left_s": spec.time_limit_s,
            "budget_left_usd": spec.budget_usd,
            "depleted": ",".join(resume.depleted) or "-",
        }.items():
            client.log_param(config_run_id, k, v)
    p = job.predicted
    client.set_tag(config_run_id, "srifty.config_id", job.config_id)
    client.set_tag(config_run_id, "srifty.configuration", str(p.get("label", "")))
    client.set_tag(config_run_id, "srifty.feasible", str(p.get("feasible")))
    for key in ("t_iter_s", "time_s", "cost_usd", "throughput", "exposed_comm_s"):
        x = _num(p.get(key))
        if x is not None:
            client.log_metric(config_run_id, f"predicted_{key}", x)
    client.log_metric(config_run_id, "usd_per_hour", job.usd_per_hour)
    plan_json = json.dumps(result, indent=2, default=str)
    client.log_text(config_run_id, plan_json, f"{job.config_id}/plan.json")
    explanation = "\n".join(job.explanation) + "\n"
    client.log_text(config_run_id, explanation, f"{job.config_id}/explanation.txt")
    return replace(job, job_run_id=job_run_id, config_run_id=config_run_id)


def log_configuration_end(job: JobPlan, result: Mapping[str, Any], *, outcome: str) -> None:
    """The configuration ended (``finished`` or ``replan``): the monitor's decisions, the
    measured iteration time beside the prediction, and why it ended."""
    if not job.config_run_id:
        return
    from srifty_core.runtime.orchestrate import DECISIONS_FILE, read_decisions
    from srifty_core.runtime.progress import median_step_s, read_progress

    client, _ = _client()
    rid = job.config_run_id
    plan = job.train
    decisions = read_decisions(plan.run_dir, job.config_id)
    for k, d in enumerate(decisions):
        step = int(d.get("iterations_done", k))
        ts = int(float(d.get("at") or 0) * 1000) or None
        for key in ("iterations_done", "elapsed_s", "spent_usd", "optimistic_throughput",
                    "projected_time_s"):  # fmt: skip
            x = _num(d.get(key))
            if x is not None:
                client.log_metric(rid, f"monitor_{key}", x, timestamp=ts, step=step)
    measured = median_step_s(read_progress(plan.progress_path), job.config_id)
    if measured is not None:
        client.log_metric(rid, "measured_t_iter_s", measured)
        predicted = _num(job.predicted.get("t_iter_s"))
        if predicted:
            client.log_metric(rid, "t_iter_error_pct", 100.0 * (predicted / measured - 1.0))
    client.set_tag(rid, "srifty.outcome", outcome)
    client.set_tag(rid, "srifty.reason", str(result.get("reason", ""))[:5000])
    if decisions:
        lines = "".join(json.dumps(d, default=str) + "\n" for d in decisions)
        client.log_text(rid, lines, f"{job.config_id}/{DECISIONS_FILE}")
    if rid != job.job_run_id:
        client.set_terminated(rid, "FINISHED")


def log_outcome(job: JobPlan, result: Mapping[str, Any]) -> dict[str, Any]:
    """The job finished: its totals and timeline go to the job's run, which ends."""
    from srifty_core.runtime.orchestrate import read_decisions
    from srifty_core.runtime.progress import read_progress
    from srifty_core.runtime.timeline import plot_timeline

    plan = job.train
    records = read_progress(plan.progress_path)
    outcome = {
        "iterations": max((r.iteration for r in records), default=0),
        "target_iterations": plan.iterations,
        "elapsed_s": float(result.get("elapsed_s", 0.0)),
        "cost_usd": float(result.get("spent_usd", 0.0)),
        "configurations": len({r.config_id for r in records}),
    }
    if not job.job_run_id:
        return outcome
    client, _ = _client()
    rid = job.job_run_id
    for k, v in outcome.items():
        client.log_metric(rid, f"outcome_{k}", float(v))
    client.set_tag(rid, "srifty.outcome", "finished")
    with tempfile.TemporaryDirectory() as tmp:
        png = plot_timeline(
            records, Path(tmp) / "timeline.png", target=plan.iterations,
            decisions=read_decisions(plan.run_dir),
        )  # fmt: skip
        client.log_artifact(rid, str(png))
    client.set_terminated(rid, "FINISHED")
    return outcome


def log_failure(job: JobPlan, reason: str) -> None:
    """The job failed (a task gave up): its runs say why and end as FAILED."""
    client, _ = _client()
    for rid in dict.fromkeys(r for r in (job.config_run_id, job.job_run_id) if r):
        client.set_tag(rid, "srifty.outcome", "failed")
        client.set_tag(rid, "srifty.reason", reason[:5000])
        client.set_terminated(rid, "FAILED")
