"""The plan-and-train job in steps, for an orchestrator (the ``srifty_plan_and_train`` DAG).

``srifty train`` runs a whole job in one process (``local_run``); an orchestrator runs it
as separate tasks, each of which may run in another process or on another machine, and
which pass only paths and ids to each other. Each step lives in a module with one job:

1. ``planning.plan_job``: the trigger's parameters (``job.JobSpec``) to a saved
   ``job.JobPlan`` with the real planner, recorded in MLflow (``job_log``); a re-plan
   plans what is left through the ``replanner.Replanner``.
2. ``provisioning.provision`` launches the plan's VMs (a re-plan keeps what it still wants
   of the allocations the parent handed over); ``start_training`` starts the workers.
3. ``monitor_step.Monitor`` / ``poll``: ``running``, ``finished`` or ``replan``.
4. ``child_run.child_conf`` stops the workers and builds the conf of the follow-up run
   (``continue_or_finish``: or, when the job did its last iteration meanwhile, finishes).
5. ``finish`` logs the outcome and the timeline to the job's MLflow run;
   ``provisioning.release`` gives back what is not handed over (a teardown).
   ``job_failed`` and ``deadline_missed`` record a failed task and a run past the job's
   time limit (the DAG's failure callback and deadline alert).

This module gathers them under one name for the DAG and the tests. Light: no torch.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from srifty_core.cloud.base import Provider
from srifty_core.cloud.local import LocalProvider
from srifty_core.errors import SriftyError
from srifty_core.jobs import job_log, outcome, planning
from srifty_core.jobs.child_run import child_conf
from srifty_core.jobs.job import (
    FINISHED,
    REPLAN,
    RUNNING,
    JobFinished,
    JobPlan,
    JobSpec,
    Launch,
    NoFeasiblePlan,
    Resume,
    TrainingFailed,
)
from srifty_core.jobs.monitor_step import (
    DECISIONS_FILE,
    Monitor,
    PollResult,
    poll,
    read_decisions,
)
from srifty_core.jobs.planning import _safe, job_request, load_bandwidth_model
from srifty_core.jobs.provisioning import (
    handed_over,
    make_provider,
    provision,
    release,
    start_training,
    worker_command,
)
from srifty_core.runs import store as run_store
from srifty_core.runs.store import runs_dir

_log = logging.getLogger(__name__)

__all__ = [
    "DECISIONS_FILE",
    "FINISHED",
    "REPLAN",
    "RUNNING",
    "JobFinished",
    "JobPlan",
    "JobSpec",
    "Launch",
    "LocalProvider",
    "Monitor",
    "NoFeasiblePlan",
    "PollResult",
    "Resume",
    "TrainingFailed",
    "child_conf",
    "continue_or_finish",
    "deadline_missed",
    "describe_plan",
    "finish",
    "handed_over",
    "job_failed",
    "job_request",
    "load_bandwidth_model",
    "make_provider",
    "plan_job",
    "poll",
    "provision",
    "read_decisions",
    "release",
    "runs_dir",
    "start_training",
    "worker_command",
]


def plan_job(
    spec: JobSpec, run_key: str, *, track: bool = True, log_plan: planning.PlanSink | None = None
) -> Path | str:
    """Plan this run of the job and save it (``planning.plan_job``), recorded in MLflow
    (``job_log.log_plan``, or ``log_plan`` where given) unless not ``track``; returns the
    ``JobPlan`` JSON's path."""
    sink = (log_plan or job_log.log_plan) if track else None
    path = planning.plan_job(spec, run_key, log_plan=sink)
    _log.info("%s", describe_plan(JobPlan.load(path)))
    return path


