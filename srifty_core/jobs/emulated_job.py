"""A job on the emulated EC2 from the shell (``srifty train --job JOB.yaml --provider
ec2-emulated``): the DAG's steps (``job_run.run_job``) against ``EmulatedProvider``.

Planning, provisioning, the monitor, the re-plan and the release are the job's own steps;
only the workers are emulated. ``start`` is what ``provisioning.start_training`` does on
this provider: the configuration's iterations are drawn by the emulator
(``EmulatedProvider.start_training``: the ground truth's compute and exchange on these
VMs, from the model's profile on the first launch's GPU) and, as the provider's
clock passes each one, ``EmulatedRanks`` writes what the real rank 0 writes: the progress
record (iteration, time on the emulator's clock, samples, configuration id, each rank's
compute and the exchange), the state file and, every ``checkpoint_every`` iterations and
at the end, the checkpoint's summary. The checkpoint file itself is a marker (no model
trained; it is no torch checkpoint): a re-plan resumes from the iteration it names, as a
real one would. The monitor reads these files and the provider's clock (``Provider.now``,
``Provider.wait``), so a job of minutes in simulated time takes seconds.

A spot preemption: ``preemptions`` (``TYPE@SECONDS``: the first VM of TYPE is taken back
SECONDS of simulated time into its training) arm the provider's ``preempt_after``.
Light: no torch until a re-plan reads the checkpoint.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from srifty_core.cloud.base import InstanceState
from srifty_core.cloud.emulated.provider import EmulatedProvider
from srifty_core.errors import ConfigError
from srifty_core.jobs.job import JobPlan, JobSpec
from srifty_core.planner.schema.field_errors import check
from srifty_core.planner.schema.fields import Seed
from srifty_core.profiling.store import ProfileStore
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import ProgressLog, ProgressRecord, TrainState, write_state

if TYPE_CHECKING:
    from srifty_core.cloud.base import Allocation
    from srifty_core.cloud.emulated.training import TrainingStep

EMULATED_CHECKPOINT = b'{"emulated": true}\n'
"""The checkpoint file's content on the emulated EC2 (its summary holds the iteration)."""
POLL_S = 5.0
"""Simulated seconds between two looks of the monitor (the DAG's trigger steps every 5 s
after its first few)."""


def parse_preemption(text: str) -> tuple[str, float]:
    """``TYPE@SECONDS`` (``g4dn.xlarge@120``) to ``(type, seconds)``."""
    name, sep, after = text.rpartition("@")
    try:
        seconds = float(after)
    except ValueError:
        seconds = math.nan
    if not sep or not name or not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"--preempt: expected TYPE@SECONDS (e.g. g4dn.xlarge@120), got {text!r}")
    return name, seconds


def make_provider(
    conf: Mapping[str, Any], preemptions: Sequence[str] = (), *, seed: int | None = None
) -> EmulatedProvider:
    """The emulated EC2 of a job conf: its region, seeded by ``seed`` (default the conf's
    ``seed``), with the ``TYPE@SECONDS`` preemptions armed."""
    after: dict[str, float] = {}
    for text in preemptions:
        name, seconds = parse_preemption(text)
        if name in after:
            raise ConfigError(f"--preempt: {name} given twice (one preemption per type)")
        after[name] = seconds
    region = conf.get("region") or "us-east-1"
    if seed is None:  # the conf's, checked as the job's schema does (not int("abc"))
        seed = conf.get("seed", 0)
        check("seed", Seed, seed)
    s = int(seed)
    return EmulatedProvider(seed=s, region=str(region), preempt_after=after)


