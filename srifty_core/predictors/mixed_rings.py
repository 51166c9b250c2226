"""Mixed-type rings in both bandwidth predictors (the probe table and the XGBoost model):
what probes of rings over several instance types teach about the composition the
simulator makes of their members.

Contract: ``split_mixes``/``mix_mask`` keep mix rows (``probing.mix``) out of every
per-type fit; ``mixed_rings`` learns a ``MixedRings`` from them against a predictor fitted
on the other rows: the factor on a ring's composed bus bandwidth as a function of the
ring's features (``ring_features``) and the buffer size, which rings were probed, and how
far an unprobed ring strays. Both predictors call it alike, each with its own per-type
predictions, so they agree on the same rows.

Imports ``probing.mix`` (mix labels) and ``predictors.network`` (``DecadeFactors``,
sustained rows); pandas only inside functions.

How and why (each rule): docs/design/bandwidth.md#mixed_rings
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.errors import ConfigError
from srifty_core.predictors.network import DecadeFactors, decades, sustained_mask
from srifty_core.probing.mix import MIX_PREFIX, parse_mix

if TYPE_CHECKING:
    import pandas as pd

MIXED_FACTOR_MAX = 1.5
"""A mixed ring is never predicted more than 1.5x faster than its members compose to."""
RING_FEATURES: Mapping[str, tuple[float, float]] = {
    "gpu_spread": (0.0, 3.0),
    "link_spread": (0.0, 7.0),
    "extra_members": (0.0, 8.0),
    "log_world": (-2.0, 7.0),
}
"""The features of a ring the factor's slopes act on, each with the range it is clipped
to (so ``MixedRings.bound`` holds for any ring): ``log2`` of the largest over the smallest
GPUs per VM among the members, the same of their rated links (members without a rating
left out), member types beyond two, and ``log2(world size / 8)``."""
SLOPE_PENALTIES = (0.1, 1.0, 10.0, np.inf)
"""The ridge penalties on the slopes that leave-one-mix-out validation chooses from
(per mix: each mix's points weigh 1 in all); ``inf``: no slopes, one level per decade."""
MIN_MIXES_FOR_SLOPES = 3


def mix_mask(probes: pd.DataFrame) -> NDArray[np.bool_]:
    """Which rows were probed over a mixed-type ring (``instance_type`` a mix label)."""
    if "instance_type" not in probes.columns or probes.empty:
        return np.zeros(len(probes), dtype=bool)
    labels = probes["instance_type"].astype(str)
    return labels.str.startswith(MIX_PREFIX).to_numpy(dtype=bool)


def split_mixes(probes: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows of single instance types, rows of mixed rings)."""
    mixed = mix_mask(probes)
    if not mixed.any():
        return probes, probes.iloc[:0]
    return probes[~mixed], probes[mixed]


def ring_key(instance_types: Iterable[str]) -> str:
    """A ring's member types, each once, sorted and joined by ``+``: how a mix is known
    whatever its VM counts (``MixedRings.probed``)."""
    return "+".join(sorted({str(t) for t in instance_types}))


def ring_features(
    gpus_per_vm: Sequence[float], rated_gbps: Sequence[float | None], world_size: int
) -> NDArray[np.float64]:
    """The ``RING_FEATURES`` of a ring over member types with these GPUs per VM and rated
    links (one entry per type), clipped to their ranges."""
    gpus = [max(1.0, float(g)) for g in gpus_per_vm]
    rated = [float(r) for r in rated_gbps if r is not None and np.isfinite(r) and r > 0]
    x = np.array(
        [
            np.log2(max(gpus) / min(gpus)),
            np.log2(max(rated) / min(rated)) if len(rated) >= 2 else 0.0,
            max(0, len(gpus) - 2),
            np.log2(max(1, int(world_size)) / 8.0),
        ]
    )
    lo, hi = np.array(list(RING_FEATURES.values())).T
    out: NDArray[np.float64] = np.clip(x, lo, hi)
    return out


@dataclass(frozen=True)
class MixedRings:
    """What the probes of mixed-type rings teach (rule: module docstring and the design
    doc): the factor's level by buffer decade (``factors``) and its slopes on the ring's
    features (``slopes``, by ``RING_FEATURES`` name; none: one level for every ring),
    which rings were probed (``probed``: ``ring_key`` of each mix label), and how far a
    ring left out of the fit strays from it (``sigma``, sd of log; ``None`` with fewer
    than two mixes). ``probed`` is ``None`` in a model saved before the probed rings were
    recorded: it cannot say which were."""

    factors: DecadeFactors = field(default_factory=DecadeFactors)
    probed: tuple[str, ...] | None = ()
    sigma: float | None = None
    slopes: Mapping[str, float] = field(default_factory=dict)

    def at(
        self, buffer_bytes: ArrayLike, features: NDArray[np.float64] | None = None
    ) -> NDArray[np.float64]:
        """The factor at each buffer size for a ring with these ``ring_features`` (none:
        the level alone), at most ``MIXED_FACTOR_MAX``."""
        level = self.factors.at(buffer_bytes)
        if features is None or not self.slopes:
            return np.minimum(level, MIXED_FACTOR_MAX)
        shift = float(np.dot(self._slope_vector(), features))
        out: NDArray[np.float64] = np.minimum(level * np.exp(shift), MIXED_FACTOR_MAX)
        return out

    def bound(self, buffer_bytes: ArrayLike) -> NDArray[np.float64]:
        """At least the factor of any ring at each buffer size (the planner's pruning
        bound): the slopes at whichever end of each feature's range raises it."""
        w = self._slope_vector()
        lo, hi = np.array(list(RING_FEATURES.values())).T
        shift = float(np.maximum(w * lo, w * hi).sum())
        out: NDArray[np.float64] = np.minimum(
            self.factors.at(buffer_bytes) * np.exp(shift), MIXED_FACTOR_MAX
        )
        return out

    def _slope_vector(self) -> NDArray[np.float64]:
        return np.array([float(self.slopes.get(k, 0.0)) for k in RING_FEATURES])

    def unprobed_sigma(self, instance_types: Sequence[str]) -> float | None:
        """For a ring over several ``instance_types`` the probes never held as one ring,
        the spread (sd of log) it adds to the network level: ``sigma``, 0 with fewer than
        two probed mixes (nothing measured a spread); ``None`` for one type, a probed
        mix, or rings whose probed mixes were not recorded."""
        if self.probed is None or len(set(instance_types)) < 2:
            return None
        if ring_key(instance_types) in self.probed:
            return None
        return self.sigma or 0.0


class MixedRingQueries:
    """What a bandwidth predictor answers about mixed-type rings, read from the
    ``MixedRings`` it learned (its ``rings``): the probe table and the XGBoost model alike."""

    @property
    def rings(self) -> MixedRings:
        raise NotImplementedError

    def unprobed_mix_sigma(self, instance_types: Sequence[str]) -> float | None:
        """For a ring over several ``instance_types`` that the probes never held as one
        ring, the spread (sd of log) it adds to the network level: how far a probed mix
        left out of the fit strays (``MixedRings.sigma``); 0 with fewer than two probed
        mixes, whose spread nothing measured. ``None`` for one type, a probed mix, or a
        model saved before the probed mixes were recorded (it cannot say)."""
        return self.rings.unprobed_sigma(instance_types)

    def mixed_factor(self, buffer_bytes: float) -> float:
        """Measured over composed bus bandwidth of a mixed-type ring at this buffer size,
        at the level alone; 1 where the fit saw no mix."""
        return float(self.rings.at(buffer_bytes))

    def mixed_factors(
        self, buffer_bytes: ArrayLike, features: NDArray[np.float64] | None = None
    ) -> NDArray[np.float64]:
        """The factor at each size for a ring with these ``ring_features`` (none: the
        level alone)."""
        return self.rings.at(buffer_bytes, features)

    def mixed_bound(self, buffer_bytes: ArrayLike) -> NDArray[np.float64]:
        """At least the factor of any ring at each size (``MixedRings.bound``)."""
        return self.rings.bound(buffer_bytes)


def mixed_rings(
    mixes: pd.DataFrame,
    per_type: pd.DataFrame,
    predict: Callable[[pd.DataFrame], NDArray[np.float64]],
    sustained_factor: Callable[[str, int], float],
    features: Sequence[str],
) -> MixedRings:
    """The ``MixedRings`` of the mix rows ``mixes`` (rule: module docstring), against a
    predictor fitted on ``per_type`` (its ``predict`` and ``sustained_factor``). Each
    member type is queried with the ``features`` of its own rows (those of the mix's
    provider and region where there are some), as the simulator queries it."""
    if mixes.empty:
        return MixedRings()
    probed = tuple(sorted({ring_key(parse_mix(str(x))) for x in mixes["instance_type"].unique()}))
    points = _composed(mixes, per_type, predict, sustained_factor, features)
    if points is None:
        return MixedRings(probed=probed)
    labels, sizes, y, x = points
    return fit_ring_factors(labels, sizes, y, x, probed)


def _composed(
    mixes: pd.DataFrame,
    per_type: pd.DataFrame,
    predict: Callable[[pd.DataFrame], NDArray[np.float64]],
    sustained_factor: Callable[[str, int], float],
    features: Sequence[str],
) -> tuple[NDArray[Any], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]] | None:
    """Per (mix, world size, buffer size, phase) at concurrency 1: (mix labels, buffer
    sizes, log of measured median over composed bus bandwidth, ring features); ``None``
    where no mix's members were all probed alone."""
    import pandas as pd

    if "gpus_per_vm" not in per_type.columns:
        raise ConfigError("probe rows of mixed rings need the gpus_per_vm of their member types")
    ok = mixes[mixes["concurrent"] == 1] if "concurrent" in mixes.columns else mixes
    if ok.empty:
        return None
    ok = ok.assign(_sustained=sustained_mask(ok))
    where = [c for c in ("provider", "region") if c in ok.columns and c in per_type.columns]
    keys = ["instance_type", *where, "world_size", "buffer_bytes", "_sustained"]
    med = ok.groupby(keys)["busbw"].median().reset_index()
    cols = [c for c in features if c in per_type.columns]
    rated_col = "network_gbps" in per_type.columns
    own = per_type.drop_duplicates(["instance_type", *where])
    rows: list[dict[str, Any]] = []
    member_of: list[tuple[int, str, int, bool]] = []  # (group, type, world, sustained)
    ring: dict[int, NDArray[np.float64]] = {}
    for g, r in enumerate(med.to_dict("records")):
        counts = parse_mix(str(r["instance_type"]))
        vms = sum(counts.values())
        found = []
        for t in counts:
            mine = own[own["instance_type"] == t]
            near = mine
            for c in where:
                near = near[near[c] == r[c]]
            row = (near if len(near) else mine).head(1)
            if row.empty:
                break
            ranks = max(1, int(row["gpus_per_vm"].iloc[0]))  # the simulator's ranks per VM
            rated = row["network_gbps"].iloc[0] if rated_col else None
            feat = {str(k): v for k, v in row[cols].iloc[0].items()}
            found.append((t, max(2, vms * ranks), feat, ranks, rated))
        if len(found) < len(counts):  # a member never probed alone: nothing to compose
            continue
        for t, world, feat, _, _ in found:
            size = r["buffer_bytes"]
            rows.append({**feat, "world_size": world, "buffer_bytes": size, "concurrent": 1})
            member_of.append((g, t, world, bool(r["_sustained"])))
        ring[g] = ring_features(
            [f[3] for f in found],
            [None if f[4] is None or pd.isna(f[4]) else float(f[4]) for f in found],
            int(r["world_size"]),
        )
    if not rows:
        return None
    frame = pd.DataFrame(rows)
    for c in ("world_size", "buffer_bytes", "concurrent"):
        frame[c] = frame[c].astype("int64")
    pred = np.asarray(predict(frame), dtype=np.float64)
    composed: dict[int, float] = {}
    for (g, t, world, held), b in zip(member_of, pred, strict=True):
        value = float(b) * (sustained_factor(t, world) if held else 1.0)
        composed[g] = min(composed.get(g, np.inf), value)
    groups = sorted(composed)
    measured = med["busbw"].to_numpy(dtype=np.float64)
    return (
        med["instance_type"].astype(str).to_numpy()[groups],
        med["buffer_bytes"].to_numpy(dtype=np.float64)[groups],
        np.log(measured[groups] / np.array([composed[g] for g in groups])),
        np.stack([ring[g] for g in groups]),
    )