def describe_plan(job: JobPlan) -> str:
    """What was planned, in a few lines (the plan task's log): the VMs, the prediction,
    the planner's explanation."""
    vms = ", ".join(
        f"{x.count} x {x.instance_type} ({x.market}, {x.ranks_per_vm} rank(s) of batch "
        f"{x.batch_per_rank})"
        for x in job.launches
    )
    p = job.predicted
    head = f"planned {job.config_id} on {job.provider}: {vms} at ${job.usd_per_hour:.3f}/h"
    numbers = ", ".join(
        f"{label} {p[key]:.4g}{unit}"
        for key, label, unit in (
            ("t_iter_s", "iteration", " s"),
            ("time_s", "time", " s"),
            ("cost_usd", "cost", " USD"),
        )
        if isinstance(p.get(key), (int, float))
    )
    lines = [head, f"predicted: {numbers}" if numbers else "", *job.explanation]
    return "\n".join(line for line in lines if line)


def continue_or_finish(
    params: Mapping[str, Any],
    job_path: Path | str,
    allocation_ids: list[str],
    result: Mapping[str, Any],
    parent_run_id: str,
    provider: Provider | None = None,
) -> dict[str, Any] | None:
    """After a ``replan`` decision: the conf of the run that continues the job
    (``child_conf``), or ``None`` when the job finished before its workers were stopped,
    which is then recorded as finished (``finish``) rather than failed. ``provider``:
    the one the job runs on (default: the job's own, ``make_provider``)."""
    try:
        return child_conf(
            params, job_path, allocation_ids, result, parent_run_id, provider=provider
        )
    except JobFinished:
        finish(job_path, {**result, "status": "finished"})
        return None


def finish(
    job_path: Path | str, result: Mapping[str, Any], *, track: bool = True
) -> dict[str, Any]:
    """The job finished: its ``outcome.json`` in the run folder (``outcome.of_result``),
    then, unless not ``track``, the last configuration, the outcome and the timeline in
    MLflow; returns the outcome."""
    job = JobPlan.load(job_path)
    out = outcome.of_result(job, result)
    out.save()
    if track:
        job_log.log_configuration_end(job, result, outcome="finished")
        job_log.log_outcome(job, out)
    return out.to_dict()


def job_failed(job_path: Path | str, reason: str) -> None:
    """Record in MLflow that the job failed (the DAG's failure callback)."""
    job_log.log_failure(JobPlan.load(job_path), reason)


def job_run_dir(run_id: str, conf: Mapping[str, Any]) -> Path | str | None:
    """The run folder of the DAG run ``run_id`` (a re-plan's is its parent's: the folder
    of ``resume.checkpoint``), under ``run_store.runs_root()`` (the deployment's run
    storage, or the data folder's ``runs/``); ``None`` when that is not a run folder
    there."""
    from srifty_core.worker.checkpoint import CHECKPOINT_FILE

    resume = conf.get("resume")
    checkpoint = resume.get("checkpoint") if isinstance(resume, Mapping) else None
    root = run_store.runs_root()
    try:
        if run_store.is_remote(root):
            if checkpoint:
                return run_store.confined_run_dir(str(checkpoint), CHECKPOINT_FILE)
            return run_store.join(root, _safe(run_id))
        runs = Path(root).resolve()
        folder = Path(str(checkpoint)).parent if checkpoint else runs / _safe(run_id)
    except SriftyError:
        return None
    folder = folder.resolve()
    return folder if folder.is_relative_to(runs) and folder != runs else None


def _config_number(job_file: str) -> tuple[int, str]:
    m = re.fullmatch(r"job-c(\d+)(?:\..*)?\.json", job_file)
    return (int(m[1]) if m else -1, job_file)


def deadline_missed(run_id: str, conf: Mapping[str, Any], deadline: str) -> str | None:
    """The run is past the job's time limit (the DAG's deadline alert): tag the job's and
    the current configuration's MLflow runs (the job file of its latest configuration,
    ``job-c<k>.json`` with the largest ``k``); the job file it found, or ``None``."""
    folder = job_run_dir(run_id, conf)
    found = run_store.names(folder, "job-c*.json") if folder is not None else []
    if folder is None or not found:
        return None
    latest = run_store.join(folder, max(found, key=_config_number))
    job_log.log_deadline_missed(JobPlan.load(latest), deadline, run_id)
    return str(latest)
