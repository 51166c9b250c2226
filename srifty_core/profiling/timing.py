"""Timing a training step on a device with the host clock, between device
synchronisations: its forward and backward passes (``measure_latency``, ``step_seconds``,
their spread ``step_spread``) and what a step adds regardless of the batch (the copy
bandwidth DDP's passes run at, ``copy_bandwidth``; the optimizer step,
``optimizer_step_seconds``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from srifty_core.noise import spread
from srifty_core.profiling.buckets import trainable
from srifty_core.profiling.config import ProfilerConfig
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings
from srifty_core.workloads import make_optimizer
from srifty_core.workloads.zoo import Batch, Workload


def measure_latency(
    workload: Workload,
    batch: Batch,
    *,
    repeats: int,
    warmup: int,
    sync: Callable[[], None],
    before_step: Callable[[], None] | None = None,
) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of ``repeats`` steps, after ``warmup`` steps;
    ``before_step`` (if given) runs before each, outside the clock (``colocated.colocated_load``'s
    lockstep)."""
    fw: list[float] = []
    bw: list[float] = []
    for i in range(warmup + repeats):
        workload.module.zero_grad(set_to_none=True)
        sync()
        if before_step is not None:
            before_step()
        t0 = time.perf_counter()
        loss = workload.loss(batch)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        if i >= warmup:
            fw.append(t1 - t0)
            bw.append(t2 - t1)
    return fw, bw


def step_seconds(
    workload: Workload,
    batch: Batch,
    config: ProfilerConfig,
    sync: Callable[[], None],
    before_step: Callable[[], None] | None = None,
) -> list[float]:
    """Forward-plus-backward seconds of ``config.repeats`` steps (``measure_latency``)."""
    fw, bw = measure_latency(
        workload,
        batch,
        repeats=config.repeats,
        warmup=config.warmup,
        sync=sync,
        before_step=before_step,
    )
    return [f + b for f, b in zip(fw, bw, strict=True)]


def step_spread(samples: tuple[list[float], list[float]]) -> float:
    """std/mean of the forward-plus-backward step times of one batch's repeats (a batch
    above ``noise.NOISY_CV`` is measured again, up to ``noise.NOISY_RETRIES`` times)."""
    return spread([f + b for f, b in zip(*samples, strict=True)])


def copy_bandwidth(
    n_bytes: int, device: torch.device, sync: Callable[[], None], repeats: int = 7
) -> float:
    """Bytes/s of copying ``n_bytes`` of float32 from one buffer into another on ``device``
    (median of ``repeats`` after a warm-up), with this process's thread setting: what DDP's
    passes over the gradients (into the buckets, divided on the way, and back out) run at."""
    n = max(1, n_bytes // 4)
    src = torch.ones(n, device=device)
    dst = torch.empty(n, device=device)
    return 4 * n / _median_seconds(lambda: dst.copy_(src), sync, repeats)


def optimizer_step_seconds(
    workload: Workload,
    batch: Batch,
    sync: Callable[[], None],
    repeats: int = 7,
    settings: TrainingSettings = DEFAULT_SETTINGS,
) -> float:
    """Median seconds of ``optimizer.step()`` for the optimizer of ``settings`` (SGD with
    momentum, or AdamW: ``workload.make_optimizer``, as the worker trains) over the
    model's parameters, gradients in place, after a warm-up step that creates its state.
    Memory-bound and independent of the batch size."""
    params = trainable(workload.module)
    opt = make_optimizer(settings, params, lr=1e-6, momentum=0.9)
    workload.module.zero_grad(set_to_none=True)
    workload.loss(batch).backward()
    seconds = _median_seconds(opt.step, sync, repeats)
    workload.module.zero_grad(set_to_none=True)
    return seconds


def _median_seconds(fn: Callable[[], object], sync: Callable[[], None], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after one warm-up call, each
    between device synchronisations."""
    times = []
    for i in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)
