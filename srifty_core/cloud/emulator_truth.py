"""Ground truth of the emulated EC2: how its network and GPUs behave. ONE module, on purpose.

The emulated provider (``cloud.emulated``) draws every measurement from the functions here.
The learned side (``srifty_core.predictors``, ``simulator``, ``planner``) must never
import it: it would learn the answer instead of the cloud (``tests/cloud/test_emulated.py``).

Contract: network: ``NetSpec.of(type)``, ``allreduce_time`` and ``cluster_allreduce_time``
(noise-free seconds; a ring of several types runs at its slowest link),
``draw_allocation_level``, ``sample_noise``; compute: ``device_rate``, ``compute_scale``,
``draw_spatial``, ``draw_temporal``, ``step_costs``; a job's iterations:
``training_iterations(_detail)``. Every draw comes from the caller's ``rng`` (seeded, the
same numbers). Imports ``errors``; the catalog's types and ``ComputeProfile`` for
annotations only.

How and why (each assumption, its calibration, its figures): docs/design/emulator.md#emulator_truth
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from srifty_core.errors import ConfigError

if TYPE_CHECKING:
    from srifty_core.catalog.types import InstanceType
    from srifty_core.profiling.profile import ComputeProfile

KB = 1024
MB = 1024**2

# --------------------------------------------------------------------------- network


@dataclass(frozen=True, slots=True)
class Protocol:
    name: str
    upto_bytes: float
    """Largest buffer this protocol carries."""
    latency_factor: float
    bandwidth_fraction: float


PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("LL", 64 * KB, 1.0, 0.5),
    Protocol("LL128", 4 * MB, 1.25, 0.9),
    Protocol("Simple", math.inf, 2.0, 1.0),
)
TREE_MAX_BYTES = 4 * MB
"""Buffers below this use a tree across VMs when the job spans 4 VMs or more."""
TREE_BW_FRACTION = 0.6


@dataclass(frozen=True, slots=True)
class FamilyNet:
    """Inter-VM network of one instance family (see the module docstring for the fit)."""

    latency_s: float
    """L0: small-message allreduce latency between two VMs."""
    efficiency: float
    """Asymptotic busbw across VMs / rated NIC bandwidth."""
    per_gpu_cap_Bps: float = math.inf
    """Ceiling one GPU's traffic reaches over the NIC (bytes/s)."""
    ramp: float = 1.0
    """Half-bandwidth size in bandwidth-delay products (see ``ramp_fraction``)."""
    basis: str = "extrapolated"


FAMILY_NET: dict[str, FamilyNet] = {
    "p3dn": FamilyNet(52e-6, 0.44, 2.6e9, 1.0, "fitted: eks-efa-examples 2x1, 2x8, 8x8"),
    "p4d": FamilyNet(140e-6, 0.87, ramp=3.0, basis="fitted: aws-efa-eks 2x8 (NCCL 2.8.3, 2.9.9)"),
    "p4de": FamilyNet(140e-6, 0.87, ramp=3.0, basis="p4d's fit (same network)"),
    "p5": FamilyNet(40e-6, 1.15, ramp=1.0, basis="fitted: terraform-aws-eks-blueprints p5 2x8"),
    "g5": FamilyNet(60e-6, 0.85, basis="bandwidth fitted: g5.8xlarge 2x1; latency extrapolated"),
    "g4dn": FamilyNet(60e-6, 0.75),
    "g6": FamilyNet(60e-6, 0.75),
    "p3": FamilyNet(75e-6, 0.75),
    "g3": FamilyNet(75e-6, 0.75),
    "g3s": FamilyNet(75e-6, 0.75),
}
DEFAULT_FAMILY_NET = FamilyNet(75e-6, 0.75)
NVLINK_EFFICIENCY = 0.45
PCIE_BUSBW_Bps = {3: 6e9, 4: 12e9, 5: 24e9}
INTRA_BASE_S = 8e-6
HOP_NVLINK_S = 1e-6
HOP_PCIE_S = 2.5e-6


