"""Planner speed with strategy ``auto`` against ``ddp`` alone, measured back to back per
request in one run (issue 50).

Two sets, one XGBoost bandwidth model fitted on an emulated probe sweep of the types:

- ``fit``: ``planner_speed.py``'s random requests (zoo models on 1-8 emulated EC2 types,
  emulated profiles): models that fit; ``auto`` searches a sharded strategy only where it
  holds local batches ddp cannot, so the ratio is what ``auto`` costs where it changes
  nothing (the plans are asserted equal where ddp won).
- ``decoder``: ``hf:gpt2-xl`` (1.6 B parameters, AdamW, bf16) on random mixes of T4/A10G/V100
  types with 1 or 4 GPUs (estimated profiles from the shipped census): no replica fits, so
  ``ddp`` has no plan; ``auto`` against ``fsdp`` pinned.

The reference (``ddp``, ``fsdp``) runs again after ``auto``: its ratio to the first run is
the noise floor of the ratios. For the decoder, ``auto`` also runs without the search on
fewer VMs in micro-batches (``planner.strategies.fewer_vms`` replaced, here only, by one
that finds nothing): what that search gains on the objective, and costs in time.

Times are wall-clock on a shared machine: read the ratios.
Run:  .venv/bin/python benchmarks/strategy_speed.py [--requests 24] [--seed 0]
Writes benchmarks/results/strategy_speed.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.planner_speed import REGION, TYPES, requests

OUT = Path(__file__).parent / "results"
DECODER_TYPES = ("g4dn.xlarge", "g5.xlarge", "p3.2xlarge", "g4dn.12xlarge", "g5.12xlarge")


def decoder_requests(n: int, seed: int) -> list[Any]:
    from srifty_core.planner.job import load_request

    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        k = int(rng.integers(1, len(DECODER_TYPES) + 1))
        names = [str(x) for x in rng.choice(DECODER_TYPES, size=k, replace=False)]
        spec = {
            "model": "hf:gpt2-xl",
            "optimizer": "adamw",
            "precision": "bf16",
            "region": REGION,
            "global_batch": int(2 ** rng.integers(4, 7)),
            "iterations": 1000,
            "objective": str(rng.choice(["time", "cost"])),
            "offers": [
                {"type": t, "market": "on-demand", "quota": int(rng.integers(2, 9))} for t in names
            ],
        }
        try:
            out.append(load_request(spec))
        except Exception:  # the quotas hold too little of the global batch
            continue
    return out


def objective_value(r: Any, res: Any) -> float | None:
    best = res.best
    if best is None:
        return None
    return float(best.cost_usd if r.objective.value == "cost" else best.time_s)


def without_fewer_vms(r: Any, sim: Any) -> tuple[float, Any]:
    """``timed`` with ``fewer_vms`` finding nothing (the search before it)."""
    from srifty_core.planner import strategies

    real = strategies.fewer_vms
    strategies.fewer_vms = lambda *_args: []  # type: ignore[assignment]
    try:
        return timed(r, sim)
    finally:
        strategies.fewer_vms = real


def timed(r: Any, sim: Any) -> tuple[float, Any]:
    from srifty_core.planner.search import plan

    t = time.perf_counter()
    res = plan(r, sim)
    return time.perf_counter() - t, res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT / "strategy_speed.json")
    args = parser.parse_args()
    os.environ.setdefault("SRIFTY_DATA_DIR", tempfile.mkdtemp(prefix="strategy-speed-"))

    from srifty_core.cloud.emulated.measurements import emulated_probe_sweep
    from srifty_core.predictors.bandwidth import BandwidthModel
    from srifty_core.simulator.estimator import Simulator

    types = sorted({*TYPES, *DECODER_TYPES})
    frame = emulated_probe_sweep(
        types, world_sizes=(2, 4, 8, 16, 32), allocations=2, seed=args.seed
    ).to_pandas()
    bw = BandwidthModel().fit(frame)
    report: dict[str, Any] = {"seed": args.seed, "sets": {}}

    rows = []
    for r in requests(args.requests, args.seed):
        t_ddp, ddp = timed(dataclasses.replace(r, strategy="ddp"), Simulator(bw))
        t_auto, auto = timed(dataclasses.replace(r, strategy="auto"), Simulator(bw))
        t_again, _ = timed(dataclasses.replace(r, strategy="ddp"), Simulator(bw))
        if auto.strategy == "ddp":
            assert (auto.best and auto.best.label) == (ddp.best and ddp.best.label)
        searched = "replicas hold every local batch" not in auto.strategy_reason
        rows.append(
            {
                "ddp_s": t_ddp,
                "auto_s": t_auto,
                "again_s": t_again,
                "strategy": auto.strategy,
                "searched": searched,
            }
        )
    report["sets"]["fit"] = summary("fit", rows, "ddp_s")

    rows = []
    for r in decoder_requests(args.requests, args.seed):
        t_fsdp, _ = timed(dataclasses.replace(r, strategy="fsdp"), Simulator(bw))
        t_auto, auto = timed(r, Simulator(bw))
        t_again, _ = timed(dataclasses.replace(r, strategy="fsdp"), Simulator(bw))
        t_before, before = without_fewer_vms(r, Simulator(bw))
        now, then = objective_value(r, auto), objective_value(r, before)
        rows.append(
            {
                "fsdp_s": t_fsdp,
                "auto_s": t_auto,
                "again_s": t_again,
                "strategy": auto.strategy,
                "method": auto.method,
                "feasible": auto.best is not None,
                "objective": r.objective.value,
                "micro_batches": auto.micro_batches,
                "without_fewer_vms_s": t_before,
                "fewer_vms_gain": None if now is None or then is None else now / then - 1,
            }
        )
    report["sets"]["decoder"] = summary("decoder", rows, "fsdp_s")
    gains = [x["fewer_vms_gain"] for x in rows if x["fewer_vms_gain"] is not None]
    better = [g for g in gains if g < -1e-9]
    report["sets"]["decoder"]["fewer_vms"] = {
        "improved": len(better),
        "worse": sum(g > 1e-9 for g in gains),
        "of": len(gains),
        "median_gain_improved": statistics.median(better) if better else 0.0,
        "best_gain": min(gains, default=0.0),
        "time_ratio_total": sum(x["auto_s"] for x in rows)
        / sum(x["without_fewer_vms_s"] for x in rows),
    }
    fewer = report["sets"]["decoder"]["fewer_vms"]
    print(f"decoder, the search on fewer VMs in micro-batches: {fewer}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


def summary(name: str, rows: list[dict[str, Any]], base: str) -> dict[str, Any]:
    auto = [x["auto_s"] for x in rows]
    ref = [x[base] for x in rows]
    ratios = [a / b for a, b in zip(auto, ref, strict=True)]
    again = [x["again_s"] for x in rows]
    floor = [a / b for a, b in zip(again, ref, strict=True)]
    picked: dict[str, int] = {}
    for x in rows:
        picked[x["strategy"]] = picked.get(x["strategy"], 0) + 1
    out = {
        "requests": len(rows),
        "auto_median_s": statistics.median(auto),
        "auto_max_s": max(auto),
        f"{base[:-2]}_median_s": statistics.median(ref),
        f"{base[:-2]}_max_s": max(ref),
        "ratio_total": sum(auto) / sum(ref),
        "ratio_median": statistics.median(ratios),
        "ratio_max": max(ratios),
        "noise_total": sum(again) / sum(ref),
        "noise_median": statistics.median(floor),
        "noise_range": [min(floor), max(floor)],
        "picked": picked,
        "rows": rows,
    }
    print(
        f"{name}: {len(rows)} requests, auto median {out['auto_median_s']:.3f} s (max "
        f"{out['auto_max_s']:.3f}), {base[:-2]} median {out[f'{base[:-2]}_median_s']:.3f} s; "
        f"auto/{base[:-2]} total x{out['ratio_total']:.2f}, median x{out['ratio_median']:.2f}, "
        f"max x{out['ratio_max']:.2f}; noise floor ({base[:-2]} twice) total "
        f"x{out['noise_total']:.2f}, median x{out['noise_median']:.2f}, range "
        f"x{min(floor):.2f}-{max(floor):.2f}; picked {picked}"
    )
    return out


if __name__ == "__main__":
    main()
