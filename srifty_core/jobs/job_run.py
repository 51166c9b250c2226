"""A whole plan-and-train job in one process, with the DAG's own steps (``srifty train
--job JOB.yaml``).

The ``srifty_plan_and_train`` DAG runs each step as a task and each re-plan as a new DAG
run; ``run_job`` runs the same steps (``orchestrate``: plan, provision, start the ranks,
monitor, on a re-plan the child conf, finish, release) in a loop, so a job started from
the shell plans, provisions (local processes, or EC2 through the deployment's AWS
connection, or the emulated EC2: ``emulated_job``), trains, re-plans on a preemption or a
projected broken limit, and gives back every VM it launched, however it ends. Each
configuration is one entry of the returned ``JobRun``. Time between two looks is the
provider's (``Provider.wait``): on the emulated EC2 its simulated clock, no wall time.

A job run again after its driver died (``srifty train --job`` killed, or stopped by Ctrl-C
or an error) resumes its unfinished run (``resume_unfinished``): each new run folder keeps
the job's request and identity (``REQUEST_FILE``, ``job_identity``); the rerun takes the
newest unfinished folder of the same identity over once its lock is free, releases what the
dead driver left launched (``local_run.release_left_behind``: the folder records its local
allocations) and continues from the checkpoint as a re-plan does (``resume_conf``: a
``resume`` block, so the log is cut back to the checkpoint and a new configuration plans
what is left). A finished run (its ``outcome.json``) is never resumed: the job starts anew.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from srifty_core.atomic import write_text_atomic
from srifty_core.cloud import provider_class
from srifty_core.cloud.base import Provider
from srifty_core.cloud.local import local_provider
from srifty_core.errors import SriftyError
from srifty_core.jobs import job_log, outcome, planning
from srifty_core.jobs import orchestrate as orc
from srifty_core.jobs.decisions import read_decisions
from srifty_core.jobs.emulated_job import make_provider
from srifty_core.jobs.job import FINISHED, JobPlan, JobSpec
from srifty_core.jobs.monitor_loop import MonitorTimeout, watch
from srifty_core.jobs.monitor_step import Monitor, PollResult
from srifty_core.jobs.orchestrate import _config_number
from srifty_core.jobs.outcome import OUTCOME_FILE
from srifty_core.jobs.replanner import Progress, Replanner
from srifty_core.planner.job import read_request_file
from srifty_core.planner.schema.job_conf import ShellJobConf
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import PROGRESS_FILE, read_progress

MAX_CONFIGURATIONS = 20
"""Re-plans one job may make before ``run_job`` gives up (a job that keeps losing VMs)."""
REQUEST_FILE = "request.json"
"""In a job's run folder: the job as requested (its conf, the working folder it was run
from) and its identity (``job_identity``), written once when the folder is made."""


class JobRunError(SriftyError):
    """The job could not go on (the message says why); nothing it launched is left up."""


@dataclass(frozen=True)
class Configuration:
    """One configuration of the job: its plan and how its monitor ended."""

    job_path: str
    config_id: str
    local_batches: tuple[int, ...]
    launches: tuple[str, ...]
    status: str
    """``finished`` or ``replan``."""
    reason: str


@dataclass(frozen=True)
class JobRun:
    configurations: tuple[Configuration, ...]
    outcome: Mapping[str, Any] = field(default_factory=dict)
    """The finished job's ``outcome.Outcome`` (as in its run folder's ``outcome.json``):
    iterations, training and wall time, training cost and the bill, the run folder."""


def run_job(
    params: Mapping[str, Any],
    *,
    run_key: str | None = None,
    provider: Provider | None = None,
    poll_s: float = 1.0,
    on_poll: Callable[[PollResult], None] | None = None,
    timeout_s: float = float("inf"),
    track: bool = True,
    resume_unfinished: bool = False,
    say: Callable[[str], None] | None = None,
) -> JobRun:
    """Run the job ``params`` (the DAG's conf, ``planner.schema.job_conf.ShellJobConf``: provider
    ``ec2-emulated`` too) to its end. ``timeout_s``: of wall time; ``poll_s``: of the
    provider's time between two looks of the monitor; ``track``: record it in MLflow
    (``job_log.ShellTracker``: a tracking store that fails never fails the job). Its
    outcome, with the wall time and the bill once everything is released, goes to the run
    folder's ``outcome.json`` (``jobs.outcome``).

    The job's run folder is its own from creation and held while it runs
    (``claim_run_folder``): a second job never trains in it. ``resume_unfinished`` (and
    no ``run_key``, no ``resume``): an unfinished run of the same job (``job_identity``)
    in a local run folder is taken over and resumed from its checkpoint instead of a new
    folder being made (``unfinished_run``, ``resume_conf``); its folder still held by a
    live job is a ``TrainingError`` naming it. ``say``: told which run folder the job
    trains in, before planning."""
    from srifty_core.jobs.local_run import run_folder_lock

    earlier = None
    if resume_unfinished and run_key is None and params.get("resume") is None:
        earlier = unfinished_run(params)
    if earlier is not None:
        with run_folder_lock(earlier):  # a live driver's folder: refused, naming it
            conf = resume_conf(params, earlier, provider)
            if conf is None:  # every iteration was done: only the outcome was missing
                if say is not None:
                    say(f"run folder: {earlier} (this job's run: every iteration was done)")
                return JobRun((), finish_run(earlier))
            if say is not None:
                done = conf["resume"]["iterations_done"] if "resume" in conf else 0
                say(
                    f"run folder: {earlier} (this job's unfinished run: resuming after "
                    f"iteration {done})"
                )
            return _run_job(conf, earlier.name, provider, poll_s, on_poll, timeout_s, track)
    key, held = claim_run_folder(params, run_key)
    with held:
        spec = JobSpec.from_params(dict(params), shell=True)
        folder = planning._run_dir(spec, key)
        if spec.resume is None and isinstance(folder, Path):
            _record_request(folder, params)
        if say is not None:
            say(f"run folder: {folder}")
        return _run_job(params, key, provider, poll_s, on_poll, timeout_s, track)


def claim_run_folder(
    params: Mapping[str, Any], run_key: str | None
) -> tuple[str, contextlib.AbstractContextManager[Any]]:
    """The run key of a job and the hold on its run folder (``local_run.run_folder_lock``,
    an OS lock released when this process exits, however it exits). Without a ``run_key``
    the job gets a new folder ``shell__<time>-<random>``, made here with an exclusive
    ``mkdir``, so two jobs started at once never share one; a given key's folder (or a
    resumed job's, its checkpoint's) is held as it is: a second job on it fails naming the
    holder. Run storage (a URI) has no folder to hold: its name is unique all the same."""
    from srifty_core.jobs.local_run import run_folder_lock

    spec = JobSpec.from_params(dict(params), shell=True)
    root = run_store.runs_root()
    local = isinstance(root, Path)
    if spec.resume is not None:  # the checkpoint's folder; the key only names the job
        local = local and not run_store.is_remote(spec.resume.checkpoint)
        key = run_key or _new_key()
    elif run_key:
        key = run_key
    else:
        for _ in range(100):  # the same second and the same 32 random bits: try again
            key = _new_key()
            if not isinstance(root, Path):
                break
            root.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                (root / key).mkdir()
                break
        else:
            raise JobRunError(f"no new run folder could be made in {root}")
    if not local:
        return key, contextlib.nullcontext()
    folder = planning._run_dir(spec, key)
    assert isinstance(folder, Path)
    return key, run_folder_lock(folder)


def job_identity(params: Mapping[str, Any], cwd: str | None = None) -> str:
    """The identity of a job from the shell: the SHA-256 of its resolved request (the
    conf checked by ``ShellJobConf``, every default filled in, ``resume`` left out, as
    canonical JSON) and the working folder it is run from (``cwd``, default this
    process's: a model file or a script named by a relative path is another file
    elsewhere). The same job file (or the same content, with the same command after
    ``--`` and ``--provider``) run from the same folder is the same job; any changed
    field (iterations, batch, offers, limits, seed, script) is another job."""
    conf = ShellJobConf.parse({k: v for k, v in params.items() if k != "resume"})
    resolved = conf.model_dump(mode="json", exclude={"resume"})
    doc = {"conf": resolved, "cwd": os.getcwd() if cwd is None else cwd}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _record_request(folder: Path, params: Mapping[str, Any]) -> None:
    """Write the job's request and identity into its new run folder (``REQUEST_FILE``),
    holding the folder's lock: a rerun that finds it finds the folder held."""
    doc = {
        "identity": job_identity(params),
        "cwd": os.getcwd(),
        "conf": dict(params),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    write_text_atomic(folder / REQUEST_FILE, json.dumps(doc, indent=1, default=str) + "\n")


def unfinished_run(params: Mapping[str, Any]) -> Path | None:
    """The newest run folder (by when its request was written) of the same job
    (``job_identity``) that has no ``outcome.json`` yet: a run whose driver died or was
    stopped. ``None`` when there is none, or the run folders are on run storage (no lock
    there tells a dead driver from a live one)."""
    root = run_store.runs_root()
    if not isinstance(root, Path) or not root.is_dir():
        return None
    if JobSpec.from_params(dict(params), shell=True).resume is not None:
        return None
    me = job_identity(params)
    found: list[tuple[float, str, Path]] = []
    for folder in root.iterdir():
        request = folder / REQUEST_FILE
        try:
            doc = json.loads(request.read_text(encoding="utf-8"))
            when = request.stat().st_mtime
        except (OSError, ValueError):
            continue
        mine = isinstance(doc, dict) and doc.get("identity") == me
        if mine and not (folder / OUTCOME_FILE).exists():
            found.append((when, folder.name, folder))
    return max(found)[2] if found else None


def resume_conf(
    params: Mapping[str, Any], run_dir: Path, provider: Provider | None = None
) -> dict[str, Any] | None:
    """The conf that continues the unfinished run of ``params`` in ``run_dir`` from its
    checkpoint, as a re-plan's conf does (``child_run.child_conf``): what is left of the
    iterations, the time limit and the budget (the time and cost its monitor last
    recorded in ``decisions.jsonl``), and a ``resume`` block naming the checkpoint and the
    job's MLflow run. ``params`` as they are when nothing was checkpointed and nothing
    logged (a first plan must still meet the limits); ``None`` when the checkpoint holds
    every iteration (the driver died after the last one, before the outcome was written:
    ``finish_run`` ends it).

    Call it holding the folder's lock: what the dead driver left launched is released
    first (``local_run.release_left_behind``), so no rank of it writes a checkpoint or a
    record after this reads them. A log with records but no checkpoint is a
    ``CheckpointError``, as for a plan file: resuming would log them a second time."""
    from srifty_core.jobs.local_run import release_left_behind
    from srifty_core.worker.checkpoint import (
        CHECKPOINT_FILE,
        CheckpointError,
        checkpoint_iteration,
    )

    release_left_behind(run_dir, local_provider(provider))
    checkpoint = run_dir / CHECKPOINT_FILE
    done = checkpoint_iteration(checkpoint) or 0
    logged = read_progress(run_dir / PROGRESS_FILE) if not done else []
    if logged:
        raise CheckpointError(
            f"{run_dir / PROGRESS_FILE} records {logged[-1].iteration} iteration(s) but there "
            f"is no checkpoint at {checkpoint}: resuming this job would start over at 0 and "
            "log them again. Restore the checkpoint, or start the job over in a new run "
            "folder with --restart"
        )
    total = int(params["iterations"])
    if done >= total:
        return None
    if not done:  # nothing to resume: the job as asked, planned afresh in this folder
        return dict(params)
    last = (read_decisions(run_dir) or [{}])[-1]
    spent_s, spent_usd = float(last.get("elapsed_s", 0.0)), float(last.get("spent_usd", 0.0))
    latest = _latest_job(run_dir)
    left = Replanner.left(
        total, _limit(params.get("time_limit_s")), _limit(params.get("budget_usd")),
        Progress(done, spent_s, spent_usd),
    )  # fmt: skip
    conf = {k: v for k, v in params.items() if k != "resume"}
    conf["iterations"] = left.iterations
    # A spent limit stays just above 0: the rerun continues on the nearest miss.
    if params.get("time_limit_s") is not None:
        conf["time_limit_s"] = max(left.time_limit_s, 1e-9)
    if params.get("budget_usd") is not None:
        conf["budget_usd"] = max(left.budget_usd, 1e-9)
    conf["resume"] = {
        "checkpoint": str(checkpoint),
        "iterations_done": done,
        "time_spent_s": spent_s,
        "cost_spent_usd": spent_usd,
        "depleted": [str(d) for d in last.get("depleted", ())],
        "parent_run_id": run_dir.name,
        "job_run_id": latest.job_run_id if latest is not None else None,
        "allocations": [],
    }
    return conf


def finish_run(run_dir: Path) -> dict[str, Any]:
    """End a run whose checkpoint holds every iteration but whose driver died before it
    wrote the outcome: its ``outcome.json`` from its latest configuration and the monitor's
    last look (``orchestrate.finish``); returns the outcome."""
    latest = _latest_job(run_dir)
    if latest is None:
        raise JobRunError(f"{run_dir}: its checkpoint holds every iteration, but no job file")
    last = (orc.read_decisions(run_dir) or [{}])[-1]
    job_path = run_dir / f"job-{latest.config_id}.json"
    return orc.finish(job_path, {**last, "status": FINISHED}, track=False)


def _latest_job(run_dir: Path) -> JobPlan | None:
    """The run folder's latest configuration (``job-c<k>.json``, the largest ``k``)."""
    found = run_store.names(run_dir, "job-c*.json")
    return JobPlan.load(run_dir / max(found, key=_config_number)) if found else None


def _limit(v: Any) -> float:
    return float("inf") if v is None else float(v)


def _new_key() -> str:
    return f"shell__{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


def _run_job(
    params: Mapping[str, Any],
    key: str,
    provider: Provider | None,
    poll_s: float,
    on_poll: Callable[[PollResult], None] | None,
    timeout_s: float,
    track: bool,
) -> JobRun:
    conf = dict(params)
    asked = JobSpec.from_params(conf, shell=True).provider
    if provider is None and provider_class(asked).simulated:  # lives in this process
        provider = make_provider(conf)
    deadline = time.monotonic() + timeout_s
    tracker = job_log.ShellTracker() if track else None
    sink = tracker.log_plan if tracker is not None else None
    clock = provider.now if provider is not None else _now
    began = clock()
    launched: list[str] = []
    done: list[Configuration] = []
    finished: JobPlan | None = None
    recorded = False  # the outcome is in MLflow already (continue_or_finish's finish)
    for n in range(MAX_CONFIGURATIONS):
        spec = JobSpec.from_params(conf, shell=True)
        try:
            job_path = orc.plan_job(spec, key if n == 0 else f"{key}.r{n}", track=track,
                                    log_plan=sink)  # fmt: skip
        except Exception:
            if orc.handed_over(spec):  # nothing will provision: give the parent's back
                orc.release(orc.handed_over(spec), provider)
            raise
        job = JobPlan.load(job_path)
        alloc = orc.provision(job_path, provider, keep=orc.handed_over(spec))
        launched += alloc
        _record_allocations(job, provider, alloc)  # a rerun releases them if we die
        kept: list[str] = []
        try:
            started = orc.start_training(job_path, alloc, provider, tie=True)  # ends with us
            monitor = Monitor(job_path, alloc, spec, started, provider=provider)
            try:
                result = watch(
                    monitor.step, poll_s=poll_s, on_poll=on_poll,
                    wait=provider.wait if provider is not None else time.sleep,
                    timeout_s=max(deadline - time.monotonic(), 0.0),
                )  # fmt: skip
            except MonitorTimeout:
                raise JobRunError(f"the job did not finish within {timeout_s:.0f} s") from None
            train = job.train
            done.append(
                Configuration(
                    str(job_path), job.config_id, train.local_batches,
                    tuple(f"{x.count} x {x.instance_type} ({x.market})" for x in job.launches),
                    result.status, result.reason,
                )
            )  # fmt: skip
            if result.status == FINISHED:
                orc.finish(job_path, result.to_dict(), track=False)  # outcome.json
                if tracker is not None:
                    tracker.configuration_end(job, result.to_dict(), "finished")
                finished = job
                break  # released below (finally), then the totals
            child = orc.continue_or_finish(
                conf, job_path, alloc, result.to_dict(), key, provider=provider
            )
            if child is None:  # the last iteration came before the workers were stopped
                finished, recorded = job, True
                break
            kept = list(child.get("resume", {}).get("allocations", []))
            conf = child
        except BaseException as exc:
            if not isinstance(exc, SriftyError | KeyboardInterrupt):
                orc.job_failed(job_path, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            orc.release(alloc, provider, job_path, except_ids=kept)
            _record_allocations(job, provider, kept)
    else:
        raise JobRunError(f"the job re-planned {MAX_CONFIGURATIONS} times without finishing")
    # Everything is released: the whole job's wall time and bill complete its outcome.
    assert finished is not None
    out = outcome.read(finished.facts.run_dir)
    if out is None:
        raise JobRunError(f"the job finished but left no {outcome.OUTCOME_FILE} in its run folder")
    wall_s = (clock() - began).total_seconds()
    if not provider_class(finished.provider).billed:
        out = outcome.with_totals(out, wall_s)
    else:
        out = outcome.with_totals(out, wall_s, *outcome.bill(provider, launched))
    out.save()
    if tracker is not None and finished.job_run_id:
        if recorded:  # add the totals
            tracker.attempt("record the totals", job_log.log_totals, finished, out)
        else:
            tracker.outcome(finished, out)
    return JobRun(tuple(done), out.to_dict())


def _record_allocations(job: JobPlan, provider: Provider | None, ids: list[str]) -> None:
    """Keep the local allocations the job holds in its run folder (``local_run.
    RUN_ALLOCATIONS``; none: the file goes): a rerun that takes the folder over releases
    what a dead driver left (``resume_conf``), even where no guard did."""
    from srifty_core.jobs.local_run import RUN_ALLOCATIONS, record_allocations

    run_dir = run_store.local_path(job.facts.run_dir)
    # the allocations are processes of this host, which a rerun finds and releases
    if not provider_class(job.provider).shares_host or run_dir is None:
        return
    if ids:
        record_allocations(run_dir, local_provider(provider), ids)
    else:
        (run_dir / RUN_ALLOCATIONS).unlink(missing_ok=True)


def _now() -> datetime:
    return datetime.now(UTC)


def read_job_file(path: Path) -> dict[str, Any]:
    """A job file (YAML or JSON: the plan-and-train DAG's conf), read as requests are."""
    return dict(read_request_file(path))
