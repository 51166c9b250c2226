"""How well does t(B) from 4 probes predict latency at batch sizes it never measured?

For each model: a dense sweep measures forward and backward latency at every batch size in
DENSE (up to the model's B_max for this benchmark). Then, from the same measurements:

- **srifty k=4**: the piecewise-linear fit on the 4 budgeted probes only (1, two geometric
  points rounded to powers of two, B_max), as ``srifty profile --probes 4`` places them;
- **line k=4**: one line t = aB + b through the same 4 probes;
- **line, all points**: one line fitted on *every* dense point (the single-line model of the
  method's comparison, given more data than Srifty gets);
- **srifty dense**: the piecewise fit on every dense point.

Errors are MAPE at the batch sizes that are not among the 4 probes, for t_fw, t_bw and
t_iter = t_fw + t_bw, on two test sets: the powers of two (the method's protocol: a
geometric sweep from 1 to B_max) and every dense size (adding 3, 6, 12, ... 96: harder).

Run:  .venv/bin/python benchmarks/compute_fit.py  [--quick]
Writes benchmarks/results/compute_fit.json and compute_fit.png.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from srifty_core.predictors.compute import budget_batch_sizes, fit_line, fit_piecewise
from srifty_core.profiling.profile import mape
from srifty_core.profiling.timing import measure_latency
from srifty_core.workloads.zoo import build

OUT = Path(__file__).parent / "results"
DENSE = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
# model -> B_max for this benchmark (bounded so the sweep takes about a minute a model)
MODELS = {
    "resnet18": 128,
    "resnet50": 128,
    "vgg16": 128,
    "alexnet": 128,
    "shufflenet_v2": 128,
    "inception_v3": 64,
    "bert_base": 32,
    "dlrm": 128,
}
QUICK = {"resnet18": 64, "alexnet": 64, "shufflenet_v2": 64, "dlrm": 64}


def sweep(name: str, b_max: int, repeats: int, warmup: int) -> dict[str, list[float]]:
    w = build(name, "small", seed=0)
    w.module.train()
    sizes = [b for b in DENSE if b <= b_max]
    fw_m, bw_m, fw_cv, bw_cv = [], [], [], []
    for b in sizes:
        batch = w.make_batch(b, torch.device("cpu"))
        fw, bw = measure_latency(w, batch, repeats=repeats, warmup=warmup, sync=lambda: None)
        fw_m.append(statistics.fmean(fw))
        bw_m.append(statistics.fmean(bw))
        fw_cv.append(statistics.stdev(fw) / fw_m[-1])
        bw_cv.append(statistics.stdev(bw) / bw_m[-1])
    return {"sizes": sizes, "fw": fw_m, "bw": bw_m, "fw_cv": fw_cv, "bw_cv": bw_cv}


K_SWEEP = (3, 5, 6)
"""Other probe budgets, to show what each extra probe buys."""


def evaluate(data: dict[str, list[float]], repeats: int) -> dict[str, dict[str, float]]:
    """MAPE of each method at the sizes the 4-probe budget did not measure (every method is
    scored on the same points; the k-sweep entries on the points their own k left out)."""
    sizes = np.asarray(data["sizes"], dtype=float)
    pow2 = (sizes.astype(int) & (sizes.astype(int) - 1)) == 0
    out: dict[str, dict[str, float]] = {}
    preds: dict[str, dict[str, np.ndarray]] = {}
    probed: dict[str, np.ndarray] = {}
    for pass_ in ("fw", "bw"):
        y = np.asarray(data[pass_])
        cv = np.asarray(data[f"{pass_}_cv"])
        pi = np.isin(sizes, budget_batch_sizes(int(sizes[-1]), 4))
        fits = {
            "srifty k=4": (fit_piecewise(sizes[pi], y[pi], cv=cv[pi], repeats=repeats), pi),
            "line k=4": (fit_line(sizes[pi], y[pi]), pi),
            "line, all points": (fit_line(sizes, y), pi),
            "srifty dense": (fit_piecewise(sizes, y, cv=cv, repeats=repeats), pi),
        }
        for k in K_SWEEP:
            pk = np.isin(sizes, budget_batch_sizes(int(sizes[-1]), k))
            fits[f"srifty k={k}"] = (
                fit_piecewise(sizes[pk], y[pk], cv=cv[pk], repeats=repeats),
                pk,
            )
        for method, (f, mask) in fits.items():
            preds.setdefault(method, {})[pass_] = f(sizes)
            probed[method] = mask
    y_fw, y_bw = np.asarray(data["fw"]), np.asarray(data["bw"])
    for method, p in preds.items():
        out[method] = {}
        pi = probed[method]
        for suffix, test in (("", ~pi & pow2), ("_all", ~pi)):
            out[method] |= {
                f"fw{suffix}": mape(p["fw"][test], y_fw[test]),
                f"bw{suffix}": mape(p["bw"][test], y_bw[test]),
                f"iter{suffix}": mape((p["fw"] + p["bw"])[test], (y_fw + y_bw)[test]),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 models, B_max 64")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = QUICK if args.quick else MODELS
    results = {}
    t_start = time.perf_counter()
    for name, b_max in models.items():
        t0 = time.perf_counter()
        data = sweep(name, b_max, args.repeats, args.warmup)
        errors = evaluate(data, args.repeats)
        noise = 100 * statistics.fmean(data["fw_cv"] + data["bw_cv"]) / args.repeats**0.5
        results[name] = {"data": data, "mape": errors, "noise_pct": noise}
        e = errors["srifty k=4"]
        print(
            f"{name:14s} B_max {b_max:4d}  srifty k=4 MAPE (pow2) fw {e['fw']:5.2f}% "
            f"bw {e['bw']:5.2f}% iter {e['iter']:5.2f}% (all sizes {e['iter_all']:5.2f}%) | "
            f"line(all) iter {errors['line, all points']['iter']:5.2f}% "
            f"({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    methods = [
        "srifty k=4",
        "line k=4",
        "line, all points",
        *(f"srifty k={k}" for k in K_SWEEP),
        "srifty dense",
    ]
    keys = ("fw", "bw", "iter", "fw_all", "bw_all", "iter_all")
    overall = {
        m: {k: float(np.nanmean([r["mape"][m][k] for r in results.values()])) for k in keys}
        for m in methods
    }
    print("\nmean over models, MAPE % at unprobed batch sizes")
    print(f"{'':18s} {'powers of two':>23s}   {'all dense sizes':>23s}")
    print(f"{'method':18s}" + f" {'t_fw':>7s} {'t_bw':>7s} {'t_iter':>7s}  " * 2)
    for m in methods:
        o = overall[m]
        med = statistics.median(r["mape"][m]["iter"] for r in results.values())
        print(
            f"{m:18s} {o['fw']:7.2f} {o['bw']:7.2f} {o['iter']:7.2f}   "
            f"{o['fw_all']:7.2f} {o['bw_all']:7.2f} {o['iter_all']:7.2f}   "
            f"(median over models, t_iter: {med:.2f})"
        )
    noise = statistics.fmean(r["noise_pct"] for r in results.values())
    print(f"\nmeasurement noise (mean CV of a {args.repeats}-repeat mean): {noise:.2f}%")
    print(
        f"total {time.perf_counter() - t_start:.0f}s, {args.threads} thread(s), "
        f"{platform.machine()}"
    )
    OUT.mkdir(exist_ok=True)
    (OUT / "compute_fit.json").write_text(
        json.dumps(
            {"args": vars(args), "overall": overall, "noise_pct": noise, "models": results},
            indent=1,
        )
    )
    plot(results)


def plot(results: dict[str, dict[str, object]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)[:4]
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8))
    for ax, name in zip(np.atleast_1d(axes), names, strict=False):
        data = results[name]["data"]
        assert isinstance(data, dict)
        sizes = np.asarray(data["sizes"], dtype=float)
        y = (np.asarray(data["fw"]) + np.asarray(data["bw"])) * 1e3
        probes = budget_batch_sizes(int(sizes[-1]), 4)
        pi = np.isin(sizes, probes)
        grid = np.linspace(1, sizes[-1], 300)
        fw = fit_piecewise(sizes[pi], np.asarray(data["fw"])[pi])
        bw = fit_piecewise(sizes[pi], np.asarray(data["bw"])[pi])
        line = fit_line(sizes, y / 1e3)
        ax.plot(sizes[~pi], y[~pi], "o", color="tab:gray", label="measured (not probed)")
        ax.plot(sizes[pi], y[pi], "s", color="tab:red", label="the 4 probes")
        ax.plot(grid, (fw(grid) + bw(grid)) * 1e3, "-", color="tab:red", label="srifty k=4")
        ax.plot(grid, line(grid) * 1e3, "--", color="tab:blue", label="line, all points")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{name} (small, CPU)")
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("t_fw + t_bw (ms)")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "compute_fit.png", dpi=100)


if __name__ == "__main__":
    main()
