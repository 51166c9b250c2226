"""Planner speed with each bandwidth model: seconds per `plan()` on random requests of 1-8
offered types, with the simulator's bandwidth prefetch (one model call per request) and
without it (one call per new world size, as before), measured in the same run.

Requests: a zoo model, 1-8 on-demand types of the emulated EC2 catalog (quota 2-8), a
power-of-two global batch, emulated profiles (3 VMs) and one probe sweep of every type
(2 allocations) fitted by the probe table and by the XGBoost model (default parameters).
Times are wall-clock on a shared machine: read the ratios, measured back to back.
Run:  .venv/bin/python benchmarks/planner_speed.py [--requests 30] [--seed 0]
Writes benchmarks/results/planner_speed.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).parent / "results"
TYPES = (
    "g4dn.xlarge",
    "g4dn.2xlarge",
    "g4dn.12xlarge",
    "g5.xlarge",
    "g5.12xlarge",
    "p3.2xlarge",
    "p3.8xlarge",
    "g3.8xlarge",
)
MODELS = ("resnet50", "vgg16", "alexnet", "bert_base", "inception_v3", "shufflenet_v2")
REGION = "us-east-1"


def requests(n: int, seed: int) -> list[Any]:
    from srifty_core.case_studies import one_core
    from srifty_core.catalog import Catalog
    from srifty_core.cloud.emulated.measurements import emulated_profiles
    from srifty_core.planner.request import Overheads, PlanRequest, offers_from_catalog
    from srifty_core.profiling.store import load_reference_profile
    from srifty_core.simulator.types import Workload

    catalog = Catalog.load()
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        model = str(rng.choice(MODELS))
        k = 1 + len(out) % 8  # 1..8 types, evenly
        names = [str(x) for x in rng.choice(TYPES, size=k, replace=False)]
        ref = load_reference_profile(model)[0]
        try:
            profiles = emulated_profiles(
                names, ref, seed=len(out), catalog=catalog, reference_rate=one_core()
            )
            spec = [{"type": t, "quota": int(rng.integers(2, 9))} for t in names]
            out.append(
                PlanRequest(
                    workload=Workload(model, profiles),
                    global_batch=int(2 ** rng.integers(6, 11)),
                    iterations=1000,
                    offers=offers_from_catalog(catalog, spec, REGION),
                    overheads=Overheads(launch_s=0.0),
                )
            )
        except Exception:  # a model that does not fit a type's memory, a batch too small
            continue
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT / "planner_speed.json")
    args = parser.parse_args()

    from srifty_core.cloud.emulated.measurements import emulated_probe_sweep
    from srifty_core.planner.search import plan
    from srifty_core.predictors.bandwidth import BandwidthModel
    from srifty_core.predictors.table import ProbeTableBandwidth
    from srifty_core.simulator.estimator import Simulator

    reqs = requests(args.requests, args.seed)
    frame = emulated_probe_sweep(
        list(TYPES), world_sizes=(2, 4, 8, 16, 32), allocations=2, seed=args.seed
    ).to_pandas()
    models = {"table": ProbeTableBandwidth().fit(frame), "xgboost": BandwidthModel().fit(frame)}

    class NoPrefetch(Simulator):
        """The simulator as before: curves asked one world size at a time."""

        def prefetch(self, *args: Any, **kwargs: Any) -> None:
            return None

    report: dict[str, Any] = {"requests": len(reqs), "seed": args.seed, "models": {}}
    for name, bw in models.items():
        rows = []
        for r in reqs:
            times = {}
            labels = {}
            for mode, sim in (("prefetch", Simulator(bw)), ("one_by_one", NoPrefetch(bw))):
                t = time.perf_counter()
                res = plan(r, sim)
                times[mode] = time.perf_counter() - t
                labels[mode] = res.best.label if res.best else None
            assert labels["prefetch"] == labels["one_by_one"], "prefetch changed a plan"
            rows.append({"offers": len(r.offers), "method": res.method, **times})
        fast = [x["prefetch"] for x in rows]
        slow = [x["one_by_one"] for x in rows]
        summary = {
            "median_s": statistics.median(fast),
            "max_s": max(fast),
            "one_by_one_median_s": statistics.median(slow),
            "one_by_one_max_s": max(slow),
            "speedup_total": sum(slow) / sum(fast),
            "rows": rows,
        }
        report["models"][name] = summary
        print(
            f"{name:8s} prefetch: median {summary['median_s']:.3f} s, max "
            f"{summary['max_s']:.3f} s | one by one: median "
            f"{summary['one_by_one_median_s']:.3f} s, max {summary['one_by_one_max_s']:.3f} s"
            f" | x{summary['speedup_total']:.1f} in total"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
