"""What probes say about a type's network beyond one short transfer, for both bandwidth
predictors (the probe table and the XGBoost model).

Contract: from probe-store frames, per instance type (and world size), ``sustained_caps``
and ``sustained_factors`` (``WorldTable``: inside one VM and across VMs kept apart, a
lookup taking the nearest probed world size on its own side only), ``level_sigmas`` and
``pooled_spreads`` (predictive spreads of the network level across allocations),
``mean_time_factors`` (per decade of buffer size, within ``MEAN_TIME_RANGE``, as
``DecadeFactors``); ``split_phases`` separates the sustained rows, which no per-type fit
sees. Mixed-type rings: ``predictors.mixed_rings``.

Imports ``probing.schema`` (names of the probe rows) and ``predictors.prior``; pandas only
inside functions.

How and why (each rule): docs/design/bandwidth.md#network
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.predictors.prior import one_vm, vms_of
from srifty_core.probing.schema import PHASE_SUSTAINED

if TYPE_CHECKING:
    import pandas as pd

LEVEL_MIN_BUFFER = 1 << 20
GROUP = "allocation_id"
MEAN_TIME_MIN_SAMPLES = 3
MEAN_TIME_RANGE = (0.2, 1.5)
"""A mean-time factor stays within these: a decade of a few wild samples makes a transfer
predicted at most 5x slower than its median, and a left-skewed one at most 1.5x faster."""


def sustained_mask(probes: pd.DataFrame) -> NDArray[np.bool_]:
    """Which rows are the sustained probe's (none where there is no ``phase`` column)."""
    if "phase" not in probes.columns:
        return np.zeros(len(probes), dtype=bool)
    return (probes["phase"] == PHASE_SUSTAINED).to_numpy(dtype=bool)


