"""Measure what each rank holds at its peak while training a model under a strategy, on
local processes (CPU over gloo, or one GPU each over NCCL): the evidence
``sharding.memory`` is checked against.

Contract: ``rank_peaks(model, size, layout, batch)`` starts ``layout.world`` processes,
each builds the model (``workloads.build``: any model reference), wraps it
(``sharding.wrap``), takes ``steps`` AdamW/SGD steps at the local ``batch`` and reports,
over its level before the model was built: the peak during those steps and what it holds
after the last optimizer step (the training state with its gradients, no activations),
with each step's loss. On the CPU the level is the resident set (Linux: ``VmHWM`` reset
through ``/proc/self/clear_refs`` after wrapping, the heap trimmed first); on CUDA it is
the caching allocator's allocated bytes (``max_memory_allocated`` after a peak reset).
Parameters, gradients, optimizer states, buffers and activations are all in the peak, with
what the collectives, FSDP and autograd allocate on the way; the import of torch is not.
On CUDA, ``precision`` bf16/fp16 runs the loss under ``torch.autocast`` (and FSDP's mixed
precision policy, ``sharding.wrap``). With ``micro_batches`` k > 1 each step runs its batch
as k slices (``batches.micro_split``), the exchange held back to the last
(``sharding.wrap.gradient_sync``) or, with ``sync_each``, on every one.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from srifty_core import host_allocator
from srifty_core.batches import micro_split
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.lifetime import free_port
from srifty_core.sharding.memory import Layout
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import build, make_optimizer
from srifty_core.workloads.prepare import cast_to_bf16


def _status_bytes(field: str) -> int:
    got = host_allocator.resident_bytes(field)
    if got is None:
        raise SriftyError(f"/proc/self/status has no {field}")
    return got


def _rank(
    rank: int,
    layout: Layout,
    port: int,
    model: str,
    size: str,
    batch: int,
    steps: int,
    settings: dict[str, object],
    device_type: str,
    out: str,
    micro_batches: int = 1,
    sync_each: bool = False,
) -> None:
    import torch
    import torch.distributed as dist

    from srifty_core.sharding.wrap import gradient_sync, wrap

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = device_type == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=layout.world)
    try:
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        train = TrainingSettings(**settings)  # type: ignore[arg-type]
        del build(model, size, seed=0).module  # the libraries it imports are not its memory
        gc.collect()
        host_allocator.trim()
        before = torch.cuda.memory_allocated(device) if cuda else _status_bytes("VmRSS")
        workload = build(model, size, seed=0)
        if cuda and train.precision == "bf16-true":
            cast_to_bf16(workload)
        module = wrap(workload.module.to(device), layout, train, device, sync_each)
        optimizer = make_optimizer(train, module.parameters(), lr=1e-3)
        data = workload.make_batch(batch, device, seed=rank)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(train.precision)
        autocast = torch.autocast("cuda", dtype=dtype) if cuda and dtype else nullcontext()
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        else:
            host_allocator.trim()
            host_allocator.reset_peak_resident()
        losses = []
        sizes = micro_split(batch, micro_batches)  # the trainer's split
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            lo, total = 0, 0.0
            for j, m in enumerate(sizes):
                part = data if len(sizes) == 1 else tuple(t[lo : lo + m] for t in data)
                lo += m
                with gradient_sync(module, j == len(sizes) - 1):
                    with autocast:
                        loss = workload._loss(module, part) * (m / batch)
                    loss.backward()  # type: ignore[no-untyped-call]
                total += float(loss.detach().float().item())
            optimizer.step()
            losses.append(total)
        if cuda:
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device)
            held = torch.cuda.memory_allocated(device)
        else:
            peak = _status_bytes("VmHWM")
            host_allocator.trim()
            held = _status_bytes("VmRSS")
        Path(out, f"{rank}.json").write_text(
            json.dumps({"peak": peak - before, "held": held - before, "losses": losses})
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True, slots=True)
class RankReading:
    """One rank's bytes over its level before the model was built (module doc)."""

    peak: int
    """The most it held during the steps."""
    held: int
    """What it holds after the last optimizer step, gradients kept."""
    losses: tuple[float, ...] = ()
    """Each step's loss on this rank's batch."""


def rank_peaks(
    model: str,
    size: str,
    layout: Layout,
    batch: int,
    *,
    settings: TrainingSettings | None = None,
    steps: int = 2,
    device: str = "cpu",
    micro_batches: int = 1,
    sync_each: bool = False,
) -> list[RankReading]:
    """Each rank's reading (module doc), rank order. ``device``: ``cpu`` or ``cuda`` (one
    GPU per rank); ``micro_batches`` and ``sync_each`` as a plan's (module doc)."""
    import torch.multiprocessing as mp

    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device: must be 'cpu' or 'cuda', got {device!r}")
    settings = settings or TrainingSettings(optimizer="adamw")
    if not 1 <= micro_batches <= batch:
        raise ConfigError(
            f"micro_batches: must be between 1 and the batch {batch}, got {micro_batches}"
        )
    with tempfile.TemporaryDirectory(prefix="srifty-peaks-") as out:
        mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
            _rank,
            args=(
                layout,
                free_port(),
                model,
                size,
                batch,
                steps,
                settings.to_dict(),
                device,
                out,
                micro_batches,
                sync_each,
            ),
            nprocs=layout.world,
            join=True,
            start_method="spawn",
        )
        readings = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(layout.world)]
        return [RankReading(r["peak"], r["held"], tuple(r["losses"])) for r in readings]
