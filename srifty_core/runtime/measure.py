"""Measure real DDP iterations on local worker processes (gloo), for checking the simulator.

Each rank builds the same zoo model (same seed), wraps it in ``DistributedDataParallel`` and
runs forward + backward on its own local batch (local batches may differ between ranks).
Every iteration starts at a barrier; its time is the slowest rank's from the barrier to the
end of ``backward()`` (DDP returns from backward once every bucket's allreduce is done).
The optimizer step is left out on purpose: the simulator models forward, backward and the
gradient exchange, and this measures exactly that.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from srifty_core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class DdpMeasurement:
    model: str
    size: str
    local_batches: tuple[int, ...]
    iteration_s: tuple[float, ...]
    """Per measured iteration, the slowest rank's time."""

    @property
    def mean_s(self) -> float:
        return sum(self.iteration_s) / len(self.iteration_s)


def _worker(
    rank: int,
    world: int,
    port: int,
    name: str,
    size: str,
    batches: list[int],
    iterations: int,
    warmup: int,
    threads: int,
    out_dir: str,
    communicate: bool = True,
) -> None:
    from srifty_core.profiling.zoo import build

    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        workload = build(name, size, seed=0)
        workload.module.train()
        ddp = nn.parallel.DistributedDataParallel(workload.module)
        if not communicate:
            # Skip the allreduce (each rank keeps its own gradients): what is left is compute
            # plus DDP's own bookkeeping, to split a measured iteration into its parts.
            def skip(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads annotations
                fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
                fut.set_result(bucket.buffer())
                return fut

            ddp.register_comm_hook(None, skip)
        batch = workload.make_batch(batches[rank], torch.device("cpu"), seed=rank)
        workload.module = ddp
        times: list[float] = []
        for i in range(warmup + iterations):
            ddp.zero_grad(set_to_none=True)
            dist.barrier()
            t0 = time.perf_counter()
            workload.loss(batch).backward()
            t1 = time.perf_counter()
            if i >= warmup:
                times.append(t1 - t0)
        gathered: list[list[float] | None] = [None] * world
        dist.all_gather_object(gathered, times)
        if rank == 0:
            slowest = [
                max(per_rank[i] for per_rank in gathered if per_rank) for i in range(iterations)
            ]
            with open(os.path.join(out_dir, "times.json"), "w") as fh:
                json.dump(slowest, fh)
    finally:
        dist.destroy_process_group()


def measure_ddp(
    name: str,
    size: str,
    local_batches: Sequence[int],
    *,
    iterations: int = 10,
    warmup: int = 3,
    threads: int = 1,
    communicate: bool = True,
) -> DdpMeasurement:
    """Run ``warmup + iterations`` DDP iterations with one process per local batch.

    ``communicate=False`` replaces the allreduce with a no-op communication hook."""
    if len(local_batches) < 2:
        raise ConfigError("local_batches: need at least 2 ranks for DDP")
    if iterations < 1 or any(b < 1 for b in local_batches):
        raise ConfigError("iterations and local batches must be >= 1")
    import torch.multiprocessing as mp

    from srifty_core.cloud.local import free_port

    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(  # type: ignore[attr-defined]
            _worker,
            args=(
                len(local_batches),
                free_port(),
                name,
                size,
                list(local_batches),
                iterations,
                warmup,
                threads,
                out_dir,
                communicate,
            ),
            nprocs=len(local_batches),
            join=True,
        )
        with open(os.path.join(out_dir, "times.json")) as fh:
            times = [float(t) for t in json.load(fh)]
    return DdpMeasurement(name, size, tuple(local_batches), tuple(times))
