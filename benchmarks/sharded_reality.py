"""Is the sharded simulator right about real FSDP2 training? Predict, then run, on this host.

1. Probe all_reduce, all_gather and reduce_scatter on local workers (gloo, world size 2)
   into a probe store; fit the probe-table bandwidth predictor on it.
2. Profile the model on the CPU (1 thread per rank, 4 budgeted probes, the slowdown of two
   ranks sharing the host measured), as ``srifty profile`` does.
3. Per case (local batches of the two ranks) and strategy (ddp, fsdp), predict the
   iteration with the simulator (``simulator.sharded`` for fsdp) from those probes and
   that profile only; then train the plan with the runtime's own worker (two gloo
   processes, ``sharding.wrap``) and read each step's time from its progress log.

The measured value is a case's mean step after the first ``--warmup`` (what a job's time
is made of); every case is measured twice, and how far the two measurements of one case
differ is the noise floor of this host. Writes
``benchmarks/results/sharded_reality.json`` (or ``--out``).

Run:  .venv/bin/python benchmarks/sharded_reality.py [--model hf:gpt2] [--size small]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from srifty_core.atomic import write_text_atomic

OUT = Path(__file__).parent / "results" / "sharded_reality.json"
CASES = [(4, 4), (8, 8), (4, 12)]
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def measure(
    model: str, size: str, strategy: str, a: int, b: int, iterations: int, warmup: int, root: Path
) -> list[float]:
    """Each step's seconds after ``warmup`` of a real 2-rank run through the worker."""
    from srifty_core.planner.schema.train_plan import TrainPlan
    from srifty_core.runs.progress import read_progress
    from srifty_core.worker.worker import run_spawned

    run_dir = Path(tempfile.mkdtemp(prefix=f"{strategy}-{a}-{b}-", dir=root))
    plan = TrainPlan(
        model=model,
        size=size,
        global_batch=a + b,
        iterations=iterations,
        local_batches=(a, b),
        run_dir=str(run_dir),
        checkpoint_every=iterations,
        strategy=strategy,
        optimizer="adamw",
        threads=1,
        timeout_s=300.0,
    )
    run_spawned(plan)
    return [r.step_s for r in read_progress(plan.progress_path)][warmup:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="hf:gpt2")
    ap.add_argument("--size", default="small")
    ap.add_argument("--iterations", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--data-dir", type=Path, help="reuse the probes and the profile kept here")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="srifty-sharded-reality-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    from srifty_core.measure.sweep import probe_sweep
    from srifty_core.predictors.table import ProbeTableBandwidth
    from srifty_core.probing.config import SweepConfig, parse_sizes
    from srifty_core.probing.store import read_probes
    from srifty_core.profiling.config import ProfilerConfig
    from srifty_core.profiling.profiler import profile_model
    from srifty_core.profiling.store import ProfileNotFoundError, ProfileStore
    from srifty_core.sharding.units import unit_parameters
    from srifty_core.simulator.estimator import Simulator
    from srifty_core.simulator.sharded import ShardedSimulator
    from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload
    from srifty_core.training_settings import TrainingSettings
    from srifty_core.workloads import build

    store_dir = root / "probes"
    if not list(store_dir.glob("**/*.parquet")):
        print("probing all_reduce, all_gather, reduce_scatter (gloo, 2 ranks) ...", flush=True)
        sweep = SweepConfig(
            sizes=parse_sizes("4B:64MB", points_per_decade=4),
            world_sizes=(2,),
            concurrency=(1,),
            repeats=5,
            allocations=2,
            collectives=COLLECTIVES,
        )
        probe_sweep(sweep, root=store_dir).raise_for_failures()
    probes = read_probes(root=store_dir)
    bandwidth = ProbeTableBandwidth().fit(probes)
    settings = TrainingSettings(optimizer="adamw")
    profiles = ProfileStore(root / "profiles")
    b_max = max(max(c) for c in CASES)
    try:
        profile = profiles.load(args.model, args.size, "cpu", settings=settings)
    except ProfileNotFoundError:
        print(f"profiling {args.model} ({args.size}), B_max {b_max} ...", flush=True)
        profile = profile_model(
            args.model,
            args.size,
            ProfilerConfig(max_batch=b_max, threads=1, share_host=2, settings=settings),
        )
        profiles.save(profile)
    units = unit_parameters(build(args.model, args.size).module)
    workload = Workload(args.model, {"cpu": profile}, unit_parameters=units)
    instance = SimInstance.local_cpu()
    sim = Simulator(bandwidth, iters=512, seed=0)
    predictors = {"ddp": sim, "fsdp": ShardedSimulator(sim, "fsdp")}

    rows = []
    for rep in (0, 1):
        for a, b in CASES:
            if a == b:
                config = ClusterConfig((Group(instance, 2, a),))
            else:
                config = ClusterConfig((Group(instance, 1, a), Group(instance, 1, b)))
            for strategy, predictor in predictors.items():
                steps = measure(
                    args.model, args.size, strategy, a, b, args.iterations, args.warmup, root
                )
                mean = statistics.fmean(steps)
                if rep == 0:
                    est = predictor.estimate(workload, config)
                    rows.append(
                        {
                            "strategy": strategy,
                            "batches": [a, b],
                            "predicted_s": est.t_iter,
                            "predicted_p90_s": est.t_iter_p90,
                            "measured_mean_s": mean,
                            "measured_median_s": statistics.median(steps),
                        }
                    )
                    print(
                        f"{strategy:5s} {a:2d}+{b:<2d} measured {mean * 1e3:7.1f} ms, "
                        f"predicted {est.t_iter * 1e3:7.1f} ms "
                        f"({100 * (est.t_iter - mean) / mean:+5.1f}%)",
                        flush=True,
                    )
                else:
                    row = next(
                        r for r in rows if r["strategy"] == strategy and r["batches"] == [a, b]
                    )
                    row["measured_again_mean_s"] = mean

    summary: dict[str, Any] = {}
    for strategy in predictors:
        mine = [r for r in rows if r["strategy"] == strategy]
        errs = [(r["predicted_s"] - r["measured_mean_s"]) / r["measured_mean_s"] for r in mine]
        floor = [
            abs(r["measured_again_mean_s"] - r["measured_mean_s"]) / r["measured_mean_s"]
            for r in mine
        ]
        summary[strategy] = {
            "mape_pct": 100 * statistics.fmean(abs(e) for e in errs),
            "mean_signed_pct": 100 * statistics.fmean(errs),
            "too_fast": f"{sum(e < 0 for e in errs)} of {len(errs)}",
            "noise_floor_pct": 100 * statistics.fmean(floor),
        }
        s = summary[strategy]
        print(
            f"{strategy}: MAPE {s['mape_pct']:.1f}% (mean {s['mean_signed_pct']:+.1f}%, too fast "
            f"in {s['too_fast']}); noise floor (two measurements of a case) "
            f"{s['noise_floor_pct']:.1f}%"
        )
    result = {
        "model": args.model,
        "size": args.size,
        "units": list(units),
        "probe_rows": len(probes),
        "iterations": args.iterations,
        "warmup": args.warmup,
        "rows": rows,
        "summary": summary,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['seconds']} s")


if __name__ == "__main__":
    main()
