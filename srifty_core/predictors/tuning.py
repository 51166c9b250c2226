"""Hyperparameter autotuning of one ``BusBandwidthRegressor``: Optuna's TPE sampler, seeded,
for a fixed number of trials, scored by MAPE under cross-validation grouped by allocation.

Contract: ``tune(data, n_trials=..., seed=...)`` (one size class's rows: features,
``busbw`` and the group column) returns a ``TuneResult``: the best parameters, their
grouped-CV MAPE (%), the out-of-fold predictions and every trial (pruned ones marked,
never the best). Nothing depends on the clock: the same data, seed and trial count give
the same trials, best parameters and error on any machine. ``Folds`` prepares each
fold's rows once for all trials.

Imports ``predictors.features``, ``predictors.metrics`` (``group_kfold``, ``mape``) and
``predictors.regressor``; Optuna only inside ``tune``.

How and why (score, space, search, pruning): docs/design/bandwidth.md#tuning
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
from srifty_core.predictors.features import GROUP, LABEL, BandwidthDataError
from srifty_core.predictors.metrics import group_kfold, mape
from srifty_core.predictors.regressor import OBJECTIVES, BusBandwidthRegressor, Design, Query

if TYPE_CHECKING:
    import optuna
    import pandas as pd

    from srifty_core.predictors.prior import LinkPrior

DEFAULT_TRIALS = 30
"""Trials per size class unless told otherwise: 10 random start-up trials, then 20 by TPE."""
PRUNE_STARTUP = 5
"""Completed trials before the pruner may stop one."""
DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "reg:pseudohubererror",
    "max_depth": 6,
    "learning_rate": 0.1,
    "n_estimators": 200,
    "min_child_weight": 1.0,
    "subsample": 1.0,
    "huber_slope": 0.5,
}
HUBER = "reg:pseudohubererror"


@dataclass(frozen=True)
class SearchSpace:
    """Ranges sampled by the tuner (log-uniform where marked)."""

    objectives: tuple[str, ...] = OBJECTIVES
    max_depth: tuple[int, int] = (2, 10)
    learning_rate: tuple[float, float] = (0.02, 0.3)  # log-uniform
    n_estimators: tuple[int, int] = (50, 600)
    min_child_weight: tuple[float, float] = (0.5, 20.0)  # log-uniform
    subsample: tuple[float, float] = (0.6, 1.0)
    huber_slope: tuple[float, float] = (0.1, 1.0)  # log-uniform; pseudo-Huber only

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """One point of the space, drawn through ``trial`` (define-by-run)."""
        params: dict[str, Any] = {
            "objective": trial.suggest_categorical("objective", list(self.objectives)),
            "max_depth": trial.suggest_int("max_depth", *self.max_depth),
            "learning_rate": trial.suggest_float("learning_rate", *self.learning_rate, log=True),
            "n_estimators": trial.suggest_int("n_estimators", *self.n_estimators),
            "min_child_weight": trial.suggest_float(
                "min_child_weight", *self.min_child_weight, log=True
            ),
            "subsample": trial.suggest_float("subsample", *self.subsample),
        }
        if params["objective"] == HUBER:
            params["huber_slope"] = trial.suggest_float("huber_slope", *self.huber_slope, log=True)
        return params


@dataclass(frozen=True)
class Trial:
    params: dict[str, Any]
    mape: float
    """Weighted MAPE (%) of the out-of-fold predictions; of the folds done if ``pruned``."""
    seconds: float
    """Wall time of the trial: reported only, never used to decide anything."""
    pruned: bool = False
    """Stopped by the pruner before its last fold."""


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
    folds: Folds | None = None,
    on_fold: Callable[[int, NDArray[np.float64]], None] | None = None,
) -> NDArray[np.float64]:
    """Out-of-fold busbw predictions, folds grouped by ``groups``; ``folds``: the same
    folds with their physics priors already fitted (``Folds``: what every trial of one
    tuning shares), else made here. ``on_fold(k, oof)`` is called after fold ``k`` with the
    predictions so far (NaN where not yet predicted); it may raise to stop early."""
    y = data[LABEL].to_numpy(dtype=float)
    w = np.ones(len(data)) if weight is None else np.asarray(weight, dtype=float)
    folds = folds or Folds(data, y, w, groups, n_splits)
    oof = np.full(len(data), np.nan)
    for k, (_, test) in enumerate(folds.splits):
        reg = BusBandwidthRegressor(**{**params, "n_jobs": n_jobs, "random_state": seed})
        reg.fit_design(folds.design(k, reg))
        oof[test] = reg.predict_query(folds.query(k, reg))
        if on_fold is not None:
            on_fold(k, oof)
    return oof


class Folds:
    """The grouped folds of one data set (``group_kfold``) and, per fold, what every trial
    would otherwise compute again from the same rows: the physics prior of its training
    rows (``BusBandwidthRegressor.fit_prior``, scipy least squares), their XGBoost matrix
    (``BusBandwidthRegressor.design``: hardware columns, one-hot encoding, distinct rows)
    and the test rows' (``query``). None of them depends on the trial's XGBoost
    parameters, only on ``prior``, ``prior_tree`` and whether the objective merges rows
    (``merges_rows``), so 30 trials make each once per fold instead of 30 times; a trial
    only trains and predicts."""

    def __init__(
        self,
        data: pd.DataFrame,
        y: NDArray[np.float64],
        weight: NDArray[np.float64],
        groups: ArrayLike,
        n_splits: int,
    ) -> None:
        self.data, self.y, self.weight = data, y, weight
        self.splits = list(group_kfold(groups, n_splits))
        self._priors: dict[tuple[int, bool], LinkPrior] = {}
        self._designs: dict[tuple[int, bool, bool, bool], Design] = {}
        self._queries: dict[tuple[int, bool, bool], Query] = {}

    def prior(self, k: int, reg: BusBandwidthRegressor) -> LinkPrior:
        key = (k, bool(reg.prior_tree))
        if key not in self._priors:
            train = self.splits[k][0]
            self._priors[key] = reg.fit_prior(
                self.data.iloc[train], self.y[train], self.weight[train]
            )
        return self._priors[key]

    def design(self, k: int, reg: BusBandwidthRegressor) -> Design:
        """Fold ``k``'s training rows made ready for ``reg`` (``reg.fit_design``)."""
        key = (k, bool(reg.prior), bool(reg.prior_tree), reg.merges_rows)
        if key not in self._designs:
            train = self.splits[k][0]
            prior = self.prior(k, reg) if reg.prior else None
            self._designs[key] = reg.design(
                self.data.iloc[train], self.y[train], self.weight[train], prior=prior
            )
        return self._designs[key]

    def query(self, k: int, reg: BusBandwidthRegressor) -> Query:
        """Fold ``k``'s test rows made ready for ``reg``, fitted on ``design(k, reg)``."""
        key = (k, bool(reg.prior), bool(reg.prior_tree))
        if key not in self._queries:
            self._queries[key] = reg.query(self.data.iloc[self.splits[k][1]])
        return self._queries[key]


