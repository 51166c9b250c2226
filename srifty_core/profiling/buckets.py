"""Gradient-ready timestamps and DDP's gradient buckets.

DDP (torch 2.x, ``find_unused_parameters=False``) starts with one bucket, then after the
first iteration rebuilds its buckets from the order in which gradients became ready: it
calls ``torch.distributed._compute_bucket_assignment_by_size`` on the parameters in ready
order with the limits ``[first_bucket_bytes_cap (1 MiB), bucket_cap (25 MiB)]`` and reduces
the buckets in that order. ``form_buckets`` calls the same function on the same order, so the
steady-state buckets are DDP's own; ``ddp_observed_buckets`` runs a real DDP job and records
what its communication hook sees, to check it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from srifty_core.lifetime import free_port
from srifty_core.profiling.config import DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES
from srifty_core.profiling.profile import GradientBucket
from srifty_core.workloads import build
from srifty_core.workloads.zoo import Batch, Workload


@dataclass(frozen=True, slots=True)
class ReadySchedule:
    """Per parameter (by index in ``module.parameters()``), when its gradient was ready."""

    order: tuple[int, ...]
    """Parameter indices in the order their gradients became ready."""
    fractions: tuple[float, ...]
    """Mean ready time of each parameter (indexed like ``module.parameters()``), as a
    fraction of the backward pass."""
    backward_s: float


def trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def gradient_ready_schedule(
    workload: Workload,
    batch: Batch,
    *,
    repeats: int = 3,
    sync: Callable[[], None] = lambda: None,
) -> ReadySchedule:
    """Record when each gradient is ready (``register_post_accumulate_grad_hook``), normalized
    to the backward duration, averaged over ``repeats`` backward passes."""
    params = trainable(workload.module)
    cuda = any(p.is_cuda for p in params)
    stamps: dict[int, float] = {}
    events: dict[int, torch.cuda.Event] = {}
    order: list[int] = []

    def hook_for(i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            if i not in stamps and i not in events:
                order.append(i)
            if cuda:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                events[i] = ev
            else:
                stamps[i] = time.perf_counter()

        return hook

    handles = [p.register_post_accumulate_grad_hook(hook_for(i)) for i, p in enumerate(params)]
    sums = np.zeros(len(params))
    total_bw = 0.0
    last_order: list[int] = []
    try:
        for _ in range(repeats):
            stamps.clear()
            events.clear()
            order.clear()
            workload.module.zero_grad(set_to_none=True)
            loss = workload.loss(batch)
            sync()
            if cuda:
                start_ev = torch.cuda.Event(enable_timing=True)
                start_ev.record()
            t0 = time.perf_counter()
            loss.backward()
            sync()
            t1 = time.perf_counter()
            if cuda:
                end_ms = start_ev.elapsed_time(events[order[-1]]) if order else 0.0
                duration = max(t1 - t0, end_ms / 1e3)
                rel = {i: start_ev.elapsed_time(ev) / 1e3 for i, ev in events.items()}
            else:
                duration = t1 - t0
                rel = {i: s - t0 for i, s in stamps.items()}
            missing = set(range(len(params))) - set(rel)
            if missing:
                raise RuntimeError(f"{len(missing)} parameters got no gradient (unused in forward)")
            for i, r in rel.items():
                sums[i] += min(1.0, max(0.0, r / duration))
            total_bw += duration
            last_order = list(order)
    finally:
        for h in handles:
            h.remove()
    fractions = sums / repeats
    # DDP rebuilds from the order of one iteration; the order is the autograd graph's and
    # repeats agree, so take the last one.
    return ReadySchedule(tuple(last_order), tuple(float(f) for f in fractions), total_bw / repeats)


def form_buckets(
    params: Sequence[torch.Tensor],
    schedule: ReadySchedule,
    *,
    bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
    first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
) -> tuple[GradientBucket, ...]:
    """DDP's steady-state buckets for ``params`` given their ready order, in reduction order,
    each with its size and the ready fraction of its last gradient."""
    ordered = [params[i] for i in schedule.order]
    limits = [first_bucket_bytes, bucket_cap_bytes]
    indices, _ = dist._compute_bucket_assignment_by_size(  # type: ignore[attr-defined]
        ordered, limits, [False] * len(ordered), list(schedule.order)
    )
    out = []
    for b, members in enumerate(indices):
        tensors = [params[i] for i in members]
        out.append(
            GradientBucket(
                index=b,
                size_bytes=int(sum(t.numel() * t.element_size() for t in tensors)),
                n_params=len(members),
                ready_fraction=max(schedule.fractions[i] for i in members),
            )
        )
    return tuple(out)


def skip_allreduce(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads hook annotations
    """No-op DDP comm hook: each rank keeps its own gradients (compute and DDP's
    bookkeeping without the exchange)."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


# --------------------------------------------------------------------- DDP cross-check
def _ddp_worker(
    rank: int,
    world: int,
    port: int,
    name: str,
    size: str,
    batch_size: int,
    iterations: int,
    out_dir: str,
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        workload = build(name, size, seed=0)
        ddp = nn.parallel.DistributedDataParallel(workload.module)
        seen: list[list[tuple[int, int]]] = [[] for _ in range(iterations)]
        step = [0]

        # No annotations: DDP inspects them, and postponed (string) annotations fail its check.
        def hook(state, bucket):  # type: ignore[no-untyped-def]
            buf = bucket.buffer()
            seen[step[0]].append((bucket.index(), buf.numel() * buf.element_size()))
            fut = dist.all_reduce(buf, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        ddp.register_comm_hook(None, hook)
        batch = workload.make_batch(batch_size, torch.device("cpu"), seed=rank)
        workload.module = ddp
        for it in range(iterations):
            step[0] = it
            ddp.zero_grad(set_to_none=True)
            workload.loss(batch).backward()
        if rank == 0:
            import json

            with open(os.path.join(out_dir, "buckets.json"), "w") as fh:
                json.dump(seen, fh)
    finally:
        dist.destroy_process_group()


def ddp_observed_buckets(
    name: str, size: str, batch_size: int = 2, iterations: int = 3, world_size: int = 2
) -> list[list[tuple[int, int]]]:
    """Run ``iterations`` of real DDP (gloo, ``world_size`` local processes) on zoo model
    ``name`` and return, per iteration, the (bucket index, bytes) the comm hook saw in order."""
    import json
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(  # type: ignore[attr-defined]
            _ddp_worker,
            args=(world_size, free_port(), name, size, batch_size, iterations, out_dir),
            nprocs=world_size,
            join=True,
        )
        with open(os.path.join(out_dir, "buckets.json")) as fh:
            raw = json.load(fh)
    return [[(int(i), int(n)) for i, n in it] for it in raw]
