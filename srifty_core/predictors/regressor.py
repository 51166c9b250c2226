"""One bus-bandwidth regressor (XGBoost on ``log(busbw / prior)``), the design matrix it
fits, the features derived from the hardware, and the merging of repeated rows."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.errors import ConfigError
from srifty_core.predictors.features import BUSBW_FLOOR, NUMERIC, BandwidthDataError, FeatureEncoder
from srifty_core.predictors.prior import (
    LinkPrior,
    distinct_rows,
    hardware_columns,
)

if TYPE_CHECKING:
    import pandas as pd

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
