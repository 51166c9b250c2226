"""What a step costs beyond one process stepping alone, measured with load workers in
lockstep (``colocated``): the slowdown of workers sharing the host (``shared_slowdown``),
what wrapping the model in DDP adds (``ddp_overhead``) and what FSDP2 adds beyond its
collectives (``fsdp_overhead``).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import statistics
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch

from srifty_core import host_allocator
from srifty_core.profiling.buckets import trainable
from srifty_core.profiling.colocated import colocated_load, ddp_of_one
from srifty_core.profiling.config import ProfilerConfig
from srifty_core.profiling.timing import measure_latency, optimizer_step_seconds, step_seconds
from srifty_core.sharding.memory import Layout, measured_model, rank_memory
from srifty_core.sharding.units import shard_units, unit_parameters
from srifty_core.sharding.wrap import wrap
from srifty_core.workloads import make_optimizer
from srifty_core.workloads.zoo import Batch, Workload

SHARE_ROUNDS = 3
"""Alternating alone/shared rounds of ``shared_slowdown``."""


def shared_slowdown(
    name: str,
    size: str,
    workload: Workload,
    batch: int,
    config: ProfilerConfig,
    device: torch.device,
    sync: Callable[[], None],
) -> tuple[tuple[int, float], ...]:
    """``(k, factor)`` for k = 2..``config.shared_workers`` (none on CUDA): the median
    forward-plus-backward time at ``batch`` with ``k - 1`` background workers doing the
    same steps in step with it (``colocated_load``'s lockstep: a job's ranks start each
    step together), over the median alone. The workers start once and are paused and
    resumed for ``SHARE_ROUNDS`` alternating rounds (alone, shared, alone, ...), so that
    drift and one-off disturbances of the host (another process starting, a page-fault
    storm) fall on both sides; at least 1."""
    workers = config.shared_workers(device.type == "cpu")
    if workers <= 1:
        return ()
    import multiprocessing as mp

    data = workload.make_batch(batch, device, seed=config.seed)
    out = []
    for k in range(2, workers + 1):
        go = mp.get_context("spawn").Event()
        alone: list[float] = []
        shared: list[float] = []
        with colocated_load(
            name, size, batch, config, device, others=k - 1, go=go, lockstep=True
        ) as together:
            for _ in range(SHARE_ROUNDS):
                go.clear()
                alone += step_seconds(workload, data, config, sync)
                go.set()
                shared += step_seconds(workload, data, config, sync, together)
        out.append((k, max(1.0, statistics.median(shared) / statistics.median(alone))))
    return tuple(out)


def ddp_overhead(
    name: str,
    size: str,
    workload: Workload,
    batch: int,
    config: ProfilerConfig,
    device: torch.device,
    sync: Callable[[], None],
) -> tuple[tuple[int, float], ...]:
    """``(k, seconds)`` for k = 1..``config.shared_workers`` (1 on a GPU): what wrapping the
    model in DDP adds to a forward-plus-backward step at ``batch``, with ``k - 1``
    background workers doing DDP steps of their own in step with it (and ``colocated - 1``
    as always): DDP's passes over the gradients are memory-bound and come at the same
    moment of every rank's step, so workers that step together slow them more than
    workers at random moments of theirs (``benchmarks/investigations/ddp_lockstep.py``:
    ResNet-18 at batch 8 beside one worker, +3.9 ms in step against +1.8 at random moments,
    medians of four alternated rounds; docs/benchmarks/local-ddp.md has the rest and the
    noise).

    A copy of the model is wrapped in ``DistributedDataParallel`` over a process group of
    this process alone (an in-memory store, gloo on the CPU, NCCL on CUDA) with a no-op
    communication hook: what remains is DDP's own work (autograd hooks, gradients copied
    into the buckets and back, buffer broadcasts), which the copy bandwidth alone does not
    predict (ShuffleNet's 170 small tensors cost 1.9 ms where its two copy passes take 0.2;
    DLRM's 38 large ones 7 ms where they take 7, and 17 ms on a busier host). Median DDP
    step minus median plain step over ``SHARE_ROUNDS`` alternating rounds, at least 0.
    Empty where a process group already exists in this process (a profile taken inside a
    training job)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return ()
    cuda = device.type == "cuda"
    try:
        module = ddp_of_one(copy.deepcopy(workload.module), device)
        wrapped = dataclasses.replace(workload, module=module)
        data = workload.make_batch(batch, device, seed=config.seed)
        out = []
        base = config.colocated - 1
        for k in range(1, config.shared_workers(not cuda) + 1):
            plain: list[float] = []
            ddp: list[float] = []
            with colocated_load(
                name, size, batch, config, device, others=base + k - 1, ddp=True, lockstep=True
            ) as together:
                for _ in range(SHARE_ROUNDS):
                    plain += step_seconds(workload, data, config, sync, together)
                    ddp += step_seconds(wrapped, data, config, sync, together)
            out.append((k, max(0.0, statistics.median(ddp) - statistics.median(plain))))
        del module, wrapped
        return tuple(out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _group_without_transport() -> int:
    """Start a process group in which this process is rank 0 of ``SHARD_WORLD`` and every
    collective returns at once without moving a byte (torch's fake backend, which its own
    tests use to trace distributed programs); the world it has. Where torch lacks that
    backend, a real group of this process alone (an in-memory store, gloo): FSDP2 then
    skips its buffer copies (its single-rank path), so less is measured."""
    import torch.distributed as dist

    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
        return 1
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=SHARD_WORLD)
    return SHARD_WORLD


SHARD_WORLD = 2
"""The world ``fsdp_overhead`` shards over (its collectives move nothing): the smallest
that takes FSDP2's multi-rank path, with its copies into and out of the collectives'
buffers."""


class ShardedTerms(NamedTuple):
    """What ``fsdp_overhead`` measures on a sharded copy of the model."""

    overhead: tuple[float, ...]
    """``ComputeProfile.fsdp_overhead``: (forward s per unit, backward s per unit, step s)."""
    peak_margin: float | None
    """``ComputeProfile.fsdp_peak_margin``: how far one sharded training step's measured
    peak rose above ``sharding.memory``'s per-rank model of it (a fraction; negative where
    the model is above); None where not measured."""


def fsdp_overhead(
    workload: Workload,
    batch: int,
    config: ProfilerConfig,
    device: torch.device,
    sync: Callable[[], None],
    memory: tuple[float, float] | None = None,
) -> ShardedTerms:
    """What FSDP2 adds to a step at ``batch`` beyond its collectives
    (``ComputeProfile.fsdp_overhead``), and, given the profile's measured memory
    (``memory``: bytes per sample, fixed bytes), how far its peak rises above the memory
    model (``ComputeProfile.fsdp_peak_margin``).

    A copy of the model is sharded as the trainer shards it (``sharding.wrap``: each unit
    of ``sharding.units``, then the root, under the settings' mixed-precision policy) over
    a process group whose collectives move nothing (``_group_without_transport``: rank 0
    of two), so what remains is FSDP2's own work: the hooks around each unit, the copies
    into and out of the collectives' buffers, the casts, the DTensor dispatch. The sharded
    simulator prices the collectives themselves from the bandwidth model and adds this per
    unit (``benchmarks/sharded_reality.py`` scores the sum against real training). Median
    sharded forward (backward) minus median plain forward (backward) over
    ``SHARE_ROUNDS`` alternating rounds, divided by the units (the root counted as one), at
    least 0; the optimizer step over this rank's shard (DTensors) minus the plain step's
    share of it. Then one more sharded step (forward, backward, optimizer step) is measured
    for its peak (CUDA's allocator; on a CPU the resident set's peak, ``VmHWM``) over what
    the rank held before it (its sharded parameters and optimizer states), set against
    ``sharding.memory.rank_memory`` of the same rank. Subnormal floats are flushed to zero
    meanwhile: the gathered halves no rank sent hold whatever the allocator left there.
    Empty (and no margin) where a process group already exists in this process (a profile
    taken inside a training job), and where FSDP2 cannot shard the model or its sharded
    step fails (parameters tied across units, say): the profile of the model is not
    refused for it, and the sharded simulator says the term is missing. FSDP2's warnings
    about the copy (a view returned from a forward) are not the profile's and are
    silenced."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return ShardedTerms((), None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return _sharded_terms(workload, batch, config, device, sync, memory)
        except Exception:  # a model FSDP2 cannot shard still gets its profile
            return ShardedTerms((), None)


def _sharded_terms(
    workload: Workload,
    batch: int,
    config: ProfilerConfig,
    device: torch.device,
    sync: Callable[[], None],
    memory: tuple[float, float] | None,
) -> ShardedTerms:
    """``fsdp_overhead``'s measurement (its doc)."""
    import torch.distributed as dist

    units = len(shard_units(workload.module)) + 1
    data = workload.make_batch(batch, device, seed=config.seed)
    world = _group_without_transport()
    flushed = torch.set_flush_denormal(True)
    try:
        sharded = dataclasses.replace(workload, module=copy.deepcopy(workload.module))
        wrap(sharded.module, Layout("fsdp", world), config.settings, device)
        fw: tuple[list[float], list[float]] = ([], [])
        bw: tuple[list[float], list[float]] = ([], [])
        for _ in range(SHARE_ROUNDS):
            for i, w in enumerate((workload, sharded)):
                f, b = measure_latency(
                    w, data, repeats=config.repeats, warmup=config.warmup, sync=sync
                )
                fw[i].extend(f)
                bw[i].extend(b)
        step = [
            optimizer_step_seconds(w, data, sync, settings=config.settings)
            for w in (dataclasses.replace(workload, module=copy.deepcopy(workload.module)),
                      sharded)
        ]  # fmt: skip
        med = statistics.median
        out = (
            max(0.0, med(fw[1]) - med(fw[0])) / units,
            max(0.0, med(bw[1]) - med(bw[0])) / units,
            max(0.0, step[1] - step[0] / world),
        )
        margin = None
        if memory is not None:
            margin = _peak_margin(sharded, data, config, device, sync, world, batch, memory)
        del sharded
        return ShardedTerms(out, margin)
    finally:
        if flushed:
            torch.set_flush_denormal(False)
        dist.destroy_process_group()


def _peak_margin(
    sharded: Workload,
    data: Batch,
    config: ProfilerConfig,
    device: torch.device,
    sync: Callable[[], None],
    world: int,
    batch: int,
    memory: tuple[float, float],
) -> float | None:
    """One sharded step's measured peak over the memory model's (``fsdp_overhead``)."""
    module = sharded.module
    optimizer = make_optimizer(config.settings, trainable(module), lr=1e-6)
    for measured in (False, True):  # the first step creates the optimizer's states
        module.zero_grad(set_to_none=True)
        if measured:  # the first step's garbage (a full collection: ~0.5 s in a big process)
            gc.collect()
        sync()
        if measured:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                before = float(torch.cuda.memory_allocated(device))
            else:
                host_allocator.trim()
                rss = host_allocator.resident_bytes("VmRSS")
                if rss is None or not host_allocator.reset_peak_resident():
                    return None
                before = float(rss)
        sharded.loss(data).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        sync()
    if device.type == "cuda":
        rise = float(torch.cuda.max_memory_allocated(device)) - before
    else:
        peak = host_allocator.resident_bytes("VmHWM")
        if peak is None:
            return None
        rise = float(peak) - before
    module.zero_grad(set_to_none=True)
    model = measured_model(unit_parameters(module), *memory, config.settings)
    predicted = rank_memory(model, config.settings, Layout("fsdp", world), batch)
    held = predicted.parameters + predicted.optimizer  # allocated before the step
    return (held + max(0.0, rise)) / predicted.total - 1.0
