"""Does a training plan fit the machine ``srifty train PLAN.json`` runs it on?

A plan written by ``srifty plan --write-plan`` is made for the VMs of its ``extra.launches``
(one rank per GPU); ``srifty train`` runs its ranks as processes on this machine. Before
any starts, ``plan_problems`` compares the plan with this machine (``Host``):

* the instance types it was made for: GPU VMs, while here its ranks would run on the CPU
  (fewer GPUs than ranks, or the plan says ``device: cpu``);
* ranks against cores: CPU ranks times their threads over ``MAX_THREADS_PER_CORE`` per
  core;
* memory: CPU ranks' estimated memory (``rank_memory``, from the model's compute profile:
  the store's CPU profile, else the shipped reference profile of the full network) over
  what the machine has available now.

``check_plan_fits`` raises one ``PlanDoesNotFit`` line naming them all; ``srifty train
--force`` runs the plan anyway. No torch: CUDA devices are counted from the driver's
files.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from srifty_core.catalog import Catalog
from srifty_core.cloud.local import LOCAL_CPU
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.host_allocator import available_bytes
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.profiling.store import (
    ProfileStore,
    load_reference_profile,
    reference_profile_paths,
)

MAX_THREADS_PER_CORE = 2
"""CPU ranks times their threads beyond this many per core are refused (they would
contend for the cores so hard that steps crawl, and a gloo collective may time out)."""
PROCESS_BYTES = 300 * 2**20
"""What a rank's interpreter takes before its model: Python with torch imported (about
280 MB measured on Linux)."""
GIB = 2**30


class PlanDoesNotFit(ConfigError):
    """The plan was made for other machines than this one (the message says how)."""

    def __init__(self, path: Path | str, problems: Sequence[str]) -> None:
        self.path = str(path)
        self.problems = tuple(problems)
        super().__init__(
            f"{path}: {'; '.join(problems)}. Run it where it was planned (srifty train "
            "--job), change the plan, or pass --force to run it here anyway"
        )


@dataclass(frozen=True, slots=True)
class Host:
    """This machine as far as a plan's ranks are concerned."""

    cores: int
    """Cores this process may run on."""
    memory_available_bytes: int | None
    """``MemAvailable`` now (``None``: unknown)."""
    gpus: int
    """CUDA devices visible (``CUDA_VISIBLE_DEVICES`` honoured)."""

    @classmethod
    def here(cls) -> Host:
        return cls(_cores(), available_bytes(), _gpus())


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _gpus(driver: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    try:
        physical = sum(1 for _ in driver.iterdir())
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical
    ids = [v for v in visible.split(",") if v.strip()]
    if not ids or ids[0].strip().startswith("-"):
        return 0
    return min(len(ids), physical)


@dataclass(frozen=True, slots=True)
class MadeFor:
    """One of the launches a plan was made for (``extra.launches``)."""

    instance_type: str
    count: int
    gpus_per_vm: int

    def describe(self) -> str:
        gpus = f", {self.count * self.gpus_per_vm} GPU(s)" if self.gpus_per_vm else ""
        return f"{self.count} x {self.instance_type}{gpus}"


def made_for(plan: TrainPlan) -> list[MadeFor]:
    """The cloud VMs ``plan`` was made for (its ``extra.launches``, as ``srifty plan
    --write-plan`` writes them); empty for a plan made by hand or for ``local.cpu``."""
    launches = plan.extra.get("launches")
    if not isinstance(launches, Sequence) or isinstance(launches, (str, bytes)):
        return []
    out: list[MadeFor] = []
    catalog: Catalog | None = None
    for x in launches:
        if not isinstance(x, Mapping):
            continue
        name, count = x.get("instance_type"), x.get("count", 1)
        if not isinstance(name, str) or name == LOCAL_CPU:
            continue
        count = count if isinstance(count, int) and not isinstance(count, bool) else 1
        catalog = catalog or Catalog.load()
        gpus = next((t.gpus_per_vm for t in catalog.types if t.name == name), 0)
        out.append(MadeFor(name, count, gpus))  # a type the catalog lacks: GPUs unknown
    return out


@dataclass(frozen=True, slots=True)
class RankMemory:
    """A CPU rank's memory estimate: ``PROCESS_BYTES`` plus the profile's training memory
    at its local batch (weights, gradients, optimizer state, activations) plus DDP's
    gradient buckets (one more copy of the gradients)."""

    fixed_bytes: float
    per_sample_bytes: float
    source: str

    def at(self, batch: int) -> float:
        return self.fixed_bytes + self.per_sample_bytes * batch


def rank_memory(plan: TrainPlan) -> RankMemory | None:
    """The memory one rank of ``plan`` takes on the CPU, from the model's compute profile
    (the store's CPU profile of the plan's model, size and settings, else the shipped
    reference profile of the full network); ``None`` when there is none."""
    store = ProfileStore()
    try:
        profile = store.load(plan.model, plan.size, "cpu", plan.settings)
        source = str(store.path(plan.model, plan.size, "cpu", plan.settings))
    except (SriftyError, OSError, ValueError, KeyError, TypeError):
        if plan.size != "full" or not plan.settings.is_default:
            return None
        try:
            profile, _ = load_reference_profile(plan.model)
        except (SriftyError, OSError, ValueError, KeyError, TypeError):
            return None
        source = str(reference_profile_paths(plan.model)[0])
    fixed = PROCESS_BYTES + profile.memory_fixed_bytes + profile.gradient_bytes
    return RankMemory(fixed, profile.memory_per_sample_bytes, source)


def runs_on_gpus(plan: TrainPlan, host: Host) -> bool:
    """Whether the plan's ranks would run on GPUs here (``placement.choose_device``: every
    rank of this host needs its own)."""
    return plan.device != "cpu" and host.gpus >= plan.world_size


def plan_problems(plan: TrainPlan, host: Host, memory: RankMemory | None = None) -> list[str]:
    """What does not fit: one phrase per problem (empty: the plan fits)."""
    problems: list[str] = []
    on_gpus = runs_on_gpus(plan, host)
    gpu_vms = [m for m in made_for(plan) if m.gpus_per_vm > 0]
    n = plan.world_size
    if gpu_vms and not on_gpus:
        here = f"{host.gpus} GPU(s)" if host.gpus else "no GPU"
        problems.append(
            f"it was made for GPU VMs ({', '.join(m.describe() for m in gpu_vms)}) and this "
            f"machine has {here}: its {n} ranks would run on the CPU"
        )
    if on_gpus:
        return problems
    threads = n * plan.threads
    if threads > MAX_THREADS_PER_CORE * host.cores:
        problems.append(
            f"{n} CPU ranks x {plan.threads} thread(s) on {host.cores} core(s) (at most "
            f"{MAX_THREADS_PER_CORE * host.cores} here)"
        )
    if memory is not None and host.memory_available_bytes is not None:
        need = sum(memory.at(b) for b in plan.local_batches)
        if need > host.memory_available_bytes:
            typical = statistics.median(plan.local_batches)
            one = memory.at(int(typical)) / GIB
            problems.append(
                f"about {need / GIB:.1f} GiB of memory for its ranks ({one:.1f} GiB a rank "
                f"at batch {typical:g}, from {memory.source}), "
                f"{host.memory_available_bytes / GIB:.1f} GiB available"
            )
    return problems


def check_plan_fits(plan: TrainPlan, path: Path | str, host: Host | None = None) -> None:
    """Raise ``PlanDoesNotFit`` (one line) when ``plan`` does not fit this machine."""
    host = host or Host.here()
    memory = None if runs_on_gpus(plan, host) else rank_memory(plan)
    problems = plan_problems(plan, host, memory)
    if problems:
        raise PlanDoesNotFit(path, problems)
