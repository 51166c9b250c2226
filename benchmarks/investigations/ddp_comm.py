"""Is DDP's gradient exchange slower than a plain allreduce of the same bytes?

Two gloo ranks on this machine (1 thread each, as the DDP workers run) train a one-
parameter model whose gradient is S bytes, in one DDP bucket. For each S, the median step
with DDP's allreduce, the same step with a no-op comm hook (forward, backward and DDP's
bookkeeping only), and a plain ``all_reduce`` of S bytes (what the probes measure). If
"step - no-op step" matches the plain allreduce, DDP adds nothing per byte on an idle
machine, and the simulator's error on this CPU (see ``simulator_reality.py``) comes from
the exchange sharing the cores with the backward pass, not from DDP itself.

Run:  .venv/bin/python benchmarks/investigations/ddp_comm.py [--repeats 12]
Writes benchmarks/results/ddp_comm.txt.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "results" / "ddp_comm.txt"
SIZES = tuple(2**k for k in (16, 18, 20, 22, 23, 24, 25, 26))


def _rank(rank: int, port: int, repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from srifty_core.profiling.buckets import skip_allreduce

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)

    class One(torch.nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.p = torch.nn.Parameter(torch.randn(n))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.p * x).sum()

    def timed(fn: Any) -> float:
        for _ in range(3):
            fn()
        samples = []
        for _ in range(repeats):
            dist.barrier()
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
        return statistics.median(samples)

    x = torch.ones(1)
    lines = [f"{'size':>9s} {'DDP step':>9s} {'no-op hook':>10s} {'DDP exch.':>9s} "
             f"{'allreduce':>9s} {'ratio':>6s}   (ms, median of {repeats})"]  # fmt: skip
    for size in SIZES:
        row = {}
        for mode in ("ddp", "noop"):
            model = DDP(One(size // 4), bucket_cap_mb=1024)
            if mode == "noop":
                model.register_comm_hook(None, skip_allreduce)

            def step(m: Any = model) -> None:
                m.zero_grad(set_to_none=True)
                m(x).backward()

            row[mode] = timed(step)
        buf = torch.randn(size // 4)
        row["raw"] = timed(lambda b=buf: dist.all_reduce(b))
        exch = row["ddp"] - row["noop"]
        lines.append(
            f"{size / 2**20:7.2f}MB {row['ddp'] * 1e3:9.2f} {row['noop'] * 1e3:10.2f} "
            f"{exch * 1e3:9.2f} {row['raw'] * 1e3:9.2f} {exch / row['raw']:6.2f}"
        )
        if rank == 0:
            print(lines[-1], flush=True)
    if rank == 0:
        Path(out).write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    from srifty_core.lifetime import free_port

    args.out.parent.mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank, args=(free_port(), args.repeats, str(args.out)), nprocs=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