def fit_ring_factors(
    labels: NDArray[Any],
    sizes: NDArray[np.float64],
    y: NDArray[np.float64],
    x: NDArray[np.float64],
    probed: tuple[str, ...],
) -> MixedRings:
    """The level per decade and the slopes (rule: the design doc), the penalty chosen by
    leave-one-mix-out validation, and ``sigma`` from the held-out mixes' residuals."""
    mixes = sorted(set(labels))
    penalties = SLOPE_PENALTIES if len(mixes) >= MIN_MIXES_FOR_SLOPES else (np.inf,)
    scores: list[float] = []
    held_out: dict[float, list[float]] = {}
    for lam in penalties:
        residuals = []
        if len(mixes) >= 2:
            for m in mixes:
                out = labels == m
                rings = _solve(sizes[~out], y[~out], x[~out], labels[~out], lam, probed)
                pred = np.log(rings.at(sizes[out], x[out][0]))
                residuals.append(float(np.median(y[out] - pred)))
        held_out[lam] = residuals
        scores.append(float(np.mean(np.square(residuals))) if residuals else 0.0)
    best = min(range(len(penalties)), key=lambda i: (round(scores[i], 12), -i))
    lam = penalties[best]
    rings = _solve(sizes, y, x, labels, lam, probed)
    r = held_out[lam]
    sigma = float(np.sqrt(np.mean(np.square(r)))) if len(r) >= 2 else None
    return MixedRings(rings.factors, probed, sigma, rings.slopes)


