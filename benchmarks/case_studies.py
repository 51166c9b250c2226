"""The method's seven case studies on the emulated EC2: Srifty against APM, CGF, FGF and the
oracle BO, each choice run on the emulator's ground truth, beside the best configuration of
the pruned space (every configuration run on the emulator).

Pipeline (one command, a few minutes; reference profiles are cached):

1. Reference compute profiles, one per model, shipped in
   ``srifty_core/shipped/reference_profiles/`` (re-made there when missing or with
   ``--reprofile``): the model's ``small`` preset profiled on this CPU with the real
   profiler (1 thread, 4 budgeted probes), its latencies scaled by the FLOP ratio of the
   ``full`` network to the small one (counted with torch's FLOP counter at batch 1; DLRM,
   whose time is embedding-bound, by the measured time ratio at batch 64), and the ``full``
   network's memory footprint (batch 1 and 2) and DDP gradient buckets (one backward at
   batch 1). So communication volume and memory are the real
   network's; the latency curve's shape is the small model's.
2. Per GPU type, ``EmulatedProvider.profile``: what the profiler would measure there.
3. An emulated probe sweep of the offered types (world sizes up to each quota's ranks) ->
   the bandwidth model (``--bandwidth module:Class``, a class with ``fit(frame)``; default
   the probe table) -> ``Simulator``. The cases and steps 2-3 are
   ``srifty_core.case_studies`` (``case_setup``), which also gives Srifty's plans
   alone in seconds (``plan_case_studies``).
4. Per case: each method's choice, predicted and actual (``--iterations`` emulated
   iterations at the median allocation level: network spreads 1, so configurations are
   compared without allocation luck; and the mean over 3 random allocations), the limits,
   the solve time; the ground-truth optimum; the ILP against the exhaustive search.

Run:  .venv/bin/python benchmarks/case_studies.py [--quick] [--reprofile]
Writes benchmarks/results/case_studies.json, case_studies.md and case_studies_frontier.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from srifty_core.case_studies import (
    CASES,
    QUICK,
    REGION,
    Case,
    case_setup,
    one_core,
    short_label,
)
from srifty_core.profiling.store import load_reference_profile, reference_profile_paths

OUT = Path(__file__).parent / "results"
MODELS = (
    "resnet50",
    "vgg16",
    "alexnet",
    "dlrm",
    "xlm",
    "bert_base",
    "inception_v3",
    "shufflenet_v2",
)
CPU_MAX_BATCH = {"bert_base": 32, "xlm": 32}
"""Upper end of the CPU profile's batch search (default 64): keeps profiling to seconds."""


# ---------------------------------------------------------------------------- profiles
def reference_profile(model: str, reprofile: bool = False) -> tuple[Any, dict[str, Any]]:
    """The shipped reference profile (``srifty_core/shipped/reference_profiles/``), made (and
    written there) when missing or asked to."""
    path, meta_path = reference_profile_paths(model)
    if path.is_file() and meta_path.is_file() and not reprofile:
        return load_reference_profile(model)
    t0 = time.perf_counter()
    prof, meta = _make_reference(model)
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.to_json() + "\n")
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"  profiled {model} in {meta['seconds']} s (scale x{meta['latency_scale']:.1f})")
    return prof, meta


