"""Measure real DDP iterations on local worker processes (gloo), for checking the simulator.

Each rank builds the same zoo model (same seed), wraps it in ``DistributedDataParallel`` and
runs forward + backward on its own local batch (local batches may differ between ranks).
Every iteration starts at a barrier; its time is the slowest rank's from the barrier to the
end of the optimizer step (SGD with momentum, as the Srifty worker trains; DDP returns from
``backward()`` once every bucket's allreduce is done). ``optimizer=False`` stops the clock
at the end of ``backward()``: forward, backward and the gradient exchange only.

``measure_ddp_cases`` measures several cases (local batches) of one model in one set of
processes, in rounds: each round runs a block of ``block`` iterations of every case, each
case also with DDP's allreduce replaced by a no-op hook (compute plus DDP's bookkeeping).
On a shared host whose speed drifts by 10-20% within minutes, measuring case after case
puts the drift into the comparison between cases and between the two modes; in rounds it
falls on all of them alike. Blocks, not single iterations, because alternating every
iteration keeps the caches cold: it measured ResNet-18's compute 15-35% slower than the
same steps back to back, which is what training (the same model and batch shapes every
step) runs like. Each block's first iteration warms up and is not counted.

With ``alone`` each round also runs the exchange by itself in the same processes: the
allreduce of buffers the size of DDP's buckets (as the no-op hook saw them), one after the
other in DDP's order, from a barrier. Beside the other two modes it splits what the
measured exchange costs into what the allreduce costs on these processes' idle cores and
what running it inside DDP's backward pass adds.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from srifty_core import host_allocator
from srifty_core.errors import ConfigError
from srifty_core.lifetime import free_port
from srifty_core.profiling.buckets import skip_allreduce
from srifty_core.workloads import build


@dataclass(frozen=True, slots=True)
class DdpMeasurement:
    model: str
    size: str
    local_batches: tuple[int, ...]
    iteration_s: tuple[float, ...]
    """Per measured iteration, the slowest rank's time."""
    no_comm_s: tuple[float, ...] = ()
    """The same with a no-op comm hook (compute and DDP's bookkeeping); empty if not run."""
    alone_s: tuple[float, ...] = ()
    """DDP's buckets allreduced one after the other with nothing else running (the
    slowest rank's time from a barrier); empty if not run."""

    @property
    def mean_s(self) -> float:
        return sum(self.iteration_s) / len(self.iteration_s)


def note_buckets(numel, bucket):  # type: ignore[no-untyped-def]  # DDP reads annotations
    """No-op DDP comm hook (``skip_allreduce``) that notes each bucket's size in elements
    in its state, a dict by bucket index."""
    numel[bucket.index()] = bucket.buffer().numel()
    return skip_allreduce(None, bucket)


def _exchange_alone(buffers: list[torch.Tensor]) -> float:
    """DDP's buckets allreduced in its order, one at a time, from a barrier."""
    dist.barrier()
    t0 = time.perf_counter()
    for buf in buffers:
        dist.all_reduce(buf)
    return time.perf_counter() - t0


def _step(workload: Any, ddp: nn.Module, opt: torch.optim.Optimizer | None, batch: Any) -> float:
    """One iteration from a barrier: this rank's forward + backward (+ optimizer step) time."""
    ddp.zero_grad(set_to_none=True)
    dist.barrier()
    t0 = time.perf_counter()
    workload.loss(batch).backward()
    if opt is not None:
        opt.step()
    return time.perf_counter() - t0


