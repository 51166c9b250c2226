"""How the bandwidth model is scored: MAPE, grouped folds, the noise floor of the probes
(the best any predictor of the features could do)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.predictors.base import FEATURE_COLUMNS, with_collective
from srifty_core.predictors.features import GROUP, LABEL, BandwidthDataError

if TYPE_CHECKING:
    import pandas as pd

# -- metrics -------------------------------------------------------------------------------


def mape(predicted: ArrayLike, observed: ArrayLike, weight: ArrayLike | None = None) -> float:
    """Mean absolute percentage error, %, optionally weighted (NaN for no rows)."""
    p = np.asarray(predicted, dtype=float)
    o = np.asarray(observed, dtype=float)
    if o.size == 0:
        return math.nan
    err = np.abs(p - o) / o
    if weight is None:
        return float(100.0 * err.mean())
    w = np.asarray(weight, dtype=float)
    return float(100.0 * np.sum(w * err) / np.sum(w)) if np.sum(w) > 0 else math.nan


def group_kfold(
    groups: ArrayLike, n_splits: int
) -> list[tuple[NDArray[np.intp], NDArray[np.intp]]]:
    """(train, test) index pairs from scikit-learn's ``GroupKFold`` (no shuffling: groups
    in decreasing size, each into the fold with the fewest rows so far), so every group is
    wholly in one test fold and never in the train and test part of the same fold.
    ``n_splits`` is lowered to the number of groups; fewer than 2 groups cannot be split."""
    from sklearn.model_selection import GroupKFold

    g = np.asarray(groups)
    n_groups = len(np.unique(g))
    k = min(n_splits, n_groups)
    if k < 2:
        raise BandwidthDataError(f"cross-validation needs >= 2 groups, got {n_groups}")
    splits = GroupKFold(n_splits=k).split(np.zeros((len(g), 1)), groups=g)
    return [(np.asarray(train, np.intp), np.asarray(test, np.intp)) for train, test in splits]


def _mape_optimal(values: NDArray[np.float64], weights: NDArray[np.float64]) -> float:
    """The constant minimising weighted MAPE on ``values``: the median with weights w/y."""
    w = weights / values
    order = np.argsort(values)
    cw = np.cumsum(w[order])
    return float(values[order][np.searchsorted(cw, 0.5 * cw[-1])])


def noise_floor_predictions(
    data: pd.DataFrame,
    *,
    group: str = GROUP,
    config: Sequence[str] = FEATURE_COLUMNS,
    weight: ArrayLike | None = None,
) -> NDArray[np.float64]:
    """For each row, the best constant guess from the *other* groups' rows of the same
    configuration (all of ``config`` equal): the value minimising their MAPE (a weighted
    median). NaN where no other group measured that configuration.

    MAPE of these against the labels is the noise floor: what a model that knew each
    configuration's distribution exactly, but not the allocation it will land on, would
    score."""
    import pandas as pd

    n = len(data)
    out = np.full(n, np.nan)
    if n == 0:
        return out
    y = data[LABEL].to_numpy(dtype=float)
    w = np.ones(n) if weight is None else np.asarray(weight, dtype=float)
    data = with_collective(data)
    keys = pd.MultiIndex.from_frame(data[list(config)].astype(str)).factorize()[0]
    gcodes = pd.factorize(data[group])[0]
    order = np.argsort(keys, kind="stable")
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    for rows in np.split(order, bounds):
        gs = gcodes[rows]
        if np.unique(gs).size < 2:
            continue
        for g in np.unique(gs):
            mine, others = rows[gs == g], rows[gs != g]
            out[mine] = _mape_optimal(y[others], w[others])
    return out
