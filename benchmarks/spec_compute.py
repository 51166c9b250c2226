"""Compute estimates for GPUs nobody profiled, scored on published throughput.

    .venv/bin/python benchmarks/spec_compute.py      # about 20 s; writes results/spec_compute.json

The evidence is what ``profiling.estimate`` learns from on a fresh install: the published
single-GPU training throughput shipped in ``shipped/reference/public_training_throughput.csv``
(NVIDIA's DeepLearningExamples and Lambda's benchmarks; rows whose GPU the catalog has a
sheet for) and the three shipped H200 profiles. Each GPU is left out in turn:

* **specs**: the roofline's efficiencies fitted on the other GPUs, the left-out GPU's rows
  predicted from its sheet alone (``predictors.roofline.held_out``);
* **scaled**: each left-out row predicted from a row of the same network, precision and kind
  on every other GPU, times the roofline's ratio between the two GPUs, with the
  efficiencies fitted without the left-out GPU (``roofline.held_out`` too).

The error is (predicted - published) / published of the step time (the throughput's
inverse). The noise floor is how far the sources disagree about the same GPU, network and
precision: per such group with two rows or more, each row's distance from the group's
median.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from srifty_core.atomic import write_text_atomic
from srifty_core.catalog import Catalog
from srifty_core.predictors import roofline as rl
from srifty_core.profiling import estimate

RESULTS = Path(__file__).resolve().parent / "results" / "spec_compute.json"


def _summary(errs: list[float]) -> dict[str, float]:
    a = np.asarray(errs, dtype=np.float64)
    if a.size == 0:
        return {"n": 0}
    return {
        "n": int(a.size),
        "median_abs": float(np.median(np.abs(a))),
        "mean_signed": float(a.mean()),
        "too_fast_share": float((a < 0).mean()),
    }


def noise_floor(observations: list[rl.Observation]) -> dict[str, float]:
    """Distance of each published row from the median of its group (same GPU, network,
    precision; step time per sample), over groups of two rows or more."""
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for o in observations:
        if o.what == "step":
            groups[(o.group, o.census.key, o.mode)].append(o.seconds / o.batch)
    dev = []
    for per_sample in groups.values():
        if len(per_sample) >= 2:
            m = statistics.median(per_sample)
            dev += [abs(x / m - 1.0) for x in per_sample]
    return {"rows": len(dev), "median_abs": float(np.median(dev)) if dev else math.nan}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    observations, _ = estimate.evidence(Catalog.load(), store=None)
    held = rl.held_out(observations)
    specs, scaled = held.specs, held.scaled
    fitted = rl.learn(observations, held)
    rows = []
    for gpu in sorted(specs):
        n_rows = sum(1 for o in observations if o.group == gpu)
        rows.append(
            {
                "gpu": gpu,
                "observations": n_rows,
                "specs": _summary(list(specs[gpu])),
                "scaled": _summary(list(scaled.get(gpu, ()))),
            }
        )
    overall = {
        "specs": _summary([e for v in specs.values() for e in v]),
        "scaled": _summary([e for v in scaled.values() for e in v]),
        "noise_floor": noise_floor(observations),
    }
    result = {
        "command": "benchmarks/spec_compute.py",
        "observations": len(observations),
        "efficiencies_all": fitted.efficiencies.to_dict(),
        "specs_cv": fitted.specs_cv,
        "scaled_cv": fitted.scaled_cv,
        "per_gpu": rows,
        "overall": overall,
        "seconds": time.perf_counter() - t0,
    }
    write_text_atomic(args.out, json.dumps(result, indent=1))
    print(f"{'GPU left out':14s} {'rows':>5s} {'specs: median |err|':>20s} {'signed':>8s} "
          f"{'scaled: median |err|':>21s} {'pairs':>6s}")  # fmt: skip
    for r in rows:
        s, c = r["specs"], r["scaled"]
        print(
            f"{r['gpu']:14s} {r['observations']:5d} {s.get('median_abs', math.nan):20.1%} "
            f"{s.get('mean_signed', math.nan):+8.1%} {c.get('median_abs', math.nan):21.1%} "
            f"{c.get('n', 0):6d}"
        )
    o = overall
    print(
        f"{'all':14s} {len(observations):5d} {o['specs']['median_abs']:20.1%} "
        f"{o['specs']['mean_signed']:+8.1%} {o['scaled']['median_abs']:21.1%} "
        f"{o['scaled']['n']:6d}"
    )
    print(
        f"noise floor (sources disagreeing on one GPU, network, precision): median "
        f"{o['noise_floor']['median_abs']:.1%} over {o['noise_floor']['rows']} rows; "
        f"targets: specs <= 15%, scaled <= 10%; {result['seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