def _solve(
    sizes: NDArray[np.float64],
    y: NDArray[np.float64],
    x: NDArray[np.float64],
    labels: NDArray[Any],
    penalty: float,
    probed: tuple[str, ...],
) -> MixedRings:
    """Weighted least squares of ``y`` on one level per decade (unpenalised) and the
    slopes (ridge ``penalty``; ``inf``: none), each mix's points weighing 1 in all."""
    d = decades(sizes)
    levels = sorted(set(d.tolist()))
    onehot = (d[:, None] == np.array(levels)[None, :]).astype(np.float64)
    counts = {m: int(np.sum(labels == m)) for m in set(labels)}
    w = np.sqrt(np.array([1.0 / counts[m] for m in labels]))
    if np.isinf(penalty):
        a, names = onehot, []
    else:
        a, names = np.hstack([onehot, x]), list(RING_FEATURES)
    rows = a * w[:, None]
    target = y * w
    if names:
        ridge = np.zeros((len(names), a.shape[1]))
        ridge[:, len(levels) :] = np.sqrt(penalty) * np.eye(len(names))
        rows, target = np.vstack([rows, ridge]), np.concatenate([target, np.zeros(len(names))])
    theta = np.linalg.lstsq(rows, target, rcond=None)[0]
    factors = DecadeFactors(
        {k: float(min(np.exp(theta[i]), MIXED_FACTOR_MAX)) for i, k in enumerate(levels)}
    )
    slopes = {n: float(theta[len(levels) + i]) for i, n in enumerate(names)}
    return MixedRings(factors, probed, None, slopes)
