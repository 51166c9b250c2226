"""FSDP2's own work per unit on a GPU: what ``ComputeProfile.fsdp_overhead`` measures.

    python3 benchmarks/gpu_fsdp_overhead.py --out <folder>             # on an NVIDIA GPU
    python3 benchmarks/gpu_fsdp_overhead.py --device cpu --size tiny --models hf:gpt2 \\
        --batches 2 --out <folder>                                      # the same on a CPU

Per model, precision and batch: the plain step's forward and backward (the profiler's
timing, between device synchronisations) and ``profiling.overheads.fsdp_overhead`` (a copy
of the model under ``fully_shard`` over a process group of one, minus the plain step, per
unit; the optimizer step over DTensors minus over plain tensors), with the number of units
and what the overhead adds to a step as a share of it. Writes ``fsdp_overhead.json`` into
``--out``. On the CPU host ``benchmarks/sharded_reality.py`` checks the term against real
2-rank training; on one GPU there is no ring, so this reports its size beside the compute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from srifty_core.profiling.config import ProfilerConfig
from srifty_core.profiling.device import resolve_device
from srifty_core.profiling.overheads import fsdp_overhead
from srifty_core.profiling.timing import measure_latency
from srifty_core.sharding.units import shard_units
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import build, prepare


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="hf:gpt2,hf:gpt2-xl")
    ap.add_argument("--size", default="full")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--batches", default="4,16")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cpu":
        torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for model in args.models.split(","):
        for precision in args.precisions.split(","):
            settings = TrainingSettings(precision=precision, optimizer="adamw")
            try:
                workload = build(model, args.size, seed=0)
                workload.module.to(device).train()
                prepare(workload, settings, autocast=True)
                units = len(shard_units(workload.module)) + 1
                for batch in (int(b) for b in args.batches.split(",")):
                    config = ProfilerConfig(
                        repeats=args.repeats, warmup=2, device=args.device, settings=settings
                    )
                    data = workload.make_batch(batch, device, seed=0)
                    fw, bw = measure_latency(
                        workload, data, repeats=args.repeats, warmup=2, sync=sync
                    )
                    over = fsdp_overhead(workload, batch, config, device, sync).overhead
                    plain = statistics.median(fw) + statistics.median(bw)
                    added = units * (over[0] + over[1]) + over[2] if over else float("nan")
                    row = {
                        "model": model,
                        "size": args.size,
                        "precision": precision,
                        "batch": batch,
                        "units": units,
                        "plain_fw_ms": statistics.median(fw) * 1e3,
                        "plain_bw_ms": statistics.median(bw) * 1e3,
                        "fsdp_overhead_ms": [x * 1e3 for x in over],
                        "added_ms": added * 1e3,
                        "added_share_of_step": added / plain,
                    }
                    rows.append(row)
                    print(
                        f"[{time.perf_counter() - t0:7.1f}s] {model} {precision} batch {batch}: "
                        f"{units} units, plain fw {row['plain_fw_ms']:.2f} bw "
                        f"{row['plain_bw_ms']:.2f} ms; FSDP2 per unit fw "
                        f"{row['fsdp_overhead_ms'][0]:.3f} bw {row['fsdp_overhead_ms'][1]:.3f} "
                        f"ms, step +{row['fsdp_overhead_ms'][2]:.2f} ms: +{row['added_ms']:.1f} "
                        f"ms a step ({row['added_share_of_step']:.0%})",
                        flush=True,
                    )
                del workload
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            except Exception as exc:  # one model's failure is reported, the rest run
                rows.append({"model": model, "precision": precision, "error": repr(exc)[:500]})
                print(f"{model} {precision}: FAILED {exc!r}"[:600], flush=True)
    env = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    out: dict[str, Any] = {"benchmark": "gpu_fsdp_overhead", "environment": env, "rows": rows}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    (args.out / "fsdp_overhead.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
