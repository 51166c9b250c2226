"""Step 2 of a refresh: tune and fit the challenger on the training allocations.

Per size class, ``tuning.tune`` (grouped CV by allocation, MAPE, ``n_trials`` seeded Optuna
trials each, so a rerun on the same data picks the same parameters), then the final fit with
the best parameters. A size class with more than ``tune_rows`` rows is tuned on a sample of
them (``tuning_sample``: the same share of every allocation, chosen by a hash of each row's
content, so the same rows give the same sample in any order); the final fit uses all.
XGBoost runs on ``n_jobs`` threads (default: one per idle core, ``idle_cores``; the fitted
trees do not depend on it). The error table reports per size class and per instance type
the out-of-fold MAPE of the best parameters beside the noise floor on the rows tuned on.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.features import (
    GROUP,
    LABEL,
    LARGE,
    SMALL,
    BandwidthDataError,
    check_training_data,
    size_masks,
)
from srifty_core.predictors.metrics import mape, noise_floor_predictions
from srifty_core.predictors.mixed_rings import mix_mask
from srifty_core.predictors.refresh.data import data_version, holdout_allocations, row_hashes
from srifty_core.predictors.refresh.staging import FIT_FILE, MODEL_DIR, json_default, read_snapshot
from srifty_core.probing.config import MIN_ALLOCATIONS

if TYPE_CHECKING:
    import pandas as pd


def idle_cores() -> int:
    """Cores not busy by the 1-minute load average, at least one: XGBoost's OpenMP threads
    spin waiting for a core another job holds (2 threads ran 13-35x slower than one on
    this 2-core host under load), so a refresh takes a second thread only when a core is
    free for it."""
    cores = os.cpu_count() or 1
    return max(1, min(cores, cores - round(os.getloadavg()[0])))


def tuning_sample(df: pd.DataFrame, max_rows: int | None) -> np.ndarray:
    """Which rows of ``df`` to tune on: all if there are at most ``max_rows`` (or it is
    None), else the rows whose content hash falls below ``max_rows / len(df)``, so every
    allocation keeps about that share of its rows (whole repeats of one probe go together
    only when their rows are identical) and the choice depends on the rows, not on their
    order."""
    if max_rows is None or len(df) <= max_rows:
        return np.ones(len(df), dtype=bool)
    return np.asarray(row_hashes(df) < np.uint64(max_rows / len(df) * 2.0**64), dtype=bool)


def error_rows(
    df: pd.DataFrame, predicted: np.ndarray, floor: np.ndarray, mtu: int, *, by_type: bool = True
) -> list[dict[str, Any]]:
    """MAPE vs noise floor per size class (and per instance type): rows of the error table."""
    y = df[LABEL].to_numpy(dtype=float)
    w = df["weight"].to_numpy(dtype=float) if "weight" in df.columns else np.ones(len(df))
    masks = size_masks(df, mtu)
    groups: list[tuple[str, np.ndarray]] = [("all", np.ones(len(df), dtype=bool))]
    if by_type:
        types = df["instance_type"].astype(str).to_numpy()
        groups += [(t, types == t) for t in sorted(set(types))]
    rows = []
    for label, gmask in groups:
        for cls in (SMALL, LARGE):
            m = gmask & masks[cls]
            covered = m & np.isfinite(floor)
            rows.append(
                {
                    "instance_type": label,
                    "size_class": cls,
                    "rows": int(m.sum()),
                    "allocations": int(df.loc[m, GROUP].nunique()),
                    "mape": mape(predicted[m], y[m], w[m]),
                    "mape_covered": mape(predicted[covered], y[covered], w[covered]),
                    "noise_floor": mape(floor[covered], y[covered], w[covered]),
                    "floor_coverage": float(covered.sum() / m.sum()) if m.any() else math.nan,
                }
            )
    return rows


def tune_and_fit(staging: Path) -> dict[str, Any]:
    """Step 2: tune each size class on the training allocations, fit the challenger, save it
    and the error table into ``staging``."""
    from srifty_core.predictors.tuning import tune

    t0 = time.monotonic()
    df, config = read_snapshot(staging)
    held = set(holdout_allocations(df, config.holdout_fraction))
    if not held:
        raise BandwidthDataError(
            f"no allocation to hold out: some instance type needs >= {MIN_ALLOCATIONS} allocations"
        )
    fitted = df[~df[GROUP].astype(str).isin(held)].reset_index(drop=True)
    check_training_data(fitted, mtu=config.mtu)
    train = fitted[~mix_mask(fitted)].reset_index(drop=True)  # mixes: only the final fit's
    w = train["weight"].to_numpy(dtype=float)
    masks = size_masks(train, config.mtu)
    n_jobs = config.n_jobs or idle_cores()
    oof = np.full(len(train), np.nan)
    tuned = np.zeros(len(train), dtype=bool)
    best: dict[str, dict[str, Any]] = {}
    tuning: dict[str, Any] = {}
    for i, cls in enumerate((SMALL, LARGE)):
        m = masks[cls].copy()
        m[m] = tuning_sample(train[m], config.tune_rows)
        result = tune(
            train[m].reset_index(drop=True),
            n_trials=config.n_trials,
            weight=w[m],
            n_splits=config.n_splits,
            seed=config.seed + i,
            n_jobs=n_jobs,
        )
        oof[m] = result.oof
        tuned |= m
        best[cls] = result.best_params
        tuning[cls] = {
            "best_params": result.best_params,
            "cv_mape": result.best_mape,
            "rows": int(masks[cls].sum()),
            "tuned_rows": int(m.sum()),
            "trials": len(result.trials),
            "pruned": sum(t.pruned for t in result.trials),
            "folds": result.n_splits,
            "seconds": result.seconds,
            "trial_log": [
                {"mape": t.mape, "seconds": t.seconds, "pruned": t.pruned, **t.params}
                for t in result.trials
            ],
        }
    floor = noise_floor_predictions(train, weight=w)  # on all rows: the sample splits repeats
    table = error_rows(train[tuned].reset_index(drop=True), oof[tuned], floor[tuned], config.mtu)
    model = BandwidthModel(
        mtu=config.mtu,
        small_params={**best[SMALL], "n_jobs": n_jobs},
        large_params={**best[LARGE], "n_jobs": n_jobs},
    )
    model.fit(fitted, sample_weight=fitted["weight"].to_numpy(dtype=float))
    model.save(staging / MODEL_DIR)
    fit = {
        "data_version": data_version(df),
        "rows": len(df),
        "train_rows": len(train),
        "allocations": int(df[GROUP].nunique()),
        "holdout_allocations": sorted(held),
        "tuning": tuning,
        "error_table": table,
        "caps": model.caps_.to_dict(),
        "n_jobs": n_jobs,
        "seconds": time.monotonic() - t0,
    }
    (staging / FIT_FILE).write_text(json.dumps(fit, indent=1, default=json_default))
    return {
        "staging": str(staging),
        "cv_mape_small": tuning[SMALL]["cv_mape"],
        "cv_mape_large": tuning[LARGE]["cv_mape"],
        "trials": tuning[SMALL]["trials"] + tuning[LARGE]["trials"],
    }
