"""The bandwidth model's features: the columns it reads and their checks, the label and
group columns, the one-hot feature encoder, and a feature frame built from dicts.

``collective`` is categorical; a frame without it is all allreduces (``base.with_collective``),
and an encoder fitted before the column existed (a model saved then) does not read it: such a
model answers every collective with its allreduce bus bandwidth, nccl-tests' busbw being
defined so that the ring algorithms of all three share it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from srifty_core.errors import SriftyError
from srifty_core.predictors.base import COLLECTIVE, FEATURE_COLUMNS, with_collective
from srifty_core.predictors.mixed_rings import mix_mask

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
    COLLECTIVE,
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

    missing = [c for c in FEATURE_COLUMNS if c not in features.columns and c != COLLECTIVE]
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
        features = with_collective(features)
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
        features = with_collective(features)
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


def feature_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """A feature frame (``FEATURE_COLUMNS``, probe-store dtypes) from dicts, for callers that
    build queries by hand (the simulator)."""
    import pandas as pd

    df = with_collective(pd.DataFrame(list(rows)))
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