@dataclass(frozen=True, slots=True)
class NetSpec:
    """What the network model needs to know about an instance type."""

    family: str
    gpus_per_vm: int
    network_gbps: float
    """Baseline (sustained) NIC bandwidth, as AWS rates it."""
    nvlink_bw_gbs: float | None
    pcie_gen: int
    burst_gbps: float | None = None
    """AWS's "up to" rate for types that burst on network I/O credits, else None."""
    vcpus: int = 0

    @classmethod
    def of(cls, t: InstanceType) -> NetSpec:
        gpu = t.gpu
        nvlink = gpu.nvlink_bw_gbs if gpu is not None and gpu.nvlink else None
        return cls(
            family=t.family,
            gpus_per_vm=max(1, t.gpus_per_vm),
            network_gbps=t.network_gbps,
            nvlink_bw_gbs=nvlink,
            pcie_gen=_pcie_gen(gpu.host_interface if gpu is not None else ""),
            burst_gbps=t.network_burst_gbps,
            vcpus=int(t.vcpus),
        )

    def nic_gbps(self, bursting: bool) -> float:
        """The NIC's rate: the burst rate while the VM has credits, else the baseline."""
        if bursting and self.burst_gbps:
            return max(self.burst_gbps, self.network_gbps)
        return self.network_gbps

    def burst_credit_s(self) -> float:
        """Seconds a fresh VM can send at its burst rate before falling to the baseline
        (0 for types that do not burst): ``BURST_MINUTES`` scaled by size."""
        if not self.burst_gbps or self.burst_gbps <= self.network_gbps:
            return 0.0
        lo, hi = BURST_MINUTES
        return 60.0 * min(hi, max(lo, lo * max(1, self.vcpus) / 4))


def _pcie_gen(text: str) -> int:
    m = re.search(r"(?:Gen\s*|PCIe\s*)(\d)(?:\.0)?", text, re.IGNORECASE)
    gen = int(m.group(1)) if m else 3
    return gen if gen in PCIE_BUSBW_Bps else 3


BURST_MINUTES = (5.0, 60.0)
"""AWS: instances rated "up to" a bandwidth "can use a network I/O credit mechanism to burst
beyond their baseline bandwidth ... for a limited time, typically from 5 to 60 minutes,
depending on the instance size" (EC2 user guide, "Amazon EC2 instance network bandwidth").
Here: 5 minutes for a 4-vCPU VM, growing with vCPUs, at most 60. Credits are not refilled
while a job keeps the NIC busy."""


def family_net(family: str) -> FamilyNet:
    return FAMILY_NET.get(family, DEFAULT_FAMILY_NET)


def intra_bw_Bps(spec: NetSpec) -> float:
    if spec.nvlink_bw_gbs:
        return NVLINK_EFFICIENCY * spec.nvlink_bw_gbs * 1e9
    return PCIE_BUSBW_Bps[spec.pcie_gen]


@dataclass(frozen=True, slots=True)
class RingMember:
    """The VMs of one instance type in an allreduce: ``vms`` VMs with ``ranks_per_vm``
    ranks each, their allocation's network level and whether their NICs are bursting."""

    spec: NetSpec
    vms: int
    ranks_per_vm: int
    level_small: float = 1.0
    level_large: float = 1.0
    bursting: bool = False


def allreduce_time(
    spec: NetSpec,
    size_bytes: NDArray[np.float64] | float,
    world_size: int,
    *,
    concurrent: int = 1,
    level_small: float = 1.0,
    level_large: float = 1.0,
    ranks_per_vm: int | None = None,
    bursting: bool = False,
) -> NDArray[np.float64]:
    """Noise-free time (s) until ``concurrent`` allreduces of ``size_bytes`` each, started
    together on ``world_size`` ranks of one instance type, have all ended. Levels > 1 mean a
    faster allocation. ``ranks_per_vm`` defaults to one rank per GPU (a published table may
    use fewer); ``bursting``: the NICs still have burst credits."""
    n = int(world_size)
    if n < 2:
        raise ConfigError(f"world_size: an allreduce needs at least 2 ranks, got {n}")
    g = ranks_per_vm or spec.gpus_per_vm
    member = RingMember(spec, math.ceil(n / g), min(n, g), level_small, level_large, bursting)
    return cluster_allreduce_time([member], size_bytes, concurrent=concurrent, world_size=n)


