"""Profile one zoo model on the device this process runs on (CPU here, CUDA where present):
``profile_model``, the profiler's entry point, runs its stages and assembles the
``ComputeProfile``.

Steps: find B_max (largest batch that fits the device's memory: ``memory``), measure
forward and backward latency at a set of batch sizes and fit the piecewise-linear t(B) per
pass (``sweep``), record the gradient-ready schedule and form DDP's buckets (``buckets``),
measure what sharing the host and DDP add (``overheads``), and time what a training step
adds regardless of the batch (DDP's copy bandwidth, the optimizer step: ``timing``).
"""

from __future__ import annotations

from datetime import UTC, datetime

import torch

from srifty_core import host_allocator
from srifty_core.console import still_running
from srifty_core.profiling.buckets import form_buckets, gradient_ready_schedule, trainable
from srifty_core.profiling.budget import DEFAULT_SIZE
from srifty_core.profiling.colocated import colocated_load
from srifty_core.profiling.config import ProfilerConfig, Progress
from srifty_core.profiling.device import device_type_of, resolve_device, sync_fn
from srifty_core.profiling.memory import find_b_max, tensor_bytes
from srifty_core.profiling.overheads import ddp_overhead, fsdp_overhead, shared_slowdown
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.sweep import latency_sweep
from srifty_core.profiling.timing import copy_bandwidth, optimizer_step_seconds
from srifty_core.profiling.user_code import user_model, user_steps
from srifty_core.workloads import build, prepare
from srifty_core.workloads.zoo import Workload


def profile_model(
    name: str,
    size: str = DEFAULT_SIZE,
    config: ProfilerConfig | None = None,
    progress: Progress | None = None,
) -> ComputeProfile:
    """Profile model ``name`` (a zoo name or any ``workload`` reference) at ``size`` on
    ``config.device`` with ``config.settings``; see the module doc."""
    config = config or ProfilerConfig()
    device = resolve_device(config.device)
    host_allocator.steady()  # the heap behaviour training runs with (host_allocator)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    with still_running(f"building model {name}"):  # a factory that hangs says so
        workload = build(name, size, seed=config.seed).to(device)
    with user_steps(name):
        return _profile(name, size, config, progress, device, workload)


def _profile(
    name: str,
    size: str,
    config: ProfilerConfig,
    progress: Progress | None,
    device: torch.device,
    workload: Workload,
) -> ComputeProfile:
    """``profile_model`` once the model is built."""
    workload.module.train()
    precision = prepare(workload, config.settings, autocast=True)
    sync = sync_fn(device)
    if user_model(name):  # a step that fails is one line before any progress line
        workload.module.zero_grad(set_to_none=True)
        workload.loss(workload.make_batch(1, device, seed=config.seed)).backward()
        workload.module.zero_grad(set_to_none=True)

    memory = find_b_max(workload, device, config, progress)
    swept = latency_sweep(name, size, workload, device, config, memory.b_max, sync, progress)
    sizes = swept.batch_sizes

    sched_b = sizes[len(sizes) // 2]
    if progress:
        progress(f"gradient schedule: batch {sched_b}", 0, 0)
    schedule = gradient_ready_schedule(
        workload,
        workload.make_batch(sched_b, device, seed=config.seed),
        repeats=config.schedule_repeats,
        sync=sync,
    )
    params = trainable(workload.module)
    buckets = form_buckets(
        params,
        schedule,
        bucket_cap_bytes=config.bucket_cap_bytes,
        first_bucket_bytes=config.first_bucket_bytes,
    )
    if progress:
        progress("DDP overhead: measuring (and host sharing, if asked)", 0, 0)
    shared = shared_slowdown(name, size, workload, sched_b, config, device, sync)
    overhead = ddp_overhead(name, size, workload, sched_b, config, device, sync)
    if progress:
        progress("DDP overhead", 1, 1)
        progress("FSDP overhead: measuring", 0, 0)
    sharded = fsdp_overhead(
        workload, sched_b, config, device, sync, (memory.per_sample_bytes, memory.fixed_bytes)
    )
    if progress:
        progress("FSDP overhead", 1, 1)
    with colocated_load(name, size, sched_b, config, device):
        copy_bw = copy_bandwidth(tensor_bytes(params), device, sync)
        # last: the steps move the weights, and nothing is measured after them
        step_s = optimizer_step_seconds(
            workload,
            workload.make_batch(sched_b, device, seed=config.seed),
            sync,
            settings=config.settings,
        )
    device_type, device_name = device_type_of(device)
    return ComputeProfile(
        model=name,
        size=size,
        device_type=device_type,
        device_name=device_name,
        fw=swept.fw,
        bw=swept.bw,
        fw_fit=swept.fw_fit,
        bw_fit=swept.bw_fit,
        b_max=memory.b_max,
        memory_per_sample_bytes=memory.per_sample_bytes,
        memory_fixed_bytes=memory.fixed_bytes,
        memory_cap_bytes=memory.cap_bytes,
        n_parameters=sum(p.numel() for p in params),
        gradient_bytes=tensor_bytes(params),
        buckets=buckets,
        bucket_cap_bytes=config.bucket_cap_bytes,
        first_bucket_cap_bytes=config.first_bucket_bytes,
        schedule_batch_size=sched_b,
        probe_mode=swept.mode,
        threads=torch.get_num_threads() if device.type == "cpu" else 0,
        torch_version=str(torch.__version__),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        copy_bytes_per_s=copy_bw,
        optimizer_step_s=step_s,
        probe_checks=swept.checks,
        shared_slowdown=shared,
        ddp_overhead=overhead,
        fsdp_overhead=sharded.overhead,
        fsdp_peak_margin=sharded.peak_margin,
        settings=config.settings,
        effective_precision=precision,
        b_max_limit=memory.limit,
        noisy=swept.noisy,
    )
