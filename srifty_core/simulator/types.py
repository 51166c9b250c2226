"""The simulator's contract: what it is asked (a workload and a cluster configuration) and
what it answers (an ``IterationEstimate``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from srifty_core.errors import ConfigError
from srifty_core.profiling.profile import ComputeProfile


@dataclass(frozen=True, slots=True)
class SimInstance:
    """An instance type as the simulator sees it.

    ``device_type`` picks the compute profile (``cpu``, ``T4``, ``V100``...); each VM runs
    ``ranks_per_vm`` workers (one per GPU), and its local batch is split evenly over them.
    ``features`` are the probe-record features the bandwidth predictor needs for this type
    (provider, cloud, region, zone, instance_type, gpu_model, gpus_per_vm, vcpus,
    network_gbps, placement_group, backend); world size, buffer size and concurrency are
    filled in per query. ``shares_host``: every rank of every such VM shares this one host's
    cores (``Provider.shares_host``, set by whoever builds the offers): the simulator then
    divides the host among them. ``gpu_memory_bytes``: one GPU's memory as the catalog
    lists it (0: unknown; the profile's ``memory_cap_bytes`` then stands for it).
    """

    name: str
    device_type: str
    ranks_per_vm: int
    features: Mapping[str, Any] = field(default_factory=dict)
    shares_host: bool = False
    gpu_memory_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.ranks_per_vm < 1:
            raise ConfigError(f"ranks_per_vm of {self.name}: must be >= 1")
        object.__setattr__(self, "features", MappingProxyType(dict(self.features)))

    def __hash__(self) -> int:
        return hash((self.name, self.device_type, self.ranks_per_vm))

    @classmethod
    def from_catalog(
        cls,
        t: Any,
        *,
        provider: str = "ec2",
        zone: str = "",
        placement_group: bool = False,
        backend: str = "nccl",
        shares_host: bool = False,
    ) -> SimInstance:
        """From a catalog ``InstanceType``."""
        return cls(
            name=t.name,
            device_type=t.device_type,
            ranks_per_vm=max(1, int(t.gpus_per_vm)),
            shares_host=shares_host,
            gpu_memory_bytes=float(getattr(t, "gpu_memory_gib", 0.0) or 0.0) * 2**30,
            features={
                "provider": provider,
                "cloud": "aws",
                "region": t.region,
                "zone": zone,
                "instance_type": t.name,
                "gpu_model": t.gpu_model,
                "gpus_per_vm": int(t.gpus_per_vm),
                "vcpus": int(t.vcpus),
                "network_gbps": float(t.network_gbps),
                "placement_group": placement_group,
                "backend": backend,
            },
        )

    @classmethod
    def local_cpu(cls, vcpus: int | None = None, ranks_per_vm: int = 1) -> SimInstance:
        """The local provider's pseudo-type: worker processes on this machine over gloo,
        sharing its cores (``shares_host``).

        ``vcpus`` defaults to this machine's CPU count, as the local probes record it."""
        if vcpus is None:
            vcpus = os.cpu_count() or 1
        return cls(
            name="local.cpu",
            device_type="cpu",
            ranks_per_vm=ranks_per_vm,
            shares_host=True,
            features={
                "provider": "local",
                "cloud": "local",
                "region": "local",
                "zone": "local",
                "instance_type": "local.cpu",
                "gpu_model": "cpu",
                "gpus_per_vm": 0,
                "vcpus": vcpus,
                "network_gbps": None,
                "placement_group": False,
                "backend": "gloo",
            },
        )


@dataclass(frozen=True, slots=True)
class Group:
    """``count`` VMs of one type, each with local batch ``batch`` (split over its ranks)."""

    instance: SimInstance
    count: int
    batch: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ConfigError(f"count of {self.instance.name}: must be >= 1, got {self.count}")
        if self.batch < self.instance.ranks_per_vm or self.batch % self.instance.ranks_per_vm:
            raise ConfigError(
                f"batch of {self.instance.name}: {self.batch} does not split over its "
                f"{self.instance.ranks_per_vm} GPU(s)"
            )

    @property
    def batch_per_rank(self) -> int:
        return self.batch // self.instance.ranks_per_vm

    @property
    def ranks(self) -> int:
        return self.count * self.instance.ranks_per_vm


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A configuration: counts and local batch per instance type (heterogeneous allowed).

    The planner gives every VM of a type the same batch; the simulator also accepts one
    type in several groups with different batches (unequal local batches on equal VMs).
    """

    groups: tuple[Group, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("a configuration needs at least one group of VMs")

    @property
    def world_size(self) -> int:
        return sum(g.ranks for g in self.groups)

    @property
    def global_batch(self) -> int:
        return sum(g.count * g.batch for g in self.groups)

    @property
    def vms(self) -> int:
        return sum(g.count for g in self.groups)

    def label(self) -> str:
        """``2xp3.8xlarge@512+8xg3.8xlarge@64`` (the method's notation)."""
        return "+".join(f"{g.count}x{g.instance.name}@{g.batch}" for g in self.groups)


@dataclass(frozen=True)
class Workload:
    """A model's compute profiles by device type (``ComputeProfile.device_type``).

    ``vm_evidence`` is what other profiles taken on the same cloud say about how much one
    VM's speed differs from the next (``{label: (vm_cv, VMs profiled)}``, from
    ``ProfileStore.vm_spreads``): pooled with these profiles' own ``vm_cv``, it narrows the
    predictive spread that three VMs of one profile alone would leave wide
    (``predictors.network.pooled_spreads``). Empty: these profiles alone.

    ``unit_parameters``: the trainable parameters of each unit FSDP shards as one, the
    root's own first (``sharding.units``; from the model's census): what the sharded
    strategies' memory and iteration are made of. Empty: not known (the whole model is
    then one unit)."""

    model: str
    profiles: Mapping[str, ComputeProfile]
    vm_evidence: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    unit_parameters: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "profiles", MappingProxyType(dict(self.profiles)))
        units = tuple(self.unit_parameters)
        if any(not isinstance(n, int) or n < 0 for n in units):
            raise ConfigError("unit_parameters: whole numbers >= 0, the root's own first")
        object.__setattr__(self, "unit_parameters", units)
        object.__setattr__(self, "vm_evidence", MappingProxyType(dict(self.vm_evidence)))
        if not self.profiles:
            raise ConfigError(f"workload {self.model}: no compute profile")
        for label, (sd, vms) in self.vm_evidence.items():
            if not (sd >= 0 and vms >= 0):
                raise ConfigError(
                    f"vm_evidence[{label!r}]: needs a spread >= 0 and a VM count >= 0, "
                    f"got ({sd}, {vms})"
                )

    def vm_spreads(self) -> dict[str, float]:
        """Per device type, the predictive spread of a VM's speed: the profiles' ``vm_cv``
        pooled with ``vm_evidence`` (``predictors.network.pooled_spreads``), less the
        evidence that is these profiles themselves (``ComputeProfile.store_key``: a store
        lists this model's profiles too, and a profile counted twice would count double)."""
        from srifty_core.predictors.network import pooled_spreads

        own = {d: (p.vm_cv, p.profiled_vms) for d, p in self.profiles.items()}
        mine = {p.store_key for p in self.profiles.values()}
        others = {k: v for k, v in self.vm_evidence.items() if k not in mine}
        return pooled_spreads(own, others)

    def __hash__(self) -> int:
        return hash((self.model, tuple(sorted(self.profiles))))

    def profile(self, device_type: str) -> ComputeProfile:
        p = self.profiles.get(device_type)
        if p is None:
            raise ConfigError(
                f"no compute profile of {self.model} for device {device_type!r} "
                f"(have: {', '.join(sorted(self.profiles))}); profile it first"
            )
        return p


P90_Z = -1.2815515655446004
"""The standard-normal quantile of 0.1: a network level this low or lower on 10% of
allocations."""


@dataclass(frozen=True, slots=True)
class IterationEstimate:
    """One training iteration of a configuration, as the simulator predicts it.

    ``t_iter`` is the mean over sampled iterations of ``t_fw,i + max(t_bw,i, t_pe)`` (plus
    DDP's copy out of its buckets and the optimizer step where profiled); ``t_fw``/``t_bw``
    are the means of the slowest VM's passes; ``exposed_comm`` is the part of the gradient
    exchange not hidden behind the backward pass. ``p50``/``p90``/``p95`` are quantiles of
    single iterations (jitter, stragglers) on a typical allocation.

    ``t_iter_p90`` is the 90th percentile of the *mean* iteration of a long job over the
    allocations it may land on: the exchange at the network level that 10% of probed
    allocations fell below (``net_sigma``, the spread of allocation levels the bandwidth
    model learned). Jitter averages out over a job; the allocation does not. Limits are
    checked against ``t_iter_quantile(q)``.

    ``missing`` names per-step terms the profiles did not measure (``optimizer_step``,
    ``ddp_copy``): the estimate leaves them out and is that much too fast.

    ``extrapolated`` names the instance types whose bus bandwidth here came from outside
    what the probes covered (a type never probed: the physics prior alone; or a VM count
    or ranks per VM beyond the probed ones); their spread, and so ``t_iter_p90``, is the
    wider one of the prior's errors on held-out types.
    """

    t_iter: float
    t_fw: float
    t_bw: float
    t_pe: float
    exposed_comm: float
    p50: float
    p95: float
    global_batch: int
    world_size: int
    bottleneck: str
    """``compute`` or ``communication``: which side sets the tail of the iteration."""
    p90: float | None = None
    t_iter_p90: float | None = None
    net_sigma: float = 0.0
    missing: tuple[str, ...] = ()
    extrapolated: tuple[str, ...] = ()
    estimated: tuple[str, ...] = ()
    """``DEVICE: how`` per device whose compute profile is an estimate nobody measured
    (``ComputeProfile.estimate``): ``t_iter_p90`` carries its spread."""
    unfit: str = ""
    """Why the configuration's ranks do not hold their local batches under the strategy
    planned (``planner.fit.short``); "" when they do. The planner counts it a broken limit."""
    micro_batches: int = 1
    """Gradient accumulation: micro-batches per rank per step (``simulator.accumulation``);
    1: none."""
    sync_each_micro_batch: bool = False
    """With micro-batches under fsdp/hsdp: every micro-batch reduce-scatters its gradients
    into the sharded ones (a rank holds no unsharded gradient between micro-batches);
    False: the exchange waits for the last (``simulator.accumulation``)."""

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.global_batch / self.t_iter

    def t_iter_quantile(self, q: float) -> float:
        """The ``q`` quantile of a long job's mean iteration time over allocations: ``t_iter``
        at the median (0.5), ``t_iter_p90`` at 0.9, and linear in the normal quantile of
        ``q`` between and beyond (the network level is log-normal across allocations).
        Never below ``t_iter`` for ``q >= 0.5``."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {q}")
        if self.t_iter_p90 is None or q == 0.5:
            return self.t_iter
        from scipy.special import ndtri

        z = float(ndtri(q))
        out = self.t_iter + (self.t_iter_p90 - self.t_iter) * z / -P90_Z
        return max(out, self.t_iter) if q >= 0.5 else min(out, self.t_iter)