def cluster_allreduce_time(
    members: Sequence[RingMember],
    size_bytes: NDArray[np.float64] | float,
    *,
    concurrent: int = 1,
    world_size: int | None = None,
) -> NDArray[np.float64]:
    """Noise-free allreduce time (s) over VMs of one or several instance types.

    Ranks of a VM sit next to each other in NCCL's ring, so the ring crosses every VM's NIC
    once in each direction and every step waits for its slowest link: the data term runs at
    the slowest member's inter-VM bandwidth (its NIC at the baseline or burst rate, its
    intra-VM links, its per-GPU ceiling), the latency term grows with the number of VMs in
    the whole ring at the slowest member's per-hop latency. One member is a homogeneous
    cluster (``allreduce_time``)."""
    s = np.atleast_1d(np.asarray(size_bytes, dtype=np.float64))
    if not members:
        raise ConfigError("an allreduce needs at least one group of VMs")
    n = int(world_size or sum(m.vms * m.ranks_per_vm for m in members))
    if n < 2:
        raise ConfigError(f"world_size: an allreduce needs at least 2 ranks, got {n}")
    k = sum(m.vms for m in members)
    hop = max(HOP_NVLINK_S if m.spec.nvlink_bw_gbs else HOP_PCIE_S for m in members)
    if k == 1:
        m = members[0]
        b_intra = intra_bw_Bps(m.spec)
        lat_ring = lat_tree = INTRA_BASE_S + 2 * (n - 1) * hop
        bw = np.full_like(s, b_intra) * blend_level(s, m.level_small, m.level_large)
        tree = np.zeros_like(s, dtype=bool)
        half = b_intra * lat_ring
        ramp_k = 1.0
    else:
        fams = [family_net(m.spec.family) for m in members]
        links = []
        b_nets = []
        for m, fam in zip(members, fams, strict=True):
            nic = m.spec.nic_gbps(m.bursting) * 1e9 / 8
            b_net = min(
                intra_bw_Bps(m.spec), fam.efficiency * nic, m.ranks_per_vm * fam.per_gpu_cap_Bps
            )
            b_nets.append(b_net)
            links.append(b_net * blend_level(s, m.level_small, m.level_large))
        bw = np.min(np.stack(links), axis=0)
        latency_s = max(f.latency_s for f in fams)
        intra = 2 * (n - k) * hop
        lat_ring = latency_s * (k - 1) + intra
        lat_tree = latency_s * math.log2(k) + intra
        tree = (s < TREE_MAX_BYTES) & (k >= 4)
        bw = np.where(tree, TREE_BW_FRACTION * bw, bw)
        b_slow = min(b_nets)
        ramp_k = max(f.ramp for f in fams)
        half = ramp_k * b_slow * (latency_s + intra)
    lat = np.where(tree, lat_tree, lat_ring)
    lat_f = np.empty_like(s)
    bw_f = np.empty_like(s)
    lower = 0.0
    for p in PROTOCOLS:
        msk = (s > lower) & (s <= p.upto_bytes) if lower else s <= p.upto_bytes
        lat_f[msk] = p.latency_factor
        bw_f[msk] = p.bandwidth_fraction
        lower = p.upto_bytes
    c = int(concurrent)
    share = min(1.10, 1.0 + 0.05 * (c - 1))  # aggregate gain from more channels
    level_small = min(m.level_small for m in members)
    latency = lat * lat_f * (1.0 + 0.15 * (c - 1)) / level_small
    ramp = np.where(s > PROTOCOLS[0].upto_bytes, ramp_fraction(c * s, half), 1.0)
    data = c * 2.0 * (n - 1) / n * s / (bw * bw_f * ramp * share)
    out: NDArray[np.float64] = latency + data
    return out


