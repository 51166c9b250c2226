"""What-if answers on the case studies: time per scenario with the simulations of the base
search reused (``planner.whatif``) against planning each changed request from scratch with a
fresh simulator (the plain method), in the same run, and whether both give the same plan.

Per case (``srifty_core.case_studies``: emulated profiles and probe sweep; the bandwidth
model is the XGBoost model the registry's champion is, fitted on the case's sweep):
the base plan, then these scenarios, each asked both ways:

- ``quota[T]=2q`` for the case's first offered type (twice its quota);
- the case's time limit or budget at 0.8x and 1.25x where it has one, else a budget at
  the base plan's cost x 0.8;
- the other objective;
- one more VM of each offered type (``--one-more-vm``).

    .venv/bin/python benchmarks/what_if.py [--quick] [--cases 1,6]

Writes ``benchmarks/results/what_if.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def request_dict(setup: Any) -> dict[str, Any]:
    r = setup.request
    out: dict[str, Any] = {
        "model": r.workload.model,
        "global_batch": r.global_batch,
        "iterations": r.iterations,
        "objective": r.objective.value,
        "overheads": {"launch_s": r.overheads.launch_s},
        "offers": [
            {
                "type": o.instance.name,
                "market": o.market.value,
                "quota": o.quota,
                "price": o.usd_per_hour,
            }
            for o in r.offers
        ],
    }
    if math.isfinite(r.time_limit_s):
        out["time_limit_s"] = r.time_limit_s
    if math.isfinite(r.budget_usd):
        out["budget_usd"] = r.budget_usd
    return out


def scenarios(data: dict[str, Any], base_cost: float | None) -> list[str]:
    first = data["offers"][0]
    out = [f"quota[{first['type']}@{first['market']}]={2 * first['quota']}"]
    limited = False
    for key in ("time_limit_s", "budget_usd"):
        if key in data:
            limited = True
            out += [f"{key}={data[key] * 0.8:.4g}", f"{key}={data[key] * 1.25:.4g}"]
    if not limited and base_cost is not None:
        out.append(f"budget_usd={base_cost * 0.8:.4g}")
    out.append("objective=" + ("cost" if data["objective"] == "time" else "time"))
    out += [f"offers[{i}].quota={o['quota'] + 1}" for i, o in enumerate(data["offers"])]
    return out


def run_case(name: str, catalog: Any) -> dict[str, Any]:
    from srifty_core.case_studies import case_setup, get_case
    from srifty_core.planner import whatif
    from srifty_core.planner.request import request_from_dict
    from srifty_core.planner.search import plan
    from srifty_core.predictors.bandwidth import BandwidthModel
    from srifty_core.simulator.estimator import Simulator

    setup = case_setup(get_case(name), catalog, fit_bandwidth=BandwidthModel().fit)
    profiles = setup.request.workload.profiles
    data = request_dict(setup)

    def build(d: Any) -> Any:
        return request_from_dict(d, catalog=catalog, load_profile=lambda m, s, dev: profiles[dev])

    what = whatif.WhatIf(data, Simulator(setup.bandwidth), build)
    base_cost = what.base.best.cost_usd if what.base.best else None
    rows = []
    for text in scenarios(data, base_cost):
        answer = what.ask(text)
        t0 = time.perf_counter()
        fresh = plan(
            build(whatif.apply_scenario(data, whatif.parse_scenario(text))),
            Simulator(setup.bandwidth),
        )
        fresh_s = time.perf_counter() - t0
        same = (answer.result.best is None and fresh.best is None) or (
            answer.result.best is not None
            and fresh.best is not None
            and answer.result.best.choice == fresh.best.choice
        )
        dt, dc = answer.delta(what.base)
        rows.append(
            {
                "scenario": text,
                "what_if_s": answer.seconds,
                "from_scratch_s": fresh_s,
                "same_plan": same,
                "best": None if answer.result.best is None else answer.result.best.label,
                "time_change_s": dt,
                "cost_change_usd": dc,
                "space": answer.result.space_size,
                "method": answer.result.method,
            }
        )
    return {
        "case": name,
        "base_s": what.base_seconds,
        "base": None if what.base.best is None else what.base.best.label,
        "scenarios": rows,
        "simulations": {"run": what.memo.misses, "reused": what.memo.hits},
    }


def main() -> None:
    from srifty_core.case_studies import CASES, QUICK
    from srifty_core.catalog import Catalog

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"cases {', '.join(QUICK)} only")
    ap.add_argument("--cases", help="comma-separated case names")
    args = ap.parse_args()
    names = (
        args.cases.split(",")
        if args.cases
        else list(QUICK)
        if args.quick
        else [c.name for c in CASES]
    )
    catalog = Catalog.load()
    out = []
    print("case  scenario                          what-if s  scratch s  ratio  same  change")
    for name in names:
        res = run_case(name, catalog)
        out.append(res)
        print(f"{name:5} base: {res['base']}  ({res['base_s']:.2f} s to plan)")
        for r in res["scenarios"]:
            ratio = r["from_scratch_s"] / max(r["what_if_s"], 1e-9)
            change = (
                "no plan"
                if r["time_change_s"] is None
                else f"{r['time_change_s']:+.0f} s, {r['cost_change_usd']:+.2f} $"
            )
            print(
                f"{'':5} {r['scenario']:33} {r['what_if_s']:9.3f} {r['from_scratch_s']:10.3f} "
                f"{ratio:6.1f} {'yes' if r['same_plan'] else 'NO':>5}  {change}"
            )
    every = [r for res in out for r in res["scenarios"]]
    w = [r["what_if_s"] for r in every]
    s = [r["from_scratch_s"] for r in every]
    summary = {
        "scenarios": len(every),
        "what_if_median_s": statistics.median(w),
        "what_if_max_s": max(w),
        "from_scratch_median_s": statistics.median(s),
        "from_scratch_max_s": max(s),
        "same_plan": sum(r["same_plan"] for r in every),
    }
    print(
        f"{summary['scenarios']} scenarios: what-if median {summary['what_if_median_s']:.3f} s, "
        f"max {summary['what_if_max_s']:.3f} s; from scratch median "
        f"{summary['from_scratch_median_s']:.3f} s, max {summary['from_scratch_max_s']:.3f} s; "
        f"same plan {summary['same_plan']}/{summary['scenarios']}"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "what_if.json").write_text(
        json.dumps({"cases": out, "summary": summary}, indent=1, default=str)
    )


if __name__ == "__main__":
    main()
