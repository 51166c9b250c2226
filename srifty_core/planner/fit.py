"""What fits: the largest local batch per (GPU, strategy, world size, ranks per VM) of a
planning request's model, from what planning already has.

Contract: ``model_memory(workload, device_type)`` is the ``sharding.memory.ModelMemory``
of the workload's model on that device (its FSDP units from ``Workload.unit_parameters``,
activations from the device's profile); ``b_max(workload, instance, strategy, world)`` the
largest local batch a rank of ``instance`` holds in a configuration of ``world`` ranks:
``ddp`` the profile's own ``b_max`` (measured, or the census' estimate) as before; the
sharded strategies from ``sharding.memory``'s per-rank model with the measured transient
above it (``PEAK_MARGIN``), anchored on the profile's B_max, or, where the profile holds
no sample, in the GPU's memory as the catalog lists it (``SimInstance.gpu_memory_bytes``;
else the profile's ``memory_cap_bytes``); never above a limit of the profile's that is not
memory (its step time or search ceiling). ``short``
says in one phrase why a configuration's ranks do not hold their batch ("" when they do).
Derivation: docs/design/sharding.md, "Planning".
"""

from __future__ import annotations

from collections.abc import Callable

from srifty_core.profiling.profile import ComputeProfile
from srifty_core.sharding.memory import (
    Layout,
    ModelMemory,
    Strategy,
    measured_model,
    rank_memory,
)
from srifty_core.sharding.memory import b_max as memory_b_max
from srifty_core.simulator.types import ClusterConfig, SimInstance, Workload

GIB = float(2**30)
PEAK_MARGIN: dict[str, float] = {"ddp": 0.12, "fsdp": 0.43, "hsdp": 0.43}
"""How far a step's peak rose above ``sharding.memory``'s per-rank model where it was
measured (``benchmarks/sharded_memory.py``: hf:gpt2, AdamW, two gloo ranks on a CPU; ddp
10-12%, fsdp 25-43%: transients the model does not hold): the worst of each. ddp's anchors
the profile's B_max; a sharded strategy's is the fallback where the profile did not measure
its own (``ComputeProfile.fsdp_peak_margin``, ``peak_margin``; on an H200 the model was 13-17%
above FSDP2's measured bf16 peaks: GPU check run 3)."""


def peak_margin(profile: ComputeProfile, strategy: Strategy) -> float:
    """The transient added to a rank's modelled peak under ``strategy``: for a sharded
    strategy the profile's measured ``fsdp_peak_margin`` (at least 0: a model above the
    measured peak is kept as it is), else ``PEAK_MARGIN``'s (profiles before the
    measurement, estimates from specs)."""
    if strategy != "ddp" and profile.fsdp_peak_margin is not None:
        return max(0.0, profile.fsdp_peak_margin)
    return PEAK_MARGIN[strategy]


def units_of(workload: Workload, device_type: str) -> tuple[int, ...]:
    """The workload's FSDP units; where unknown, the whole model as one unit beside an
    empty root (the conservative reading: it is gathered whole)."""
    if workload.unit_parameters:
        return workload.unit_parameters
    return (0, workload.profile(device_type).n_parameters)


def model_memory(workload: Workload, device_type: str) -> ModelMemory:
    """The model's memory on ``device_type``: activations per sample from its profile, the
    fixed part its profile measured beyond the training state (parameters, gradients and
    optimizer states of one ddp rank alone, as the profile held them)."""
    p = workload.profile(device_type)
    return measured_model(
        units_of(workload, device_type), p.memory_per_sample_bytes, p.memory_fixed_bytes, p.settings
    )


def capacity_bytes(workload: Workload, instance: SimInstance) -> float:
    """One rank's memory: the catalog's GPU memory, else the profile's cap."""
    if instance.gpu_memory_bytes > 0:
        return instance.gpu_memory_bytes
    return float(workload.profile(instance.device_type).memory_cap_bytes)


