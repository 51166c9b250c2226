"""Planner at scale (issue 18): planning time, peak memory and plan quality from 1 to 12
offered types, quotas 4-64 and global batches 256-8192, against the exact optimum of the
same simulator where brute force is feasible, and against the previous planner (plain
exhaustive search up to 10,000 configurations, else the anchored ILP) in the same run.

Requests: ResNet-50 (``--model``), the first 1, 2, 4, 8 or 12 of twelve GPU types of the
emulated EC2 catalog (on-demand prices), every type the same quota, 1000 iterations, no
launch overhead. Emulated profiles (3 VMs per GPU) from the shipped reference profile and
one emulated probe sweep of the twelve types (2 allocations, world sizes 2-64, one mixed
ring) fitted by the probe table. Three requests per (types, quota, batch):

- ``time``: fastest, no limits;
- ``cost``: cheapest, no limits;
- ``cost|limit``: cheapest within a time limit of 1.2 x the fastest plan's time at risk
  (so the fastest plan is a feasible witness: the planner must not answer "infeasible").

Per request: the exact size of the pruned space, the search that answered (``exact``:
branch and bound run to the end, ``approx``: approximation plus a bounded branch and
bound), planning time (wall clock and this process's CPU, the lower of two runs, each
with a fresh simulator), peak memory of planning (tracemalloc, a third run), and where
the searched space has at most ``--brute`` configurations the ratio of the exact optimum
(every configuration simulated; its peak memory too) to the plan's objective (1 =
optimal), for the new planner, its approximation alone (no branch and bound) and the
previous planner. Times are of a shared 2-core machine: read the CPU column and the
ratios, measured back to back.

Run:  .venv/bin/python benchmarks/planner_scale.py [--quick] [--deep N]
(about 3 minutes; ``--quick``: 30 requests in under a minute). Writes
benchmarks/results/planner_scale.json (``--out``) and prints the summary table.
``--deep N``: also run the branch and bound to the end (at most N work units) on the
spaces too large for brute force, for the approximation's ratio there.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "results"
TYPES = (
    "g4dn.xlarge",
    "p3.2xlarge",
    "g5.xlarge",
    "g4dn.12xlarge",
    "g6.xlarge",
    "p3.8xlarge",
    "g3.4xlarge",
    "g5.12xlarge",
    "g6.12xlarge",
    "g3.8xlarge",
    "p4d.24xlarge",
    "p5.4xlarge",
)
OFFERS = (1, 2, 4, 8, 12)
QUOTAS = (4, 16, 64)
BATCHES = (256, 512, 1024, 2048, 4096, 8192)
QUICK = {"offers": (1, 4, 12), "quotas": (4, 64), "batches": (256, 8192), "brute": 5_000}
KINDS = ("time", "cost", "cost|limit")
BRUTE = 50_000
OLD_EXHAUSTIVE = 10_000
"""The previous planner's switch from the plain exhaustive search to the ILP."""
REGION = "us-east-1"
LIMIT_SLACK = 1.2


def setup(model: str, seed: int) -> tuple[Any, Any, Any]:
    """(catalog, workload, bandwidth model) for the twelve types."""
    from srifty_core.case_studies import one_core
    from srifty_core.catalog import Catalog
    from srifty_core.cloud.emulated.measurements import emulated_probe_sweep, emulated_profiles
    from srifty_core.predictors.table import ProbeTableBandwidth
    from srifty_core.profiling.store import load_reference_profile
    from srifty_core.simulator.types import Workload

    catalog = Catalog.load()
    ref = load_reference_profile(model)[0]
    profiles = emulated_profiles(
        list(TYPES), ref, seed=seed, catalog=catalog, reference_rate=one_core()
    )
    frame = emulated_probe_sweep(
        list(TYPES),
        world_sizes=(2, 4, 8, 16, 32, 64),
        allocations=2,
        seed=seed,
        mixes=({"g4dn.12xlarge": 1, "g4dn.xlarge": 2},),
    ).to_pandas()
    return catalog, Workload(model, profiles), ProbeTableBandwidth().fit(frame)