RAMP_EXPONENT = 0.8


def ramp_fraction(size_bytes: NDArray[np.float64], half_bytes: float) -> NDArray[np.float64]:
    """Share of the asymptotic bandwidth a transfer of ``size_bytes`` reaches: ``x / (1 + x)``
    with ``x = (size / half) ** 0.8``. The half-bandwidth size is ``ramp`` bandwidth-delay
    products (bandwidth x latency floor): a fast NIC needs larger buffers to fill its
    pipeline (nccl-tests: about 130 KB on p3dn 2x1, 1 MB on p3dn 2x8, 20 MB on p4d 2x8)."""
    x = np.power(np.maximum(size_bytes, 1.0) / half_bytes, RAMP_EXPONENT)
    out: NDArray[np.float64] = x / (1.0 + x)
    return out


SMALL_REF_BYTES = 1 * KB
LARGE_REF_BYTES = 256 * MB


def blend_level(
    size_bytes: NDArray[np.float64], level_small: float, level_large: float
) -> NDArray[np.float64]:
    """The allocation's bandwidth level at each size: the small level up to 1 KB, the large
    one from 256 MB, geometric interpolation in log(size) between."""
    w = np.clip(
        np.log(np.maximum(size_bytes, 1.0) / SMALL_REF_BYTES)
        / math.log(LARGE_REF_BYTES / SMALL_REF_BYTES),
        0.0,
        1.0,
    )
    out: NDArray[np.float64] = np.exp((1 - w) * math.log(level_small) + w * math.log(level_large))
    return out


@dataclass(frozen=True, slots=True)
class NetworkLevel:
    """One allocation's draw: multipliers on bandwidth (large) and on 1/latency (small)."""

    small: float
    large: float


SPREAD_LARGE = 1.8
SPREAD_SMALL = 1.5
PLACEMENT_NARROWING = 0.4
PLACEMENT_GAIN = 1.05


def draw_allocation_level(
    rng: np.random.Generator,
    *,
    placement_group: bool = False,
    spread_small: float = SPREAD_SMALL,
    spread_large: float = SPREAD_LARGE,
) -> NetworkLevel:
    """Levels whose max/min across allocations is at most the spread (truncated normal in
    log space, sd a third of the half-range, correlation 0.5 between small and large)."""
    z1, z2 = rng.standard_normal(2)
    z_large = z1
    z_small = 0.5 * z1 + math.sqrt(0.75) * z2
    out = []
    for z, spread in ((z_small, spread_small), (z_large, spread_large)):
        if placement_group:
            spread = spread**PLACEMENT_NARROWING
        half = math.log(spread) / 2
        x = float(np.clip(z / 3.0, -1.0, 1.0)) * half
        out.append(math.exp(x) * (PLACEMENT_GAIN if placement_group else 1.0))
    return NetworkLevel(small=out[0], large=out[1])


SAMPLE_CV_SMALL = 0.10
SAMPLE_CV_LARGE = 0.04
OUTLIER_P = 0.01


