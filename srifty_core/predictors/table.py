"""A measured-table bus-bandwidth predictor: the median of the probes themselves.

Contract: ``ProbeTableBandwidth().fit(probes)`` (a probe-store frame; a ``ConfigError``
when it lacks a needed column or holds no successful rows of single instance types)
implements ``BandwidthPredictor``: ``predict`` (bytes/s per query row), ``bandwidth_cap``,
``sustained_factor``, ``level_sigma``, ``mean_time_factors``, ``mixed_factors``, ``mixed_bound`` and
``unprobed_mix_sigma``. No
learning and no extrapolation to unprobed instance types: a baseline for the XGBoost
model, and what a simulation of *this* machine needs when only local probes exist.

Collectives: one curve per ``collective`` probed; a query for a collective the probes lack
(or a frame without the column: allreduces) reads the type's allreduce curve, nccl-tests'
busbw being defined so that the ring algorithms share it. The caps and network statistics
are the allreduce rows' where there are any.

Imports ``predictors.network`` (sustained bandwidth, factors, spreads, ``WorldTable``),
``predictors.mixed_rings`` and ``predictors.prior.one_vm``.

How and why (interpolation, nearest world size, the cap): docs/design/bandwidth.md#table
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.errors import ConfigError
from srifty_core.predictors.base import COLLECTIVE, with_collective
from srifty_core.predictors.mixed_rings import (
    MixedRingQueries,
    MixedRings,
    mixed_rings,
    split_mixes,
)
from srifty_core.predictors.network import (
    DecadeFactors,
    WorldTable,
    level_sigmas,
    mean_time_factors,
    one_vm_rows,
    split_phases,
    sustained_caps,
    sustained_factors,
)
from srifty_core.predictors.prior import one_vm
from srifty_core.probing.config import ALL_REDUCE

if TYPE_CHECKING:
    import pandas as pd


class ProbeTableBandwidth(MixedRingQueries):
    """Implements ``BandwidthPredictor`` from probe rows (fit on a probe-store frame)."""

    def __init__(self) -> None:
        # keys: (type, inside one VM, world size, concurrency, collective) and (type,
        # inside, world size)
        self.curves_: dict[
            tuple[str, bool, int, int, str], tuple[NDArray[np.float64], NDArray[np.float64]]
        ]
        self.caps_: dict[tuple[str, bool, int], float]
        self.sustained_: WorldTable
        self.factors_: WorldTable
        self.sigmas_: dict[str, float]
        self.mean_time_: dict[str, DecadeFactors]
        self.rings_: MixedRings

    def fit(self, probes: pd.DataFrame) -> ProbeTableBandwidth:
        need = {"instance_type", "world_size", "concurrent", "buffer_bytes", "busbw"}
        missing = need - set(probes.columns)
        if missing:
            raise ConfigError(f"probe frame lacks column(s): {', '.join(sorted(missing))}")
        ok = probes
        if "status" in probes.columns:
            ok = probes[probes["status"] == "ok"]
        ok = ok.dropna(subset=["busbw"])
        if ok.empty:
            raise ConfigError("no successful probe rows to fit on")
        ok, mixed = split_mixes(ok)
        if ok.empty:
            raise ConfigError("no probe rows of single instance types to fit on (only mixes)")
        ok, sustained = split_phases(with_collective(ok))
        if ok.empty:
            raise ConfigError("no grid probe rows to fit on (only sustained ones)")
        allreduce = ok[ok[COLLECTIVE] == ALL_REDUCE]
        basis = allreduce if len(allreduce) else ok
        self.sustained_ = sustained_caps(sustained)
        self.factors_ = sustained_factors(basis, sustained)
        self.sigmas_ = level_sigmas(basis)
        self.mean_time_ = mean_time_factors(basis)
        keys = ["instance_type", "_one_vm", "world_size", "concurrent", COLLECTIVE, "buffer_bytes"]
        med = (
            ok.assign(_one_vm=one_vm_rows(ok))
            .groupby(keys)["busbw"]
            .median()
            .reset_index()
            .sort_values("buffer_bytes")
        )
        points: dict[tuple[str, bool, int, int, str], list[tuple[float, float]]] = {}
        caps: dict[tuple[str, bool, int], float] = {}
        caps_any: dict[tuple[str, bool, int], float] = {}
        for t, inside, n, c, k, s, b in med.itertuples(index=False, name=None):
            side = (str(t), bool(inside), int(n))
            points.setdefault((*side, int(c), str(k)), []).append((float(s), float(b)))
            caps_any[side] = max(caps_any.get(side, 0.0), float(b) * int(c))
            if k == ALL_REDUCE:
                caps[side] = max(caps.get(side, 0.0), float(b) * int(c))
        self.curves_ = {
            k: (np.log([s for s, _ in v]), np.asarray([b for _, b in v])) for k, v in points.items()
        }
        self.caps_ = {**caps_any, **caps}  # a side without allreduces: the others' caps
        self.rings_ = mixed_rings(
            mixed, basis, self.predict, self.sustained_factor, ("instance_type",)
        )
        return self

    def _curve(
        self, t: str, inside: bool, n: int, c: int, collective: str = ALL_REDUCE
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        keys = [k for k in self.curves_ if k[0] == t]
        if not keys:
            raise ConfigError(
                f"no probes of instance type {t!r} (have: {sorted({k[0] for k in self.curves_})})"
            )
        keys = (
            [k for k in keys if k[4] == collective]
            or [k for k in keys if k[4] == ALL_REDUCE]
            or keys
        )  # its own collective where probed, else the allreduce's (module docstring)
        keys = [k for k in keys if k[1] == inside] or keys  # its own side where probed
        best = min(keys, key=lambda k: (abs(np.log(k[2] / n)), abs(k[3] - c)))
        return self.curves_[best]

    def predict(self, features: pd.DataFrame) -> NDArray[np.float64]:
        out = np.empty(len(features))
        features = with_collective(features)
        cols = zip(
            features["instance_type"],
            one_vm_rows(features),
            features["world_size"],
            features["concurrent"],
            features["buffer_bytes"],
            features[COLLECTIVE],
            strict=True,
        )
        for i, (t, inside, n, c, s, k) in enumerate(cols):
            xs, ys = self._curve(str(t), bool(inside), int(n), int(c), str(k))
            out[i] = np.interp(np.log(float(s)), xs, ys)
        return out

    def sustained_factor(self, instance_type: str, world_size: int) -> float:
        """Sustained over burst bus bandwidth (``predictors.network``); 1 where the sweep
        ran no sustained probe for the type."""
        found = self.factors_.get(instance_type, world_size, one_vm(instance_type, world_size))
        return 1.0 if found is None else found

    def level_sigma(self, instance_type: str) -> float:
        """Spread (sd of log) of the network level across the probed allocations."""
        return self.sigmas_.get(instance_type, 0.0)

    def mean_time_factors(self, instance_type: str, buffer_bytes: ArrayLike) -> NDArray[np.float64]:
        """Typical over mean-time bus bandwidth at each size (``predictors.network``): the
        factor that turns the table's medians into what the mean transfer gets; 1 for a
        type or size the probes have no repeated samples of."""
        return self.mean_time_.get(instance_type, DecadeFactors()).at(buffer_bytes)

    @property
    def rings(self) -> MixedRings:
        """What the fit learned of mixed-type rings (``predictors.mixed_rings``)."""
        return self.rings_

    def bandwidth_cap(self, instance_type: str, world_size: int) -> float:
        inside = one_vm(instance_type, world_size)
        sustained = self.sustained_.get(instance_type, world_size, inside)
        if sustained is not None:
            return sustained
        keys = [k for k in self.caps_ if k[0] == instance_type]
        if not keys:
            raise ConfigError(f"no probes of instance type {instance_type!r}")
        keys = [k for k in keys if k[1] == inside] or keys  # its own side where probed
        best = min(keys, key=lambda k: abs(np.log(k[2] / world_size)))
        return self.caps_[best]
