"""The emulated EC2's network: NCCL's protocols and algorithms over each family's links, a
ring of several types at its slowest link, allocation levels and per-sample noise.
Part of the ground truth (``cloud.emulator_truth``): the learned side never imports it.
How and why: docs/design/emulator.md#emulator_truth
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from srifty_core.errors import ConfigError

if TYPE_CHECKING:
    from srifty_core.catalog.types import InstanceType

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
    ring_only: bool = False,
) -> NDArray[np.float64]:
    """Noise-free time (s) until ``concurrent`` allreduces of ``size_bytes`` each, started
    together on ``world_size`` ranks of one instance type, have all ended. Levels > 1 mean a
    faster allocation. ``ranks_per_vm`` defaults to one rank per GPU (a published table may
    use fewer); ``bursting``: the NICs still have burst credits; ``ring_only``: never the
    tree (``collective_time``)."""
    n = int(world_size)
    if n < 2:
        raise ConfigError(f"world_size: an allreduce needs at least 2 ranks, got {n}")
    g = ranks_per_vm or spec.gpus_per_vm
    member = RingMember(spec, math.ceil(n / g), min(n, g), level_small, level_large, bursting)
    return cluster_allreduce_time(
        [member], size_bytes, concurrent=concurrent, world_size=n, ring_only=ring_only
    )


def collective_time(
    collective: str,
    spec: NetSpec,
    size_bytes: NDArray[np.float64] | float,
    world_size: int,
    **kw: float | int | bool | None,
) -> NDArray[np.float64]:
    """Noise-free time (s) of ``concurrent`` all_reduce, all_gather or reduce_scatter
    collectives of ``size_bytes`` in all (nccl-tests' sizes: an all-gather's output, a
    reduce-scatter's input), with ``allreduce_time``'s keywords.

    The relations are the published ones, not fitted (the five public all_gather_perf tables
    of an EC2 type check them: docs/design/emulator.md; no reduce_scatter_perf one): nccl-tests'
    PERFORMANCE.md derives a ring all-gather or reduce-scatter as ``n - 1`` steps moving
    ``(n-1)/n`` of the buffer per rank, and an allreduce as a reduce-scatter followed by an
    all-gather (``2(n - 1)`` steps, ``2(n-1)/n``), which is why their bus bandwidths share
    one scale; and NCCL's tree algorithm is allreduce-only (its NCCL_ALGO documentation), so
    these two always run as rings. Hence: half the ring allreduce of the same buffer, its
    latency and data terms alike, its bus bandwidth the ring allreduce's."""
    if collective == "all_reduce":
        return allreduce_time(spec, size_bytes, world_size, **kw)  # type: ignore[arg-type]
    if collective not in ("all_gather", "reduce_scatter"):
        raise ConfigError(
            f"collective: must be one of all_reduce, all_gather, reduce_scatter, got {collective!r}"
        )
    ring = allreduce_time(spec, size_bytes, world_size, ring_only=True, **kw)  # type: ignore[arg-type]
    out: NDArray[np.float64] = 0.5 * ring
    return out


def cluster_allreduce_time(
    members: Sequence[RingMember],
    size_bytes: NDArray[np.float64] | float,
    *,
    concurrent: int = 1,
    world_size: int | None = None,
    ring_only: bool = False,
) -> NDArray[np.float64]:
    """Noise-free allreduce time (s) over VMs of one or several instance types (``ring_only``:
    never the tree NCCL takes for small buffers across 4 VMs or more).

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
        tree = (s < TREE_MAX_BYTES) & (k >= 4) & (not ring_only)
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
