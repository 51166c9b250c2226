"""What the bandwidth model knows (``Domain``) and how wrong it was on rows it did not see
(``LogErrors``: held-out log errors by coverage)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from srifty_core.errors import ConfigError
from srifty_core.predictors.metrics import group_kfold
from srifty_core.predictors.prior import (
    LinkPrior,
)
from srifty_core.predictors.regressor import BusBandwidthRegressor, with_hardware

if TYPE_CHECKING:
    import pandas as pd

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
