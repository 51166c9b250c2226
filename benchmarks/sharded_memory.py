"""The per-rank memory model (``sharding.memory``) against measured memory: each layout
trains the model on local gloo processes (``measure.sharded_memory.rank_peaks``: the
resident set's peak over its level before the model was built) and the model predicts
the same rank from the model's unit sizes and the activations per sample measured by
the one-process runs at two batches (``--batches``). Two readings per rank: the peak
during the steps, and what it holds after the optimizer step (the training state: its
prediction is the state less FSDP's gathered units, which are resharded by then).

Run:  .venv/bin/python benchmarks/sharded_memory.py [--model hf:gpt2] [--size full]
Writes benchmarks/results/sharded_memory.json. About 2 minutes for gpt2 full on this
2-core host when quiet (about 3 GB per rank).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from srifty_core.measure.sharded_memory import rank_peaks
from srifty_core.sharding.memory import Layout, ModelMemory, parse_strategy, rank_memory
from srifty_core.sharding.units import unit_parameters
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import build

MIB = 2**20
OUT = Path(__file__).parent / "results" / "sharded_memory.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="hf:gpt2")
    ap.add_argument("--size", default="full")
    ap.add_argument("--batches", type=int, nargs=2, default=(1, 4))
    ap.add_argument("--layouts", nargs="+", default=["ddp:2", "fsdp:2"])
    args = ap.parse_args()
    settings = TrainingSettings(optimizer="adamw")
    units = unit_parameters(build(args.model, args.size).module)
    b1, b2 = args.batches
    # activations per sample, measured: one process (DDP of one: its buckets are in both)
    one = [rank_peaks(args.model, args.size, Layout("ddp", 1), b, settings=settings)[0].peak
           for b in (b1, b2)]  # fmt: skip
    per_sample = (one[1] - one[0]) / (b2 - b1)
    rows = []
    for spec in args.layouts:
        strategy, world = spec.split(":")
        layout = Layout(parse_strategy(strategy, "--layouts"), int(world))
        for b in (b1, b2):
            t0 = time.perf_counter()
            measured = rank_peaks(args.model, args.size, layout, b, settings=settings)
            model = ModelMemory(units, per_sample)
            r = rank_memory(model, settings, layout, b)
            held = r.parameters + r.gradients + r.optimizer
            if strategy == "ddp":
                held += r.communication  # DDP's buckets stay; FSDP's units are resharded
            row = {
                "layout": spec, "batch": b,
                "measured_mib": [round(m.peak / MIB) for m in measured],
                "predicted_mib": round(r.total / MIB),
                "error": [round(r.total / m.peak - 1, 3) for m in measured],
                "held_mib": [round(m.held / MIB) for m in measured],
                "predicted_held_mib": round(held / MIB),
                "held_error": [round(held / m.held - 1, 3) for m in measured],
                "seconds": round(time.perf_counter() - t0, 1),
            }  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(
        json.dumps(
            {"model": args.model, "size": args.size, "units": units,
             "one_process_mib": [round(m / MIB) for m in one],
             "per_sample_mib": round(per_sample / MIB, 1), "rows": rows},
            indent=1,
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
