"""Is the exchange exposed by real DDP training longer than the same allreduces alone?

Two gloo ranks (1 thread each) on this host, which leaves no core spare for gloo, train a
zoo model. Iteration by iteration they alternate: a DDP step, the same step with a no-op
comm hook (compute and DDP's bookkeeping), the allreduce of buffers the size of DDP's
buckets launched together (what the probes see; the faster rank's time, since the rank
that arrived last waits for nobody), and a pass dividing those buffers by the world size
(shown, not subtracted: DDP's built-in path divides while it copies each gradient into its
bucket, which the no-op step does too, so the DDP step makes no such pass; the factors of
``benchmarks/results/ddp_exchange.txt`` predate this and subtracted it). Per model:

    factor = (DDP step - no-op step) / allreduce alone     (medians)

1 means that what DDP exposes on this host is exactly the probed allreduce started after
the backward pass (the simulator's rule here). Alternating keeps a host that speeds up or
slows down during the run from biasing the ratio.

Run:  .venv/bin/python benchmarks/investigations/ddp_exchange.py
      [--iterations 12] [--cases dlrm:16,...]
Writes benchmarks/results/ddp_exchange.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def _noop(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads annotations
    """DDP comm hook that keeps each rank's gradients and notes the bucket sizes."""
    buf = bucket.buffer()
    state.append(buf.numel())
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _worker(
    rank: int,
    world: int,
    port: int,
    name: str,
    size: str,
    batch: int,
    threads: int,
    iterations: int,
    warmup: int,
    bucket_cap_bytes: int,
    out_dir: str,
) -> None:
    from srifty_core.workloads.zoo import build

    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        real = build(name, size, seed=0)
        quiet = build(name, size, seed=0)
        steps = []
        sizes: list[int] = []
        for w, hooked in ((real, False), (quiet, True)):
            w.module.train()
            ddp = nn.parallel.DistributedDataParallel(
                w.module, bucket_cap_mb=bucket_cap_bytes / 2**20
            )
            if hooked:
                ddp.register_comm_hook(sizes, _noop)
            w.module = ddp
            steps.append((w, ddp, w.make_batch(batch, torch.device("cpu"), seed=rank)))
        buffers: list[torch.Tensor] = []
        times: list[tuple[float, float, float, float]] = []
        for i in range(warmup + iterations):
            row = []
            for w, ddp, data in steps:
                sizes.clear()
                ddp.zero_grad(set_to_none=True)
                dist.barrier()
                t0 = time.perf_counter()
                w.loss(data).backward()
                row.append(time.perf_counter() - t0)
            if [b.numel() for b in buffers] != sizes:  # DDP rebuilds its buckets once
                buffers = [torch.ones(n) for n in sizes]
            dist.barrier()
            t0 = time.perf_counter()
            works = [dist.all_reduce(b, async_op=True) for b in buffers]
            for work in works:
                work.wait()
            row.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for b in buffers:
                b.div_(world)
            row.append(time.perf_counter() - t0)
            if i >= warmup:
                times.append((row[0], row[1], row[2], row[3]))
        gathered: list[list[tuple[float, float, float, float]] | None] = [None] * world
        dist.all_gather_object(gathered, times)
        if rank == 0:
            ranks = [g for g in gathered if g is not None]
            out = {
                "ddp": [max(r[i][0] for r in ranks) for i in range(iterations)],
                "noop": [max(r[i][1] for r in ranks) for i in range(iterations)],
                "alone": [min(r[i][2] for r in ranks) for i in range(iterations)],
                "scale": [max(r[i][3] for r in ranks) for i in range(iterations)],
            }
            with open(os.path.join(out_dir, "exchange.json"), "w") as fh:
                json.dump(out, fh)
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True, slots=True)
class ExchangeFactor:
    factor: float
    """Exposed exchange of DDP over the same allreduces alone (medians); >= 0."""
    ddp_s: float
    noop_s: float
    alone_s: float
    scale_s: float


def measure_exchange_factor(
    name: str,
    size: str,
    batch: int,
    *,
    threads: int = 1,
    world: int = 2,
    iterations: int = 12,
    warmup: int = 3,
    bucket_cap_bytes: int = 25 * 2**20,
) -> ExchangeFactor:
    import torch.multiprocessing as mp

    from srifty_core.lifetime import free_port

    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(
            _worker,
            args=(
                world,
                free_port(),
                name,
                size,
                batch,
                threads,
                iterations,
                warmup,
                bucket_cap_bytes,
                out_dir,
            ),
            nprocs=world,
            join=True,
        )
        with open(os.path.join(out_dir, "exchange.json")) as fh:
            d = json.load(fh)
    ddp, noop, alone, scale = (statistics.median(d[k]) for k in ("ddp", "noop", "alone", "scale"))
    factor = max(0.0, ddp - noop) / alone
    return ExchangeFactor(factor, ddp, noop, alone, scale)


CASES = "resnet18:8,resnet18:32,alexnet:8,alexnet:32,dlrm:16,dlrm:64,bert_base:4"
OUT = Path(__file__).resolve().parent.parent / "results" / "ddp_exchange.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--cases", default=CASES, help="model:batch,... (small models)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    lines = [
        f"{'model':10s} {'batch':>5s} {'DDP step':>9s} {'no-op':>7s} {'scaling':>7s} "
        f"{'alone':>7s} {'factor':>6s}   (ms, medians of {args.iterations}, {os.cpu_count()} cores)"
    ]
    print(lines[0], flush=True)
    for case in args.cases.split(","):
        name, batch = case.split(":")
        f = measure_exchange_factor(name, "small", int(batch), iterations=args.iterations)
        lines.append(
            f"{name:10s} {int(batch):5d} {f.ddp_s * 1e3:9.1f} {f.noop_s * 1e3:7.1f} "
            f"{f.scale_s * 1e3:7.1f} {f.alone_s * 1e3:7.1f} {f.factor:6.2f}"
        )
        print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
