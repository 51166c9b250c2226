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
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from srifty_core.cloud.base import Provider
from srifty_core.errors import SriftyError
from srifty_core.runtime.job import FINISHED, JobPlan, JobSpec
from srifty_core.runtime.monitor_loop import MonitorTimeout, watch
from srifty_core.runtime.monitor_step import Monitor, PollResult

MAX_CONFIGURATIONS = 20
"""Re-plans one job may make before ``run_job`` gives up (a job that keeps losing VMs)."""


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
) -> JobRun:
    """Run the job ``params`` (the DAG's conf, ``planner.schema.ShellJobConf``: provider
    ``ec2-emulated`` too) to its end. ``timeout_s``: of wall time; ``poll_s``: of the
    provider's time between two looks of the monitor; ``track``: record it in MLflow
    (``job_log.ShellTracker``: a tracking store that fails never fails the job). Its
    outcome, with the wall time and the bill once everything is released, goes to the run
    folder's ``outcome.json`` (``runtime.outcome``).

    The job's run folder is its own from creation and held while it runs
    (``claim_run_folder``): a second job never trains in it."""
    key, held = claim_run_folder(params, run_key)
    with held:
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
    from srifty_core.runtime import planning, run_store
    from srifty_core.runtime.local_run import run_folder_lock

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
    from srifty_core.runtime import job_log, outcome
    from srifty_core.runtime import orchestrate as orc

    conf = dict(params)
    if provider is None and JobSpec.from_params(conf, shell=True).provider == "ec2-emulated":
        from srifty_core.runtime.emulated_job import make_provider

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
    else:
        raise JobRunError(f"the job re-planned {MAX_CONFIGURATIONS} times without finishing")
    # Everything is released: the whole job's wall time and bill complete its outcome.
    assert finished is not None
    out = outcome.read(finished.facts.run_dir)
    if out is None:
        raise JobRunError(f"the job finished but left no {outcome.OUTCOME_FILE} in its run folder")
    wall_s = (clock() - began).total_seconds()
    if finished.provider == "local":
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


def _now() -> datetime:
    return datetime.now(UTC)


def read_job_file(path: Path) -> dict[str, Any]:
    """A job file (YAML or JSON: the plan-and-train DAG's conf), read as requests are."""
    from srifty_core.planner.job import read_request_file

    return dict(read_request_file(path))
