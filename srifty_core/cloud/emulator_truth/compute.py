"""The emulated EC2's GPUs and a training iteration on them: device rates and scaling,
spatial and temporal variance, stragglers, step costs, memory, and the iterations of a job
of several VM groups. Part of the ground truth (``cloud.emulator_truth``): the learned side
never imports it. How and why: docs/design/emulator.md#emulator_truth
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from srifty_core.errors import ConfigError

if TYPE_CHECKING:
    from srifty_core.catalog.types import InstanceType
    from srifty_core.profiling.profile import ComputeProfile
from srifty_core.cloud.emulator_truth.network import (
    NetSpec,
    NetworkLevel,
    RingMember,
    cluster_allreduce_time,
    sample_noise,
)

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