def tune(
    data: pd.DataFrame,
    *,
    n_trials: int = DEFAULT_TRIALS,
    group: str = GROUP,
    weight: ArrayLike | None = None,
    n_splits: int = 5,
    seed: int = 0,
    space: SearchSpace | None = None,
    n_jobs: int = 1,
    prune: bool = True,
) -> TuneResult:
    """Search ``space`` for one size class's rows ``data`` (features, ``busbw`` and the
    ``group`` column) in ``n_trials`` seeded trials (rules: module docstring). ``n_jobs`` is
    XGBoost's thread count; the trials themselves always run one after the other."""
    import optuna

    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise ConfigError(f"n_trials: must be an integer >= 1, got {n_trials!r}")
    if group not in data.columns:
        raise BandwidthDataError(
            f"tuning data: missing group column {group!r} (pass group= to name the column "
            "that says which allocation or table each row came from)"
        )
    space = space or SearchSpace()
    groups = data[group].astype(str).to_numpy()
    y = data[LABEL].to_numpy(dtype=float)
    start = time.monotonic()
    w = np.ones(len(data)) if weight is None else np.asarray(weight, dtype=float)
    folds = Folds(data, y, w, groups, n_splits)  # shared by every trial
    trials: list[Trial] = []
    best_oof: dict[str, NDArray[np.float64]] = {}

    def objective(trial: optuna.Trial) -> float:
        t0 = time.monotonic()
        params = space.suggest(trial)

        def report(k: int, oof: NDArray[np.float64]) -> None:
            if not prune or k == len(folds.splits) - 1:
                return
            done = ~np.isnan(oof)
            partial = _finite(mape(oof[done], y[done], w[done]))
            trial.report(partial, k)
            if trial.should_prune():
                trials.append(Trial(params, partial, time.monotonic() - t0, pruned=True))
                raise optuna.TrialPruned()

        oof = cross_val_predict(
            params,
            data,
            groups=groups,
            weight=w,
            n_jobs=n_jobs,
            seed=seed,
            folds=folds,
            on_fold=report,
        )
        score = _finite(mape(oof, y, weight))
        if all(score < t.mape for t in trials if not t.pruned):
            best_oof["oof"] = oof
        trials.append(Trial(params=params, mape=score, seconds=time.monotonic() - t0))
        return score

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial otherwise
    study = optuna.create_study(
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=PRUNE_STARTUP, n_warmup_steps=1),
    )
    study.enqueue_trial(dict(DEFAULT_PARAMS))
    study.optimize(objective, n_trials=n_trials, n_jobs=1)
    best = min((t for t in trials if not t.pruned), key=lambda t: t.mape)  # first of equals
    return TuneResult(
        best_params=best.params,
        best_mape=best.mape,
        oof=best_oof["oof"],
        trials=trials,
        n_splits=min(n_splits, len(np.unique(groups))),
        seconds=time.monotonic() - start,
    )


def _finite(score: float) -> float:
    """A score Optuna can rank: NaN (no rows) and infinities become +inf."""
    return score if math.isfinite(score) else math.inf