def make_request(catalog: Any, workload: Any, k: int, quota: int, batch: int, **kw: Any) -> Any:
    from srifty_core.planner.request import Overheads, PlanRequest, offers_from_catalog

    spec = [{"type": t, "market": "on-demand", "quota": quota} for t in TYPES[:k]]
    return PlanRequest(
        workload=workload,
        global_batch=batch,
        iterations=1000,
        offers=offers_from_catalog(catalog, spec, REGION),
        overheads=Overheads(launch_s=0.0),
        **kw,
    )


def timed(fn: Callable[[], Any], runs: int) -> tuple[Any, float, float]:
    """(result of the last run, least wall seconds, least CPU seconds) over ``runs``."""
    wall = cpu = math.inf
    out = None
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        wall = min(wall, time.perf_counter() - w)
        cpu = min(cpu, time.process_time() - c)
    return out, wall, cpu


def peak_mib(fn: Callable[[], Any]) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def measure(
    request: Any, bandwidth: Any, res_of: Callable[[Any], float], args: Any
) -> dict[str, Any]:
    from srifty_core.planner.search import plan
    from srifty_core.planner.space import Space
    from srifty_core.simulator.estimator import Simulator

    def sim() -> Simulator:
        return Simulator(bandwidth)

    space = Space.build(request)
    size = space.size(limit=10**12)
    wide = Space.build(request, saturate=False).size(limit=args.brute)
    row: dict[str, Any] = {"size": size}
    new, row["new_wall_s"], row["new_cpu_s"] = timed(lambda: plan(request, sim()), 2)
    row["new_peak_mib"] = peak_mib(lambda: plan(request, sim()))
    row["method"] = new.method
    row["evaluated"] = new.evaluated
    row["new"] = res_of(new)
    row["new_label"] = new.best.label if new.best else None
    old_method = "exhaustive" if size <= OLD_EXHAUSTIVE else "ilp"
    old, row["old_wall_s"], row["old_cpu_s"] = timed(
        lambda: plan(request, sim(), method=old_method), 1
    )
    row["old_method"] = old_method
    row["old"] = res_of(old)
    searched = wide if wide <= BRUTE and wide <= args.brute else size
    row["searched"] = searched
    if searched <= args.brute:
        held: list[Any] = []
        row["brute_peak_mib"] = peak_mib(
            lambda: held.append(plan(request, sim(), method="exhaustive", exhaustive_limit=BRUTE))
        )
        brute = held[0]
        row["optimum"] = res_of(brute)
        row["optimum_label"] = brute.best.label if brute.best else None
    elif args.deep:
        row["optimum"], row["optimum_label"] = deep_optimum(request, sim(), args.deep, res_of)
    if row.get("optimum") is not None:  # the approximation alone, no branch and bound
        row["approx"] = res_of(plan(request, sim(), method="approx", exact_limit=0, budget=0))
    return row


def deep_optimum(
    request: Any, sim: Any, budget: int, res_of: Callable[[Any], float]
) -> tuple[float | None, str | None]:
    """The exact optimum by the branch and bound run to the end (from the approximation's
    answer), within ``budget`` work units (``None`` if it did not finish)."""
    from srifty_core.planner.approx import approximate
    from srifty_core.planner.bnb import BranchAndBound, Keeper
    from srifty_core.planner.search import _prefetch_all
    from srifty_core.planner.space import Space

    space = Space.build(request)
    keeper = Keeper(request, 1)
    _prefetch_all(request, sim, space)
    approximate(request, sim, space, keeper)
    if not BranchAndBound(request, sim, space, keeper, budget=budget).run():
        return None, None
    top = keeper.top()
    return (res_of_candidate(request, top[0]) if top else math.nan), (top[0].label if top else None)


def res_of_candidate(request: Any, c: Any) -> float:
    return float(c.time_s if request.objective.value == "time" else c.cost_usd)


