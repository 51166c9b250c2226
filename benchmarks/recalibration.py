"""Online recalibration (issue 22, part 1) on the emulated EC2, in simulated time.

ResNet-50, global batch 1024, minimize cost within a deadline; offers p3.8xlarge,
g3.8xlarge, g4dn.8xlarge on demand (quotas 2, 8, 8). The planner predicts with the Srifty
simulator (profiles measured on the emulator, probe-table bandwidth over an emulated
sweep). After the first plan, a hidden 30 % slowdown of the GPUs of the type that plan
uses most is injected (``EmulatedProvider.hidden_slowdown``: only ``train`` applies it,
the profiles never saw it), so the first plan, which the simulator says meets the
deadline, breaks it.

Each (seed, request) runs three arms, each on its own emulated world from the same seed
(the same profiles, the same first plan; an exact rerun up to where the arms differ):

* ``first plan``: the first configuration to the end, no re-plan;
* ``plain``: the method's monitor: each window, re-plan (with the uncalibrated simulator)
  when even the window's optimistic throughput (mean + 1.96 standard errors) projects past
  the deadline;
* ``recalibrated``: each window, the per-device compute and per-link communication
  factors are updated from what rank 0 gathers (``simulator.calibration``), the rest is
  projected on the recalibrated simulator, and ``should_replan`` decides, the alternative
  being the best plan for the rest on the recalibrated simulator (switching cost: launch,
  checkpoint-volume detach, solve).

Projection error after window k: on the ``first plan`` arm (it stays on its configuration),
|projected rest - actual rest| / actual rest, where the projection is the (un)calibrated
simulator's mean for the remaining iterations and the actual is what the emulator then
took for them. Monitor windows are 300 s of training (the runtime's ``WINDOW_S``).

Run:  .venv/bin/python benchmarks/recalibration.py [--seeds 1 2 3 4] [--slowdown 1.3]
Writes benchmarks/results/recalibration.json.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "results"
REGION = "us-east-1"
QUOTAS = {"p3.8xlarge": 4, "g3.8xlarge": 8, "g4dn.8xlarge": 8}
"""The most of each type any request offers (the bandwidth model's probe sweep)."""
B = 1024
WINDOW_S = 300.0
LAUNCH_S, DETACH_S, SOLVE_S = 150.0, 5.0, 1.0
REQUESTS: tuple[tuple[dict[str, int], int, float], ...] = (
    ({"p3.8xlarge": 2, "g3.8xlarge": 8, "g4dn.8xlarge": 8}, 6000, 1.05),
    ({"p3.8xlarge": 2, "g3.8xlarge": 8, "g4dn.8xlarge": 8}, 8000, 1.12),
    ({"p3.8xlarge": 4, "g3.8xlarge": 8, "g4dn.8xlarge": 8}, 8000, 1.05),
    ({"p3.8xlarge": 4, "g3.8xlarge": 8, "g4dn.8xlarge": 8}, 8000, 1.15),
    ({"g3.8xlarge": 8, "g4dn.8xlarge": 8}, 4000, 1.1),
)
"""(quotas, iterations, deadline over the cheapest plan's predicted time at its p90)."""
ARMS = ("first plan", "plain", "recalibrated")


@dataclass
class World:
    cloud: Any
    workload: Any
    request: Any
    first: Any
    hidden: str


@dataclass
class ArmResult:
    arm: str
    finish_s: float = 0.0
    cost_usd: float = 0.0
    met: bool = False
    replans: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)
    configs: list[str] = field(default_factory=list)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--slowdown", type=float, default=1.3)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    bandwidth = fit_bandwidth()
    for seed in args.seeds:
        for quotas, iterations, tight in REQUESTS:
            rows.append(case(seed, quotas, iterations, tight, args.slowdown, bandwidth))
    summary = summarize(rows)
    print(table(rows, summary))
    OUT.mkdir(exist_ok=True)
    result = {
        "slowdown": args.slowdown,
        "seeds": args.seeds,
        "requests": [
            {"quotas": q, "iterations": n, "deadline_over_cheapest_p90": t} for q, n, t in REQUESTS
        ],
        "window_s": WINDOW_S,
        "summary": summary,
        "cases": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    (OUT / "recalibration.json").write_text(json.dumps(result, indent=1, default=str) + "\n")


def fit_bandwidth() -> Any:
    from srifty_core import case_studies as cs
    from srifty_core.catalog import Catalog
    from srifty_core.predictors.table import ProbeTableBandwidth

    return ProbeTableBandwidth().fit(cs.probe_frame(QUOTAS, Catalog.load()))


def world(
    seed: int,
    quotas: dict[str, int],
    iterations: int,
    tight: float,
    slowdown: float,
    bandwidth: Any,
) -> World:
    """A fresh emulated world of ``seed``: profiles, the first plan (uncalibrated), and
    the hidden slowdown of the type the first plan uses most, injected after both."""
    from srifty_core import case_studies as cs
    from srifty_core.catalog import Catalog
    from srifty_core.cloud.emulated.provider import EmulatedProvider
    from srifty_core.planner.request import Objective, Overheads, PlanRequest, offers_from_catalog
    from srifty_core.planner.search import plan
    from srifty_core.profiling.store import load_reference_profile
    from srifty_core.simulator.estimator import Simulator
    from srifty_core.simulator.types import Workload

    catalog = Catalog.load()
    ref, _ = load_reference_profile("resnet50")
    cloud = EmulatedProvider(seed=seed, region=REGION, catalog=catalog, volume_detach_s=DETACH_S)
    profiles: dict[str, Any] = {}
    for name in quotas:
        gpu = catalog.get(name, REGION).gpu_model
        profiles.setdefault(
            gpu, cloud.profile(name, ref, probes=4, repeats=5, reference_rate=cs.one_core())
        )
    offers = offers_from_catalog(
        catalog, [{"type": n, "market": "on-demand", "quota": q} for n, q in quotas.items()],
        REGION,
    )  # fmt: skip
    workload = Workload("resnet50", profiles)
    sim = Simulator(bandwidth)

    def request(limit: float) -> PlanRequest:
        return PlanRequest(
            workload=workload, global_batch=B, iterations=iterations, offers=offers,
            time_limit_s=limit, objective=Objective.COST,
            overheads=Overheads(launch_s=LAUNCH_S, solve_s=SOLVE_S),
        )  # fmt: skip

    cheapest = plan(request(math.inf), sim).best
    assert cheapest is not None
    req = request(tight * cheapest.time_at_risk_s)
    first = plan(req, sim).best
    assert first is not None
    counts: dict[str, int] = {}
    for i, c, _ in first.choice:
        counts[offers[i].instance.name] = counts.get(offers[i].instance.name, 0) + c
    hidden = max(counts, key=lambda n: (counts[n], n))
    cloud.hidden_slowdown = {hidden: slowdown}
    return World(cloud, workload, req, first, hidden)


def case(
    seed: int,
    quotas: dict[str, int],
    iterations: int,
    tight: float,
    slowdown: float,
    bandwidth: Any,
) -> dict[str, Any]:
    def fresh() -> World:
        return world(seed, quotas, iterations, tight, slowdown, bandwidth)

    arms = {arm: run_arm(arm, fresh(), bandwidth) for arm in ARMS}
    w = fresh()
    stay = arms["first plan"]
    errors = projection_errors(stay)
    out = {
        "seed": seed,
        "quotas": quotas,
        "iterations": iterations,
        "deadline_s": round(w.request.time_limit_s, 1),
        "first_plan": w.first.label,
        "first_predicted_s": round(w.first.time_s, 1),
        "first_predicted_q_s": round(w.first.time_at_risk_s, 1),
        "hidden_slowdown": {w.hidden: slowdown},
        "projection_error": errors,
        "arms": {a: vars(r) for a, r in arms.items()},
    }
    print(
        f"seed {seed} N={iterations} deadline {w.request.time_limit_s:.0f} s: "
        + ", ".join(
            f"{a} {r.finish_s:.0f} s {'met' if r.met else 'MISSED'} ${r.cost_usd:.2f}"
            for a, r in arms.items()
        )
        + "; calibrated projection error by window: "
        + " ".join(f"{100 * e['calibrated']:.1f}%" for e in errors[:4]),
        flush=True,
    )
    return out


def run_arm(arm: str, w: World, bandwidth: Any) -> ArmResult:
    """One arm on its own world (see the module's doc)."""
    from srifty_core import case_studies as cs
    from srifty_core.jobs.replanner import Progress, Replanner
    from srifty_core.planner.request import Overheads
    from srifty_core.profiling.store import load_reference_profile
    from srifty_core.simulator import calibration as calib
    from srifty_core.simulator.estimator import Simulator
    from srifty_core.simulator.types import ClusterConfig, Group

    cloud, req = w.cloud, w.request
    ref, _ = load_reference_profile("resnet50")
    sim = Simulator(bandwidth)
    overheads = Overheads(launch_s=LAUNCH_S, detach_s=DETACH_S, solve_s=SOLVE_S)
    cal = calib.prior(w.workload, [o.instance for o in req.offers], bandwidth)
    gpu = {o.instance.name: o.instance.device_type for o in req.offers}
    out = ArmResult(arm)
    t0 = cloud.now()

    def at() -> float:
        return float((cloud.now() - t0).total_seconds())

    def launch(choice: Any, r: Any) -> tuple[list[Any], dict[str, int], ClusterConfig, float]:
        from srifty_core.cloud.base import LaunchRequest

        reqs = [LaunchRequest(r.offers[i].instance.name, count=c, market=r.offers[i].market)
                for i, c, _ in choice]  # fmt: skip
        config = ClusterConfig(tuple(Group(r.offers[i].instance, c, b) for i, c, b in choice))
        rate = sum(r.offers[i].usd_per_hour * c for i, c, _ in choice)
        return cloud.launch_many(reqs), {r.offers[i].instance.name: b for i, _, b in choice}, \
            config, rate  # fmt: skip

    cloud.advance(SOLVE_S)
    allocs, batches, config, rate = launch(w.first.choice, req)
    every = list(allocs)
    out.configs.append(w.first.label)
    done, trained = 0, 0.0
    while done < req.iterations:
        per = max(1, int(WINDOW_S / sim.estimate(w.workload, config).t_iter))
        n = min(per, req.iterations - done)
        run = cloud.train(allocs, ref, batches, n, reference=cs.one_core(), warm_s=trained)
        done += run.completed
        trained += float(run.iteration_s.sum())
        g = run.window(0, run.completed)
        by_gpu: dict[str, list[Any]] = {}
        for name, x in g["pass_s"].items():
            by_gpu.setdefault(gpu[name], []).append(x)
        import numpy as np

        window = calib.Window.from_samples(
            g["iteration_s"], {d: np.hstack(xs) for d, xs in by_gpu.items()}, g["exchange_s"]
        )
        cal = calib.update(cal, window, sim, w.workload, config)
        left = req.iterations - done
        rec: dict[str, Any] = {
            "done": done, "t_s": round(at(), 1), "config": config.label(),
            "measured_t_iter_s": window.iteration.mean_s if window.iteration else None,
            "factors": {k: round(f.scale, 4) for k, f in {**cal.compute, **cal.comm}.items()
                        if f.windows},
        }  # fmt: skip
        if left > 0:
            proj = calib.project(calib.calibrated(sim, cal), w.workload, config, left, rate,
                                 req.risk_quantile)  # fmt: skip
            plain_proj = calib.project(sim, w.workload, config, left, rate, req.risk_quantile)
            rec.update(projected_rest_s=proj.mean_s, projected_rest_q_s=proj.q_s,
                       uncalibrated_rest_s=plain_proj.mean_s, iterations_left=left)  # fmt: skip
        out.windows.append(rec)
        if left <= 0 or arm == "first plan":
            continue
        spent = sum(cloud.cost(a) for a in every)
        progress = Progress(done, at(), spent)
        if arm == "plain":
            m = window.iteration
            assert m is not None
            optimistic = m.mean_s - 1.96 * m.sd_s / math.sqrt(m.n)
            if at() + left * optimistic <= req.time_limit_s:
                continue
            replanner = Replanner(sim, overheads=overheads)
            reason = "the window's optimistic throughput projects past the deadline"
            result = replanner.plan(req, progress)
        else:
            other = calib.calibrated(sim, cal.unobserved())  # configurations not run yet
            replanner = Replanner(other, overheads=overheads)
            result = replanner.plan(req, progress)
            best, _ = replanner.choose(result)
            alt_config = ClusterConfig(
                tuple(Group(result.request.offers[i].instance, c, b) for i, c, b in best.choice)
            )
            alt = None
            if alt_config.label() != config.label():
                alt = calib.project(other, w.workload, alt_config, left,
                                    sum(result.request.offers[i].usd_per_hour * c
                                        for i, c, _ in best.choice), req.risk_quantile)  # fmt: skip
            decision = calib.should_replan(
                proj, elapsed_s=at(), spent_usd=spent, time_limit_s=req.time_limit_s,
                budget_usd=req.budget_usd, alternative=alt, switch_s=overheads.total_s,
                objective="cost",
            )  # fmt: skip
            if not decision.replan:
                continue
            reason = decision.reason
        chosen, missed = replanner.choose(result)
        new_config = ClusterConfig(
            tuple(Group(result.request.offers[i].instance, c, b) for i, c, b in chosen.choice)
        )
        if new_config.label() == config.label():
            continue
        out.replans.append({
            "done": done, "t_s": round(at(), 1), "reason": reason, "to": chosen.label,
            "predicted_finish_s": round(at() + chosen.time_s, 1), "nearest_miss": bool(missed),
        })  # fmt: skip
        target = replanner.target(result.request, chosen.choice)
        change = replanner.change(cloud, allocs, target)
        for a in change.release:
            cloud.release(a)  # the volume detaches as they go (the emulator's detach)
        cloud.advance(SOLVE_S)
        new = cloud.launch_many(list(change.launch))
        every.extend(new)
        allocs = [*change.keep, *new]
        batches = {result.request.offers[i].instance.name: b for i, _, b in chosen.choice}
        config = new_config
        rate = sum(result.request.offers[i].usd_per_hour * c for i, c, _ in chosen.choice)
        out.configs.append(chosen.label)
    out.cost_usd = round(sum(cloud.cost(a) for a in {a.id: a for a in every}.values()), 2)
    for a in allocs:
        cloud.release(a)
    out.finish_s = round(at(), 1)
    out.met = out.finish_s <= req.time_limit_s
    return out


def projection_errors(stay: ArmResult) -> list[dict[str, Any]]:
    """Per window of the arm that stays on its configuration: the projection errors of
    the rest (calibrated and uncalibrated) against what the rest then took."""
    out = []
    ws = stay.windows
    for k, rec in enumerate(ws):
        if "projected_rest_s" not in rec:
            continue
        actual = sum(
            (ws[j]["measured_t_iter_s"] or 0.0) * (ws[j]["done"] - ws[j - 1]["done"])
            for j in range(k + 1, len(ws))
        )
        out.append({
            "window": k + 1,
            "calibrated": abs(rec["projected_rest_s"] / actual - 1),
            "uncalibrated": abs(rec["uncalibrated_rest_s"] / actual - 1),
            "q_covers": rec["projected_rest_q_s"] >= actual,
        })  # fmt: skip
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    import statistics

    def err(k: int, kind: str) -> float:
        return float(max(r["projection_error"][k - 1][kind] for r in rows))

    return {
        "cases": len(rows),
        "met": {a: sum(r["arms"][a]["met"] for r in rows) for a in ARMS},
        "max_projection_error_by_window": {
            kind: [round(err(k, kind), 4) for k in (1, 2, 3)]
            for kind in ("calibrated", "uncalibrated")
        },
        "median_cost_usd": {
            a: round(statistics.median(r["arms"][a]["cost_usd"] for r in rows), 2) for a in ARMS
        },
    }


def table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = [
        "| seed | N | deadline s | first plan | hidden | proj. err. w1 / w2 (calibrated) | "
        "uncalibrated | first plan | plain | recalibrated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e = r["projection_error"]

        def cell(a: str, arms: dict[str, Any] = r["arms"]) -> str:
            x = arms[a]
            return (
                f"{x['finish_s']:.0f} s {'met' if x['met'] else '**missed**'} ${x['cost_usd']:.2f}"
            )

        lines.append(
            f"| {r['seed']} | {r['iterations']} | {r['deadline_s']:.0f} | {r['first_plan']} | "
            f"{next(iter(r['hidden_slowdown']))} | {100 * e[0]['calibrated']:.1f}% / "
            f"{100 * e[1]['calibrated']:.1f}% | {100 * e[1]['uncalibrated']:.1f}% | "
            f"{cell('first plan')} | {cell('plain')} | {cell('recalibrated')} |"
        )
    lines.append("")
    lines.append(f"summary: {json.dumps(summary)}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
