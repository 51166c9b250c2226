"""The estimate from specs against profiles measured on a real GPU that it never saw.

    .venv/bin/python benchmarks/gpu_check_estimate.py [RESULTS_DIR]
        # default: benchmarks/results/gpu_check_h200_2026-12-04 (the run of
        # benchmarks/gpu_check.sh on one H200); writes estimate.json and estimate.txt there

For each measured profile in the folder (``<device>_<model>_<precision>.json``, with the
dense sweep of the same run in ``gpu_check.json``), ``profiling.estimate`` is asked for the
profile a new user gets before profiling: the model's operator census and the GPU's sheet,
through the roofline fitted on the shipped evidence (published single-GPU throughput and the
shipped H200 profiles), with that evidence cut in two ways so the measured profile is never
part of it:

* ``no_device``: every observation on the measured GPU is left out (public rows and shipped
  profiles): the GPU is new to the project;
* ``no_model_on_device``: only the observations of the same network on that GPU are left
  out: the GPU is known from other models;

and, for the record, ``as_shipped`` (the evidence as installed, which for ResNet-50 in fp32
holds an earlier H200 profile of the same network: in-sample, not evidence of accuracy).

Reported per profile and evidence cut: the signed error (estimate - measured) / measured of
t_iter = t_fw + t_bw at every dense batch, its median absolute value and mean, split into
the launch-bound batches (where the measured t_iter is within 25% of its smallest value) and
the throughput-bound rest; whether the measured t_iter lies inside the estimate's p90 band
(``estimate_cv``, what a plan's p90 carries); and the memory model (bytes per sample, B_max)
against the profiler's measurement. The noise floor is the run's own repeat spread (the
same batch measured in two profiles).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from srifty_core.atomic import write_text_atomic
from srifty_core.catalog import Catalog
from srifty_core.predictors import roofline as rl
from srifty_core.profiling import estimate
from srifty_core.profiling.census import load_census
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.roofline_profile import estimate_profile

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_check_h200_2026-12-04"
LAUNCH_BOUND = 1.25
"""A batch is launch-bound where its measured t_iter is within this factor of the
smallest measured t_iter (the flat start of the curve)."""
Z90 = 1.2816
"""One-sided 90% quantile of the standard normal: the p90 a plan checks is the estimate
times exp(Z90 * estimate_cv)."""


def _stats(errs: list[float]) -> dict[str, Any]:
    if not errs:
        return {"n": 0}
    a = np.asarray(errs)
    return {
        "n": int(a.size),
        "median_abs_pct": float(np.median(np.abs(a)) * 100),
        "mean_signed_pct": float(a.mean() * 100),
        "too_fast_share": float((a < 0).mean()),
    }


def cut_evidence(
    observations: list[rl.Observation], device: str, model: str | None
) -> list[rl.Observation]:
    """``observations`` without those on GPU ``device`` (of network ``model`` alone, when
    given)."""
    return [
        o
        for o in observations
        if not (o.device.name == device and (model is None or o.census.model == model))
    ]


def compare(
    measured: ComputeProfile, dense: dict[str, Any], fitted: rl.Roofline, catalog: Catalog
) -> dict[str, Any]:
    """The estimate of ``measured``'s model, settings and GPU from ``fitted``, set against
    the measured dense sweep."""
    spec = estimate.device_spec(catalog, measured.device_type)
    if spec is None:
        raise SystemExit(f"{measured.device_type}: no sheet in the catalog")
    census = load_census(measured.model, measured.size, estimate.census_settings(measured.settings))
    census = replace(census, settings=measured.settings)
    est = estimate_profile(census, spec, fitted)
    sizes = [int(b) for b in dense["sizes"]]
    meas = np.asarray(dense["fw_mean_s"]) + np.asarray(dense["bw_mean_s"])
    pred = np.asarray([float(est.fw_fit.at(b)) + float(est.bw_fit.at(b)) for b in sizes])
    err = (pred - meas) / meas
    floor = float(meas.min())
    launch = [i for i in range(len(sizes)) if meas[i] <= LAUNCH_BOUND * floor]
    through = [i for i in range(len(sizes)) if i not in launch]
    band = math.exp(Z90 * est.estimate_cv) if est.estimate_cv else 1.0
    inside = [(pred[i] / band) <= meas[i] <= (pred[i] * band) for i in range(len(sizes))]
    held = census.held_lines(measured.settings.precision)
    saved1 = census.saved_bytes(measured.settings.precision)[1]
    return {
        "estimate_path": est.estimate,
        "estimate_cv": est.estimate_cv,
        "batches": sizes,
        "measured_iter_ms": [round(float(x) * 1e3, 3) for x in meas],
        "estimated_iter_ms": [round(float(x) * 1e3, 3) for x in pred],
        "signed_err_pct": [round(float(e) * 100, 1) for e in err],
        "all": _stats(list(err)),
        "launch_bound": _stats([float(err[i]) for i in launch]),
        "launch_bound_batches": [sizes[i] for i in launch],
        "throughput_bound": _stats([float(err[i]) for i in through]),
        "p90_band_coverage": float(np.mean(inside)),
        "memory": {
            "measured_per_sample_mib": measured.memory_per_sample_bytes / 2**20,
            "estimated_per_sample_mib": est.memory_per_sample_bytes / 2**20,
            # a sample's share of what the passes hold at most at large batches (the
            # census's steepest moment), at the widths that run, and of the saved tensors
            "census_peak_per_sample_mib": max(b for _, b in held) / 2**20 if held else None,
            "census_saved_per_sample_mib": saved1 / 2**20,
            "measured_fixed_mib": measured.memory_fixed_bytes / 2**20,
            "estimated_fixed_mib": est.memory_fixed_bytes / 2**20,
            "measured_b_max": measured.b_max,
            "estimated_b_max": est.b_max,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    run = json.loads((args.results / "gpu_check.json").read_text(encoding="utf-8"))
    catalog = Catalog.load()
    observations, _ = estimate.evidence(catalog, store=None)
    fits: dict[tuple[str, str | None], rl.Roofline] = {}

    def fitted(device: str, model: str | None) -> rl.Roofline:
        if (device, model) not in fits:
            fits[(device, model)] = rl.learn(cut_evidence(observations, device, model))
        return fits[(device, model)]

    out: dict[str, Any] = {
        "benchmark": "gpu_check_estimate",
        "results": args.results.name,
        "device_name": run["environment"].get("device_name"),
        "torch": run["environment"].get("torch"),
        "tf32": {
            "matmul": run["environment"].get("cuda_matmul_allow_tf32"),
            "cudnn": run["environment"].get("cudnn_allow_tf32"),
        },
        "evidence_observations": len(observations),
        "profiles": [],
    }
    lines = [
        f"Estimate from specs against profiles measured on {out['device_name']} "
        f"({args.results.name}); error = (estimate - measured) / measured of t_fw + t_bw",
        "",
    ]
    for m in run["models"]:
        if m.get("status") != "ok":
            continue
        measured = ComputeProfile.from_json(
            (args.results / m["profile_file"]).read_text(encoding="utf-8")
        )
        rep = m["eval"].get("repeat_spread", {})
        spread = [rep.get("fw_mean_abs_pct"), rep.get("bw_mean_abs_pct")]
        row: dict[str, Any] = {
            "model": measured.model,
            "precision": measured.settings.precision,
            "device_type": measured.device_type,
            "repeat_spread_pct": spread,
            "cuts": {},
        }
        cuts = {
            "no_device": (measured.device_type, None),
            "no_model_on_device": (measured.device_type, measured.model),
            "as_shipped": ("", ""),  # cuts nothing: no GPU is named ""
        }
        for name, (device, model) in cuts.items():
            roof = fitted(device, model)
            row["cuts"][name] = c = compare(measured, m["dense"], roof, catalog)
            c["evidence_gpus"] = list(roof.gpus)
            c["evidence_observations"] = roof.observations
            a, lb, tb = c["all"], c["launch_bound"], c["throughput_bound"]
            lines.append(
                f"{measured.model} {measured.settings.precision} [{name}]: median |err| "
                f"{a['median_abs_pct']:.1f}% (mean {a['mean_signed_pct']:+.1f}%, too fast "
                f"{a['too_fast_share']:.0%}); launch-bound B<={max(c['launch_bound_batches'])} "
                f"{lb.get('median_abs_pct', math.nan):.1f}% "
                f"(mean {lb.get('mean_signed_pct', math.nan):+.1f}%), throughput-bound "
                f"{tb.get('median_abs_pct', math.nan):.1f}% "
                f"(mean {tb.get('mean_signed_pct', math.nan):+.1f}%); p90 band "
                f"(cv {c['estimate_cv']:.2f}) holds {c['p90_band_coverage']:.0%}"
            )
        mem = row["cuts"]["no_device"]["memory"]
        lines.append(
            f"    memory: per sample {mem['estimated_per_sample_mib']:.1f} MiB estimated vs "
            f"{mem['measured_per_sample_mib']:.1f} measured"
            + (
                f" (the passes' peak {mem['census_peak_per_sample_mib']:.1f}, "
                f"the saved tensors {mem['census_saved_per_sample_mib']:.1f})"
                if mem.get("census_peak_per_sample_mib") is not None
                and "census_saved_per_sample_mib" in mem
                else ""
            )
            + "; fixed "
            f"{mem['estimated_fixed_mib']:.0f} vs {mem['measured_fixed_mib']:.0f} MiB; B_max "
            f"{mem['estimated_b_max']} vs {mem['measured_b_max']}"
            f"{' (search capped)' if m.get('b_max_capped') else ''}; repeat spread fw/bw "
            + " / ".join(f"{s:.1f}%" for s in spread if s is not None)
        )
        out["profiles"].append(row)
    for cut in ("no_device", "no_model_on_device"):
        errs = [e / 100 for r in out["profiles"] for e in r["cuts"][cut]["signed_err_pct"]]
        thr = [
            e / 100
            for r in out["profiles"]
            for e, b in zip(
                r["cuts"][cut]["signed_err_pct"], r["cuts"][cut]["batches"], strict=True
            )
            if b not in r["cuts"][cut]["launch_bound_batches"]
        ]
        out[f"overall_{cut}"] = {"all": _stats(errs), "throughput_bound": _stats(thr)}
    spreads = [s for r in out["profiles"] for s in r["repeat_spread_pct"] if s is not None]
    out["noise_floor_repeat_spread_median_pct"] = statistics.median(spreads) if spreads else None
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    lines += [
        "",
        "overall (every profile, every dense batch): "
        + "; ".join(
            f"{cut} median |err| {out[f'overall_{cut}']['all']['median_abs_pct']:.1f}% "
            f"(throughput-bound {out[f'overall_{cut}']['throughput_bound']['median_abs_pct']:.1f}%)"
            for cut in ("no_device", "no_model_on_device")
        )
        + f"; noise floor (repeat spread, median) {out['noise_floor_repeat_spread_median_pct']:.1f}"
        + "%",
        f"wall {out['wall_s']} s",
    ]
    write_text_atomic(args.results / "estimate.json", json.dumps(out, indent=1) + "\n")
    write_text_atomic(args.results / "estimate.txt", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
