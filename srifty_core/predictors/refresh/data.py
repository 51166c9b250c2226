"""Step 1 of a refresh: the training data, and which allocations are held out.

- **Data**: probe records from the store (``read_probes``: ok rows only, ``probed_at`` in
  ``[now - since, until)``), with age weights ``0.5 ** (age / half_life)`` in ``weight``:
  stale samples decay. ``data_version`` is a hash of the rows used.
- **Held-out allocations**: an allocation is held out when the hash of its id falls below
  ``holdout_fraction`` (per instance type; a type with >= 3 allocations and none below holds
  out its lowest-hash one; two always stay in training). The rule depends only on the id, so
  every fit holds out the same allocations and a champion never trained on the rows it is
  judged on. Rows of mixed-type rings (``probing.mix``) are never held out, tuned on or
  scored: they only give the fitted model its mixed-ring factor.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from srifty_core.predictors.features import GROUP, BandwidthDataError, check_training_data
from srifty_core.predictors.mixed_rings import split_mixes
from srifty_core.predictors.refresh.config import RefreshConfig
from srifty_core.predictors.refresh.staging import SNAPSHOT
from srifty_core.probing.config import MIN_ALLOCATIONS

if TYPE_CHECKING:
    import pandas as pd

TRAIN_ALLOCATIONS = 2
"""Allocations of a type that always stay in training (grouped CV needs two groups)."""
"""Two to cross-validate on, one to hold out."""


def load_training_data(config: RefreshConfig, root: Path | None = None) -> pd.DataFrame:
    """Probe records for training, with ``weight``; checked (``BandwidthDataError``)."""
    from srifty_core.probing.store import read_probes

    now = config.now or datetime.now(UTC)
    df = read_probes(
        root,
        since=now - config.since if config.since is not None else None,
        until=config.until,
        providers=config.providers,
        instance_types=config.instance_types,
        half_life=config.half_life,
        now=now,
    )
    if config.half_life is None:
        df["weight"] = 1.0
    check_refresh_data(df, config.mtu)
    return df


def check_refresh_data(df: pd.DataFrame, mtu: int) -> None:
    check_training_data(df, mtu=mtu)
    n_alloc = split_mixes(df)[0][GROUP].nunique()
    if n_alloc < MIN_ALLOCATIONS:
        raise BandwidthDataError(
            f"need probes from >= {MIN_ALLOCATIONS} allocations (two to cross-validate on, one "
            f"to hold out), got {n_alloc}; run the sweep with more allocations"
        )


def data_version(df: pd.DataFrame) -> str:
    """A hash of the rows (order-independent): same rows, same version."""
    return hashlib.sha256(np.sort(row_hashes(df)).tobytes()).hexdigest()[:16]


def row_hashes(df: pd.DataFrame) -> np.ndarray:
    """A 64-bit hash of each row's content (every column but ``weight``), independent of
    the row's position: what ``data_version`` and ``tuning_sample`` read."""
    import pandas as pd

    cols = [c for c in df.columns if c != "weight"]
    return pd.util.hash_pandas_object(df[cols].astype(str), index=False).to_numpy()


def holdout_allocations(df: pd.DataFrame, fraction: float) -> list[str]:
    """The held-out allocation ids (rule: module docstring)."""
    out: list[str] = []
    for _, part in split_mixes(df)[0].groupby("instance_type", sort=True):
        ids = sorted(part[GROUP].astype(str).unique())
        h = {a: int(hashlib.sha256(a.encode()).hexdigest()[:12], 16) / 16**12 for a in ids}
        held = [a for a in ids if h[a] < fraction]
        if not held and len(ids) >= MIN_ALLOCATIONS:
            held = [min(ids, key=lambda a: h[a])]
        while held and len(ids) - len(held) < TRAIN_ALLOCATIONS:  # grouped CV needs two
            held.remove(max(held, key=lambda a: h[a]))
        out.extend(held)
    return sorted(out)


def stage_data(config: RefreshConfig, staging: Path, root: Path | None = None) -> dict[str, Any]:
    """Step 1: read, check and snapshot the training data into ``staging``."""
    df = load_training_data(config, root)
    staging.mkdir(parents=True, exist_ok=True)
    df.to_parquet(staging / SNAPSHOT, index=False)
    (staging / "config.json").write_text(json.dumps(config.to_json(), indent=1))
    return {
        "staging": str(staging),
        "rows": len(df),
        "allocations": int(df[GROUP].nunique()),
        "instance_types": sorted(df["instance_type"].unique().tolist()),
        "data_version": data_version(df),
    }
