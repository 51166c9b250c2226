"""Public nccl-tests tables (``all_reduce_perf``; ``all_gather_perf`` and
``reduce_scatter_perf`` in ``COLLECTIVES_FILE``) as bus-bandwidth rows the model can fit on.

Contract: ``nccl_tests_frame(path)`` (default: the shipped
``srifty_core/shipped/reference/nccl_tests_public.csv``; ``collectives_path()`` the shipped
all-gather and reduce-scatter tables; columns:
``srifty_core/shipped/SOURCES.md`` section 4) returns probe-like rows: the model's features
(``predictors.base.FEATURE_COLUMNS``), the label ``busbw`` and the grouping columns, which
``BandwidthModel.fit`` and ``tuning.tune`` take as they are. A missing needed column or
empty cell raises ``BandwidthDataError`` naming it; a type the catalog lacks raises
``UnknownNameError`` with the closest names. The ``collective`` column (absent: all_reduce)
sets the label's factor: nccl-tests' busbw, ``2s(n-1)/(n t)`` for all_reduce and
``s(n-1)/(n t)`` for all_gather and reduce_scatter (``size_bytes`` the total buffer).

Imports ``paths``, ``predictors.features`` (label, group, ``BandwidthDataError``) and the
catalog (at call time); pandas only inside functions.

How and why (each column's rule, the fixed features): docs/design/bandwidth.md#nccl_tests
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from srifty_core import paths
from srifty_core.catalog import Catalog
from srifty_core.errors import UnknownNameError
from srifty_core.predictors.base import COLLECTIVE
from srifty_core.predictors.features import GROUP, LABEL, BandwidthDataError
from srifty_core.probing.config import ALL_REDUCE, BUSBW_FACTOR, COLLECTIVES

if TYPE_CHECKING:
    import pandas as pd


NCCL_TESTS_FILE = "nccl_tests_public.csv"
COLLECTIVES_FILE = "nccl_tests_collectives_public.csv"
"""The shipped all_gather_perf and reduce_scatter_perf tables (same columns)."""
NEEDED: tuple[str, ...] = ("instance_type", "world_size", "size_bytes", "time_us")
"""Table columns the features or the label are derived from."""
TABLE = "table_id"
CATALOG_CLOUD = "aws"
"""The cloud of the shipped catalog's types (EC2)."""
CATALOG_REGION = "us-east-1"
"""Where the catalog is read for a type's shape and rated network (the same in every region
the catalog holds)."""


def default_path() -> Path:
    """The shipped table."""
    return paths.REFERENCE_DIR / NCCL_TESTS_FILE


def collectives_path() -> Path:
    """The shipped all-gather and reduce-scatter tables."""
    return paths.REFERENCE_DIR / COLLECTIVES_FILE


def nccl_tests_frame(
    path: Path | str | None = None,
    *,
    catalog: Catalog | None = None,
    region: str = CATALOG_REGION,
) -> pd.DataFrame:
    """The rows of the nccl-tests table at ``path`` (default: the shipped one) as probe-like
    records (rules: module docstring); ``catalog`` defaults to ``Catalog.load()``."""
    import pandas as pd

    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise BandwidthDataError(f"nccl-tests table not found: {path}")
    raw = pd.read_csv(path)
    where = f"nccl-tests table {path.name}"
    missing = [c for c in NEEDED if c not in raw.columns]
    if missing:
        raise BandwidthDataError(
            f"{where}: missing column(s) {missing}, needed for the features and the label "
            f"(has: {', '.join(map(str, raw.columns))})"
        )
    for c in ("world_size", "size_bytes", "time_us"):
        raw[c] = pd.to_numeric(raw[c], errors="coerce")
    raw = raw[~(raw["size_bytes"] <= 0) & ~(raw["time_us"] <= 0)].reset_index(drop=True)
    for c in NEEDED:
        empty = int(raw[c].isna().sum())
        if empty:
            raise BandwidthDataError(
                f"{where}: column {c!r} has {empty} empty or non-numeric cell(s)"
            )
    if raw.empty:
        raise BandwidthDataError(f"{where}: no rows with a positive size and time")
    collective = _collective(raw, where)

    catalog = catalog or Catalog.load()
    spec = {}
    for name in raw["instance_type"].astype(str).unique():
        if name not in catalog.names():
            raise UnknownNameError("instance type", name, catalog.names(), context=f"in {where}")
        t = catalog.get(name, region)
        spec[name] = (t.gpu_model, t.gpus_per_vm, t.vcpus, t.network_gbps)
    itype = raw["instance_type"].astype(str)
    n = raw["world_size"].astype(np.int64)
    s = raw["size_bytes"].astype(np.int64)
    t_s = raw["time_us"].astype(float) * 1e-6
    table = _table_ids(raw, path)
    return pd.DataFrame(
        {
            "provider": "public",
            "cloud": _cloud(raw),
            "region": "unknown",
            "zone": "unknown",
            "instance_type": itype,
            "gpu_model": [spec[x][0] for x in itype],
            "gpus_per_vm": [spec[x][1] for x in itype],
            "vcpus": [spec[x][2] for x in itype],
            "network_gbps": [spec[x][3] for x in itype],
            "placement_group": False,
            "world_size": n,
            "buffer_bytes": s,
            "concurrent": 1,
            "backend": "nccl",
            COLLECTIVE: collective,
            LABEL: collective.map(BUSBW_FACTOR).astype(float) * s * (n - 1) / (n * t_s),
            TABLE: table,
            GROUP: table,
            "num_nodes": _num_nodes(raw),
        }
    )


def _collective(raw: pd.DataFrame, where: str) -> pd.Series:
    import pandas as pd

    if COLLECTIVE not in raw.columns:
        return pd.Series(ALL_REDUCE, index=raw.index, dtype=object)
    values = raw[COLLECTIVE].astype(object).where(raw[COLLECTIVE].notna(), ALL_REDUCE).astype(str)
    bad = sorted(set(values) - set(COLLECTIVES))
    if bad:
        raise BandwidthDataError(
            f"{where}: column 'collective' must be one of {', '.join(COLLECTIVES)}, got {bad}"
        )
    return values


def _cloud(raw: pd.DataFrame) -> pd.Series:
    import pandas as pd

    if "cloud" not in raw.columns:
        return pd.Series(CATALOG_CLOUD, index=raw.index, dtype=object)
    return raw["cloud"].astype(object).where(raw["cloud"].notna(), CATALOG_CLOUD).astype(str)


def _table_ids(raw: pd.DataFrame, path: Path) -> pd.Series:
    import pandas as pd

    ids = pd.Series(path.name, index=raw.index, dtype=object)
    for c in ("source", TABLE):  # later columns win where they have a value
        if c in raw.columns:
            ids = raw[c].astype(object).where(raw[c].notna(), ids)
    return ids.astype(str)


def _num_nodes(raw: pd.DataFrame) -> pd.Series:
    import pandas as pd

    nodes = pd.Series(pd.NA, index=raw.index, dtype="Int64")
    if "gpus_per_node" in raw.columns:
        per = pd.to_numeric(raw["gpus_per_node"], errors="coerce")
        world = raw["world_size"]
        ok = (per > 0) & (world % per == 0)  # False where per is null or 0
        nodes[ok] = (world[ok] // per[ok]).astype("int64")
    if "num_nodes" in raw.columns:
        given = pd.to_numeric(raw["num_nodes"], errors="coerce").astype("Int64")
        nodes = given.where(given.notna(), nodes)
    return nodes