def _make_reference(model: str) -> tuple[Any, dict[str, Any]]:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from srifty_core.predictors.compute import PiecewiseLinear
    from srifty_core.profiling.buckets import form_buckets, gradient_ready_schedule, trainable
    from srifty_core.profiling.config import ProfilerConfig
    from srifty_core.profiling.memory import training_memory_bytes
    from srifty_core.profiling.profile import PassStats
    from srifty_core.profiling.profiler import profile_model
    from srifty_core.profiling.timing import measure_latency
    from srifty_core.workloads.zoo import build

    cfg = ProfilerConfig(
        max_batch=CPU_MAX_BATCH.get(model, 64),
        threads=1,
        repeats=3,
        warmup=1,
        probes=4,
        share_host=1,  # GPU case studies: no local ranks share a host
    )
    small = profile_model(model, "small", cfg)
    cpu = torch.device("cpu")

    def footprint(size: str) -> tuple[Any, float, int, int]:
        wl = build(model, size)
        wl.module.train()
        with FlopCounterMode(display=False) as fc:
            m1 = training_memory_bytes(wl, wl.make_batch(1, cpu), cpu)
        m2 = training_memory_bytes(wl, wl.make_batch(2, cpu), cpu)
        return wl, float(fc.get_total_flops()), m1, m2

    small_wl, small_flops, _, _ = footprint("small")
    full_wl, full_flops, m1, m2 = footprint("full")
    if model == "dlrm":  # embedding-bound: FLOPs say little; time one step of each at 64
        times = []
        for wl in (small_wl, full_wl):
            fw, bw = measure_latency(
                wl, wl.make_batch(64, cpu), repeats=2, warmup=1, sync=lambda: None
            )
            times.append(statistics.fmean(fw) + statistics.fmean(bw))
        scale, how = times[1] / times[0], "measured time ratio full/small at batch 64"
    else:
        scale, how = full_flops / small_flops, "forward FLOP ratio full/small"
    schedule = gradient_ready_schedule(full_wl, full_wl.make_batch(1, cpu), repeats=1)
    params = trainable(full_wl.module)
    buckets = form_buckets(params, schedule)

    def stats(s: PassStats) -> PassStats:
        return PassStats(
            s.batch_sizes,
            tuple(x * scale for x in s.mean_s),
            tuple(x * scale for x in s.std_s),
            s.repeats,
        )

    def fit(f: PiecewiseLinear) -> PiecewiseLinear:
        return dataclasses.replace(
            f,
            slopes=tuple(x * scale for x in f.slopes),
            intercepts=tuple(x * scale for x in f.intercepts),
        )

    ref = dataclasses.replace(
        small,
        size="full (latency scaled from small)",
        fw=stats(small.fw),
        bw=stats(small.bw),
        fw_fit=fit(small.fw_fit),
        bw_fit=fit(small.bw_fit),
        memory_per_sample_bytes=float(m2 - m1),
        memory_fixed_bytes=float(2 * m1 - m2),
        n_parameters=sum(p.numel() for p in params),
        gradient_bytes=sum(p.numel() * p.element_size() for p in params),
        buckets=buckets,
    )
    meta = {
        "model": model,
        "latency_scale": scale,
        "scale_from": how,
        "small_flops_fw_b1": small_flops,
        "full_flops_fw_b1": full_flops,
        "full_memory_b1_bytes": m1,
        "full_memory_b2_bytes": m2,
        "full_gradient_mib": ref.gradient_bytes / 2**20,
        "full_buckets": len(buckets),
        "cpu_profile": {"max_batch": cfg.max_batch, "repeats": cfg.repeats, "threads": 1},
    }
    return ref, meta


# ---------------------------------------------------------------------------- truth
class Truth:
    """The emulator's ground truth for configurations, cached by label."""

    def __init__(self, reference: Any, iterations: int, catalog: Any, seed: int = 0) -> None:
        self.reference, self.iterations, self.catalog, self.seed = (
            reference,
            iterations,
            catalog,
            seed,
        )
        self.cache: dict[tuple[str, int], float] = {}
        self.calls = 0

    def _run(self, config: Any, seed: int, median_level: bool) -> float:
        from srifty_core.cloud.base import LaunchRequest
        from srifty_core.cloud.emulated.provider import EmulatedProvider

        spread = {"spread_small": 1.0, "spread_large": 1.0} if median_level else {}
        p = EmulatedProvider(seed=seed, region=REGION, catalog=self.catalog, **spread)
        counts: dict[str, int] = {}
        batches: dict[str, int] = {}
        allocs = []
        for g in config.groups:
            name = g.instance.name
            if name in batches and batches[name] != g.batch:
                # one allocation per (type, batch): the emulator takes one batch per type
                return self._split_run(config, seed, median_level)
            counts[name] = counts.get(name, 0) + g.count
            batches[name] = g.batch
        for name, n in counts.items():
            allocs.append(p.launch(LaunchRequest(name, count=n)))
        run = p.train(allocs, self.reference, batches, self.iterations, reference=one_core())
        return run.mean_s

    def _split_run(self, config: Any, seed: int, median_level: bool) -> float:
        # a type with two batches (a greedy's last VM): run the larger batch on every VM of
        # the type, an upper bound the greedy heuristics are charged with (rare)
        from srifty_core.simulator.types import ClusterConfig, Group

        merged: dict[str, Any] = {}
        for g in config.groups:
            k = g.instance.name
            if k in merged:
                m = merged[k]
                merged[k] = Group(g.instance, m.count + g.count, max(m.batch, g.batch))
            else:
                merged[k] = g
        return self._run(ClusterConfig(tuple(merged.values())), seed, median_level)

    def measure(self, config: Any) -> float:
        key = (config.label(), 0)
        if key not in self.cache:
            self.calls += 1
            self.cache[key] = self._run(config, self.seed, True)
        return self.cache[key]

    def random_allocations(self, config: Any, n: int = 3) -> list[float]:
        return [self._run(config, self.seed + 1 + k, False) for k in range(n)]


