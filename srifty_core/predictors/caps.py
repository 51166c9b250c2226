"""The bus bandwidth one VM of a type sustains across concurrent transfers
(``BandwidthCaps``), for the simulator's fair sharing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from srifty_core.catalog import Catalog
from srifty_core.errors import ConfigError
from srifty_core.predictors.features import (
    GROUP,
    LABEL,
)
from srifty_core.predictors.network import (
    DecadeFactors,
    WorldTable,
)
from srifty_core.predictors.prior import (
    hardware_of,
    one_vm,
)

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_CAP_QUANTILE = 0.95
"""The quantile over allocations of what each sustained (``BandwidthCaps``)."""
DEFAULT_CAP_MIN_BUFFER = 1 << 20
"""Buffers from this size (bytes) count for a cap."""


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
    mixed_probed: tuple[str, ...] | None = None
    """The rings the probes hold (``mixed_rings.ring_key``); ``None``: a model saved before
    they were recorded, which cannot say."""
    mixed_sigma: float | None = None
    """How far one mix strays from the factor (``mixed_rings.MixedRings.sigma``)."""
    mixed_slopes: Mapping[str, float] = field(default_factory=dict)
    """The mixed-ring factor's slopes on ring features (``mixed_rings.RING_FEATURES``);
    none in a model saved before them: one level for every ring."""
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
            "mixed_probed": None if self.mixed_probed is None else list(self.mixed_probed),
            "mixed_sigma": self.mixed_sigma,
            "mixed_slopes": dict(self.mixed_slopes),
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
            mixed_probed=(
                None if d.get("mixed_probed") is None else tuple(map(str, d["mixed_probed"]))
            ),
            mixed_sigma=None if d.get("mixed_sigma") is None else float(d["mixed_sigma"]),
            mixed_slopes={k: float(v) for k, v in (d.get("mixed_slopes") or {}).items()},
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
    for t in Catalog.load().types:
        if t.name == instance_type and t.network_gbps and t.network_gbps > 0:
            return float(t.network_gbps) * 1e9 / 8
    return None
