"""A ``ComputeProfile`` of a GPU nobody measured, from a learned ``Roofline``: from the GPU's
sheet, or scaled from a measured profile of the same model on another GPU
(``nearest_measured`` picks it); ``batch_limit`` is the B_max the census allows; and the
measured profiles' times as the roofline's observations (``profile_observations``).

Imports ``predictors.roofline``, ``predictors.compute`` and ``profiling.profile`` (at call
time); numpy, no torch. How and why: docs/design/compute.md#roofline
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from srifty_core.predictors.compute import (
    PiecewiseLinear,
    budget_batch_sizes,
    dense_batch_sizes,
    fit_piecewise,
)
from srifty_core.predictors.roofline import (
    MAX_BATCH,
    MEMORY_HEADROOM,
    DeviceSpec,
    Observation,
    Roofline,
    mode_of,
    op_times,
    pass_times,
    scale,
)
from srifty_core.profiling.profile import NO_REPLICA, ComputeProfile, GradientBucket, PassStats
from srifty_core.training_settings import OPTIMIZER_STATES

if TYPE_CHECKING:
    from srifty_core.profiling.census import OpCensus

PROFILER = "srifty profile"
"""``Observation.source`` of a measured profile's times: every profile is the same program,
the model's step under srifty's profiler."""


def profile_observations(
    profile: ComputeProfile, census: OpCensus, device: DeviceSpec
) -> list[Observation]:
    """The forward and backward means of a measured GPU profile, one per probed batch."""
    mode = mode_of(profile.settings.precision, profile.settings.tf32)
    out = []
    for what, stats in (("fw", profile.fw), ("bw", profile.bw)):
        for b, m in zip(stats.batch_sizes, stats.mean_s, strict=True):
            out.append(
                Observation(census, device, mode, int(b), float(m), what, PROFILER, device.chip)
            )
    return out


# ----------------------------------------------------------------------------- profiles
def memory_lines(
    census: OpCensus, optimizer_states: int, precision: str = "fp32"
) -> list[tuple[float, float]]:
    """What a step holds, as lines ``(fixed, per_sample)`` in the batch at ``precision``'s
    widths: the saved tensors plus the weights, their gradients and the optimizer's state,
    then each moment of the passes (``OpCensus.held_lines``) plus the weights and the state;
    the most held at batch ``B`` is the largest line there."""
    saved0, saved1 = census.saved_bytes(precision)
    state = optimizer_states * census.gradient_bytes
    lines = [(saved0 + 2 * census.gradient_bytes + state, saved1)]
    lines += [(a + census.gradient_bytes + state, b) for a, b in census.held_lines(precision)]
    return lines


def batch_limit(
    census: OpCensus,
    device: DeviceSpec,
    optimizer_states: int,
    precision: str = "fp32",
    measured_per_sample: float = 0.0,
) -> tuple[int, float, float]:
    """(B_max, fixed bytes, bytes per sample) on ``device``, at ``precision``'s widths.

    B_max is the largest batch under all of ``memory_lines`` in ``MEMORY_HEADROOM`` of the
    GPU; the line returned is the steepest, what holds at large batches (the activations a
    sharded rank keeps). Where a GPU measured the same program (``measured_per_sample``),
    every line's share a sample is scaled so the steepest has it. The saved tensors alone
    miss the transients beside them: a decoder's logits and their gradient."""
    lines = memory_lines(census, optimizer_states, precision)
    fixed, per = max(lines, key=lambda line: (line[1], line[0]))
    if measured_per_sample > 0 and per > 0:
        lines = [(a, b * measured_per_sample / per) for a, b in lines]
        per = measured_per_sample
    room = device.memory_gib * 2**30 * MEMORY_HEADROOM

    def fitting(line: tuple[float, float]) -> float:  # the batches under this line
        if line[1] > 0:
            return (room - line[0]) / line[1]
        return math.inf if line[0] <= room else -math.inf

    b_max = min(float(MAX_BATCH), *(fitting(line) for line in lines))  # -inf: none fits
    return (int(b_max) if b_max > 0 else 0), fixed, max(per, 1.0)


