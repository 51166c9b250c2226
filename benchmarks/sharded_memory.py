"""The per-rank memory model (``sharding.memory``) against measured memory: each layout
trains the model on local gloo processes (``measure.sharded_memory.rank_peaks``: the
resident set's peak over its level before the model was built) and the model predicts
the same rank from the model's unit sizes and the activations per sample measured by
the one-process runs at two batches (``--batches``). Two readings per rank: the peak
during the steps, and what it holds after the optimizer step (the training state: its
prediction is the state less FSDP's gathered units, which are resharded by then).

With ``--accumulate K``: each sharded layout at the larger batch in K micro-batches, the
exchange held back to the last (each rank keeps every unsharded gradient: the model's
``accumulating=True``) and reduce-scattered on every one (``sync_each``), against the
model at a micro-batch.

Run:  .venv/bin/python benchmarks/sharded_memory.py [--model hf:gpt2] [--size full]
      [--accumulate K]
Writes benchmarks/results/sharded_memory.json (with --accumulate:
sharded_memory_accumulate.json). About 2 minutes for gpt2 full on this 2-core host when
quiet (about 3 GB per rank).
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
    ap.add_argument("--accumulate", type=int, default=0, metavar="K")
    args = ap.parse_args()
    settings = TrainingSettings(optimizer="adamw")
    units = unit_parameters(build(args.model, args.size).module)
    b1, b2 = args.batches
    # activations per sample, measured: one process (DDP of one: its buckets are in both)
    one = [rank_peaks(args.model, args.size, Layout("ddp", 1), b, settings=settings)[0].peak
           for b in (b1, b2)]  # fmt: skip
    per_sample = (one[1] - one[0]) / (b2 - b1)
    if args.accumulate > 1:
        accumulate(args, settings, units, per_sample, one)
        return
    rows = []
    for spec, layout in _layouts(args):
        for b in (b1, b2):
            t0 = time.perf_counter()
            measured = rank_peaks(args.model, args.size, layout, b, settings=settings)
            model = ModelMemory(units, per_sample)
            r = rank_memory(model, settings, layout, b)
            held = r.parameters + r.gradients + r.optimizer
            if layout.strategy == "ddp":
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
    _write(OUT, args, units, one, per_sample, rows)


def accumulate(
    args: argparse.Namespace,
    settings: TrainingSettings,
    units: tuple[int, ...],
    per_sample: float,
    one: list[int],
) -> None:
    """``--accumulate K`` (module doc): both modes per sharded layout, peak and held."""
    k, batch = args.accumulate, args.batches[1]
    model = ModelMemory(units, per_sample)
    rows = []
    for spec, layout in _layouts(args):
        for sync_each in (False, True):
            t0 = time.perf_counter()
            measured = rank_peaks(args.model, args.size, layout, batch, settings=settings,
                                  micro_batches=k, sync_each=sync_each)  # fmt: skip
            r = rank_memory(model, settings, layout, -(-batch // k), accumulating=not sync_each)
            row = {
                "layout": spec, "batch": batch, "micro_batches": k,
                "mode": "sync_each" if sync_each else "held_back",
                "measured_mib": [round(m.peak / MIB) for m in measured],
                "predicted_mib": round(r.total / MIB),
                "error": [round(r.total / m.peak - 1, 3) for m in measured],
                "predicted_gradients_mib": round(r.gradients / MIB),
                "held_mib": [round(m.held / MIB) for m in measured],
                "seconds": round(time.perf_counter() - t0, 1),
            }  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    _write(OUT.with_name("sharded_memory_accumulate.json"), args, units, one, per_sample, rows)


def _layouts(args: argparse.Namespace) -> list[tuple[str, Layout]]:
    """``--layouts`` as given (``strategy:world``), each with its ``Layout``."""
    out = []
    for spec in args.layouts:
        strategy, world = spec.split(":")
        out.append((spec, Layout(parse_strategy(strategy, "--layouts"), int(world))))
    return out


def _write(
    out: Path,
    args: argparse.Namespace,
    units: tuple[int, ...],
    one: list[int],
    per_sample: float,
    rows: list[dict[str, object]],
) -> None:
    """The run's results file: the model, its one-process readings and the rows."""
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {"model": args.model, "size": args.size, "units": units,
             "one_process_mib": [round(m / MIB) for m in one],
             "per_sample_mib": round(per_sample / MIB, 1), "rows": rows},
            indent=1,
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
