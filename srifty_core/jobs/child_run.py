"""The run that continues a job after a re-plan: its conf, built by the parent run.

The parent stops the workers (they checkpoint), hands over the allocations whose VMs all
still run (where the provider can start new workers on them), and states what is left
through the ``Replanner``: the iterations, time and budget, the offers less what was
taken back (spot: ``depleted``; local workers: quota lowered), the checkpoint and the
parent's ids. The child plans with that conf and keeps what it still wants of the
handed-over allocations (``provisioning.provision(keep=...)``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from srifty_core.cloud.base import InstanceState, Provider
from srifty_core.jobs import job_log
from srifty_core.jobs.job import JobFinished, JobPlan, TrainingFailed, item_key
from srifty_core.jobs.provisioning import make_provider
from srifty_core.jobs.replanner import Progress, Replanner
from srifty_core.runs import store as run_store


def child_conf(
    params: Mapping[str, Any],
    job_path: Path | str,
    allocation_ids: Sequence[str],
    result: Mapping[str, Any],
    parent_run_id: str,
    *,
    provider: Provider | None = None,
) -> dict[str, Any]:
    """Stop the workers (they checkpoint) and build the conf of the run that continues the
    job; ``resume.allocations`` lists the allocations handed over (the parent's teardown
    leaves those running)."""
    from srifty_core.worker.checkpoint import CHECKPOINT_FILE, checkpoint_iteration

    job = JobPlan.load(job_path)
    provider = provider or make_provider(job)
    facts = job.facts
    allocs = [provider.get_allocation(a) for a in allocation_ids]
    for a in allocs:
        provider.stop(a)
    checkpoint = run_store.join(facts.run_dir, CHECKPOINT_FILE)
    done = checkpoint_iteration(checkpoint) or 0
    prior = params.get("resume") or {}
    prior_done = int(prior.get("iterations_done", 0))
    prior_s = float(prior.get("time_spent_s", 0.0))
    prior_usd = float(prior.get("cost_spent_usd", 0.0))
    elapsed, spent = float(result["elapsed_s"]), float(result["spent_usd"])
    # What this run did, against this run's conf (which held what was left when it began).
    this_run = Progress(done - prior_done, elapsed - prior_s, spent - prior_usd)
    left = Replanner.left(
        int(params["iterations"]),
        _limit(params.get("time_limit_s")),
        _limit(params.get("budget_usd")),
        this_run,
    )
    if left.iterations < 1:
        raise JobFinished(
            f"the job finished its {params['iterations']} iterations before the re-plan "
            "stopped it; nothing to continue"
        )
    lost = dict(result.get("lost") or {})
    offers = []
    for o in params["offers"]:
        o = dict(o)
        o["quota"] = max(int(o.get("quota", 0)) - int(lost.get(item_key(o), 0)), 0)
        offers.append(o)
    if all(o["quota"] == 0 for o in offers):
        raise TrainingFailed("every instance was taken back; nothing is left to resume on")
    conf = {k: v for k, v in params.items() if k != "resume"}
    conf["iterations"] = left.iterations
    conf["offers"] = offers
    # A spent limit stays just above 0: the child continues on the nearest miss.
    if params.get("time_limit_s") is not None:
        conf["time_limit_s"] = max(left.time_limit_s, 1e-9)
    if params.get("budget_usd") is not None:
        conf["budget_usd"] = max(left.budget_usd, 1e-9)
    keep = [
        a.id for a in allocs
        if provider.reruns_workers
        and all(i.state is InstanceState.RUNNING for i in provider.describe(a))
    ]  # fmt: skip
    conf["resume"] = {
        "checkpoint": str(checkpoint),
        "iterations_done": done,
        "time_spent_s": elapsed,
        "cost_spent_usd": spent,
        "depleted": list(result.get("depleted", ())),
        "parent_run_id": parent_run_id,
        "job_run_id": job.job_run_id,
        "allocations": keep,
    }
    job_log.log_configuration_end(job, result, outcome="replan")
    # Beside the checkpoint too, so the follow-up can be started by hand if need be.
    aside = run_store.join(facts.run_dir, f"replan-after-{job.config_id}.json")
    run_store.write_text(aside, json.dumps(conf, indent=2))
    return conf


def _limit(v: Any) -> float:
    return float("inf") if v is None else float(v)