# ---------------------------------------------------------------------------- cases
def load_bandwidth(spec: str) -> Callable[[Any], Any]:
    mod, _, cls = spec.partition(":")
    klass = getattr(importlib.import_module(mod), cls)
    return lambda frame: klass().fit(frame)


def actual(request: Any, cand: Any, truth: Truth) -> dict[str, Any]:
    from srifty_core.planner.space import Space

    config = Space(request, ()).config(cand.choice)
    t = truth.measure(config)
    rate = sum(request.offers[i].usd_per_hour * c for i, c, _ in cand.choice)
    time_s = request.overheads.total_s + request.iterations * t
    cost = rate * time_s / 3600
    return {
        "t_iter_s": t,
        "throughput": config.global_batch / t,
        "time_s": time_s,
        "cost_usd": cost,
        "limits_held": time_s <= request.time_limit_s and cost <= request.budget_usd,
    }


def run_case(case: Case, args: argparse.Namespace, catalog: Any, fit_bw: Any) -> dict[str, Any]:
    from srifty_core.planner import baselines
    from srifty_core.planner.request import Objective
    from srifty_core.planner.search import plan
    from srifty_core.planner.space import Space
    from srifty_core.simulator.estimator import Simulator

    setup = case_setup(
        case, catalog, fit_bandwidth=fit_bw, reference=reference_profile(case.model, args.reprofile)
    )
    request, bandwidth = setup.request, setup.bandwidth
    ref, meta = setup.reference, setup.reference_meta
    offers, profiles = request.offers, request.workload.profiles
    truth = Truth(ref, args.iterations, catalog)
    sim = Simulator(bandwidth)
    choices = [
        baselines.srifty(request, sim),
        baselines.apm(request),
        baselines.cheapest_gpu_first(request, Simulator(bandwidth)),
        baselines.fastest_gpu_first(request, Simulator(bandwidth)),
        baselines.oracle_bo(request, truth.measure, seed=0),
    ]
    srifty_result = choices[0].result
    rows = []
    for mc in choices:
        row: dict[str, Any] = {
            "method": mc.method,
            "label": mc.label,
            "solve_s": mc.solve_s,
            "evaluated": mc.evaluated,
            "note": mc.note,
        }
        if mc.candidate is not None:
            c = mc.candidate
            row["predicted"] = {
                "t_iter_s": c.estimate.t_iter,
                "time_s": c.time_s,
                "cost_usd": c.cost_usd,
                "feasible": c.feasible,
            }
            row["actual"] = actual(request, c, truth)
            if mc.method == "srifty":
                cfg = Space(request, ()).config(c.choice)
                rnd = truth.random_allocations(cfg)
                row["actual_random_allocations_t_iter_s"] = rnd
        rows.append(row)

    # ground truth: every configuration of the power-of-two space on the emulator (batches
    # under the saturation threshold included: the planner may search there too)
    t0 = time.perf_counter()
    space = Space.build(request, saturate=False)
    every = [tuple(sorted(ch)) for ch in space.enumerate()]
    best, best_key = None, None
    n_feasible = 0
    for ch in every:
        cand = _cand(request, ch)
        a = actual(request, cand, truth)
        if not a["limits_held"]:
            continue
        n_feasible += 1
        key = a["time_s"] if request.objective is Objective.TIME else a["cost_usd"]
        if best_key is None or key < best_key:
            best, best_key = (cand.label, a), key
    truth_s = time.perf_counter() - t0
    optimum: dict[str, Any] = {
        "configurations": len(every),
        "meeting_limits": n_feasible,
        "seconds": truth_s,
    }
    if best is not None:
        optimum.update({"label": best[0], "actual": best[1]})
    sr = rows[0]
    if best is not None and "actual" in sr and sr["actual"]["limits_held"]:
        if request.objective is Objective.TIME:
            frac = sr["actual"]["throughput"] / best[1]["throughput"]
        else:
            frac = best[1]["cost_usd"] / sr["actual"]["cost_usd"]
        optimum["srifty_fraction"] = frac
    elif best is None and sr["label"] == "(none)":
        optimum["srifty_fraction"] = 1.0  # agrees: nothing meets the limits
    else:
        optimum["srifty_fraction"] = 0.0

    # the ILP against the exhaustive search, on the same predictions
    ilp: dict[str, Any] = {}
    if srifty_result is not None and srifty_result.space_size <= 10_000:
        res = plan(request, Simulator(bandwidth), method="ilp")
        ex = srifty_result.best
        ilp = {
            "space": srifty_result.space_size,
            "ilp_label": res.best.label if res.best else None,
            "ilp_solve_s": res.solve_s,
            "ilp_evaluated": res.evaluated,
            "exhaustive_label": ex.label if ex else None,
        }
        if res.best is not None and ex is not None:
            if request.objective is Objective.TIME:
                ilp["ratio"] = res.best.time_s / ex.time_s
            else:
                ilp["ratio"] = res.best.cost_usd / ex.cost_usd
            ilp["ilp_actual"] = actual(request, res.best, truth)
    return {
        "case": case.name,
        "model": case.model,
        "global_batch": case.global_batch,
        "iterations": case.iterations,
        "objective": case.objective,
        "time_limit_s": None if math.isinf(case.time_limit_s) else case.time_limit_s,
        "budget_usd": None if math.isinf(case.budget_usd) else case.budget_usd,
        "offers": [
            {
                "type": o.instance.name,
                "market": o.market.value,
                "quota": o.quota,
                "usd_per_hour": o.usd_per_hour,
            }
            for o in offers
        ],
        "b_max": {g: p.b_max for g, p in profiles.items()},
        "notes": list(setup.notes),
        "reference_profile": meta,
        "bandwidth_fit_s": setup.bandwidth_fit_s,
        "space_size": srifty_result.space_size if srifty_result else None,
        "search": srifty_result.method if srifty_result else None,
        "methods": rows,
        "optimum": optimum,
        "ilp_vs_exhaustive": ilp,
        "_result": srifty_result,
    }