def _worker(
    rank: int,
    world: int,
    port: int,
    name: str,
    size: str,
    cases: list[list[int]],
    modes: list[bool],
    iterations: int,
    warmup: int,
    block: int,
    threads: int,
    optimizer: bool,
    alone: bool,
    out_dir: str,
) -> None:
    host_allocator.steady()  # as the Srifty worker and the profiler run
    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        steps = []  # per mode: (workload, DDP wrapper, optimizer); each its own model copy
        numel: dict[int, int] = {}  # DDP's buckets (elements by index), as the hook saw them
        for communicate in modes:
            workload = build(name, size, seed=0)
            workload.module.train()
            opt = (
                torch.optim.SGD(workload.module.parameters(), lr=1e-6, momentum=0.9)
                if optimizer
                else None
            )
            ddp = nn.parallel.DistributedDataParallel(workload.module)
            if not communicate:
                ddp.register_comm_hook(numel, note_buckets)
            workload.module = ddp
            steps.append((workload, ddp, opt))
        batches = [steps[0][0].make_batch(c[rank], torch.device("cpu"), seed=rank) for c in cases]
        n_modes = len(modes) + alone
        times: list[list[list[float]]] = [[[] for _ in range(n_modes)] for _ in cases]
        for batch in batches:  # warm every case and mode up once
            for workload, ddp, opt in steps:
                for _ in range(warmup):
                    _step(workload, ddp, opt, batch)
        buffers: list[torch.Tensor] = []
        if alone:  # DDP's buckets, in its order (index 0 is the first to be ready)
            buffers = [torch.ones(numel[i]) for i in sorted(numel)]
            for _ in range(warmup):
                _exchange_alone(buffers)
        while len(times[0][0]) < iterations:  # rounds of blocks
            n = min(block, iterations - len(times[0][0]))
            for c, batch in enumerate(batches):
                for m, (workload, ddp, opt) in enumerate(steps):
                    _step(workload, ddp, opt, batch)  # the block's first step is not counted
                    times[c][m].extend(_step(workload, ddp, opt, batch) for _ in range(n))
                if alone:  # the same for every case: measured in each case's slot of the round
                    _exchange_alone(buffers)
                    times[c][-1].extend(_exchange_alone(buffers) for _ in range(n))
        gathered: list[list[list[list[float]]] | None] = [None] * world
        dist.all_gather_object(gathered, times)
        if rank == 0:
            ranks = [g for g in gathered if g is not None]
            slowest = [
                [
                    [max(r[c][m][i] for r in ranks) for i in range(iterations)]
                    for m in range(n_modes)
                ]
                for c in range(len(cases))
            ]
            with open(os.path.join(out_dir, "times.json"), "w") as fh:
                json.dump(slowest, fh)
    finally:
        dist.destroy_process_group()


def _run(
    name: str,
    size: str,
    cases: Sequence[Sequence[int]],
    modes: Sequence[bool],
    iterations: int,
    warmup: int,
    threads: int,
    block: int,
    optimizer: bool,
    alone: bool = False,
) -> list[list[list[float]]]:
    if not cases:
        raise ConfigError("cases: need at least one set of local batches")
    world = len(cases[0])
    if world < 2:
        raise ConfigError("local_batches: need at least 2 ranks for DDP")
    if any(len(c) != world for c in cases):
        raise ConfigError(f"cases: every case needs {world} local batches, got {list(cases)}")
    if min(iterations, threads, block, *(b for c in cases for b in c)) < 1:
        raise ConfigError("iterations, threads, block and local batches must be >= 1")
    if alone and False not in modes:
        raise ConfigError("alone: needs the no-op hook's run (split), which finds DDP's buckets")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(  # type: ignore[attr-defined]
            _worker,
            args=(
                world,
                free_port(),
                name,
                size,
                [list(c) for c in cases],
                list(modes),
                iterations,
                warmup,
                block,
                threads,
                optimizer,
                alone,
                out_dir,
            ),
            nprocs=world,
            join=True,
        )
        with open(os.path.join(out_dir, "times.json")) as fh:
            return [[[float(t) for t in m] for m in c] for c in json.load(fh)]


def measure_ddp(
    name: str,
    size: str,
    local_batches: Sequence[int],
    *,
    iterations: int = 10,
    warmup: int = 3,
    threads: int = 1,
    communicate: bool = True,
    optimizer: bool = True,
) -> DdpMeasurement:
    """Run ``warmup + iterations`` DDP iterations with one process per local batch.

    ``communicate=False`` replaces the allreduce with a no-op communication hook."""
    times = _run(
        name,
        size,
        [local_batches],
        [communicate],
        iterations,
        warmup,
        threads,
        iterations,
        optimizer,
    )
    return DdpMeasurement(name, size, tuple(local_batches), tuple(times[0][0]))


def measure_ddp_cases(
    name: str,
    size: str,
    cases: Sequence[Sequence[int]],
    *,
    iterations: int = 10,
    warmup: int = 3,
    threads: int = 1,
    split: bool = True,
    block: int = 5,
    optimizer: bool = True,
    alone: bool = False,
) -> list[DdpMeasurement]:
    """Measure every case (local batches, one per rank) of model ``name`` in one set of
    processes, interleaved (see the module doc); with ``split`` each case also runs with
    a no-op comm hook, into ``DdpMeasurement.no_comm_s``, and with ``alone`` (needs
    ``split``) DDP's buckets are allreduced by themselves, into ``alone_s``."""
    modes = [True, False] if split else [True]
    times = _run(name, size, cases, modes, iterations, warmup, threads, block, optimizer, alone)
    return [
        DdpMeasurement(
            name,
            size,
            tuple(c),
            tuple(t[0]),
            tuple(t[1]) if split else (),
            tuple(t[2]) if alone else (),
        )
        for c, t in zip(cases, times, strict=True)
    ]
