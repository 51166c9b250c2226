"""Provisioning a run of the job: the provider, launching (or keeping) its allocations,
starting the workers, and giving everything back.

Providers: ``local`` (worker processes on this machine; one allocation per worker, so a
worker taken back leaves its peers' allocations whole and keepable) and ``ec2`` (the
catalog's types through the Airflow AWS connection; the workers start from the VMs' user
data, so a stopped EC2 worker cannot be restarted and nothing is handed over) and
``ec2-emulated`` (the emulated EC2, which lives in one process: ``srifty train --job``
passes it in; its workers are ``jobs.emulated_job``'s).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from srifty_core.catalog.types import Market
from srifty_core.cloud import get_provider, provider_class
from srifty_core.cloud.base import Allocation, LaunchRequest, Provider, Workers, release_all
from srifty_core.cloud.local import LocalProvider
from srifty_core.errors import ConfigError
from srifty_core.jobs import emulated_job
from srifty_core.jobs.artifact import worker_wheel
from srifty_core.jobs.job import JobPlan, JobSpec
from srifty_core.jobs.outcome import rank_logs
from srifty_core.jobs.replanner import Key, Replanner, launch_all
from srifty_core.lifetime import caller_env
from srifty_core.worker.launch import launch_argv
from srifty_core.worker.rendezvous import TrainingStart

_log = logging.getLogger(__name__)


def make_provider(
    job: JobPlan, *, worker: Sequence[str] | None = None, training: bool = False
) -> Provider:
    """The job's provider (``cloud.get_provider``); ``training``: VMs that start the job's
    workers themselves at launch (``Provider.starts_workers_at_launch``: EC2's user data,
    torchrun over the configuration's VMs, ``rendezvous``). Such VMs install
    ``artifact.worker_wheel()``: the deployment's wheel, else the wheel of this source,
    built and uploaded to the run storage once."""
    cls = provider_class(job.provider)
    if cls.simulated:
        raise ConfigError(
            "provider: the emulated EC2 lives in the process that runs the job; run it with "
            "`srifty train --job JOB.yaml --provider ec2-emulated` (not as the DAG's tasks)"
        )
    if not cls.starts_workers_at_launch:
        return get_provider(job.provider)

    plan = TrainingStart.for_plan(job.train_plan, job.config_id) if training else None
    wheel = None
    if training or worker:
        # What the VMs install (after the plan checked out): the deployment's wheel, else
        # this source's, uploaded to the run storage with its sha256 (artifact.worker_wheel).

        wheel = worker_wheel()
    return get_provider(
        job.provider, ec2=job.ec2, region=job.region, worker=worker, wheel=wheel, training=plan
    )


def worker_command(job: JobPlan) -> list[str]:
    """Every rank's command: the launcher, which runs the plan's entrypoint (your script)
    or the built-in worker (``worker.launch``)."""
    return launch_argv(job.train_plan)


def _split(provider: Provider, requests: Sequence[LaunchRequest]) -> list[LaunchRequest]:
    """One allocation per worker where the provider wants it (``one_allocation_per_worker``:
    local, see the module's doc); else as asked."""
    if not provider.one_allocation_per_worker:
        return list(requests)
    return [
        LaunchRequest(r.instance_type, count=1, market=r.market, zone=r.zone)
        for r in requests
        for _ in range(r.count)
    ]


def provision(
    job_path: Path | str, provider: Provider | None = None, *, keep: Sequence[str] = ()
) -> list[str]:
    """Launch the plan's VMs; returns the allocation ids in the plan's rank order.

    ``keep``: allocations handed over by the run that re-planned; the ``Replanner`` keeps
    those this configuration wants, releases the others and launches only the difference.
    On a failure, everything (handed over or launched) is released before the error goes
    up.
    """
    job = JobPlan.load(job_path)
    if provider is None:
        # On EC2 the workers start from the user data: torchrun over the configuration.
        provider = make_provider(job, training=True)
    if not keep:
        requests = _split(provider, [x.request() for x in job.launches])
        ids = [a.id for a in launch_all(provider, requests)]
        _log.info("%s: launched %s", job.config_id, ", ".join(ids))
        return ids
    try:
        current = [provider.get_allocation(a) for a in keep]
        target: dict[Key, int] = {}
        for x in job.launches:
            key = (x.instance_type, Market.parse(x.market))
            target[key] = target.get(key, 0) + x.count
        change = Replanner.change(provider, current, target)
        release_all(provider, change.release)
        new = launch_all(provider, _split(provider, change.launch))
    except BaseException:
        release_all(provider, list(keep))
        raise
    order = {x.key: k for k, x in enumerate(job.launches)}
    allocs: list[Allocation] = [*change.keep, *new]
    _log.info(
        "%s: kept %s from the run that re-planned, released %s, launched %s",
        job.config_id, _ids(change.keep), _ids(change.release), _ids(new),
    )  # fmt: skip
    allocs.sort(key=lambda a: order.get(f"{a.spec.name}/{a.market.value}", len(order)))
    return [a.id for a in allocs]


def start_training(
    job_path: Path | str,
    allocation_ids: Sequence[str],
    provider: Provider | None = None,
    *,
    tie: bool = False,
) -> float:
    """Start the workers on the allocations (``Provider.start_workers``); returns the start
    time (Unix seconds, the provider's clock: simulated on the emulator).

    Local: one process per rank, one process group over the allocations (ranks in their
    order); ``tie``: they end with this process (``lifetime.caller_env``: a caller that
    watches them itself, ``srifty train --job``; not the DAG, whose next task watches).
    EC2: the workers started from the user data at launch; this only notes the time. The
    emulated EC2: its emulated ranks start (``emulated_job.start``).
    """
    job = JobPlan.load(job_path)
    cls = type(provider) if provider is not None else provider_class(job.provider)
    if cls.starts_workers_at_launch:
        return provider.now().timestamp() if provider is not None else time.time()
    provider = provider or make_provider(job)
    if provider.name != job.provider:
        raise ConfigError(
            f"provider: a {job.provider} plan needs the {job.provider} provider, "
            f"got {provider.name}"
        )

    started = provider.now().timestamp()
    workers = Workers(
        worker_command(job),
        caller_env() if tie else None,
        rank_logs(job.facts.run_dir, job.config_id),  # in the run folder, beside its outcome
        emulate=functools.partial(emulated_job.start, job_path),
    )
    provider.start_workers([provider.get_allocation(a) for a in allocation_ids], workers)
    return started


def handed_over(spec: JobSpec) -> tuple[str, ...]:
    """Allocations a re-planning parent handed to this run."""
    return spec.resume.allocations if spec.resume else ()


def release(
    allocation_ids: Sequence[str] | str,
    provider: Provider | None = None,
    job_path: Path | str | None = None,
    *,
    except_ids: Sequence[str] = (),
) -> None:
    """Give back the allocations and stop anything still running on them (idempotent);
    ``except_ids`` were handed over to the run that continues the job."""
    given = [allocation_ids] if isinstance(allocation_ids, str) else list(allocation_ids)
    ids = [a for a in given if a not in set(except_ids)]
    kept = [a for a in given if a in set(except_ids)]
    if provider is None:
        provider = make_provider(JobPlan.load(job_path)) if job_path else LocalProvider()
    release_all(provider, ids)
    _log.info(
        "released %s%s", ", ".join(ids) or "nothing",
        f"; left running for the re-planned run: {', '.join(kept)}" if kept else "",
    )  # fmt: skip


def _ids(allocs: Sequence[Allocation]) -> str:
    return ", ".join(a.id for a in allocs) or "none"
