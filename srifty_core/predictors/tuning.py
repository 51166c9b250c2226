"""Hyperparameter autotuning of one ``BusBandwidthRegressor``: seeded random search, scored by
MAPE under cross-validation grouped by allocation, stopped by a time budget.

- Score: weighted MAPE (%) of the out-of-fold predictions, folds from ``group_kfold`` on the
  group column (``allocation_id``): every allocation is predicted by a model that never saw
  it, so the score says how the model does on a *new* allocation.
- Space (``SearchSpace``): objective (pseudo-Huber, squared, absolute error; on log busbw),
  max_depth, learning rate (eta), n_estimators, min_child_weight, subsample, and the
  pseudo-Huber slope.
- Budget: trials are drawn from a ``numpy`` generator seeded with ``seed``; the first trial
  is the default parameters. Before each new trial the elapsed time is checked: once
  ``budget_s`` is spent no new trial starts (the one running finishes; at least one runs).
  ``max_trials`` bounds the count too. The sequence of trials is reproducible for a seed;
  how many fit in the budget depends on the machine's speed and load.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.errors import ConfigError
from srifty_core.predictors.bandwidth import (
    GROUP,
    LABEL,
    OBJECTIVES,
    BusBandwidthRegressor,
    group_kfold,
    mape,
)

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "reg:pseudohubererror",
    "max_depth": 6,
    "learning_rate": 0.1,
    "n_estimators": 200,
    "min_child_weight": 1.0,
    "subsample": 1.0,
    "huber_slope": 0.5,
}


@dataclass(frozen=True)
class SearchSpace:
    """Ranges sampled by the tuner (log-uniform where marked)."""

    objectives: tuple[str, ...] = OBJECTIVES
    max_depth: tuple[int, int] = (2, 10)
    learning_rate: tuple[float, float] = (0.02, 0.3)  # log-uniform
    n_estimators: tuple[int, int] = (50, 600)
    min_child_weight: tuple[float, float] = (0.5, 20.0)  # log-uniform
    subsample: tuple[float, float] = (0.6, 1.0)
    huber_slope: tuple[float, float] = (0.1, 1.0)  # log-uniform

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        def logu(lo: float, hi: float) -> float:
            return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))

        return {
            "objective": str(rng.choice(list(self.objectives))),
            "max_depth": int(rng.integers(self.max_depth[0], self.max_depth[1] + 1)),
            "learning_rate": logu(*self.learning_rate),
            "n_estimators": int(rng.integers(self.n_estimators[0], self.n_estimators[1] + 1)),
            "min_child_weight": logu(*self.min_child_weight),
            "subsample": float(rng.uniform(*self.subsample)),
            "huber_slope": logu(*self.huber_slope),
        }


@dataclass(frozen=True)
class Trial:
    params: dict[str, Any]
    mape: float
    seconds: float


@dataclass
class TuneResult:
    """The best parameters, their grouped-CV MAPE and out-of-fold predictions, all trials."""

    best_params: dict[str, Any]
    best_mape: float
    oof: NDArray[np.float64]
    trials: list[Trial] = field(default_factory=list)
    n_splits: int = 0
    seconds: float = 0.0


def cross_val_predict(
    params: Mapping[str, Any],
    data: pd.DataFrame,
    *,
    groups: ArrayLike,
    weight: ArrayLike | None = None,
    n_splits: int = 5,
    n_jobs: int = 1,
    seed: int = 0,
) -> NDArray[np.float64]:
    """Out-of-fold busbw predictions, folds grouped by ``groups``."""
    y = data[LABEL].to_numpy(dtype=float)
    w = np.ones(len(data)) if weight is None else np.asarray(weight, dtype=float)
    oof = np.full(len(data), np.nan)
    for train, test in group_kfold(groups, n_splits):
        reg = BusBandwidthRegressor(**{**params, "n_jobs": n_jobs, "random_state": seed})
        reg.fit(data.iloc[train], y[train], w[train])
        oof[test] = reg.predict(data.iloc[test])
    return oof


def tune(
    data: pd.DataFrame,
    *,
    budget_s: float,
    group: str = GROUP,
    weight: ArrayLike | None = None,
    n_splits: int = 5,
    seed: int = 0,
    max_trials: int | None = None,
    space: SearchSpace | None = None,
    n_jobs: int = 1,
    clock: Callable[[], float] = time.monotonic,
) -> TuneResult:
    """Random search over ``space`` for one size class's rows ``data`` (features, ``busbw``
    and the ``group`` column), within ``budget_s`` seconds."""
    if not budget_s > 0:
        raise ConfigError(f"budget: must be positive seconds, got {budget_s}")
    if max_trials is not None and max_trials < 1:
        raise ConfigError(f"max_trials: must be >= 1, got {max_trials}")
    space = space or SearchSpace()
    rng = np.random.default_rng(seed)
    groups = data[group].astype(str).to_numpy()
    y = data[LABEL].to_numpy(dtype=float)
    start = clock()
    trials: list[Trial] = []
    best: tuple[float, dict[str, Any], NDArray[np.float64]] | None = None
    while True:
        if trials and (clock() - start >= budget_s):
            break
        if max_trials is not None and len(trials) >= max_trials:
            break
        params = dict(DEFAULT_PARAMS) if not trials else space.sample(rng)
        t0 = clock()
        oof = cross_val_predict(
            params, data, groups=groups, weight=weight, n_splits=n_splits, n_jobs=n_jobs, seed=seed
        )
        score = mape(oof, y, weight)
        trials.append(Trial(params=params, mape=score, seconds=clock() - t0))
        if best is None or score < best[0]:
            best = (score, params, oof)
    assert best is not None
    return TuneResult(
        best_params=best[1],
        best_mape=best[0],
        oof=best[2],
        trials=trials,
        n_splits=min(n_splits, len(np.unique(groups))),
        seconds=clock() - start,
    )