def b_max(
    workload: Workload,
    instance: SimInstance,
    strategy: Strategy,
    world: int,
    *,
    accumulating: bool = False,
) -> int:
    """The largest local batch of a rank of ``instance`` under ``strategy`` in a
    configuration of ``world`` ranks (module doc); 0 where not even the state fits.
    ``accumulating``: the largest micro-batch while gradients accumulate (a sharded rank
    then holds the whole model's unsharded gradients: ``sharding.memory.rank_memory``).

    ``ddp``: the profile's. A sharded strategy where the profile holds a sample: the
    batch whose sharded peak, with its measured transient (``PEAK_MARGIN``), fills what one
    replica's peak at the profile's B_max filled, so the measurement stays the anchor.
    Where the profile holds none (the model fits no such GPU alone): ``sharding.memory``'s
    ``b_max`` in the GPU's memory less the transient."""
    p = workload.profile(instance.device_type)
    if strategy == "ddp":
        return p.b_max
    rpv = instance.ranks_per_vm
    if strategy == "hsdp" and rpv == 1:
        return 0  # one shard per VM: hsdp would be ddp with more to exchange
    memory = model_memory(workload, instance.device_type)
    layout = Layout(strategy, max(world, rpv), rpv)
    margin = 1.0 + peak_margin(p, strategy)
    if p.b_max >= 1:
        per_sample = memory.activation_bytes_per_sample
        if per_sample <= 0:
            return p.b_max
        # the measured B_max filled the GPU with one replica's peak (the model's, and ddp's
        # transient above it); the sharded peak, with its own transient, fills as much
        alone = rank_memory(memory, p.settings, Layout("ddp", 1), p.b_max).total
        filled = alone * (1.0 + PEAK_MARGIN["ddp"]) / margin
        sharded = rank_memory(memory, p.settings, layout, 0, accumulating=accumulating).total
        fits = max(0, int((filled - sharded) // per_sample))
    else:
        capacity = capacity_bytes(workload, instance)
        if capacity <= 0:
            return 0  # no memory known: nothing to shard into
        fits = memory_b_max(
            memory, p.settings, layout, capacity / margin, accumulating=accumulating
        )
    if not p.b_max_limit.startswith("memory") and p.b_max >= 1:  # a limit sharding keeps
        fits = min(fits, p.b_max)
    return fits


UNEQUAL_VMS = "hsdp shards inside each VM: every VM needs as many GPUs"
"""``short``'s answer for an hsdp configuration whose VMs hold different numbers of GPUs
(no sharded model of it: callers compare with this)."""


def short(
    workload: Workload,
    config: ClusterConfig,
    strategy: Strategy,
    b_max_of: Callable[[SimInstance, int], int] | None = None,
) -> str:
    """Why the ranks of ``config`` do not hold their local batches under ``strategy``
    ("" when they do); ``b_max_of(instance, world)``: ``b_max`` of ``workload`` and
    ``strategy`` (memoised by a caller that asks often)."""
    if strategy == "hsdp" and len({g.instance.ranks_per_vm for g in config.groups}) > 1:
        return UNEQUAL_VMS
    world = config.world_size
    for g in config.groups:
        if b_max_of is None:
            most = b_max(workload, g.instance, strategy, world)
        else:
            most = b_max_of(g.instance, world)
        if g.batch_per_rank > most:
            return (
                f"{g.instance.name} holds {most} samples per GPU under {strategy} over "
                f"{world} ranks, {g.batch_per_rank} asked"
            )
    return ""


def state_gib(workload: Workload, device_type: str) -> float:
    """GiB of one ddp replica's training state and fixed activations (what one GPU must
    hold before its first sample)."""
    p = workload.profile(device_type)
    m = model_memory(workload, device_type)
    return rank_memory(m, p.settings, Layout("ddp", 1), 0).total / GIB
