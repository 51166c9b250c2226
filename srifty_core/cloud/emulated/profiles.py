"""The emulated EC2's compute profiles: what ``srifty profile`` run on VMs of a type would
measure for a model profiled on another device (``profile``): B_max from the GPU's memory,
pass times from the ground truth at the profiler's budgeted and refined batch sizes, fitted
as the profiler fits them.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from srifty_core.cloud import emulator_truth as truth
from srifty_core.cloud.emulated.world import EmulatedWorld
from srifty_core.errors import ConfigError
from srifty_core.predictors.compute import (
    PiecewiseLinear,
    budget_batch_sizes,
    fit_piecewise,
    refine_batch_sizes,
)
from srifty_core.profiling.profile import PassStats

if TYPE_CHECKING:
    from srifty_core.profiling.profile import ComputeProfile

MEMORY_BOUND_BATCH = 1 << 24
"""``profile`` without ``max_batch``: B_max is the GPU memory's bound alone (this is only
the arithmetic's ceiling)."""


class EmulatedProfiles(EmulatedWorld):
    """The emulated EC2's profiler (see the module's docstring)."""

    def profile(
        self,
        instance_type: str,
        reference: ComputeProfile,
        *,
        probes: int = 4,
        repeats: int = 5,
        warmup: int = 2,
        max_batch: int | None = None,
        reference_rate: truth.DeviceRate | None = None,
        seed: int | None = None,
        vms: int = 3,
        refine: int = 3,
    ) -> ComputeProfile:
        """What ``srifty profile`` run on one VM of ``instance_type`` would measure for the
        model of ``reference`` (a profile of the same network on another device).

        * **B_max**: the largest per-GPU batch up to ``max_batch`` (the profiler's search
          range) whose footprint ``reference.memory_fixed_bytes +
          reference.memory_per_sample_bytes x B`` fits one GPU's memory
          (``emulator_truth.max_batch_in_memory``, the test training applies). The
          footprint is the network's, so the memory fields are kept; ``memory_cap_bytes``
          becomes the GPU's.
        * **Latency**: at the budgeted batch sizes (``budget_batch_sizes(B_max, probes)``)
          the ground truth's pass times (the reference scaled to this GPU), on ``vms`` VMs
          at once (default 3, as the profiling DAG maps over VMs), each with its own
          spatial factor, times a temporal factor per step (``repeats`` steps after
          ``warmup``): per size the mean of the VMs' means and the pooled within-VM std,
          fitted with ``fit_piecewise`` as the profiler does; ``vm_cv`` is the spread of
          the VMs' mean step times.
          Then, as the profiler does (``refine``, default 3), check probes between the
          budgeted ones where the fit may bend (``refine_batch_sizes``), refitted after
          each; the fit's errors at them are kept in ``probe_checks``.
        * **Per-step terms**: DDP's copy bandwidth and the optimizer step
          (``emulator_truth.step_costs``), median of ``repeats`` timings.
        * **Gradient buckets** (sizes, ready fractions): the reference's; they depend on
          the model and DDP's bucketing, not on the device.

        The clock advances by the measured steps. ``device_type`` is the GPU model as the
        catalog names it (T4, V100, M60, A10G...).
        """
        if repeats < 2:
            raise ConfigError(f"repeats: need at least 2 for a spread, got {repeats}")
        if vms < 1:
            raise ConfigError(f"vms: need at least 1, got {vms}")
        t = self.catalog_type(instance_type)
        rng = np.random.default_rng(seed) if seed is not None else self._rng
        rate = truth.device_rate(t)
        rates = {
            x.device_type: truth.device_rate(x)
            for x in self._catalog.by_region(self.region)
            if x.gpu is not None and x.gpu.memory_bw_gbs is not None
        }
        ref = reference_rate or truth.reference_rate(reference, rates)
        scale = truth.compute_scale(ref, rate)
        b_max = truth.max_batch_in_memory(reference, t, max_batch or MEMORY_BOUND_BATCH)
        if b_max < 1:
            need = float(reference.memory_bytes(1)) / 1024**3
            raise ConfigError(
                f"{reference.model}/{reference.size} does not fit one {t.gpu_model} of "
                f"{instance_type}: one sample needs {need:.1f} GiB of {t.gpu_memory_gib:g} GiB"
            )
        sizes = budget_batch_sizes(b_max, probes) if b_max > 1 else [1]
        spatial = truth.draw_spatial(rng, vms)  # the VMs the profile runs on, at once
        fw_by: dict[int, list[list[float]]] = {}
        bw_by: dict[int, list[list[float]]] = {}
        elapsed = 0.0

        def run(b: int) -> None:
            nonlocal elapsed
            t_fw, t_bw, cv_fw, cv_bw = truth.profile_pass_times(reference, b, scale)
            fw_vm, bw_vm = [], []
            for k in range(vms):
                fw = t_fw * spatial[k] * truth.draw_temporal(rng, (warmup + repeats,), cv_fw)
                bw = t_bw * spatial[k] * truth.draw_temporal(rng, (warmup + repeats,), cv_bw)
                if k == 0:
                    elapsed += float(fw.sum() + bw.sum())
                fw_vm.append([float(x) for x in fw[warmup:]])
                bw_vm.append([float(x) for x in bw[warmup:]])
            fw_by[b], bw_by[b] = fw_vm, bw_vm

        def stats(by: Mapping[int, list[list[float]]]) -> PassStats:
            """Mean over VMs of each VM's mean; the spread within a VM (pooled)."""
            bs = sorted(by)
            return PassStats(
                tuple(bs),
                tuple(statistics.fmean(statistics.fmean(v) for v in by[b]) for b in bs),
                tuple(
                    math.sqrt(statistics.fmean(statistics.variance(v) for v in by[b])) for b in bs
                ),
                repeats,
            )

        def fits() -> tuple[PiecewiseLinear, PiecewiseLinear]:
            f, b = stats(fw_by), stats(bw_by)
            return (
                fit_piecewise(f.batch_sizes, f.mean_s, cv=f.cv, repeats=repeats),
                fit_piecewise(b.batch_sizes, b.mean_s, cv=b.cv, repeats=repeats),
            )

        for b in sizes:
            run(b)
        checks: list[tuple[int, float]] = []
        if len(sizes) >= 2 and refine > 0:
            current = list(fits())

            def predict(b: int) -> float:
                return current[0].at(b) + current[1].at(b)

            def measure(b: int) -> tuple[float, float]:
                run(b)
                current[:] = fits()
                steps = [
                    f + w
                    for fv, bv in zip(fw_by[b], bw_by[b], strict=True)
                    for f, w in zip(fv, bv, strict=True)
                ]
                mean = statistics.fmean(steps)
                return mean, statistics.stdev(steps) / mean / math.sqrt(len(steps))

            checks = refine_batch_sizes(sizes, predict, measure, budget=refine)
        sizes = sorted(fw_by)
        fw_s = [fw_by[b] for b in sizes]
        bw_s = [bw_by[b] for b in sizes]

        vm_means = [
            statistics.fmean(
                statistics.fmean(fw_s[i][k]) + statistics.fmean(bw_s[i][k])
                for i in range(len(sizes))
            )
            for k in range(vms)
        ]
        vm_cv = statistics.stdev(vm_means) / statistics.fmean(vm_means) if vms >= 2 else 0.0

        # what every step adds whatever the batch: DDP's copy pass, the optimizer step
        copy_s, step_s = truth.step_costs(reference, rate)
        copy_m = copy_s * float(np.median(truth.draw_temporal(rng, (repeats,), 0.02)))
        step_m = step_s * float(np.median(truth.draw_temporal(rng, (repeats,), 0.02)))
        elapsed += repeats * (copy_s + step_s)
        fw_stats, bw_stats = stats(fw_by), stats(bw_by)
        if len(sizes) >= 2:
            fw_fit = fit_piecewise(sizes, fw_stats.mean_s, cv=fw_stats.cv, repeats=repeats)
            bw_fit = fit_piecewise(sizes, bw_stats.mean_s, cv=bw_stats.cv, repeats=repeats)
        else:  # B_max = 1: one point, a flat line through it
            fw_fit = PiecewiseLinear.flat(fw_stats.mean_s[0])
            bw_fit = PiecewiseLinear.flat(bw_stats.mean_s[0])
        self.advance(elapsed)
        return dataclasses.replace(
            reference,
            device_type=t.device_type,
            device_name=f"{t.device_type} ({t.name}, {self.name})",
            fw=fw_stats,
            bw=bw_stats,
            fw_fit=fw_fit,
            bw_fit=bw_fit,
            b_max=b_max,
            memory_cap_bytes=int(truth.gpu_memory_bytes(t)),
            schedule_batch_size=sizes[len(sizes) // 2],
            probe_mode=f"budget:{probes}" + (f"+{len(checks)}" if checks else ""),
            probe_checks=tuple(checks),
            threads=0,
            copy_bytes_per_s=float(reference.gradient_bytes) / copy_m,
            optimizer_step_s=step_m,
            vm_cv=vm_cv,
            profiled_vms=vms,
            created_at=self._clock.isoformat(timespec="seconds"),
        )