def split_phases(probes: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(grid rows, sustained rows)."""
    held = sustained_mask(probes)
    return probes[~held], probes[held]


def one_vm_rows(rows: pd.DataFrame) -> NDArray[np.bool_]:
    """Which rows were measured on a ring inside one VM (``prior.vms_of`` is 1); none where
    the rows carry no ``gpus_per_vm`` (a VM's size is then unknown)."""
    if rows.empty or "gpus_per_vm" not in rows.columns:
        return np.zeros(len(rows), dtype=bool)
    out: NDArray[np.bool_] = vms_of(rows) == 1
    return out


Table = Mapping[str, Mapping[int, float]]
"""``{instance_type: {world_size: value}}``."""


@dataclass(frozen=True)
class WorldTable:
    """Values per instance type and world size, kept apart for rings inside one VM
    (``one_vm``) and rings across VMs (``across``); a lookup takes the nearest world size
    probed on its own side only (``nearest_world``), else nothing."""

    across: Table = field(default_factory=dict)
    one_vm: Table = field(default_factory=dict)

    @classmethod
    def of(cls, rows: pd.DataFrame, table: Callable[[pd.DataFrame], Table]) -> WorldTable:
        """``table`` of the rows across VMs and of those inside one VM (``one_vm_rows``)."""
        inside = one_vm_rows(rows)
        return cls(across=table(rows[~inside]), one_vm=table(rows[inside]))

    def side(self, one_vm: bool) -> Table:
        return self.one_vm if one_vm else self.across

    def get(self, instance_type: str, world_size: int, one_vm: bool) -> float | None:
        """The value at the nearest world size probed on the same side, None if none."""
        table = self.side(one_vm).get(instance_type)
        return nearest_world(table, world_size) if table else None

    def types(self) -> set[str]:
        """Every instance type with a value on either side."""
        return set(self.across) | set(self.one_vm)

    def to_dict(self) -> dict[str, Any]:
        def plain(t: Table) -> dict[str, dict[str, float]]:
            return {k: {str(w): float(v) for w, v in m.items()} for k, m in t.items()}

        return {"across": plain(self.across), "one_vm": plain(self.one_vm)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> WorldTable:
        """From ``to_dict``; a table saved before the two sides were kept apart (one
        ``{type: {world: value}}``, from probes packed one rank per GPU) is split by
        ``prior.one_vm``."""
        d = dict(d or {})
        if set(d) <= {"across", "one_vm"}:
            return cls(*(_ints(d.get(k) or {}) for k in ("across", "one_vm")))
        across: dict[str, dict[int, float]] = {}
        inside: dict[str, dict[int, float]] = {}
        for t, m in _ints(d).items():
            for w, v in m.items():
                (inside if one_vm(t, w) else across).setdefault(t, {})[w] = v
        return cls(across, inside)


def _ints(d: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    return {str(t): {int(w): float(v) for w, v in m.items()} for t, m in d.items()}


def sustained_caps(sustained: pd.DataFrame, group: str = GROUP) -> WorldTable:
    """The sustained bus bandwidth (bytes/s) per instance type and world size, on each
    side of the VM boundary (``WorldTable``), from sustained rows (empty: none)."""
    return WorldTable.of(sustained, lambda rows: _sustained_caps(rows, group))


def _sustained_caps(sustained: pd.DataFrame, group: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    if sustained.empty:
        return out
    per_alloc = (
        sustained.groupby(["instance_type", "world_size", group])["busbw"].median().reset_index()
    )
    for (itype, world), part in per_alloc.groupby(["instance_type", "world_size"]):
        out.setdefault(str(itype), {})[int(str(world))] = float(np.median(part["busbw"]))
    return out


def sustained_factors(
    grid: pd.DataFrame, sustained: pd.DataFrame, group: str = GROUP
) -> WorldTable:
    """Sustained over burst bus bandwidth per instance type and world size (rule: module),
    each side of the VM boundary from its own rows (``WorldTable``; empty: none)."""
    inside = one_vm_rows(grid)
    held = one_vm_rows(sustained)
    return WorldTable(
        across=_sustained_factors(grid[~inside], sustained[~held], group),
        one_vm=_sustained_factors(grid[inside], sustained[held], group),
    )


def _sustained_factors(
    grid: pd.DataFrame, sustained: pd.DataFrame, group: str
) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    if sustained.empty or grid.empty:
        return out
    one = grid[grid["concurrent"] == 1]
    for (itype, world), part in sustained.groupby(["instance_type", "world_size"]):
        size = float(np.median(part["buffer_bytes"]))
        rows = one[(one["instance_type"] == itype) & (one["world_size"] == world)]
        if rows.empty:
            continue
        sizes = np.unique(rows["buffer_bytes"].to_numpy(dtype=float))
        nearest = sizes[np.argmin(np.abs(np.log(sizes / size)))]
        at = rows[rows["buffer_bytes"] == nearest]
        burst = float(np.median(at.groupby(group)["busbw"].median()))
        held = float(np.median(part.groupby(group)["busbw"].median()))
        out.setdefault(str(itype), {})[int(str(world))] = min(1.0, held / burst)
    return out


def level_sigmas(
    grid: pd.DataFrame, *, min_buffer: int = LEVEL_MIN_BUFFER, group: str = GROUP
) -> dict[str, float]:
    """``{instance_type: sd of log network level across allocations}`` (rule: module)."""
    out: dict[str, float] = {}
    if grid.empty or group not in grid.columns:
        return out
    big = grid[grid["buffer_bytes"] >= min_buffer]
    if big.empty:
        return out
    point = ["instance_type", "world_size", "buffer_bytes", "concurrent"]
    med = big.groupby([*point, group])["busbw"].median().reset_index()
    med["log"] = np.log(med["busbw"].to_numpy(dtype=float))
    med["log"] -= med.groupby(point)["log"].transform("median")
    spread: dict[str, tuple[float, int]] = {}
    for itype, part in med.groupby("instance_type"):
        per_alloc = part.groupby(group)["log"].mean().to_numpy(dtype=float)
        k = int(per_alloc.size)
        spread[str(itype)] = (float(np.std(per_alloc, ddof=1)) if k >= 2 else 0.0, k)
    return pooled_spreads(spread)


def mean_time_factors(grid: pd.DataFrame, group: str = GROUP) -> dict[str, DecadeFactors]:
    """``{instance_type: mean-time factors by decade}`` (rule: module docstring); empty
    where the rows carry no ``time_s``."""
    import pandas as pd

    need = {"instance_type", "world_size", "buffer_bytes", "concurrent", "time_s"}
    if grid.empty or not need <= set(grid.columns):
        return {}
    rows = grid[(grid["concurrent"] == 1) & (grid["time_s"] > 0)]
    if "status" in rows.columns:
        rows = rows[rows["status"] == "ok"]
    point = ["instance_type", "world_size", "buffer_bytes"]
    if group in rows.columns:
        point.append(group)
    times = rows.groupby(point)["time_s"]
    keep = (times.transform("size") >= MEAN_TIME_MIN_SAMPLES).to_numpy(dtype=bool)
    if not keep.any():
        return {}
    rel = (rows["time_s"] / times.transform("median")).to_numpy(dtype=float)[keep]
    sizes = rows["buffer_bytes"].to_numpy(dtype=float)[keep]
    frame = pd.DataFrame(
        {
            "instance_type": rows["instance_type"].astype(str).to_numpy()[keep],
            "decade": decades(sizes),
            "rel": rel,
        }
    )
    lo, hi = MEAN_TIME_RANGE
    out: dict[str, DecadeFactors] = {}
    for itype, part in frame.groupby("instance_type"):
        means = part.groupby("decade")["rel"].mean()
        factors = np.clip(1.0 / means.to_numpy(dtype=float), lo, hi)
        held = means.index.to_numpy(dtype=int)
        out[str(itype)] = DecadeFactors(
            {int(d): float(f) for d, f in zip(held, factors, strict=True)}
        )
    return out


WIDER_LEVEL = 0.95
"""How sure the pooled spreads must be that a key spreads more than the rest before it
keeps its own (``pooled_spreads``): the usual one-sided 5% test on the F ratio of its
sample variance over the others' pooled variance, Bonferroni-corrected for the number of
keys tested (of 14 types that all spread alike, a plain 5% test flags one by chance in
about half of the sweeps, and that type's own 2 degrees of freedom widen it 1.7x)."""


def pooled_spreads(
    spread: Mapping[str, tuple[float, int]],
    evidence: Mapping[str, tuple[float, int]] | None = None,
) -> dict[str, float]:
    """``{key: predictive sd}`` for every key of ``spread`` (``{key: (sample sd, draws)}``):
    the variance pooled over every key with two or more draws, of ``spread`` and of
    ``evidence`` (more draws of the same kind whose own keys are not asked for: the VM
    spreads of the other profiles taken on this cloud, ``ProfileStore.vm_spreads``), each
    weighted by its degrees of freedom, made predictive with the pooled degrees of freedom
    and the key's own draws (``predictive_spread``). A key whose sample variance is wider
    than the others' pooled variance beyond chance (an F test at ``WIDER_LEVEL``, corrected
    for the number of keys) keeps its own, made predictive with its own degrees of
    freedom, and is left out of the others' pool. 0 for a key with fewer than two draws.

    Few draws per key (three allocations of a type, three VMs of a device) make a
    Student t with 2 degrees of freedom, which alone would widen the spread 1.7x; the
    spread from one allocation or VM to the next is a property of the cloud more than of
    one type or model, and pooling puts every sweep's allocations, and every profile's
    VMs, behind it. A sample of three that happens to spread 1.7x the pool is not evidence
    of a wider key (alone, the F test's 95th percentile on 2 degrees of freedom is 3x the
    variance); one of 0.2 among 0.01s is."""
    from scipy.special import fdtri

    every = {("own", k): v for k, v in spread.items()}
    every.update({("evidence", k): v for k, v in (evidence or {}).items()})
    drawn = {k: (sd, n) for k, (sd, n) in every.items() if n >= 2}

    dof_all = sum(n - 1 for _, n in drawn.values())
    ss_all = sum((n - 1) * sd**2 for sd, n in drawn.values())
    wider: set[tuple[str, str]] = set()
    level = 1.0 - (1.0 - WIDER_LEVEL) / max(1, len(drawn))
    for tagged, (sd, n) in drawn.items():  # against the pool of all the others
        dof = dof_all - (n - 1)
        var = (ss_all - (n - 1) * sd**2) / dof if dof else 0.0
        if dof and var > 0 and sd**2 / var > float(fdtri(n - 1, dof, level)):
            wider.add(tagged)
    dof = dof_all - sum(drawn[k][1] - 1 for k in wider)
    ss = ss_all - sum((drawn[k][1] - 1) * drawn[k][0] ** 2 for k in wider)
    var = ss / dof if dof > 0 else 0.0
    out: dict[str, float] = {}
    for key, (sd, n) in spread.items():
        if n < 2:
            out[key] = 0.0
        elif ("own", key) in wider or dof <= 0:
            out[key] = sd * predictive_spread(n)
        else:
            out[key] = float(np.sqrt(var)) * predictive_spread(n, dof=dof)
    return out


@lru_cache(maxsize=256)
def predictive_spread(k: int, q: float = 0.9, dof: int | None = None) -> float:
    """Factor on a sample standard deviation from ``k`` draws that makes a normal with
    that spread put its ``q`` quantile where the predictive distribution of the next draw
    does (Student t with ``dof`` degrees of freedom, default ``k - 1``, scale
    ``sqrt(1 + 1/k)``): 1.7 for k = 3 allocations, 1.3 for 5, towards 1 as k grows. 0
    below two draws. A pooled sd passes its pooled ``dof``."""
    if k < 2:
        return 0.0
    from scipy.special import ndtri, stdtrit

    # stdtrit(dof, q) is what scipy.stats.t.ppf(q, dof) returns, without importing
    # scipy.stats (about half a second, on the planning path)
    return float(np.sqrt(1.0 + 1.0 / k) * stdtrit(dof or k - 1, q) / ndtri(q))


def nearest_world(table: Mapping[int, float], world_size: int) -> float:
    """The value at ``world_size``, else at the nearest probed world size (ties: the
    larger), the largest beyond the largest probed."""
    if world_size in table:
        return float(table[world_size])
    sizes = sorted(table)
    if world_size > sizes[-1]:
        return float(table[sizes[-1]])
    return float(table[min(sizes, key=lambda s: (abs(s - world_size), -s))])


# --------------------------------------------------------------------------- factors by size


def decades(buffer_bytes: ArrayLike) -> NDArray[np.int64]:
    """The decade of each buffer size, ``floor(log10 bytes)`` (0 for sizes under 10 bytes)."""
    s = np.maximum(np.asarray(buffer_bytes, dtype=np.float64), 1.0)
    out: NDArray[np.int64] = np.floor(np.log10(s)).astype(np.int64)
    return out


@dataclass(frozen=True)
class DecadeFactors:
    """A factor on bus bandwidth by decade of buffer size (``floor(log10 bytes)``; a size
    between the decades held takes the nearest one's, ties the larger): the mixed-ring
    factor's level and the mean-time factor (rules: module docstring); 1 everywhere when empty."""

    by_decade: Mapping[int, float] = field(default_factory=dict)

    def at(self, buffer_bytes: ArrayLike) -> NDArray[np.float64]:
        """The factor at each buffer size (same shape)."""
        s = np.asarray(buffer_bytes, dtype=np.float64)
        if not self.by_decade:
            return np.ones(s.shape)
        keys = np.asarray(sorted(self.by_decade), dtype=np.float64)
        values = np.asarray([self.by_decade[int(k)] for k in keys], dtype=np.float64)
        d = decades(s)
        hi = np.clip(np.searchsorted(keys, d), 0, keys.size - 1)
        lo = np.clip(hi - 1, 0, keys.size - 1)
        pick = np.where(np.abs(keys[lo] - d) < np.abs(keys[hi] - d), lo, hi)
        out: NDArray[np.float64] = values[pick]
        return out

    def to_dict(self) -> dict[str, float]:
        return {str(k): float(v) for k, v in sorted(self.by_decade.items())}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> DecadeFactors:
        return cls({int(k): float(v) for k, v in (d or {}).items()})