def estimate_profile(
    census: OpCensus,
    device: DeviceSpec,
    roofline: Roofline,
    *,
    source: ComputeProfile | None = None,
    source_device: DeviceSpec | None = None,
    relative_std: float = 0.02,
) -> ComputeProfile:
    """A ``ComputeProfile`` of ``census``'s model on ``device`` that nobody measured: from
    the specs, or scaled from ``source`` (a measured profile of the same model, size and
    settings on ``source_device``, whose measured memory a sample it keeps: the same
    program's activations). ``estimate`` says which, ``estimate_cv`` is the
    roofline's held-out spread for that path (from specs, wider for a network the evidence
    does not hold: ``Roofline.spec_cv``); ``relative_std`` the step-to-step jitter the
    passes are given (``profiling.estimate`` passes the measured GPU profiles' median,
    ``step_jitter``)."""
    settings = census.settings if source is None else source.settings
    mode = mode_of(settings.precision, settings.tf32)
    eff = roofline.efficiencies
    states = OPTIMIZER_STATES[settings.optimizer]
    # scaled: the program's activations a sample as the source GPU measured them (its
    # fused kernels, its allocator), not the eager census's count
    measured = source.memory_per_sample_bytes if source is not None else 0.0
    b_max, fixed, per_sample = batch_limit(census, device, states, settings.precision, measured)
    saved0 = census.saved_bytes(settings.precision)[0]
    span = b_max
    if b_max < 1:  # no replica fits: timed up to what a rank holds with its state sharded away
        room = device.memory_gib * 2**30 * MEMORY_HEADROOM - saved0
        # at least one sample: where even its activations do not fit, the planner's
        # sharded B_max is 0 on this GPU (``planner.fit``) and the request plans on the others
        span = max(1, min(MAX_BATCH, int(room // per_sample)))

    def times(b: int) -> tuple[float, float, float]:
        fw, bw, opt = pass_times(census, device, mode, eff, b)
        if source is None or source_device is None:
            return fw, bw, opt
        s_fw, s_bw, s_opt = pass_times(census, source_device, mode, eff, b)
        c = roofline.carry
        return (
            scale(float(source.fw_fit.at(b)), s_fw, fw, c),
            scale(float(source.bw_fit.at(b)), s_bw, bw, c),
            scale(source.optimizer_step_s, s_opt, opt, c) if source.optimizer_step_s > 0 else opt,
        )

    dense = dense_batch_sizes(span)  # the fit's points
    probes = budget_batch_sizes(span, 4) if span > 1 else [1]  # what a profile lists
    at = {b: times(b) for b in sorted({*dense, *probes})}

    def stats(k: int) -> PassStats:
        means = tuple(at[b][k] for b in probes)
        return PassStats(tuple(probes), means, tuple(m * relative_std for m in means), 5)

    def fitted(k: int) -> PiecewiseLinear:
        if len(dense) < 2:
            return PiecewiseLinear.flat(at[dense[0]][k])
        ys = [at[b][k] for b in dense]
        return fit_piecewise(dense, ys, cv=[relative_std] * len(dense), repeats=5)

    fw_stats, bw_stats, fw_fit, bw_fit = stats(0), stats(1), fitted(0), fitted(1)
    sched_b = probes[len(probes) // 2]
    bw_ops = op_times(census, device, mode, eff, sched_b, 1)
    done = np.minimum(np.cumsum(bw_ops) / max(float(bw_ops.sum()), 1e-12), 1.0)
    buckets = tuple(
        GradientBucket(i, size, n, float(done[min(op, done.size - 1)]) if done.size else 1.0)
        for i, (size, n, op) in enumerate(
            zip(census.bucket_sizes, census.bucket_params, census.bucket_ready_op, strict=True)
        )
    )
    opt_s = at[sched_b][2]
    path = "specs" if source is None else f"scaled from {source.device_type}"
    cv = roofline.spec_cv(census.model) if source is None else roofline.scaled_cv
    return ComputeProfile(
        model=census.model,
        size=census.size,
        device_type=device.name,
        device_name=f"{device.variant or device.name} (estimated: {path})",
        fw=fw_stats,
        bw=bw_stats,
        fw_fit=fw_fit,
        bw_fit=bw_fit,
        b_max=b_max,
        memory_per_sample_bytes=per_sample,
        memory_fixed_bytes=fixed,
        memory_cap_bytes=int(device.memory_gib * 2**30),
        n_parameters=census.n_parameters,
        gradient_bytes=census.gradient_bytes,
        buckets=buckets,
        bucket_cap_bytes=census.bucket_cap_bytes,
        first_bucket_cap_bytes=census.first_bucket_cap_bytes,
        schedule_batch_size=sched_b,
        probe_mode=f"estimated:{path}",
        threads=0,
        torch_version=census.torch_version,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        copy_bytes_per_s=device.memory_bytes_per_s * eff.memory,
        optimizer_step_s=opt_s,
        settings=settings,
        effective_precision=settings.precision,
        b_max_limit="memory (estimated)" if b_max else NO_REPLICA,
        estimate=path,
        estimate_cv=cv,
    )


def nearest_measured(
    device: DeviceSpec, measured: Iterable[tuple[ComputeProfile, DeviceSpec]]
) -> tuple[ComputeProfile, DeviceSpec] | None:
    """The measured profile whose GPU is nearest ``device`` in peak compute and memory
    bandwidth (log distance): the one to scale from."""
    best = None
    for prof, spec in measured:
        d = abs(math.log(spec.fp32_flops / device.fp32_flops)) + abs(
            math.log(spec.memory_bytes_per_s / device.memory_bytes_per_s)
        )
        if best is None or d < best[0]:
            best = (d, (prof, spec))
    return None if best is None else best[1]
