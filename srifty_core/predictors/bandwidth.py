"""The allreduce bus-bandwidth model: two XGBoost regressors split at the MTU, plus caps.

What it predicts: **bus bandwidth** ``2*s*(n-1)/(n*t)`` in bytes/s of one allreduce (not its
time, not algorithm bandwidth ``s/t``), from the probe-record features
(``predictors.base.FEATURE_COLUMNS``).

How:

- **Two regressors.** Buffers up to the MTU (``buffer_bytes <= mtu``; 9001 bytes on EC2) are
  latency-bound and noisy, larger ones bandwidth-bound; one XGBoost model each
  (``BusBandwidthRegressor``). ``BandwidthModel`` routes each row by its buffer size.
- **Physics prior, learned residual.** Each regressor first fits the link prior
  (``predictors.prior``: rated NVLink/PCIe/NIC bandwidth from the catalog and GPU specs,
  with each link class's efficiency and per-hop latency learned from the rows), then
  XGBoost fits ``log(busbw / prior)`` on the features plus ones that describe any type
  (``DERIVED``: VMs, ranks per VM, rated intra and NIC bandwidth, the prior itself). A type
  the rows never held (in the catalog, never probed) is answered by the prior alone: the
  trees' type columns know nothing about it, and held out by table, the prior alone did
  better on such types than the trees (BENCHMARKS.md). Monotone constraints (``MONOTONE``)
  keep the prediction non-decreasing in every rated link speed, where physics is certain.
- **Distinct rows.** With squared error, XGBoost trains on one row per distinct feature
  row (``merge_rows``: the weighted mean of its log targets, the sum of its weights):
  probes repeat each configuration 6 to 15 times (repeats, allocations), and the trees are
  the same. Tuning prepares each fold's rows once for all its trials (``tuning.Folds``).
- **Knows what it does not know** (``Domain``, ``LogErrors``): a row is in domain when its
  type was probed with that many ranks per VM over a VM count range holding its own;
  ``predict_interval`` gives the band that held-out probes fell in (grouped
  cross-validation inside the domain, the prior on held-out types outside it), and
  ``level_sigma`` of an unprobed type is that wider spread, which the simulator's p90 uses.
- **Never <= 0.** Each regressor fits ``log(busbw)`` (centred on its weighted median), so a
  prediction is ``exp(...)``, positive by construction; it is then clipped from below at
  ``BUSBW_FLOOR`` (1 byte/s) so that an underflow can never return 0. Fitting in log space
  also makes squared error on the target close to squared *relative* error, which is what
  MAPE reads.
- **Categorical features** (``CATEGORICAL``: provider, cloud, region, zone, instance_type,
  gpu_model, backend) are one-hot encoded with the vocabulary seen at fit time. A category
  never seen in training (a new instance type, a new zone) encodes as all zeros: every tree
  then takes the "not any known type" branch at each split on that column, and the
  prediction rests on the numeric features (``NUMERIC``: network_gbps, gpus_per_vm, vcpus,
  world_size, buffer_bytes, concurrent, placement_group), which describe any type. A null
  ``network_gbps`` is passed to XGBoost as missing.
- **Caps** (``BandwidthCaps``): the total bus bandwidth one VM of a type sustains across
  concurrent transfers, for the simulator's fair sharing. Rule, per (instance type, world
  size): on large buffers (``>= cap_min_buffer``, 1 MiB by default, or the largest size
  probed when none is that large), take for each allocation the median over repeats of
  ``concurrent * busbw`` at every (buffer, concurrency) point and keep its maximum (what that
  allocation sustained); the cap is the ``cap_quantile`` (0.95) quantile of these over
  allocations. Caps of rings inside one VM (NVLink or PCIe) and across VMs (the NICs) are
  kept apart (``predictors.network.WorldTable``), and a query is inside one VM when its
  ranks, one per GPU, fit on one (``prior.one_vm``). A world size never probed for that
  type on its side takes the cap of the nearest probed world size on that side (ties: the
  larger one); beyond the largest probed, the largest's. A type never probed on that side:
  its rated link there (the NIC across VMs, its NVLink or PCIe per GPU and direction inside
  one: ``prior.hardware_of``) ``x`` the median cap/rated ratio of the probed types of that
  side, or the rated link itself where no probed type of the side has a rating; a type
  without a rating takes the smallest cap probed on that side (else on either:
  conservative).
- **Mixed rings**: rows probed over a ring of several instance types (``probing.mix``)
  train neither regressor nor any cap; they give the mixed-ring factor
  (``mixed_factor``, rule in ``predictors.network``), saved with the caps (a model saved
  before has none: 1).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.errors import ConfigError, SriftyError
from srifty_core.predictors.base import FEATURE_COLUMNS
from srifty_core.predictors.network import (
    DecadeFactors,
    WorldTable,
    level_sigmas,
    mean_time_factors,
    mix_mask,
    mixed_ring_factors,
    sustained_caps,
    sustained_factors,
    sustained_mask,
)
from srifty_core.predictors.prior import (
    LinkPrior,
    distinct_rows,
    hardware_columns,
    hardware_of,
    one_vm,
)

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_MTU = 9001
"""Bytes one network packet carries on EC2 (jumbo frames)."""
BUSBW_FLOOR = 1.0
"""Predictions are never below this (bytes/s): a documented floor against underflow."""
CATEGORICAL: tuple[str, ...] = (
    "provider",
    "cloud",
    "region",
    "zone",
    "instance_type",
    "gpu_model",
    "backend",
)
NUMERIC: tuple[str, ...] = tuple(c for c in FEATURE_COLUMNS if c not in CATEGORICAL)
"""Every other feature of the contract, in its order: gpus_per_vm, vcpus, network_gbps,
placement_group, world_size, buffer_bytes, concurrent."""
LABEL = "busbw"
GROUP = "allocation_id"
SMALL, LARGE = "small", "large"
"""Size classes: ``buffer_bytes <= mtu`` and ``> mtu``."""
MIN_ROWS_PER_CLASS = 8
MIN_GROUPS = 2
DEFAULT_CAP_QUANTILE = 0.95
DEFAULT_CAP_MIN_BUFFER = 1 << 20
_FEATURE_NAME_BAD = re.compile(r"[\[\]<>,]")


class BandwidthDataError(SriftyError, ValueError):
    """Training data the bandwidth model cannot use (empty, too small, bad columns)."""


# -- data checks ---------------------------------------------------------------------------


def null_numeric_as_nan(features: pd.DataFrame) -> pd.DataFrame:
    """Numeric feature columns that hold only nulls (``network_gbps`` of a type without a
    rated network, e.g. ``local.cpu``) come out of ``pd.DataFrame(rows)`` as ``object``;
    give them a float dtype (NaN) so that the model sees a missing value."""
    empty = [
        c for c in NUMERIC
        if c in features.columns and features[c].dtype == object and features[c].isna().all()
    ]  # fmt: skip
    if not empty:
        return features
    return features.astype({c: "float64" for c in empty})


def check_features(features: pd.DataFrame, *, where: str = "features") -> None:
    """Raise ``BandwidthDataError`` unless every feature column is present with a usable
    type (numbers for ``NUMERIC``; ``network_gbps`` may be null)."""
    import pandas as pd

    missing = [c for c in FEATURE_COLUMNS if c not in features.columns]
    if missing:
        raise BandwidthDataError(f"{where}: missing column(s) {missing}")
    for c in NUMERIC:
        col = features[c]
        if not (pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col)):
            raise BandwidthDataError(f"{where}: column {c!r} must be numeric, got {col.dtype}")
        if c != "network_gbps" and col.isna().any():
            raise BandwidthDataError(f"{where}: column {c!r} has null values")
    if (features["buffer_bytes"] <= 0).any():
        raise BandwidthDataError(f"{where}: buffer_bytes must be positive")


def check_training_data(
    probes: pd.DataFrame,
    *,
    mtu: int = DEFAULT_MTU,
    min_rows: int = MIN_ROWS_PER_CLASS,
    min_groups: int = MIN_GROUPS,
    group: str = GROUP,
) -> None:
    """Raise ``BandwidthDataError`` (naming what is wrong) unless ``probes`` can train and
    cross-validate the model: the feature columns, a positive finite ``busbw``, a group
    column, and for each size class at least ``min_rows`` rows from ``min_groups`` groups
    of single instance types (rows of mixed rings train no regressor)."""
    if len(probes) == 0:
        raise BandwidthDataError("no probe records to train on (empty dataset)")
    check_features(probes, where="probe records")
    if LABEL not in probes.columns:
        raise BandwidthDataError(f"probe records: missing column {LABEL!r}")
    if group not in probes.columns:
        raise BandwidthDataError(
            f"probe records: missing group column {group!r} (which allocation each row was "
            "measured on; pass group= to name another column, e.g. a table or run id)"
        )
    y = probes[LABEL].to_numpy(dtype=float, na_value=np.nan)
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise BandwidthDataError("probe records: busbw must be positive and finite")
    if "weight" in probes.columns:
        w = probes["weight"].to_numpy(dtype=float, na_value=np.nan)
        if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
            raise BandwidthDataError("probe records: weights must be finite, >= 0, not all 0")
    mixed = mix_mask(probes)
    if mixed.all():
        raise BandwidthDataError(
            "probe records: only mixed-type rings; probe their instance types on their own too"
        )
    for name, mask in size_masks(probes, mtu).items():
        part = probes[mask & ~mixed]
        n_groups = part[group].nunique()
        if len(part) < min_rows or n_groups < min_groups:
            where = "<=" if name == SMALL else ">"
            raise BandwidthDataError(
                f"too few probes for buffers {where} MTU ({mtu} B): {len(part)} row(s) from "
                f"{n_groups} {group} value(s); need >= {min_rows} rows from >= {min_groups} "
                "(probe more sizes or allocations)"
            )


def size_masks(features: pd.DataFrame, mtu: int) -> dict[str, NDArray[np.bool_]]:
    """Row masks of the two size classes."""
    b = features["buffer_bytes"].to_numpy(dtype=np.int64)
    return {SMALL: b <= mtu, LARGE: b > mtu}


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


# -- features ------------------------------------------------------------------------------


class FeatureEncoder:
    """Numeric features as they are; categorical ones one-hot over the fitted vocabulary
    (unseen categories: all zeros)."""

    def __init__(
        self,
        categorical: Sequence[str] = CATEGORICAL,
        numeric: Sequence[str] = NUMERIC,
    ) -> None:
        self.categorical = tuple(categorical)
        self.numeric = tuple(numeric)

    def fit(self, features: pd.DataFrame) -> FeatureEncoder:
        check_features(features)
        self.categories_: dict[str, list[str]] = {
            c: sorted(features[c].astype(str).unique().tolist()) for c in self.categorical
        }
        self.feature_names_: list[str] = [*self.numeric] + [
            _FEATURE_NAME_BAD.sub("_", f"{c}={v}")
            for c in self.categorical
            for v in self.categories_[c]
        ]
        return self

    def transform(self, features: pd.DataFrame) -> NDArray[np.float32]:
        check_features(features)
        n = len(features)
        cols = [features[c].to_numpy(dtype=np.float64, na_value=np.nan) for c in self.numeric]
        for c in self.categorical:
            values = features[c].astype(str).to_numpy()
            for v in self.categories_[c]:
                cols.append((values == v).astype(np.float64))
        if not cols:
            return np.zeros((n, 0), dtype=np.float32)
        return np.stack(cols, axis=1).astype(np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {
            "categorical": list(self.categorical),
            "numeric": list(self.numeric),
            "categories": self.categories_,
            "feature_names": self.feature_names_,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FeatureEncoder:
        enc = cls(d["categorical"], d["numeric"])
        enc.categories_ = {k: list(v) for k, v in d["categories"].items()}
        enc.feature_names_ = list(d["feature_names"])
        return enc


# -- one regressor -------------------------------------------------------------------------

OBJECTIVES = ("reg:pseudohubererror", "reg:squarederror", "reg:absoluteerror")


class BusBandwidthRegressor:
    """One XGBoost regressor of bus bandwidth, scikit-learn style: the constructor only
    stores its parameters, ``fit`` returns ``self``, fitted attributes end in ``_``.

    The target is ``(log(busbw) - offset_) / scale_``: centred on its weighted median and
    divided by its weighted RMS spread, so every objective starts from 0 and residuals are
    O(1). Pseudo-Huber needs this: its hessian vanishes for residuals much larger than
    ``huber_slope``, and ``min_child_weight`` (a hessian sum) then blocks every split, so
    training stalls on unscaled log targets. ``huber_slope`` is therefore in units of the
    spread. ``predict`` returns ``max(exp(raw * scale_ + offset_), BUSBW_FLOOR)``.
    """

    def __init__(
        self,
        *,
        objective: str = "reg:pseudohubererror",
        max_depth: int = 6,
        learning_rate: float = 0.1,
        n_estimators: int = 200,
        min_child_weight: float = 1.0,
        subsample: float = 1.0,
        huber_slope: float = 0.5,
        reg_lambda: float = 1.0,
        random_state: int = 0,
        n_jobs: int = 1,
        prior: bool = True,
        monotone: bool = True,
        prior_tree: bool = True,
    ) -> None:
        self.objective = objective
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.n_estimators = n_estimators
        self.min_child_weight = min_child_weight
        self.subsample = subsample
        self.huber_slope = huber_slope
        self.reg_lambda = reg_lambda
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.prior = prior
        self.monotone = monotone
        self.prior_tree = prior_tree

    _PARAMS = (
        "objective",
        "max_depth",
        "learning_rate",
        "n_estimators",
        "min_child_weight",
        "subsample",
        "huber_slope",
        "reg_lambda",
        "random_state",
        "n_jobs",
        "prior",
        "monotone",
        "prior_tree",
    )

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {p: getattr(self, p) for p in self._PARAMS}

    def set_params(self, **params: Any) -> BusBandwidthRegressor:
        for k, v in params.items():
            if k not in self._PARAMS:
                raise ConfigError(f"unknown parameter {k!r}; valid: {', '.join(self._PARAMS)}")
            setattr(self, k, v)
        return self

    def _xgb_params(self) -> dict[str, Any]:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective: {self.objective!r} is not one of {OBJECTIVES}")
        params: dict[str, Any] = {
            "objective": self.objective,
            "max_depth": int(self.max_depth),
            "eta": float(self.learning_rate),
            "min_child_weight": float(self.min_child_weight),
            "subsample": float(self.subsample),
            "lambda": float(self.reg_lambda),
            "seed": int(self.random_state),
            "nthread": int(self.n_jobs),
            "base_score": 0.0,
            "tree_method": "hist",
            "verbosity": 0,
        }
        if self.objective == "reg:pseudohubererror":
            params["huber_slope"] = float(self.huber_slope)
        return params

    def _monotone(self, names: Sequence[str]) -> dict[str, int]:
        """XGBoost's monotone constraints on the residual (``MONOTONE``), for the features
        present. With the prior among the features, the final prediction is then
        non-decreasing in every rated link speed: the prior is, and so is the residual, both
        directly and through the prior."""
        if not self.monotone:
            return {}
        return {name: sign for name, sign in MONOTONE.items() if name in names}

    def fit_prior(
        self, X: pd.DataFrame, y: ArrayLike, sample_weight: ArrayLike | None = None
    ) -> LinkPrior:
        """The physics prior ``fit`` learns first from these rows: it depends on the rows
        and ``prior_tree`` alone, not on the XGBoost parameters, so a tuner fits it once
        per fold and hands it to every trial's ``fit`` (``prior=``)."""
        target, w = self._checked(X, y, sample_weight)
        return LinkPrior(tree=self.prior_tree).fit(with_hardware(X), target, w)

    def _checked(
        self, X: pd.DataFrame, y: ArrayLike, sample_weight: ArrayLike | None
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The bus bandwidths and the weights rescaled to mean 1, checked."""
        target = np.asarray(y, dtype=float)
        if target.shape != (len(X),):
            raise BandwidthDataError("busbw must have one value per feature row")
        if len(X) == 0:
            raise BandwidthDataError("no rows to fit")
        if not np.all(np.isfinite(target)) or np.any(target <= 0):
            raise BandwidthDataError("busbw must be positive and finite")
        w = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        if w.shape != (len(X),) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise BandwidthDataError("sample weights must be finite, >= 0 and not all 0")
        # Only relative weights matter; rescaled to mean 1 so that min_child_weight and the
        # L2 penalty mean the same whatever the age of the data (old data: tiny weights).
        return target, w / w.mean()

    def fit(
        self,
        X: pd.DataFrame,
        y: ArrayLike,
        sample_weight: ArrayLike | None = None,
        *,
        prior: LinkPrior | None = None,
    ) -> BusBandwidthRegressor:
        """Fit on feature rows ``X`` and bus bandwidths ``y`` (bytes/s, > 0); weights are
        relative (rescaled to mean 1). ``prior``: the one ``fit_prior`` returned for these
        same rows (else it is fitted here)."""
        return self.fit_design(self.design(X, y, sample_weight, prior=prior))

    def design(
        self,
        X: pd.DataFrame,
        y: ArrayLike,
        sample_weight: ArrayLike | None = None,
        *,
        prior: LinkPrior | None = None,
    ) -> Design:
        """What ``fit`` makes of the rows before XGBoost runs (``Design``): it depends on the
        rows, ``prior``, ``prior_tree`` and whether the objective is squared error (its
        rows are merged, ``merge_rows``) alone, so a tuner makes it once per fold and every
        trial's ``fit_design`` trains on it."""
        import xgboost as xgb

        target, w = self._checked(X, y, sample_weight)
        X = with_hardware(X)
        log_y = np.log(target)
        if self.prior:
            if prior is None:
                prior = LinkPrior(tree=self.prior_tree).fit(X, target, w)
            X = X.assign(log_prior=np.log(prior.predict(X)))
            log_y = log_y - X["log_prior"].to_numpy()
        else:
            prior = None
        encoder = FeatureEncoder(numeric=_numeric(prior)).fit(X)
        offset = _weighted_median(log_y, w)
        spread = float(np.sqrt(np.average((log_y - offset) ** 2, weights=w)))
        scale = spread if spread > 1e-6 else 1.0
        label = (log_y - offset) / scale
        features, merged, weight = encoder.transform(X), label, w
        if self.merges_rows:
            features, merged, weight = merge_rows(features, label, w)
        # no feature names: xgboost reads them back from the matrix at every boosting round
        # (a tenth of a tuning's time); the constraints go by position (fit_design) and the
        # prediction matrices (query) carry the names
        matrix = xgb.DMatrix(features, label=merged, weight=weight, missing=np.nan)
        return Design(
            prior=prior,
            encoder=encoder,
            types=sorted(X["instance_type"].astype(str).unique().tolist()),
            offset=offset,
            scale=scale,
            # Pseudo-Huber leaves are gradient / hessian, and the hessian vanishes on large
            # residuals: a leaf can overshoot by orders of magnitude (seen: 360x on an
            # allocation held out). Predictions are kept within the targets seen.
            raw_range=(float(label.min()), float(label.max())),
            matrix=matrix,
        )

    @property
    def merges_rows(self) -> bool:
        """Whether XGBoost trains on distinct feature rows (``merge_rows``): for squared
        error alone, where the trees are the same. Merged, pseudo-Huber lost 0.1-0.2 point
        of held-out MAPE on the emulated sweep and 0.8 on the public tables (BENCHMARKS.md)."""
        return self.objective == "reg:squarederror"

    def fit_design(self, design: Design) -> BusBandwidthRegressor:
        """Train XGBoost with this regressor's parameters on a ``design`` made by a
        regressor of the same ``prior``, ``prior_tree`` and ``merges_rows``."""
        import xgboost as xgb

        params = self._xgb_params()
        self.prior_: LinkPrior | None = design.prior
        self.encoder_ = design.encoder
        self.types_: list[str] = list(design.types)
        self.offset_, self.scale_ = design.offset, design.scale
        self.raw_range_: tuple[float, float] | None = design.raw_range
        names = self.encoder_.feature_names_
        constraints = self._monotone(names)
        if constraints:
            signs = ",".join(str(constraints.get(name, 0)) for name in names)
            params["monotone_constraints"] = f"({signs})"
        self.booster_ = xgb.train(params, design.matrix, num_boost_round=int(self.n_estimators))
        self.n_features_in_ = len(self.encoder_.feature_names_)
        return self

    def predict(self, X: pd.DataFrame) -> NDArray[np.float64]:
        if not hasattr(self, "booster_"):
            raise ConfigError("this regressor is not fitted yet: call fit() first")
        if len(X) == 0:
            return np.zeros(0)
        return self.predict_query(self.query(X))

    def query(self, X: pd.DataFrame) -> Query:
        """What ``predict`` makes of the rows before XGBoost runs (``Query``): the same for
        every regressor fitted on one ``Design``, so a tuner makes it once per fold."""
        import xgboost as xgb

        X = with_hardware(X)
        log_prior = np.zeros(len(X))
        unseen = np.zeros(len(X), dtype=bool)
        if self.prior_ is not None:
            log_prior = np.log(self.prior_.predict(X))
            X = X.assign(log_prior=log_prior)
            unseen = ~X["instance_type"].astype(str).isin(self.types_).to_numpy()
        matrix = xgb.DMatrix(
            self.encoder_.transform(X), feature_names=self.encoder_.feature_names_, missing=np.nan
        )
        return Query(matrix=matrix, log_prior=log_prior, unseen=unseen)

    def predict_query(self, query: Query) -> NDArray[np.float64]:
        """``predict`` of the rows ``query`` was made from."""
        raw = np.asarray(self.booster_.predict(query.matrix), dtype=np.float64)
        if self.raw_range_ is not None:
            raw = np.clip(raw, *self.raw_range_)
        raw = raw * self.scale_ + self.offset_ + query.log_prior
        if self.prior_ is not None:  # a type never probed: the prior alone
            raw = np.where(query.unseen, query.log_prior, raw)
        out: NDArray[np.float64] = np.maximum(np.exp(np.minimum(raw, 700.0)), BUSBW_FLOOR)
        return out

    def prior_only(self, X: pd.DataFrame) -> NDArray[np.float64]:
        """The physics prior alone (``predictors.prior``) for each row, bytes/s."""
        if getattr(self, "prior_", None) is None:
            raise ConfigError("this regressor was fitted without the physics prior")
        assert self.prior_ is not None
        return np.maximum(self.prior_.predict(with_hardware(X)), BUSBW_FLOOR)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.booster_.save_model(str(folder / "booster.json"))
        meta = {
            "params": self.get_params(),
            "offset": self.offset_,
            "scale": self.scale_,
            "encoder": self.encoder_.to_dict(),
            "prior": None if self.prior_ is None else self.prior_.to_dict(),
            "raw_range": None if self.raw_range_ is None else list(self.raw_range_),
            "types": self.types_,
        }
        (folder / "regressor.json").write_text(json.dumps(meta, indent=1))

    @classmethod
    def load(cls, folder: Path) -> BusBandwidthRegressor:
        import xgboost as xgb

        meta = json.loads((folder / "regressor.json").read_text())
        reg = cls(**{"prior": False, **meta["params"]})
        reg.prior_ = LinkPrior.from_dict(meta["prior"]) if meta.get("prior") else None
        reg.types_ = list(meta.get("types", []))
        span = meta.get("raw_range")
        reg.raw_range_ = None if span is None else (float(span[0]), float(span[1]))
        reg.offset_ = float(meta["offset"])
        reg.scale_ = float(meta["scale"])
        reg.encoder_ = FeatureEncoder.from_dict(meta["encoder"])
        booster = xgb.Booster()
        booster.load_model(str(folder / "booster.json"))
        reg.booster_ = booster
        reg.n_features_in_ = len(reg.encoder_.feature_names_)
        return reg


DERIVED: tuple[str, ...] = ("vms", "ranks_per_vm", "intra_gbs", "nic_gbs")
"""Features derived from the hardware (``predictors.prior.hardware_columns``): they describe
any type, probed or not."""

MONOTONE: Mapping[str, int] = {"network_gbps": 1, "nic_gbs": 1, "intra_gbs": 1, "log_prior": 1}
"""Where physics is certain: a faster rated link never lowers bus bandwidth (+1: the
residual is non-decreasing in the feature). The residual is also non-decreasing in the prior
itself, so that a faster link cannot lower the prediction through the prior's feature either.
Concurrency is left free: the prior's ``c * s_eff / B`` overstates how much a second
allreduce slows the first where one alone does not fill the link, and the residual must
be able to rise with ``c`` to correct it (constraining it there cost 0.2-2 points of held-out
MAPE on the emulated sweep). Buffer size is left free too: NCCL's protocol switches make
bus bandwidth dip between sizes (p3dn at 8 MB in the public tables)."""


def _numeric(prior: LinkPrior | None) -> tuple[str, ...]:
    return (*NUMERIC, *DERIVED, *(("log_prior",) if prior is not None else ()))


def with_hardware(X: pd.DataFrame) -> pd.DataFrame:
    """``X`` with the hardware columns (``predictors.prior``), computed once."""
    return X if "vms" in X.columns else hardware_columns(X)


@dataclass(frozen=True)
class Design:
    """A regressor's training rows made ready for XGBoost (``BusBandwidthRegressor.design``):
    the physics prior, the encoder, the target's centring, and the XGBoost matrix of the
    distinct feature rows (``merge_rows``)."""

    prior: LinkPrior | None
    encoder: FeatureEncoder
    types: list[str]
    offset: float
    scale: float
    raw_range: tuple[float, float]
    matrix: Any  # xgboost.DMatrix (imported when used)


@dataclass(frozen=True)
class Query:
    """Rows made ready for a fitted regressor's XGBoost (``BusBandwidthRegressor.query``)."""

    matrix: Any  # xgboost.DMatrix
    log_prior: NDArray[np.float64]
    unseen: NDArray[np.bool_]
    """Rows of a type the fit never saw: the prior alone answers them."""


def merge_rows(
    features: NDArray[np.float32], label: NDArray[np.float64], weight: NDArray[np.float64]
) -> tuple[NDArray[np.float32], NDArray[np.float64], NDArray[np.float64]]:
    """One row per distinct feature row (in order of first appearance), with the weighted
    mean of its labels and the sum of its weights.

    Probes repeat every configuration (repeats on one allocation, the same grid on every
    allocation of a type: 6 to 15 rows each in a sweep), and nothing in the features tells
    them apart. For squared error the trees are then exactly the same (each split and leaf
    sums gradients ``w * (f - label)`` and hessians ``w``, which the merged row gives), on
    a fraction of the rows. Pseudo-Huber and absolute error would see the mean of a
    configuration's spread instead of each row: not the same fit (``merges_rows``)."""
    if len(features) == 0:
        return features, label, weight
    first, inverse = distinct_rows(features)
    total = np.bincount(inverse, weights=weight)
    mean = np.bincount(inverse, weights=weight * label) / np.where(total > 0, total, 1.0)
    return features[first], mean, np.asarray(total, dtype=np.float64)


def _weighted_median(values: NDArray[np.float64], weights: NDArray[np.float64]) -> float:
    order = np.argsort(values)
    cw = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cw, 0.5 * cw[-1])])


