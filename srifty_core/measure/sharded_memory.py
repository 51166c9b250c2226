"""Measure what each rank holds at its peak while training a model under a strategy, on
local CPU processes over gloo: the evidence ``sharding.memory`` is checked against.

Contract: ``rank_peaks(model, size, layout, batch)`` starts ``layout.world`` processes,
each builds the model (``workloads.build``: any model reference), wraps it
(``sharding.wrap``), takes ``steps`` AdamW/SGD steps at the local ``batch`` and reports,
over its resident set before the model was built: the peak during those steps (Linux:
``VmHWM`` reset through ``/proc/self/clear_refs`` after wrapping, the heap trimmed first)
and what it holds after the last optimizer step (the heap trimmed: the training state with
its gradients, no activations). Parameters, gradients, optimizer states, buffers and
activations are all in the peak, with what gloo, FSDP and autograd allocate on the way;
the import of torch itself is not.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from srifty_core import host_allocator
from srifty_core.errors import SriftyError
from srifty_core.lifetime import free_port
from srifty_core.sharding.memory import Layout
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import build, make_optimizer


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise SriftyError(f"/proc/self/status has no {field}")


def _rank(
    rank: int,
    layout: Layout,
    port: int,
    model: str,
    size: str,
    batch: int,
    steps: int,
    settings: dict[str, object],
    out: str,
) -> None:
    import torch
    import torch.distributed as dist

    from srifty_core.sharding.wrap import wrap

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=layout.world)
    try:
        device = torch.device("cpu")
        del build(model, size, seed=0).module  # the libraries it imports are not its memory
        gc.collect()
        host_allocator.trim()
        before = _status_bytes("VmRSS")
        workload = build(model, size, seed=0)
        module = wrap(workload.module, layout, TrainingSettings(**settings), device)  # type: ignore[arg-type]
        optimizer = make_optimizer(TrainingSettings(**settings), module.parameters(), lr=1e-3)  # type: ignore[arg-type]
        data = workload.make_batch(batch, device, seed=rank)
        host_allocator.trim()
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            workload._loss(module, data).backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        peak = _status_bytes("VmHWM")
        host_allocator.trim()
        held = _status_bytes("VmRSS")
        Path(out, f"{rank}.json").write_text(
            json.dumps({"peak": peak - before, "held": held - before})
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


def rank_peaks(
    model: str,
    size: str,
    layout: Layout,
    batch: int,
    *,
    settings: TrainingSettings | None = None,
    steps: int = 2,
) -> list[RankReading]:
    """Each rank's reading (module doc), rank order."""
    import torch.multiprocessing as mp

    settings = settings or TrainingSettings(optimizer="adamw")
    with tempfile.TemporaryDirectory(prefix="srifty-peaks-") as out:
        mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
            _rank,
            args=(layout, free_port(), model, size, batch, steps, settings.to_dict(), out),
            nprocs=layout.world,
            join=True,
            start_method="spawn",
        )
        readings = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(layout.world)]
        return [RankReading(r["peak"], r["held"]) for r in readings]
