"""The latency sweep: which batch sizes to measure below B_max (dense, budgeted or
explicit), their forward and backward times (a batch whose repeats disagree is measured
again), the piecewise-linear t(B) fitted per pass, and, in budgeted mode, the checks
between probes where the fit may bend (``latency_sweep``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from srifty_core.errors import ConfigError
from srifty_core.noise import NOISY_CV, NOISY_RETRIES
from srifty_core.predictors.compute import (
    PiecewiseLinear,
    budget_batch_sizes,
    dense_batch_sizes,
    fit_piecewise,
    refine_batch_sizes,
)
from srifty_core.profiling.colocated import colocated_load
from srifty_core.profiling.config import ProfilerConfig, Progress
from srifty_core.profiling.memory import BatchDoesNotFitError
from srifty_core.profiling.profile import PassStats
from srifty_core.profiling.timing import measure_latency, step_spread
from srifty_core.workloads.zoo import Workload


@dataclass(frozen=True, slots=True)
class Sweep:
    """What the sweep measured and fitted: per pass the stats and the fit over every batch
    size measured (``batch_sizes``, checks included), the probe mode (``dense``,
    ``explicit``, ``budget:<n>`` and ``+<checks>``), the checks between probes (batch,
    measured step seconds) and one line per batch whose repeats stayed noisy."""

    fw: PassStats
    bw: PassStats
    fw_fit: PiecewiseLinear
    bw_fit: PiecewiseLinear
    batch_sizes: tuple[int, ...]
    mode: str
    checks: tuple[tuple[int, float], ...]
    noisy: tuple[str, ...]


def probe_sizes(
    workload: Workload, size: str, b_max: int, config: ProfilerConfig
) -> tuple[list[int], str]:
    """The batch sizes to measure and the probe mode: ``config.batch_sizes`` (each must be
    at most ``b_max``), else a dense sweep (``probes`` ``None``), else the budget's."""
    if config.batch_sizes:
        sizes = sorted(set(config.batch_sizes))
        too_big = [b for b in sizes if b > b_max or b < 1]
        if too_big:
            raise BatchDoesNotFitError(
                f"batch size(s) {too_big} do not fit {workload.name}/{size} on {config.device}: "
                f"B_max is {b_max}"
            )
        mode = "explicit"
    elif config.probes is None:
        sizes = dense_batch_sizes(b_max, config.min_batch)
        mode = "dense"
    else:
        sizes = budget_batch_sizes(b_max, config.probes, config.min_batch)
        mode = f"budget:{config.probes}"
    if len(sizes) < 2:
        raise ConfigError(f"need at least 2 distinct batch sizes to fit, got {sizes}")
    return sizes, mode


def latency_sweep(
    name: str,
    size: str,
    workload: Workload,
    device: torch.device,
    config: ProfilerConfig,
    b_max: int,
    sync: Callable[[], None],
    progress: Progress | None,
) -> Sweep:
    """Measure the forward and backward times at ``probe_sizes`` (beside
    ``config.colocated - 1`` load workers), fit t(B) per pass, then check between the
    budgeted probes (``config.refine``) and fit again."""
    sizes, mode = probe_sizes(workload, size, b_max, config)
    samples: dict[int, tuple[list[float], list[float]]] = {}
    noisy: dict[int, str] = {}

    def run(b: int) -> None:
        batch = workload.make_batch(b, device, seed=config.seed)
        best: tuple[float, tuple[list[float], list[float]]] | None = None
        for _ in range(1 + NOISY_RETRIES):
            with colocated_load(name, size, b, config, device):
                got = measure_latency(
                    workload, batch, repeats=config.repeats, warmup=config.warmup, sync=sync
                )
            cv = step_spread(got)
            if best is None or cv < best[0]:
                best = (cv, got)
            if best[0] <= NOISY_CV:
                break
            if progress:
                progress(f"latency sweep: batch {b} spread {cv:.0%}, measuring again", 0, 0)
        assert best is not None
        samples[b] = best[1]
        if best[0] > NOISY_CV:
            noisy[b] = (
                f"batch {b}: steps spread {best[0]:.0%} (std/mean over {config.repeats} "
                f"repeats) after {NOISY_RETRIES} re-measurements; the host was busy"
            )
        else:
            noisy.pop(b, None)

    def fits() -> tuple[PassStats, PassStats, PiecewiseLinear, PiecewiseLinear]:
        bs = sorted(samples)
        fw_stats = _stats(bs, [samples[b][0] for b in bs], config.repeats)
        bw_stats = _stats(bs, [samples[b][1] for b in bs], config.repeats)
        return (
            fw_stats,
            bw_stats,
            fit_piecewise(bs, fw_stats.mean_s, cv=fw_stats.cv, repeats=config.repeats),
            fit_piecewise(bs, bw_stats.mean_s, cv=bw_stats.cv, repeats=config.repeats),
        )

    for i, b in enumerate(sizes):
        if progress:
            progress(f"latency sweep: batch {b}", i, len(sizes))
        run(b)
        if progress:
            progress(f"latency sweep: batch {b}", i + 1, len(sizes))
    current = fits()
    checks: list[tuple[int, float]] = []
    if mode.startswith("budget") and config.refine > 0:

        def predict(b: int) -> float:
            return current[2].at(b) + current[3].at(b)

        def measure(b: int) -> tuple[float, float]:
            nonlocal current
            run(b)
            current = fits()
            steps = [f + w for f, w in zip(*samples[b], strict=True)]
            mean = statistics.fmean(steps)
            if progress:
                progress("checks between probes", len(checks) + 1, config.refine)
            return mean, statistics.stdev(steps) / mean / len(steps) ** 0.5

        checks = refine_batch_sizes(
            sizes, predict, measure, budget=config.refine, tolerance=config.refine_tolerance
        )
        if checks:
            mode += f"+{len(checks)}"
    fw_stats, bw_stats, fw_fit, bw_fit = current
    return Sweep(
        fw_stats,
        bw_stats,
        fw_fit,
        bw_fit,
        tuple(sorted(samples)),
        mode,
        tuple(checks),
        tuple(noisy[b] for b in sorted(noisy)),
    )


def _stats(batch_sizes: list[int], samples: list[list[float]], repeats: int) -> PassStats:
    return PassStats(
        tuple(batch_sizes),
        tuple(statistics.fmean(s) for s in samples),
        tuple(statistics.stdev(s) for s in samples),
        repeats,
    )