def _cand(request: Any, choice: Any) -> Any:
    """A Candidate shell for ``actual`` (only its choice and label are read)."""
    from srifty_core.planner.result import Candidate, choice_label

    label = choice_label(request.offers, choice)
    return Candidate(choice, label, None, 0.0, 0.0, ())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- report
def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| case | method | configuration | pred. t_iter | actual t_iter | pred. time / cost "
        "| actual time / cost | limits held (actual) | solve s |",
        "|---|---|---|---:|---:|---:|---:|:---:|---:|",
    ]
    for r in results:
        head = f"{r['case']} {r['model']} B={r['global_batch']} min {r['objective']}"
        for m in r["methods"]:
            if "actual" in m:
                p, a = m["predicted"], m["actual"]
                cells = [
                    f"{p['t_iter_s'] * 1e3:.0f} ms",
                    f"{a['t_iter_s'] * 1e3:.0f} ms",
                    f"{p['time_s']:.0f} s / ${p['cost_usd']:.2f}",
                    f"{a['time_s']:.0f} s / ${a['cost_usd']:.2f}",
                    "yes" if a["limits_held"] else "**no**",
                ]
            else:
                cells = ["-", "-", "-", "-", "-"]
            lines.append(
                f"| {head} | {m['method']} | {short_label(m['label'])} | "
                + " | ".join(cells)
                + f" | {m['solve_s']:.2f} |"
            )
            head = ""
        o = r["optimum"]
        if "label" in o:
            a = o["actual"]
            lines.append(
                f"| | *optimum (all {o['configurations']} on the emulator)* | "
                f"{short_label(o['label'])}"
                f" | | {a['t_iter_s'] * 1e3:.0f} ms | | {a['time_s']:.0f} s / ${a['cost_usd']:.2f}"
                " | yes | |"
            )
        else:
            lines.append(
                f"| | *optimum (all {o['configurations']} on the emulator)* | none meets the "
                "limits | | | | | | |"
            )
    return "\n".join(lines)


