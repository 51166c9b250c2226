"""Compute estimates for GPUs nobody profiled, scored on published throughput.

    .venv/bin/python benchmarks/spec_compute.py      # about 15 s; writes results/spec_compute.json

The evidence is what ``profiling.estimate`` learns from on a fresh install: the published
single-GPU training throughput shipped in ``shipped/reference/public_training_throughput.csv``
(NVIDIA's DeepLearningExamples and Lambda's benchmarks; rows whose GPU the catalog has a
sheet for) and the three shipped H200 profiles. Each GPU is left out in turn:

* **specs**: the roofline's efficiencies fitted on the other GPUs, the left-out GPU's rows
  predicted from its sheet alone (``predictors.roofline.held_out``);
* **scaled**: each left-out row predicted from each row of the same program (source,
  network, precision, kind: ``Observation.same_program``) on every other GPU, through the
  roofline's times on the two GPUs and the share of the source row's departure that carries
  (``roofline.scale``), with the efficiencies and the share learned without the left-out
  GPU (``roofline.held_out`` too). ``scaled_any`` pairs rows of the same network, precision
  and kind from any source (another framework or harness too), for the record.

The error is (predicted - published) / published of the step time (the throughput's
inverse). ``public`` is the published rows alone (the H200 profiles' forward and backward
points at small batches are the rest). The noise floor is how far the sources disagree
about the same GPU, network and precision: per such group with two rows or more, each
row's distance from the group's median.
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
    public = {
        g: [e for o, e in zip([o for o in observations if o.group == g], v, strict=True)
            if o.what == "step"]
        for g, v in specs.items()
    }  # fmt: skip
    for gpu in sorted(specs):
        n_rows = sum(1 for o in observations if o.group == gpu)
        rows.append(
            {
                "gpu": gpu,
                "observations": n_rows,
                "specs": _summary(list(specs[gpu])),
                "specs_public": _summary(public[gpu]),
                "scaled": _summary(list(scaled.get(gpu, ()))),
                "scaled_any": _summary(list(held.scaled_any.get(gpu, ()))),
                "carry": held.carry.get(gpu),
            }
        )
    overall = {
        "specs": _summary([e for v in specs.values() for e in v]),
        "specs_public": _summary([e for v in public.values() for e in v]),
        "scaled": _summary([e for v in scaled.values() for e in v]),
        "scaled_any": _summary([e for v in held.scaled_any.values() for e in v]),
        "noise_floor": noise_floor(observations),
    }
    result = {
        "command": "benchmarks/spec_compute.py",
        "observations": len(observations),
        "efficiencies_all": fitted.efficiencies.to_dict(),
        "carry_all": fitted.carry,
        "specs_cv": fitted.specs_cv,
        "scaled_cv": fitted.scaled_cv,
        "per_gpu": rows,
        "overall": overall,
        "seconds": time.perf_counter() - t0,
    }
    write_text_atomic(args.out, json.dumps(result, indent=1))
    print(f"{'GPU left out':14s} {'rows':>5s} {'specs':>7s} {'signed':>8s} {'public':>7s} "
          f"{'scaled':>7s} {'pairs':>6s} {'any src':>8s} {'carry':>6s}")  # fmt: skip
    for r in rows:
        s, p, c, a = r["specs"], r["specs_public"], r["scaled"], r["scaled_any"]
        print(
            f"{r['gpu']:14s} {r['observations']:5d} {s.get('median_abs', math.nan):7.1%} "
            f"{s.get('mean_signed', math.nan):+8.1%} {p.get('median_abs', math.nan):7.1%} "
            f"{c.get('median_abs', math.nan):7.1%} {c.get('n', 0):6d} "
            f"{a.get('median_abs', math.nan):8.1%} {r['carry']:6.2f}"
        )
    o = overall
    print(
        f"{'all':14s} {len(observations):5d} {o['specs']['median_abs']:7.1%} "
        f"{o['specs']['mean_signed']:+8.1%} {o['specs_public']['median_abs']:7.1%} "
        f"{o['scaled']['median_abs']:7.1%} {o['scaled']['n']:6d} "
        f"{o['scaled_any']['median_abs']:8.1%} {fitted.carry:6.2f}"
    )
    print(
        "median |error| held out by GPU; public: the published rows alone; scaled: from the "
        "same program on another GPU; any src: from any source"
    )
    print(
        f"noise floor (sources disagreeing on one GPU, network, precision): median "
        f"{o['noise_floor']['median_abs']:.1%} over {o['noise_floor']['rows']} rows; "
        f"targets: specs <= 15%, scaled <= 10%; {result['seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
