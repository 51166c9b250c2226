"""A shared host's slowdown, measured in step with the other worker or at random moments?

The profile's ``shared_slowdown`` at 2 workers is a step beside a background worker doing
the same steps over the step alone, and its ``ddp_overhead`` at 2 a DDP step (a process
group of one, a no-op exchange) minus the plain step beside a worker doing DDP steps
(``srifty_core.profiling.overheads``). A job's ranks start every step together, so their
memory-bound phases fall at the same moment; a worker stepping at random moments of its
own meets them only by chance. This measures both ways in the same process, alternating
round by round (the host's drift falls on both; which goes first alternates too): per
round the slowdown (median plain step beside a plain worker over the median alone, just
before) and DDP's overhead (median DDP step minus median plain step beside a DDP worker),
``--repeats`` steps each.

Run:  .venv/bin/python benchmarks/investigations/ddp_lockstep.py
      [--models resnet18,dlrm] [--rounds 4]
(about a minute per model)
Writes benchmarks/results/ddp_lockstep.json (or --out).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from srifty_core.atomic import write_text_atomic

OUT = Path(__file__).resolve().parent.parent / "results"
MODELS = ("resnet18", "alexnet", "dlrm", "shufflenet_v2")


def overhead(name: str, batch: int, rounds: int, repeats: int) -> dict[str, Any]:
    """Per round and way (at random moments, in step): the slowdown beside one plain
    worker and DDP's overhead (ms) beside one DDP worker."""
    import torch
    import torch.distributed as dist

    from srifty_core import host_allocator
    from srifty_core.profiling.colocated import colocated_load, ddp_of_one
    from srifty_core.profiling.config import ProfilerConfig
    from srifty_core.profiling.timing import step_seconds
    from srifty_core.workloads.zoo import build

    host_allocator.steady()
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    config = ProfilerConfig(threads=1, repeats=repeats, warmup=2)
    plain = build(name, "small", seed=0)
    plain.module.train()
    wrapped = dataclasses.replace(plain, module=ddp_of_one(copy.deepcopy(plain.module), cpu))
    data = plain.make_batch(batch, cpu, seed=0)

    def median(w: Any, together: Any = None) -> float:
        return statistics.median(step_seconds(w, data, config, lambda: None, together))

    ways = {False: "random moments", True: "in step"}
    out: dict[str, dict[str, list[float]]] = {
        w: {"slowdown": [], "ddp_overhead_ms": []} for w in ways.values()
    }
    try:
        for r in range(rounds):
            for lockstep in (False, True) if r % 2 == 0 else (True, False):
                alone = median(plain)
                with colocated_load(
                    name, "small", batch, config, cpu, others=1, lockstep=lockstep
                ) as together:
                    shared = median(plain, together)
                with colocated_load(
                    name, "small", batch, config, cpu, others=1, ddp=True, lockstep=lockstep
                ) as together:
                    p, d = median(plain, together), median(wrapped, together)
                out[ways[lockstep]]["slowdown"].append(shared / alone)
                out[ways[lockstep]]["ddp_overhead_ms"].append(1e3 * (d - p))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return {
        "batch": batch,
        **{
            way: {k: {"per_round": v, "median": statistics.median(v)} for k, v in m.items()}
            for way, m in out.items()
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=lambda v: v.split(","), default=list(MODELS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=OUT / "ddp_lockstep.json")
    args = ap.parse_args()
    bad = [m for m in args.models if m not in MODELS]
    if bad:
        ap.error(f"--models: unknown {bad}; choose from {list(MODELS)}")
    for flag, least in (("batch", 1), ("rounds", 1), ("repeats", 2)):
        if getattr(args, flag) < least:
            ap.error(f"--{flag}: must be at least {least}")
    t0 = time.perf_counter()
    results = {}
    for name in args.models:
        res = overhead(name, args.batch, args.rounds, args.repeats)
        results[name] = res
        for way in ("random moments", "in step"):
            sd, ov = res[way]["slowdown"], res[way]["ddp_overhead_ms"]
            lo, hi = min(ov["per_round"]), max(ov["per_round"])
            print(
                f"{name:14s} {way:15s} slowdown beside one worker {sd['median']:.3f} "
                f"({min(sd['per_round']):.3f}..{max(sd['per_round']):.3f}), DDP's overhead "
                f"{ov['median']:+.2f} ms ({lo:+.1f}..{hi:+.1f})",
                flush=True,
            )
    print(f"{time.perf_counter() - t0:.0f} s")
    write_text_atomic(args.out, json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
