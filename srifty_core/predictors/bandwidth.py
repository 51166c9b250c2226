"""The bus-bandwidth model (``BandwidthModel``): two regressors split at the MTU
(``predictors.regressor``), the caps (``predictors.caps``), the domain and held-out errors
(``predictors.uncertainty``); fit, predict, save and load. How and why: docs/design/bandwidth.md.

Collectives: the regressors learn ``collective`` as a categorical feature (all_reduce,
all_gather, reduce_scatter); the caps and network statistics (sustained factors, level
spreads, mean-time and mixed-ring factors) are the allreduce rows' where the probes hold
any. A model saved before the feature existed loads and answers every collective with its
allreduce bus bandwidth (``predictors.features``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.errors import ConfigError, UnknownNameError
from srifty_core.predictors.base import COLLECTIVE, FEATURE_COLUMNS, with_collective
from srifty_core.predictors.caps import DEFAULT_CAP_MIN_BUFFER, DEFAULT_CAP_QUANTILE, BandwidthCaps
from srifty_core.predictors.features import (
    DEFAULT_MTU,
    GROUP,
    LABEL,
    LARGE,
    SMALL,
    BandwidthDataError,
    check_features,
    check_training_data,
    null_numeric_as_nan,
    size_masks,
)
from srifty_core.predictors.mixed_rings import (
    MixedRingQueries,
    MixedRings,
    mix_mask,
    mixed_rings,
)
from srifty_core.predictors.network import (
    DecadeFactors,
    level_sigmas,
    mean_time_factors,
    sustained_caps,
    sustained_factors,
    sustained_mask,
)
from srifty_core.predictors.prior import (
    catalog_types,
    hardware_of,
    one_vm,
)
from srifty_core.predictors.regressor import BusBandwidthRegressor, with_hardware
from srifty_core.predictors.uncertainty import DEFAULT_INTERVAL_FOLDS, Domain, LogErrors, log_errors
from srifty_core.probing.config import ALL_REDUCE

if TYPE_CHECKING:
    import pandas as pd

# -- the predictor -------------------------------------------------------------------------

MODEL_FORMAT = 1


class BandwidthModel(MixedRingQueries):
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
        probes = with_collective(probes)
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
        allreduce = probes[probes[COLLECTIVE] == ALL_REDUCE]
        basis = allreduce if len(allreduce) else probes  # the caps: concurrent allreduces
        caps = BandwidthCaps.from_probes(
            basis, quantile=self.cap_quantile, min_buffer=self.cap_min_buffer, group=group
        )
        self.caps_ = dataclasses.replace(
            caps,
            sustained=sustained_caps(sustained, group),
            factors=sustained_factors(basis, sustained, group),
            sigmas=level_sigmas(basis, group=group),
            mean_time=mean_time_factors(basis, group=group),
        )
        rings = mixed_rings(mixes, basis, self.predict, self.sustained_factor, FEATURE_COLUMNS)
        self.caps_ = dataclasses.replace(
            self.caps_,
            mixed=rings.factors,
            mixed_probed=rings.probed,
            mixed_sigma=rings.sigma,
            mixed_slopes=dict(rings.slopes),
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

    @property
    def rings(self) -> MixedRings:
        """What the fit learned of mixed-type rings (``predictors.mixed_rings``)."""
        caps = self.caps_
        return MixedRings(caps.mixed, caps.mixed_probed, caps.mixed_sigma, caps.mixed_slopes)

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