def ratio(optimum: float | None, got: float | None) -> float | None:
    """Optimum over what the planner got (1 = optimal); 0 when it found nothing though a
    configuration exists; None without an optimum."""
    if optimum is None or (isinstance(optimum, float) and math.isnan(optimum)):
        return None
    if got is None or math.isnan(got):
        return 0.0
    return optimum / got


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for k in sorted({r["offers"] for r in rows}):
        mine = [r for r in rows if r["offers"] == k]
        ratios = [r["ratio"] for r in mine if r.get("ratio") is not None]
        approx = [r["approx_ratio"] for r in mine if r.get("approx_ratio") is not None]
        old = [r["old_ratio"] for r in mine if r.get("old_ratio") is not None]
        out.append(
            {
                "offers": k,
                "requests": len(mine),
                "exact": sum(r["method"] == "exact" for r in mine),
                "size_max": max(r["size"] for r in mine),
                "cpu_median_s": statistics.median(r["new_cpu_s"] for r in mine),
                "cpu_max_s": max(r["new_cpu_s"] for r in mine),
                "wall_median_s": statistics.median(r["new_wall_s"] for r in mine),
                "wall_max_s": max(r["new_wall_s"] for r in mine),
                "peak_mib_max": max(r["new_peak_mib"] for r in mine),
                "brute_peak_mib_max": max(
                    (r["brute_peak_mib"] for r in mine if "brute_peak_mib" in r), default=None
                ),
                "old_cpu_median_s": statistics.median(r["old_cpu_s"] for r in mine),
                "old_cpu_max_s": max(r["old_cpu_s"] for r in mine),
                "speedup_cpu_total": sum(r["old_cpu_s"] for r in mine)
                / sum(r["new_cpu_s"] for r in mine),
                "with_optimum": len(ratios),
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios) if ratios else None,
                "approx_ratio_median": statistics.median(approx) if approx else None,
                "approx_ratio_min": min(approx) if approx else None,
                "old_ratio_median": statistics.median(old) if old else None,
                "old_ratio_min": min(old) if old else None,
                "false_infeasible": sum(r["false_infeasible"] for r in mine),
                "old_false_infeasible": sum(r["old_false_infeasible"] for r in mine),
            }
        )
    return out


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (12 cells, ~1 min)")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--brute", type=int, default=BRUTE, help="brute force up to this size")
    parser.add_argument("--deep", type=int, default=0, help="work units (0: off)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    offers, quotas, batches = OFFERS, QUOTAS, BATCHES
    if args.quick:
        offers, quotas, batches = QUICK["offers"], QUICK["quotas"], QUICK["batches"]
        args.brute = min(args.brute, int(QUICK["brute"]))
    out = args.out or OUT / ("planner_scale_quick.json" if args.quick else "planner_scale.json")

    from srifty_core.errors import ConfigError
    from srifty_core.planner.request import Objective

    t_start = time.perf_counter()
    catalog, workload, bandwidth = setup(args.model, args.seed)
    rows: list[dict[str, Any]] = []
    for k in offers:
        for quota in quotas:
            for batch in batches:
                witness_time = None
                for kind in KINDS:
                    kw: dict[str, Any] = {"objective": Objective.TIME if kind == "time" else
                                          Objective.COST}  # fmt: skip
                    if kind == "cost|limit":
                        if witness_time is None:
                            continue
                        kw["time_limit_s"] = LIMIT_SLACK * witness_time
                    try:
                        request = make_request(catalog, workload, k, quota, batch, **kw)
                    except ConfigError:  # the quotas cannot hold the batch
                        continue

                    def res_of(result: Any, request: Any = request) -> float:
                        if result.best is None:
                            return math.nan
                        return res_of_candidate(request, result.best)

                    row = {"offers": k, "quota": quota, "batch": batch, "kind": kind}
                    row |= measure(request, bandwidth, res_of, args)
                    row["ratio"] = ratio(row.get("optimum"), row["new"])
                    row["approx_ratio"] = ratio(row.get("optimum"), row.get("approx"))
                    row["old_ratio"] = ratio(row.get("optimum"), row["old"])
                    feasible_known = kind == "cost|limit" or not math.isnan(
                        row.get("optimum") or math.nan
                    )
                    row["false_infeasible"] = bool(feasible_known and math.isnan(row["new"]))
                    row["old_false_infeasible"] = bool(feasible_known and math.isnan(row["old"]))
                    for key in ("new", "old", "optimum", "approx"):
                        if isinstance(row.get(key), float) and math.isnan(row[key]):
                            row[key] = None
                    rows.append(row)
                    if kind == "time" and row["new"] is not None:
                        witness_time = _time_at_risk(request, bandwidth)
                    print(
                        f"{k:2d} types q{quota:<2d} B{batch:<5d} {kind:10s} "
                        f"size {row['size']:>12,d} {row['method']:6s} "
                        f"cpu {row['new_cpu_s']:.3f} s wall "
                        f"{row['new_wall_s']:.3f} s peak {row['new_peak_mib']:.1f} MiB"
                        f" | old {row['old_method']} cpu {row['old_cpu_s']:.2f} s"
                        f" | ratio {fmt(row['ratio'], '.4f')} approx "
                        f"{fmt(row['approx_ratio'], '.4f')} old {fmt(row['old_ratio'], '.4f')}",
                        flush=True,
                    )
    summary = summarize(rows)
    report = {
        "model": args.model,
        "seed": args.seed,
        "quick": args.quick,
        "brute": args.brute,
        "deep": args.deep,
        "types": list(TYPES),
        "seconds": time.perf_counter() - t_start,
        "summary": summary,
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print()
    print(
        "| types | requests | exact | largest space | CPU median / max (s) | wall median /"
        " max (s) | peak MiB | old CPU median / max (s) | CPU speed-up | with optimum |"
        " ratio median / min | approx alone | old |"
    )
    print("|---:" * 13 + "|")
    for s in summary:
        print(
            f"| {s['offers']} | {s['requests']} | {s['exact']} | {s['size_max']:.3g} | "
            f"{s['cpu_median_s']:.3f} / {s['cpu_max_s']:.3f} | {s['wall_median_s']:.3f} / "
            f"{s['wall_max_s']:.3f} | {s['peak_mib_max']:.1f} | {s['old_cpu_median_s']:.3f} / "
            f"{s['old_cpu_max_s']:.3f} | x{s['speedup_cpu_total']:.1f} | {s['with_optimum']} |"
            f" {fmt(s['ratio_median'], '.4f')} / {fmt(s['ratio_min'], '.4f')} |"
            f" {fmt(s['approx_ratio_median'], '.4f')} / {fmt(s['approx_ratio_min'], '.4f')} |"
            f" {fmt(s['old_ratio_median'], '.4f')} / {fmt(s['old_ratio_min'], '.4f')} |"
        )
    every = [r for r in rows]
    ratios = [r["ratio"] for r in every if r["ratio"] is not None]
    print(
        f"\n{len(every)} requests in {report['seconds']:.0f} s; CPU max "
        f"{max(r['new_cpu_s'] for r in every):.3f} s, wall max "
        f"{max(r['new_wall_s'] for r in every):.3f} s; ratio median "
        f"{fmt(statistics.median(ratios) if ratios else None, '.4f')}, min "
        f"{fmt(min(ratios) if ratios else None, '.4f')} over {len(ratios)}; false "
        f"infeasible {sum(r['false_infeasible'] for r in every)} (old planner: "
        f"{sum(r['old_false_infeasible'] for r in every)})"
    )


def _time_at_risk(request: Any, bandwidth: Any) -> float:
    """The fastest plan's time at the request's risk quantile (the limit's witness)."""
    from srifty_core.planner.search import plan
    from srifty_core.simulator.estimator import Simulator

    best = plan(request, Simulator(bandwidth)).best
    assert best is not None
    return float(best.time_at_risk_s)


if __name__ == "__main__":
    main()
