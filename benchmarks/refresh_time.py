"""How long the bandwidth model's tuning takes, with the physics prior fitted once per fold
and shared by every trial (``tuning.Folds``) against the old way (each trial fits it again
in each fold), in the same run, alternated.

    .venv/bin/python benchmarks/refresh_time.py               # about 2 minutes (8 types)
    .venv/bin/python benchmarks/refresh_time.py --types 4 --trials 3 --rounds 1

Data: an emulated probe sweep (``cloud.emulated.emulated_probe_sweep``, seeded) of
``--types`` instance types, the size class above the MTU (where the prior fits longest).
Both ways must give the same best parameters and cross-validated MAPE (checked). Results:
``results/refresh_time.json``. Times on this shared 2-core host move by 10-20% from run to
run: read the ratio, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from srifty_core.atomic import write_text_atomic
from srifty_core.predictors import tuning
from srifty_core.predictors.bandwidth import DEFAULT_MTU, LARGE, mix_mask, size_masks

RESULTS = Path(__file__).resolve().parent / "results" / "refresh_time.json"
TYPES = (
    "g4dn.xlarge", "g4dn.12xlarge", "p3.8xlarge", "g5.xlarge",
    "g5.12xlarge", "p3.2xlarge", "g4dn.2xlarge", "g6.xlarge",
)  # fmt: skip


def _per_trial_folds(data: Any, n_trials: int, seed: int) -> tuning.TuneResult:
    """``tune`` as it was: every trial makes its folds and fits their priors itself."""

    def no_sharing(*args: Any, **kwargs: Any) -> Any:
        kwargs["folds"] = None
        return original(*args, **kwargs)

    original = tuning.cross_val_predict
    tuning.cross_val_predict = no_sharing  # type: ignore[assignment]
    try:
        return tuning.tune(data, n_trials=n_trials, seed=seed)
    finally:
        tuning.cross_val_predict = original  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    from srifty_core.cloud.emulated import emulated_probe_sweep

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", type=int, default=8, help="instance types swept (1-8)")
    ap.add_argument("--trials", type=int, default=5, help="tuning trials (default 5)")
    ap.add_argument("--rounds", type=int, default=2, help="alternated rounds (default 2)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    for name in ("types", "trials", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: must be >= 1")
    table = emulated_probe_sweep(
        list(TYPES[: args.types]), allocations=3, repeats=3, seed=0, sustained=False
    )
    df = table.to_pandas()
    df = df[~mix_mask(df)].reset_index(drop=True)
    data = df[size_masks(df, DEFAULT_MTU)[LARGE]].reset_index(drop=True)
    shared: list[float] = []
    fresh: list[float] = []
    results = []
    for _ in range(args.rounds):
        for label, run, into in (
            ("shared", lambda: tuning.tune(data, n_trials=args.trials, seed=1), shared),
            ("per trial", lambda: _per_trial_folds(data, args.trials, 1), fresh),
        ):
            t0 = time.perf_counter()
            r = run()
            into.append(time.perf_counter() - t0)
            results.append((label, r.best_mape, r.best_params))
    same = len({(m, json.dumps(p, sort_keys=True)) for _, m, p in results}) == 1
    out = {
        "command": "benchmarks/refresh_time.py",
        "rows": len(data),
        "types": args.types,
        "trials": args.trials,
        "rounds": args.rounds,
        "shared_s": shared,
        "per_trial_s": fresh,
        "ratio_median": statistics.median(f / s for f, s in zip(fresh, shared, strict=True)),
        "same_result": same,
        "best_mape": results[0][1],
    }
    write_text_atomic(args.out, json.dumps(out, indent=1))
    print(
        f"{len(data)} rows, {args.trials} trials x 5 folds: prior shared per fold "
        f"{np.median(shared):.1f} s, fitted per trial {np.median(fresh):.1f} s "
        f"(x{out['ratio_median']:.2f} in the same run, {args.rounds} alternated rounds); "
        f"same best parameters and MAPE: {same}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