# -- caps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BandwidthCaps:
    """Per-instance-type total bus bandwidth caps (bytes/s) by world size, inside one VM
    and across VMs; rule in the module docstring."""

    by_type: WorldTable
    rated: Mapping[str, float] = field(default_factory=dict)
    """Rated network bytes/s of each probed type (when the probes carry a rating)."""
    quantile: float = DEFAULT_CAP_QUANTILE
    min_buffer: int = DEFAULT_CAP_MIN_BUFFER
    sustained: WorldTable = field(default_factory=WorldTable)
    """Sustained bus bandwidth per type and world size, where the sweep measured it: the
    cap then (``predictors.network``)."""
    factors: WorldTable = field(default_factory=WorldTable)
    """Sustained over burst bus bandwidth, per type and world size."""
    sigmas: Mapping[str, float] = field(default_factory=dict)
    """Spread of network levels across allocations, per type."""
    mixed: DecadeFactors = field(default_factory=DecadeFactors)
    """Measured over composed bus bandwidth of mixed-type rings, by buffer size."""
    mean_time: Mapping[str, DecadeFactors] = field(default_factory=dict)
    """Typical over mean-time bus bandwidth per type, by buffer size."""

    @classmethod
    def from_probes(
        cls,
        probes: pd.DataFrame,
        *,
        quantile: float = DEFAULT_CAP_QUANTILE,
        min_buffer: int = DEFAULT_CAP_MIN_BUFFER,
        group: str = GROUP,
    ) -> BandwidthCaps:
        if not 0 < quantile <= 1:
            raise ConfigError(f"cap quantile: must be in (0, 1], got {quantile}")
        rated: dict[str, float] = {}
        for itype, part in probes.groupby("instance_type", sort=True):
            gbps = part["network_gbps"].dropna()
            if len(gbps):
                rated[str(itype)] = float(gbps.median()) * 1e9 / 8
        by_type = WorldTable.of(probes, lambda rows: _caps(rows, quantile, min_buffer, group))
        return cls(by_type=by_type, rated=rated, quantile=quantile, min_buffer=min_buffer)

    def cap(self, instance_type: str, world_size: int) -> float:
        inside = one_vm(instance_type, world_size)
        for table in (self.sustained, self.by_type):
            found = table.get(instance_type, world_size, inside)
            if found is not None:
                return found
        return self._unseen_cap(instance_type, inside)

    def _rating(self, instance_type: str, inside: bool) -> float | None:
        """Bytes/s of the type's rated link on that side of the VM boundary: NVLink or
        PCIe per GPU and direction inside one VM, the NIC across VMs (the probes' rating,
        else the catalog's)."""
        if inside:
            hw = hardware_of(instance_type)
            return hw.intra_gbs * 1e9 if hw is not None and hw.intra_gbs else None
        return self.rated.get(instance_type) or _catalog_rated_bytes(instance_type)

    def _unseen_cap(self, instance_type: str, inside: bool) -> float:
        if not self.by_type.types():
            raise ConfigError("no bandwidth caps: the model was fitted without probes")
        side = {t: max(v.values()) for t, v in self.by_type.side(inside).items()}
        ratios = [m / r for t, m in side.items() if (r := self._rating(t, inside))]
        rated = self._rating(instance_type, inside)
        if rated:
            return float(rated * (np.median(ratios) if ratios else 1.0))
        every = [max(v.values()) for t in (self.by_type.across, self.by_type.one_vm)
                 for v in t.values()]  # fmt: skip
        return float(min(side.values()) if side else min(every))

    def to_dict(self) -> dict[str, Any]:
        return {
            "by_type": self.by_type.to_dict(),
            "rated": dict(self.rated),
            "quantile": self.quantile,
            "min_buffer": self.min_buffer,
            "sustained": self.sustained.to_dict(),
            "factors": self.factors.to_dict(),
            "sigmas": dict(self.sigmas),
            "mixed": self.mixed.to_dict(),
            "mean_time": {t: f.to_dict() for t, f in self.mean_time.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BandwidthCaps:
        """From ``to_dict``; the world tables of a model saved before rings inside one VM
        were kept apart are split by ``prior.one_vm`` (``WorldTable.from_dict``)."""
        return cls(
            by_type=WorldTable.from_dict(d["by_type"]),
            rated={t: float(v) for t, v in d.get("rated", {}).items()},
            quantile=float(d["quantile"]),
            min_buffer=int(d["min_buffer"]),
            sustained=WorldTable.from_dict(d.get("sustained")),
            factors=WorldTable.from_dict(d.get("factors")),
            sigmas={t: float(v) for t, v in d.get("sigmas", {}).items()},
            mixed=DecadeFactors.from_dict(d.get("mixed")),
            mean_time={t: DecadeFactors.from_dict(f) for t, f in d.get("mean_time", {}).items()},
        )


def _caps(
    probes: pd.DataFrame, quantile: float, min_buffer: int, group: str
) -> dict[str, dict[int, float]]:
    """``{instance_type: {world_size: cap}}`` of ``probes`` (rule: module docstring)."""
    out: dict[str, dict[int, float]] = {}
    if probes.empty:
        return out
    for (itype, world), part in probes.groupby(["instance_type", "world_size"], sort=True):
        big = part[part["buffer_bytes"] >= min(min_buffer, int(part["buffer_bytes"].max()))]
        agg = (
            (big["concurrent"] * big[LABEL])
            .groupby([big[group], big["buffer_bytes"], big["concurrent"]])
            .median()
        )
        per_alloc = agg.groupby(level=0).max().to_numpy(dtype=float)
        out.setdefault(str(itype), {})[int(str(world))] = float(
            np.quantile(per_alloc, quantile, method="linear")
        )
    return out


def _catalog_rated_bytes(instance_type: str) -> float | None:
    """Rated network bandwidth of a catalog type in bytes/s (any region), else None."""
    from srifty_core.catalog import Catalog

    for t in Catalog.load().types:
        if t.name == instance_type and t.network_gbps and t.network_gbps > 0:
            return float(t.network_gbps) * 1e9 / 8
    return None


# -- what the model knows, and how wrong it was on what it did not see ----------------------

DEFAULT_INTERVAL_FOLDS = 3
COVERAGES = (0.5, 0.8, 0.9, 0.95)


@dataclass(frozen=True)
class Domain:
    """What the probes covered: per instance type and ranks per VM, the range of VM counts
    probed (grid rows). A row is *in domain* when its type was probed with that many ranks
    per VM and its VM count lies within the probed range; anything else is extrapolation
    (an unprobed type is predicted by the prior alone)."""

    shapes: Mapping[str, Mapping[int, tuple[int, int]]] = field(default_factory=dict)

    @property
    def types(self) -> list[str]:
        return sorted(self.shapes)

    @classmethod
    def of(cls, probes: pd.DataFrame) -> Domain:
        hw = with_hardware(probes)
        out: dict[str, dict[int, tuple[int, int]]] = {}
        agg = hw.groupby(["instance_type", "ranks_per_vm"])["vms"].agg(["min", "max"])
        for key, lo, hi in zip(agg.index, agg["min"], agg["max"], strict=True):
            itype, rpv = key
            out.setdefault(str(itype), {})[int(rpv)] = (int(lo), int(hi))
        return cls(out)

    def contains(self, features: pd.DataFrame) -> NDArray[np.bool_]:
        import pandas as pd

        hw = with_hardware(features)
        keys = pd.MultiIndex.from_arrays(
            [hw["instance_type"].astype(str), hw["vms"], hw["ranks_per_vm"]]
        )
        codes, uniques = keys.factorize()
        ok = np.zeros(len(uniques), dtype=bool)
        for i, (t, v, r) in enumerate(uniques):
            span = self.shapes.get(t, {}).get(int(r))
            ok[i] = span is not None and span[0] <= int(v) <= span[1]
        out: NDArray[np.bool_] = ok[codes]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {t: {str(r): list(s) for r, s in m.items()} for t, m in self.shapes.items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Domain:
        return cls(
            {t: {int(r): (int(s[0]), int(s[1])) for r, s in m.items()} for t, m in d.items()}
        )


@dataclass(frozen=True)
class LogErrors:
    """How far held-out probes fell from the model, as quantiles of ``|log(measured /
    predicted)|`` at ``COVERAGES``: ``inside`` from cross-validation grouped by allocation
    (or table; every row predicted by a model that never saw its group), ``outside`` from
    the prior alone on each instance type held out of the prior's fit (how an unprobed type
    is predicted). Empty tuples: not measured (too few groups or types); ``outside`` then
    falls back to ``inside``, and both to no width."""

    inside: tuple[float, ...] = ()
    outside: tuple[float, ...] = ()
    rows_inside: int = 0
    rows_outside: int = 0

    def quantile(self, coverage: float, *, in_domain: bool) -> float:
        if not 0 < coverage < 1:
            raise ConfigError(f"coverage: must be within (0, 1), got {coverage}")
        qs = self.inside
        if not in_domain and self.outside:
            qs = tuple(
                max(a, b) for a, b in zip(self.inside or self.outside, self.outside, strict=True)
            )
        if not qs:
            return 0.0
        return float(np.interp(coverage, COVERAGES, qs))

    def sigma(self, *, in_domain: bool) -> float:
        """The normal sd whose two-sided 90% band is this one's 90% band."""
        return self.quantile(0.9, in_domain=in_domain) / 1.6448536269514722

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> LogErrors:
        if not d:
            return cls()
        return cls(
            inside=tuple(float(v) for v in d.get("inside", ())),
            outside=tuple(float(v) for v in d.get("outside", ())),
            rows_inside=int(d.get("rows_inside", 0)),
            rows_outside=int(d.get("rows_outside", 0)),
        )


def log_errors(
    rows: pd.DataFrame,
    busbw: NDArray[np.float64],
    weight: NDArray[np.float64],
    params: Mapping[str, Any],
    *,
    group: str,
    folds: int,
) -> LogErrors:
    """``LogErrors`` of one size class (rules: ``LogErrors``); ``folds`` 0 measures nothing."""
    if folds < 1 or len(rows) == 0:
        return LogErrors()
    inside: tuple[float, ...] = ()
    n_in = 0
    if rows[group].nunique() >= 2:
        oof = np.full(len(rows), np.nan)
        for train, test in group_kfold(rows[group].astype(str).to_numpy(), folds):
            reg = BusBandwidthRegressor(**params).fit(rows.iloc[train], busbw[train], weight[train])
            oof[test] = reg.predict(rows.iloc[test])
        err = np.abs(np.log(busbw / oof))
        inside = tuple(float(v) for v in np.quantile(err, COVERAGES))
        n_in = len(err)
    outside: tuple[float, ...] = ()
    n_out = 0
    types = rows["instance_type"].astype(str).to_numpy()
    if len(np.unique(types)) >= 2 and params.get("prior", True):
        errs = []
        for t in np.unique(types):
            held = types == t
            prior = LinkPrior().fit(rows[~held], busbw[~held], weight[~held])
            errs.append(np.abs(np.log(busbw[held] / prior.predict(rows[held]))))
        err = np.concatenate(errs)
        outside = tuple(float(v) for v in np.quantile(err, COVERAGES))
        n_out = len(err)
    return LogErrors(inside, outside, n_in, n_out)


# -- the predictor -------------------------------------------------------------------------

MODEL_FORMAT = 1


class BandwidthModel:
    """The bus-bandwidth predictor (``predictors.base.BandwidthPredictor``): a regressor for
    buffers ``<= mtu`` (``small_``), one for larger buffers (``large_``), and the caps
    (``caps_``). scikit-learn style: ``fit`` returns ``self``; fitted attributes end in ``_``.
    """

    def __init__(
        self,
        *,
        mtu: int = DEFAULT_MTU,
        small_params: Mapping[str, Any] | None = None,
        large_params: Mapping[str, Any] | None = None,
        cap_quantile: float = DEFAULT_CAP_QUANTILE,
        cap_min_buffer: int = DEFAULT_CAP_MIN_BUFFER,
        interval_folds: int = DEFAULT_INTERVAL_FOLDS,
    ) -> None:
        self.mtu = mtu
        self.small_params = dict(small_params or {})
        self.large_params = dict(large_params or {})
        self.cap_quantile = cap_quantile
        self.cap_min_buffer = cap_min_buffer
        self.interval_folds = interval_folds

    def fit(
        self,
        probes: pd.DataFrame,
        sample_weight: ArrayLike | None = None,
        *,
        group: str = GROUP,
    ) -> BandwidthModel:
        """Fit both regressors and the caps on probe records (``FEATURE_COLUMNS``, ``busbw``
        and the ``group`` column); ``sample_weight`` per row (e.g. the store's age weights).

        ``group`` names the column saying which allocation each row was measured on
        (``allocation_id`` in the probe store; ``predictors.nccl_tests`` rows carry it too, one
        published table being one allocation): the caps and the spread of network levels are
        statistics over allocations. ``tuning.tune`` takes it the same way."""
        if self.mtu < 1:
            raise ConfigError(f"mtu: must be >= 1 byte, got {self.mtu}")
        check_training_data(probes, mtu=self.mtu, min_rows=1, min_groups=1, group=group)
        w = np.ones(len(probes)) if sample_weight is None else np.asarray(sample_weight, float)
        mixed = mix_mask(probes)  # rings of several types: only the mixed-ring factor
        mixes = probes[mixed]
        probes, w = probes[~mixed], w[~mixed]
        held = sustained_mask(probes)  # regressors learn the grid; caps the sustained probes
        sustained = probes[held]
        probes, w = probes[~held], w[~held]
        if probes.empty:
            raise BandwidthDataError("no grid probe rows to fit on (only sustained ones)")
        probes = with_hardware(probes)
        masks = size_masks(probes, self.mtu)
        y = probes[LABEL].to_numpy(dtype=float)
        self.small_ = BusBandwidthRegressor(**self.small_params).fit(
            probes[masks[SMALL]], y[masks[SMALL]], w[masks[SMALL]]
        )
        self.large_ = BusBandwidthRegressor(**self.large_params).fit(
            probes[masks[LARGE]], y[masks[LARGE]], w[masks[LARGE]]
        )
        self.domain_ = Domain.of(probes)
        self.errors_ = {
            name: log_errors(probes[m], y[m], w[m], params, group=group, folds=self.interval_folds)
            for name, m, params in (
                (SMALL, masks[SMALL], self.small_params),
                (LARGE, masks[LARGE], self.large_params),
            )
        }
        caps = BandwidthCaps.from_probes(
            probes, quantile=self.cap_quantile, min_buffer=self.cap_min_buffer, group=group
        )
        self.caps_ = dataclasses.replace(
            caps,
            sustained=sustained_caps(sustained, group),
            factors=sustained_factors(probes, sustained, group),
            sigmas=level_sigmas(probes, group=group),
            mean_time=mean_time_factors(probes, group=group),
        )
        self.caps_ = dataclasses.replace(
            self.caps_,
            mixed=mixed_ring_factors(
                mixes, probes, self.predict, self.sustained_factor, FEATURE_COLUMNS
            ),
        )
        return self

    def sustained_factor(self, instance_type: str, world_size: int) -> float:
        """Sustained over burst bus bandwidth of a type (``predictors.network``), from the
        probes on the same side of the VM boundary; 1 for a type whose sweep ran no
        sustained probe there."""
        n = int(world_size)
        found = self.caps_.factors.get(instance_type, n, one_vm(instance_type, n))
        return 1.0 if found is None else found

    def mean_time_factors(self, instance_type: str, buffer_bytes: ArrayLike) -> NDArray[np.float64]:
        """Typical over mean-time bus bandwidth at each size (``predictors.network``): the
        regressors fit the typical transfer, a job's time adds up the mean ones; 1 for a
        type or size without repeated samples in the probes (a type never probed)."""
        return self.caps_.mean_time.get(instance_type, DecadeFactors()).at(buffer_bytes)

    def level_sigma(self, instance_type: str) -> float:
        """Spread (sd of log) of the network level across the probed allocations of a type
        (``predictors.network``). A type never probed is predicted by the prior alone: its
        spread is that of the prior's errors on types held out of its fit (large buffers,
        ``LogErrors``), as a normal sd; 0 where the fit could not measure it."""
        if instance_type in self.caps_.sigmas or instance_type in self.domain_.types:
            return float(self.caps_.sigmas.get(instance_type, 0.0))
        return self.errors_[LARGE].sigma(in_domain=False)

    def in_domain(self, features: pd.DataFrame) -> NDArray[np.bool_]:
        """Whether each row is inside what the probes covered (``Domain``)."""
        return self.domain_.contains(features)

    def predict_interval(
        self, features: pd.DataFrame, coverage: float = 0.9
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
        """(prediction, low, high, in domain) per row: the band that held ``coverage`` of
        held-out probes (``LogErrors``: grouped cross-validation in domain, types held out
        of the prior's fit outside it)."""
        pred = self.predict(features)
        inside = self.in_domain(features)
        width = np.zeros(len(features))
        for name, mask in size_masks(features, self.mtu).items():
            errs = self.errors_[name]
            width[mask] = np.where(
                inside[mask],
                errs.quantile(coverage, in_domain=True),
                errs.quantile(coverage, in_domain=False),
            )
        return pred, pred * np.exp(-width), pred * np.exp(width), inside

    def mixed_factor(self, buffer_bytes: float) -> float:
        """Measured over composed bus bandwidth of a mixed-type ring at this buffer size
        (``predictors.network``); 1 where the fit saw no mix."""
        return float(self.caps_.mixed.at(buffer_bytes))

    def mixed_factors(self, buffer_bytes: ArrayLike) -> NDArray[np.float64]:
        """``mixed_factor`` at each size."""
        return self.caps_.mixed.at(buffer_bytes)

    def predict(self, features: pd.DataFrame) -> NDArray[np.float64]:
        """Bus bandwidth, bytes/s (>= ``BUSBW_FLOOR``), for each row of ``features``."""
        if not hasattr(self, "small_"):
            raise ConfigError("this bandwidth model is not fitted yet: call fit() first")
        features = null_numeric_as_nan(features)
        check_features(features)
        self._check_known(features)
        features = with_hardware(features)
        out = np.empty(len(features))
        for name, mask in size_masks(features, self.mtu).items():
            if mask.any():
                reg = self.small_ if name == SMALL else self.large_
                out[mask] = reg.predict(features[mask])
        return out

    def _check_known(self, features: pd.DataFrame) -> None:
        """A type neither probed nor in the catalog has no hardware to reason from: a
        one-line error naming the closest known types."""
        from srifty_core.errors import UnknownNameError
        from srifty_core.predictors.prior import catalog_types

        for name in features["instance_type"].astype(str).unique():
            if name not in self.domain_.types and hardware_of(name) is None:
                raise UnknownNameError(
                    "instance type",
                    name,
                    [*catalog_types(), *self.domain_.types],
                    context="(neither probed nor in the catalog)",
                )

    def bandwidth_cap(self, instance_type: str, world_size: int) -> float:
        """Total bus bandwidth (bytes/s) one VM of ``instance_type`` sustains across
        concurrent allreduces at ``world_size`` (rule: module docstring)."""
        return self.caps_.cap(instance_type, int(world_size))

    # persistence: a folder with model.json and one sub-folder per regressor
    def save(self, folder: Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.small_.save(folder / SMALL)
        self.large_.save(folder / LARGE)
        meta = {
            "format": MODEL_FORMAT,
            "label": "busbw (bytes/s)",
            "mtu": self.mtu,
            "cap_quantile": self.cap_quantile,
            "cap_min_buffer": self.cap_min_buffer,
            "small_params": self.small_.get_params(),
            "large_params": self.large_.get_params(),
            "caps": self.caps_.to_dict(),
            "feature_columns": list(FEATURE_COLUMNS),
            "interval_folds": self.interval_folds,
            "domain": self.domain_.to_dict(),
            "errors": {k: v.to_dict() for k, v in self.errors_.items()},
        }
        (folder / "model.json").write_text(json.dumps(meta, indent=1))
        return folder

    @classmethod
    def load(cls, folder: Path) -> BandwidthModel:
        folder = Path(folder)
        meta_path = folder / "model.json"
        if not meta_path.is_file():
            raise ConfigError(f"no bandwidth model in {folder} (model.json missing)")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != MODEL_FORMAT:
            raise ConfigError(f"{meta_path}: unknown model format {meta.get('format')!r}")
        model = cls(
            mtu=int(meta["mtu"]),
            small_params=meta["small_params"],
            large_params=meta["large_params"],
            cap_quantile=float(meta["cap_quantile"]),
            cap_min_buffer=int(meta["cap_min_buffer"]),
        )
        model.small_ = BusBandwidthRegressor.load(folder / SMALL)
        model.large_ = BusBandwidthRegressor.load(folder / LARGE)
        model.caps_ = BandwidthCaps.from_dict(meta["caps"])
        model.interval_folds = int(meta.get("interval_folds", DEFAULT_INTERVAL_FOLDS))
        model.domain_ = Domain.from_dict(meta.get("domain", {}))
        model.errors_ = {
            k: LogErrors.from_dict(meta.get("errors", {}).get(k)) for k in (SMALL, LARGE)
        }
        return model


def feature_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """A feature frame (``FEATURE_COLUMNS``, probe-store dtypes) from dicts, for callers that
    build queries by hand (the simulator)."""
    import pandas as pd

    df = pd.DataFrame(list(rows))
    missing = [c for c in FEATURE_COLUMNS if c not in df.columns]
    if missing:
        raise BandwidthDataError(f"features: missing column(s) {missing}")
    df = df[list(FEATURE_COLUMNS)].copy()
    for c in ("gpus_per_vm", "vcpus", "world_size", "concurrent"):
        df[c] = df[c].astype("int64")
    df["buffer_bytes"] = df["buffer_bytes"].astype("int64")
    df["network_gbps"] = df["network_gbps"].astype("float64")
    df["placement_group"] = df["placement_group"].astype(bool)
    return df