class EmulatedRanks:
    """What rank 0 writes, for the emulated steps of one configuration
    (``EmulatedProvider.start_training``'s ``on_step``)."""

    def __init__(self, job: JobPlan, start_iteration: int) -> None:
        plan = json.loads(run_store.read_text(job.train_plan) or "{}")
        self.facts = job.facts
        self.start = start_iteration
        self.checkpoint_every = int(plan.get("checkpoint_every", 10))
        self.ranks_per_vm = {x.instance_type: x.ranks_per_vm for x in job.launches}
        self.checkpointed = start_iteration

    def __call__(self, step: TrainingStep) -> None:
        from srifty_core.worker.checkpoint import CHECKPOINT_FILE

        f = self.facts
        it = self.start + step.index + 1
        compute = tuple(
            p for p, name in zip(step.pass_s, step.vm_types, strict=True)
            for _ in range(self.ranks_per_vm.get(name, 1))
        )  # fmt: skip
        at = step.ended_at.timestamp()
        record = ProgressRecord(
            it, at, step.iteration_s, f.global_batch, f.config_id,
            compute_s=compute, exchange_s=step.exchange_s, upkeep_s=0.0,
        )  # fmt: skip
        with ProgressLog(f.progress_path) as log:
            log.append(record)
        if it % self.checkpoint_every == 0 or it >= f.iterations:
            write_checkpoint(run_store.join(f.run_dir, CHECKPOINT_FILE), it, f.config_id)
            self.checkpointed = it
        write_state(f.state_path, TrainState(it, at, f.config_id, self.checkpointed))


def write_checkpoint(path: Any, iteration: int, config_id: str) -> None:
    """The emulated checkpoint: the marker file, then its summary (``checkpoint_iteration``
    reads the iteration from it, as from a real one's)."""
    import hashlib

    from srifty_core.worker.checkpoint import sidecar_path

    run_store.publish(path, EMULATED_CHECKPOINT)
    digest = hashlib.sha256(EMULATED_CHECKPOINT).hexdigest()
    summary = {"iteration": iteration, "config_id": config_id, "sha256": digest, "emulated": True}
    run_store.write_text(sidecar_path(path), json.dumps(summary) + "\n")


def start(job_path: Any, provider: EmulatedProvider, allocs: Sequence[Allocation]) -> None:
    """Start the configuration's emulated ranks on ``provider`` (its ``start_workers`` calls
    this: ``Workers.emulate``): from the checkpoint's iteration to the plan's, with the
    per-VM batches of its launches and the profile the planner read for the first launch's
    GPU (stored or estimated), which the emulator scales to every other GPU."""
    from srifty_core.worker.checkpoint import CHECKPOINT_FILE, checkpoint_iteration

    job = JobPlan.load(job_path)
    facts = job.facts
    done = checkpoint_iteration(run_store.join(facts.run_dir, CHECKPOINT_FILE)) or 0
    batches: dict[str, int] = {}
    for x in job.launches:
        per_vm = x.batch_per_rank * x.ranks_per_vm
        if batches.setdefault(x.instance_type, per_vm) != per_vm:
            raise ConfigError(
                f"{x.instance_type}: two local batches in a configuration "
                f"({batches[x.instance_type]} and {per_vm} per VM); the emulator takes one per type"
            )
    plan = json.loads(run_store.read_text(job.train_plan) or "{}")
    spec = JobSpec(
        model=str(plan["model"]), size=str(plan["size"]), global_batch=facts.global_batch,
        iterations=facts.iterations, offers=(),
        precision=str(plan.get("precision", "fp32")), optimizer=str(plan.get("optimizer", "sgd")),
        compile=bool(plan.get("compile", False)), channels_last=bool(plan.get("channels_last")),
        tf32=bool(plan.get("tf32")),
    )  # fmt: skip
    gpu = provider.catalog_type(job.launches[0].instance_type).device_type
    profile = ProfileStore().load_or_estimate(spec.model, spec.size, gpu, spec.settings)
    left = facts.iterations - done
    if left < 1:
        return
    provider.start_training(list(allocs), profile, batches, left, EmulatedRanks(job, done))


def summary(provider: EmulatedProvider, since: Any = None) -> str:
    """One line on what the job did on the emulator: allocations launched and still up,
    instances taken back, the simulated time since ``since`` (a datetime; default the
    first launch) and the cost billed per second."""
    allocs = provider.allocations()
    if not allocs:
        return "emulated EC2: nothing launched"
    live = (InstanceState.RUNNING, InstanceState.PENDING)
    up = [a.id for a in allocs if any(i.state in live for i in provider.describe(a))]
    taken = sum(len(provider.interruptions(a)) for a in allocs)
    start = since or min(a.created_at for a in allocs)
    simulated = (provider.now() - start).total_seconds()
    cost = sum(provider.cost(a) for a in allocs)
    state = "all released" if not up else f"STILL UP: {', '.join(up)}"
    return (
        f"emulated EC2: {len(allocs)} allocation(s) launched, {state}; {taken} instance(s) "
        f"taken back; {simulated:.0f} s of simulated time, ${cost:.2f} billed"
    )