def sample_noise(rng: np.random.Generator, size_bytes: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per-sample multiplicative factor on time (>= 0.5): log-normal, wider on small
    buffers, with rare slow outliers."""
    w = np.clip(
        np.log(np.maximum(size_bytes, 1.0) / SMALL_REF_BYTES)
        / math.log(LARGE_REF_BYTES / SMALL_REF_BYTES),
        0.0,
        1.0,
    )
    cv = SAMPLE_CV_SMALL + (SAMPLE_CV_LARGE - SAMPLE_CV_SMALL) * w
    f = np.exp(cv * rng.standard_normal(size_bytes.shape))
    outlier = rng.random(size_bytes.shape) < OUTLIER_P
    f = np.where(outlier, f * rng.uniform(1.3, 2.0, size_bytes.shape), f)
    out: NDArray[np.float64] = np.maximum(f, 0.5)
    return out


# --------------------------------------------------------------------------- compute


@dataclass(frozen=True, slots=True)
class DeviceRate:
    """What the compute scaling uses about a device."""

    fp32_tflops: float
    memory_bw_gbs: float


CPU_REFERENCE = DeviceRate(fp32_tflops=0.1, memory_bw_gbs=20.0)
SPATIAL_SD = 0.025
TEMPORAL_SD_MIN = 0.015
VARIANCE_CLIP = 0.1 / 2.1
"""Truncation: (1 + c) / (1 - c) = 1.1, the largest ratio METHOD.md reports."""


def device_rate(t: InstanceType) -> DeviceRate:
    if t.gpu is None or t.gpu.memory_bw_gbs is None:
        raise ConfigError(f"{t.name}: the catalog has no GPU spec (FP32, memory bandwidth)")
    return DeviceRate(t.gpu.fp32_tflops, t.gpu.memory_bw_gbs)


def compute_scale(reference: DeviceRate, target: DeviceRate) -> float:
    """Factor on latency moving from ``reference`` to ``target``."""
    return math.sqrt(
        (reference.fp32_tflops / target.fp32_tflops)
        * (reference.memory_bw_gbs / target.memory_bw_gbs)
    )


def draw_spatial(rng: np.random.Generator, count: int) -> NDArray[np.float64]:
    """Per-VM factors on compute time (normal, truncated)."""
    z = np.clip(SPATIAL_SD * rng.standard_normal(count), -VARIANCE_CLIP, VARIANCE_CLIP)
    out: NDArray[np.float64] = 1.0 + z
    return out


STRAGGLER_P = 0.002
"""Chance that one VM's pass is a straggler in an iteration (a noisy neighbour, a page
fault storm, a GC pause): an assumption, rare enough that a profile's few repeats seldom
see one, common enough that a 64-VM job meets one every few iterations."""
STRAGGLER_SLOWDOWN = (1.2, 1.6)


def draw_temporal(
    rng: np.random.Generator, shape: tuple[int, ...], cv: float
) -> NDArray[np.float64]:
    """Per-step factors on compute time: a right-skewed body (log-normal with the given
    spread, truncated as METHOD.md's histograms are) and rare stragglers."""
    sd = max(float(cv), TEMPORAL_SD_MIN)
    z = np.clip(sd * rng.standard_normal(shape), -VARIANCE_CLIP, VARIANCE_CLIP)
    body = np.exp(z - 0.5 * sd * sd)
    slow = rng.random(shape) < STRAGGLER_P
    out: NDArray[np.float64] = np.where(
        slow, body * rng.uniform(*STRAGGLER_SLOWDOWN, size=shape), body
    )
    return out


OPTIMIZER_BYTES_PER_PARAM = 24
"""SGD with momentum in fp32 reads the gradient, the momentum buffer and the parameter and
writes the buffer and the parameter back: 6 accesses of 4 bytes per parameter."""
COPY_EFFICIENCY = 0.8
"""Share of a GPU's datasheet memory bandwidth DDP's gradient copy reaches: 2.0 TB/s of
gradient bytes (4.0 TB/s read + written) on an H200 (4.8 TB/s), VGG-16, measured by
``benchmarks/gpu_check.sh`` (``benchmarks/results/gpu_check.json``)."""
STEP_EFFICIENCY = 0.54
STEP_LAUNCH_S = 4.4e-6
"""The optimizer step = ``STEP_LAUNCH_S`` per parameter tensor + its bytes at
``STEP_EFFICIENCY`` of the memory bandwidth: fitted to the H200 steps of ResNet-50 (161
tensors, 0.95 ms), VGG-16 (32, 1.43 ms) and checked on BERT (202, 1.91 predicted vs 1.93
measured), ``benchmarks/results/gpu_check.json``. Small tensors make it launch-bound."""
KERNEL_LAUNCH_S = 20e-6


def step_costs(profile: ComputeProfile, rate: DeviceRate) -> tuple[float, float]:
    """(one pass of DDP over the gradients, the optimizer step), seconds, on a device of
    ``rate``: the bytes they move at the memory bandwidth (and, for the step, a launch per
    parameter tensor), as measured on an H200."""
    bw = rate.memory_bw_gbs * 1e9
    grad = float(profile.gradient_bytes)
    copy = 2 * grad / (COPY_EFFICIENCY * bw) + KERNEL_LAUNCH_S
    tensors = sum(b.n_params for b in profile.buckets) or 1
    step = (
        OPTIMIZER_BYTES_PER_PARAM * profile.n_parameters / (STEP_EFFICIENCY * bw)
        + STEP_LAUNCH_S * tensors
    )
    return copy, step


def profile_pass_times(
    profile: ComputeProfile, batch: int, scale: float
) -> tuple[float, float, float, float]:
    """(t_fw, t_bw, cv_fw, cv_bw) of ``profile`` at ``batch`` on a device ``scale`` times
    slower than the profiled one. Uses the fitted pieces directly (``B_max`` is a property
    of the profiled device; memory is checked by the caller)."""
    b = np.asarray([float(batch)])
    t_fw = float(profile.fw_fit(b)[0]) * scale
    t_bw = float(profile.bw_fit(b)[0]) * scale
    cv_fw = float(np.interp(math.log2(batch), np.log2(profile.fw.batch_sizes), profile.fw.cv))
    cv_bw = float(np.interp(math.log2(batch), np.log2(profile.bw.batch_sizes), profile.bw.cv))
    if not (t_fw > 0 and t_bw > 0):
        raise ConfigError(f"{profile.model}: fitted latency at batch {batch} is not positive")
    return t_fw, t_bw, cv_fw, cv_bw


@dataclass(frozen=True, slots=True)
class VmGroup:
    """The VMs of one instance type in a training job."""

    spec: NetSpec
    count: int
    batch_per_gpu: int
    t_fw: float
    t_bw: float
    cv_fw: float
    cv_bw: float
    level: NetworkLevel
    spatial: NDArray[np.float64]
    """Per-VM factor, length ``count``."""
    copy_s: float = 0.0
    """One pass of DDP over the gradients on this GPU."""
    step_s: float = 0.0
    """The optimizer step on this GPU."""
    credit_s: float = 0.0
    """Seconds of burst left on these VMs' NICs."""


def _member(gr: VmGroup, bursting: bool) -> RingMember:
    return RingMember(
        gr.spec, gr.count, gr.spec.gpus_per_vm, gr.level.small, gr.level.large, bursting
    )


def slowed(group: VmGroup, factor: float) -> VmGroup:
    """``group`` with every GPU step ``factor`` times slower (forward, backward, DDP's
    copies, the optimizer step): a slowdown its compute profile never saw (a throttled or
    degraded batch of GPUs), injected by ``EmulatedProvider(hidden_slowdown=...)``."""
    if not factor > 0:
        raise ConfigError(f"hidden slowdown: must be > 0, got {factor}")
    return dataclasses.replace(
        group,
        t_fw=group.t_fw * factor,
        t_bw=group.t_bw * factor,
        copy_s=group.copy_s * factor,
        step_s=group.step_s * factor,
    )


@dataclass(frozen=True, slots=True)
class IterationDetail:
    """What ``training_iterations_detail`` measured, per iteration (seconds)."""

    iteration_s: NDArray[np.float64]
    compute_s: NDArray[np.float64]
    """Slowest forward + backward with DDP's copies and the optimizer step."""
    exposed_s: NDArray[np.float64]
    """Communication not hidden behind the backward pass."""
    pass_s: NDArray[np.float64]
    """Iterations x VMs (groups in order, VMs of a group together): each VM's own forward
    + backward pass, without DDP's copies (what each rank times of itself)."""
    exchange_s: NDArray[np.float64]
    """Time the allreduce stream was busy (the sum of the buckets' transfers)."""


def training_iterations(
    groups: Sequence[VmGroup],
    bucket_sizes: Sequence[int],
    bucket_ready: Sequence[float],
    iterations: int,
    rng: np.random.Generator,
    *,
    warm_s: float = 0.0,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Per iteration: (iteration time, slowest forward+backward with DDP's copies and the
    optimizer step, exposed communication), seconds (``training_iterations_detail``)."""
    d = training_iterations_detail(
        groups, bucket_sizes, bucket_ready, iterations, rng, warm_s=warm_s
    )
    return d.iteration_s, d.compute_s, d.exposed_s


def training_iterations_detail(
    groups: Sequence[VmGroup],
    bucket_sizes: Sequence[int],
    bucket_ready: Sequence[float],
    iterations: int,
    rng: np.random.Generator,
    *,
    warm_s: float = 0.0,
) -> IterationDetail:
    """Per iteration: iteration time, slowest forward+backward with DDP's copies and the
    optimizer step, exposed communication, and the per-rank breakdown (each VM's forward
    + backward; the allreduce stream's busy time), seconds. Buckets are given in the order
    DDP reduces them, one at a time on one stream, over a ring of every VM of the job
    (``cluster_allreduce_time``). NICs burst while their credits last; ``warm_s`` seconds
    of the same training ran before the first iteration counted (a job hours in has spent
    its credits)."""
    if iterations < 1:
        raise ConfigError(f"iterations: must be >= 1, got {iterations}")
    world = sum(gr.count * gr.spec.gpus_per_vm for gr in groups)
    sizes = np.asarray(bucket_sizes, dtype=np.float64)
    ready = np.asarray(bucket_ready, dtype=np.float64)
    comm = world >= 2 and sizes.size > 0
    credit = [gr.credit_s for gr in groups]
    ar_cache: dict[tuple[bool, ...], NDArray[np.float64]] = {}

    def ar_times() -> NDArray[np.float64]:
        state = tuple(c > 0 for c in credit)
        hit = ar_cache.get(state)
        if hit is None:
            members = [_member(gr, b) for gr, b in zip(groups, state, strict=True)]
            hit = cluster_allreduce_time(members, sizes) if comm else np.zeros(sizes.size)
            ar_cache[state] = hit
        return hit

    copy = max(gr.copy_s for gr in groups) if world >= 2 else 0.0
    after = copy + max(gr.step_s for gr in groups)
    t_compute = max(gr.t_fw + gr.t_bw for gr in groups) + copy
    left = float(warm_s)
    while left > 0 and comm and any(c > 0 for c in credit):  # fast-forward the warm-up
        busy = float(ar_times().sum())
        t_it = max(t_compute, busy) + after
        bursting = [i for i, c in enumerate(credit) if c > 0]
        n_out = min(credit[i] for i in bursting) / busy
        n = min(n_out, left / t_it)
        if n <= 0.0:  # what is left of the warm-up rounds to no time at all (underflow)
            break
        for i in bursting:
            credit[i] -= n * busy
        left -= n * t_it
        credit = [c if c > 1e-9 else 0.0 for c in credit]

    iters = np.empty(iterations)
    compute = np.empty(iterations)
    vms = sum(gr.count for gr in groups)
    passes = np.empty((iterations, vms))
    exchange = np.zeros(iterations)
    for it in range(iterations):
        fw_end = []
        bw_len = []
        for gr in groups:
            fw = gr.t_fw * gr.spatial * draw_temporal(rng, (gr.count,), gr.cv_fw)
            bw = gr.t_bw * gr.spatial * draw_temporal(rng, (gr.count,), gr.cv_bw)
            fw_end.append(fw)
            bw_len.append(bw + copy)  # into the buckets (divided), on the compute stream
        fw_all = np.concatenate(fw_end)
        bw_all = np.concatenate(bw_len)
        passes[it] = fw_all + bw_all - copy
        done = float(np.max(fw_all + bw_all))
        compute[it] = done + after
        end = 0.0
        if comm:
            ar = ar_times()
            noise = sample_noise(rng, sizes)
            busy = 0.0
            for j in range(sizes.size):
                start = float(np.max(fw_all + ready[j] * bw_all))
                took = float(ar[j] * noise[j])
                end = max(start, end) + took
                busy += took
            credit = [max(0.0, c - busy) if c > 0 else 0.0 for c in credit]
            exchange[it] = busy
        iters[it] = max(done, end) + after
    return IterationDetail(iters, compute, iters - compute, passes, exchange)


def gpu_memory_bytes(t: InstanceType) -> float:
    """Memory of one GPU of ``t`` (0 when the catalog does not say)."""
    return float(t.gpu_memory_gib) * 1024**3


def max_batch_in_memory(profile: ComputeProfile, t: InstanceType, limit: int) -> int:
    """The largest per-GPU batch (at most ``limit``) whose training footprint, the profile's
    ``memory_fixed_bytes + memory_per_sample_bytes x B``, fits one GPU of ``t``: the same
    test ``group_for`` applies. The footprint is the profiled network's, whatever the
    device (same model, same precision; framework workspaces are not modelled). 0 when even
    one sample does not fit."""
    cap = gpu_memory_bytes(t)
    if cap <= 0:
        return limit
    room = cap - profile.memory_fixed_bytes
    if room < profile.memory_per_sample_bytes:
        return 0
    if profile.memory_per_sample_bytes <= 0:
        return limit
    return int(min(limit, math.floor(room / profile.memory_per_sample_bytes)))


def group_for(
    t: InstanceType,
    count: int,
    batch_per_vm: int,
    profile: ComputeProfile,
    reference: DeviceRate,
    level: NetworkLevel,
    rng: np.random.Generator,
    credit_s: float | None = None,
) -> VmGroup:
    """Build the VM group of one type: scaled pass times, memory check, spatial draws, the
    per-step costs and the NICs' burst credits (``credit_s``; default a fresh VM's)."""
    g = max(1, t.gpus_per_vm)
    if batch_per_vm < g or batch_per_vm % g:
        raise ConfigError(
            f"batches[{t.name}]: {batch_per_vm} samples per VM do not split evenly over its "
            f"{g} GPU(s)"
        )
    per_gpu = batch_per_vm // g
    mem = float(profile.memory_bytes(per_gpu))
    cap = gpu_memory_bytes(t)
    if cap > 0 and mem > cap:
        raise ConfigError(
            f"batches[{t.name}]: {per_gpu} samples per GPU need {mem / 1024**3:.1f} GiB, over "
            f"the {t.gpu_memory_gib:g} GiB of one {t.gpu_model}"
        )
    rate = device_rate(t)
    scale = compute_scale(reference, rate)
    t_fw, t_bw, cv_fw, cv_bw = profile_pass_times(profile, per_gpu, scale)
    copy_s, step_s = step_costs(profile, rate)
    spec = NetSpec.of(t)
    return VmGroup(
        spec=spec,
        count=count,
        batch_per_gpu=per_gpu,
        t_fw=t_fw,
        t_bw=t_bw,
        cv_fw=cv_fw,
        cv_bw=cv_bw,
        level=level,
        spatial=draw_spatial(rng, count),
        copy_s=copy_s,
        step_s=step_s,
        credit_s=spec.burst_credit_s() if credit_s is None else credit_s,
    )


def reference_rate(profile: ComputeProfile, gpu_rates: Mapping[str, DeviceRate]) -> DeviceRate:
    """The device the profile was measured on: a catalog GPU, else ``CPU_REFERENCE``."""
    return gpu_rates.get(profile.device_type, CPU_REFERENCE)
