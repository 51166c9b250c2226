"""What probes say about a type's network beyond one short transfer, for both bandwidth
predictors (the probe table and the XGBoost model):

- **Sustained bandwidth** (``sustained_caps``): the bus bandwidth of the sweep's
  sustained-transfer probe (``phase == "sustained"``: back-to-back large allreduces after
  the NICs' burst credits are spent), per (instance type, world size): the median over
  allocations of each allocation's median. A training job sends hundreds of MB every
  iteration for hours, so this, not the short probes' burst rate, is what its transfers get.
- **Sustained factor** (``sustained_factors``): per (instance type, world size), the
  sustained bus bandwidth over the grid's (burst) bus bandwidth at the same world size,
  concurrency 1 and the grid size nearest the sustained probe's, at most 1. The grid's
  shape over buffer sizes (protocols, trees, the pipeline ramp) is the same once the NIC
  runs at its baseline, scaled down by this factor, so a bucket of any size is predicted
  at ``grid busbw x factor``.
- **Allocation spread** (``level_sigmas``): how much the network level differs from one
  allocation to the next, per type: at each probed point of large buffers (burst phase,
  >= ``min_buffer``), each allocation's median bus bandwidth over the median of all
  allocations' medians, in log; each allocation's mean of those; the standard deviation of
  these across allocations (0 with fewer than two), widened into a *predictive* spread
  (``predictive_spread``): a sweep sees only a few allocations, so the level of the next
  one is Student-t distributed around them. The simulator turns it into the network level
  of a 10th-percentile allocation (``IterationEstimate.t_iter_p90``).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from srifty_core.probing.schema import PHASE_SUSTAINED

if TYPE_CHECKING:
    import pandas as pd

LEVEL_MIN_BUFFER = 1 << 20
GROUP = "allocation_id"


def sustained_mask(probes: pd.DataFrame) -> NDArray[np.bool_]:
    """Which rows are the sustained probe's (none where there is no ``phase`` column)."""
    if "phase" not in probes.columns:
        return np.zeros(len(probes), dtype=bool)
    return (probes["phase"] == PHASE_SUSTAINED).to_numpy(dtype=bool)


def split_phases(probes: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(grid rows, sustained rows)."""
    held = sustained_mask(probes)
    return probes[~held], probes[held]


def sustained_caps(sustained: pd.DataFrame, group: str = GROUP) -> dict[str, dict[int, float]]:
    """``{instance_type: {world_size: bytes/s}}`` from sustained rows (empty: none)."""
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
) -> dict[str, dict[int, float]]:
    """``{instance_type: {world_size: sustained / burst}}`` (rule: module; empty: none)."""
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
    for itype, part in med.groupby("instance_type"):
        per_alloc = part.groupby(group)["log"].mean().to_numpy(dtype=float)
        if per_alloc.size >= 2:
            sd = float(np.std(per_alloc, ddof=1))
            out[str(itype)] = sd * predictive_spread(int(per_alloc.size))
        else:
            out[str(itype)] = 0.0
    return out


@lru_cache(maxsize=256)
def predictive_spread(k: int, q: float = 0.9) -> float:
    """Factor on a sample standard deviation from ``k`` draws that makes a normal with
    that spread put its ``q`` quantile where the predictive distribution of the next draw
    does (Student t with ``k - 1`` degrees of freedom, scale ``sqrt(1 + 1/k)``): 2.4 for
    k = 3 allocations, 1.5 for 5, towards 1 as k grows. 0 below two draws."""
    if k < 2:
        return 0.0
    from scipy.special import ndtri
    from scipy.stats import t

    return float(np.sqrt(1.0 + 1.0 / k) * t.ppf(q, k - 1) / ndtri(q))


def nearest_world(table: Mapping[int, float], world_size: int) -> float:
    """The value at ``world_size``, else at the nearest probed world size (ties: the
    larger), the largest beyond the largest probed."""
    if world_size in table:
        return float(table[world_size])
    sizes = sorted(table)
    if world_size > sizes[-1]:
        return float(table[sizes[-1]])
    return float(table[min(sizes, key=lambda s: (abs(s - world_size), -s))])