def summary_md(results: list[dict[str, Any]]) -> str:
    lines = [
        "| case | search | space | Srifty solve s | Srifty / optimum (actual) | "
        "target 0.97 | solve < 0.5 s | Srifty t_iter, 3 random allocations |",
        "|---|---|---:|---:|---:|:---:|:---:|---|",
    ]
    for r in results:
        s = r["methods"][0]
        f = r["optimum"].get("srifty_fraction", float("nan"))
        rnd = s.get("actual_random_allocations_t_iter_s")
        rnd_s = (
            f"{statistics.fmean(rnd) * 1e3:.0f} ms ({min(rnd) * 1e3:.0f}-{max(rnd) * 1e3:.0f})"
            if rnd
            else "-"
        )
        lines.append(
            f"| {r['case']} {r['model']} | {r['search']} | {r['space_size']} | "
            f"{s['solve_s']:.2f} | {f:.3f} | {'met' if f >= 0.97 else '**missed**'} | "
            f"{'met' if s['solve_s'] < 0.5 else '**missed**'} | {rnd_s} |"
        )
    lines += [
        "",
        "| case | space | exhaustive choice | ILP choice | ILP / exhaustive "
        "(predicted objective) | ILP actual | ILP solve s |",
        "|---|---:|---|---|---:|---|---:|",
    ]
    for r in results:
        x = r["ilp_vs_exhaustive"]
        if not x:
            continue
        ratio = f"{x['ratio']:.3f}" if "ratio" in x else "-"
        act = x.get("ilp_actual")
        act_s = f"{act['time_s']:.0f} s / ${act['cost_usd']:.2f}" if act else "-"
        ex = short_label(x["exhaustive_label"] or "(none)")
        il = short_label(x["ilp_label"] or "(none)")
        lines.append(
            f"| {r['case']} {r['model']} | {x['space']} | {ex} | {il} | {ratio} | {act_s} "
            f"| {x['ilp_solve_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"cases {', '.join(QUICK)} only")
    parser.add_argument("--cases", help="comma-separated case names (e.g. 1,6)")
    parser.add_argument("--reprofile", action="store_true", help="re-make the reference profiles")
    parser.add_argument("--iterations", type=int, default=30, help="emulated iterations a run")
    parser.add_argument(
        "--bandwidth",
        default="srifty_core.predictors.table:ProbeTableBandwidth",
        help="module:Class of the bandwidth model (fit(frame) -> predictor)",
    )
    parser.add_argument("--frontier-case", default="6x")
    args = parser.parse_args()
    from srifty_core.catalog import Catalog
    from srifty_core.planner.plot import plot_frontier

    catalog = Catalog.load()
    fit_bw = load_bandwidth(args.bandwidth)
    wanted = set(args.cases.split(",")) if args.cases else set(QUICK) if args.quick else None
    t_all = time.perf_counter()
    results = []
    for case in CASES:
        if wanted is not None and case.name not in wanted:
            continue
        t0 = time.perf_counter()
        r = run_case(case, args, catalog, fit_bw)
        print(f"case {case.name} ({case.model}): {time.perf_counter() - t0:.1f} s", flush=True)
        for m in r["methods"]:
            act = m.get("actual", {})
            print(
                f"  {m['method']:9s} {short_label(m['label'])[:60]:60s} solve {m['solve_s']:.2f} s"
                f"  actual {act.get('time_s', math.nan):.0f} s ${act.get('cost_usd', math.nan):.2f}"
                f" held={act.get('limits_held')}"
            )
        print(
            f"  optimum {r['optimum'].get('label')}  fraction {r['optimum']['srifty_fraction']:.3f}"
        )
        if case.name == args.frontier_case and r["_result"] is not None:
            plot_frontier(r["_result"], OUT / "case_studies_frontier.png")
        results.append(r)
    total = time.perf_counter() - t_all
    for r in results:
        r.pop("_result")
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {
        "bandwidth": args.bandwidth,
        "iterations": args.iterations,
        "total_s": total,
        "cases": results,
    }
    (OUT / "case_studies.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    md = markdown(results) + "\n\n" + summary_md(results) + "\n"
    (OUT / "case_studies.md").write_text(md)
    print(md)
    print(f"total {total:.1f} s")


if __name__ == "__main__":
    main()
