"""Where in a step does an FSDP2 (or DDP) rank's memory go? Two gloo ranks train
``hf:gpt2`` (full) one AdamW step at batch 1; each rank prints its resident set (the heap
trimmed) over its level before the model was built, after each phase: build, wrap,
forward, backward, optimizer step, zero_grad. Levels, not peaks: what is held between
phases (docs/design/sharding.md#check-against-measured-memory).

Run:  .venv/bin/python benchmarks/investigations/fsdp_phases.py [fsdp ddp]
"""

from __future__ import annotations

import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from srifty_core import host_allocator
from srifty_core.lifetime import free_port
from srifty_core.sharding.memory import Layout, parse_strategy
from srifty_core.sharding.wrap import wrap
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import build, make_optimizer

MODEL, SIZE = "hf:gpt2", "full"


def rss_mib() -> int:
    host_allocator.trim()
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("no VmRSS")


def rank(r: int, port: int, strategy: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=r, world_size=2)
    settings = TrainingSettings(optimizer="adamw")
    del build(MODEL, SIZE).module  # the libraries it imports are not its memory
    gc.collect()
    base = rss_mib()
    levels = {}
    workload = build(MODEL, SIZE)
    levels["build"] = rss_mib() - base
    module = wrap(
        workload.module, Layout(parse_strategy(strategy), 2), settings, torch.device("cpu")
    )
    gc.collect()
    levels["wrap"] = rss_mib() - base
    optimizer = make_optimizer(settings, module.parameters(), lr=1e-3)
    batch = workload.make_batch(1, torch.device("cpu"))
    loss = workload._loss(module, batch)
    levels["forward"] = rss_mib() - base
    loss.backward()  # type: ignore[no-untyped-call]
    del loss
    levels["backward"] = rss_mib() - base
    optimizer.step()
    levels["step"] = rss_mib() - base
    optimizer.zero_grad(set_to_none=True)
    levels["zero_grad"] = rss_mib() - base
    print(strategy, f"rank {r}", " ".join(f"{k} {v}" for k, v in levels.items()), "MiB", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    for strategy in sys.argv[1:] or ["fsdp", "ddp"]:
        mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
            rank, args=(free_port(), strategy), nprocs=2, join=True, start_method="spawn"
        )
