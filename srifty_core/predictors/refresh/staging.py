"""The staging folder the refresh steps hand over their files through: where a new one
goes (``staging_dir``), the names of its files, the training data's snapshot
(``read_snapshot``) and its removal (``refresh_bandwidth_model`` removes it when it ends,
done or failed; the DAG's teardown task does the same)."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from srifty_core import paths
from srifty_core.predictors.refresh.config import RefreshConfig

if TYPE_CHECKING:
    import pandas as pd

SNAPSHOT = "probes.parquet"
FIT_FILE = "fit.json"
EVAL_FILE = "evaluation.json"
MODEL_DIR = "model"
REGISTERED_FILE = "registered.json"
PLOT_FILE = "busbw_vs_size.png"


def staging_dir(root: Path | None = None) -> Path:
    """A new staging folder under ``<data dir>/models/bandwidth/``."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return (root or paths.data_dir()) / "models" / "bandwidth" / stamp


def read_snapshot(staging: Path) -> tuple[pd.DataFrame, RefreshConfig]:
    """The training data and the config step 1 wrote into ``staging``."""
    import pandas as pd

    df = pd.read_parquet(staging / SNAPSHOT)
    config = RefreshConfig.from_json(json.loads((staging / "config.json").read_text()))
    return df, config


def remove_staging(folder: Path) -> None:
    """Remove a staging folder (the DAG's last task does, once the run is done)."""
    shutil.rmtree(folder, ignore_errors=True)


def json_default(o: Any) -> Any:
    """How the steps' JSON files write what ``json`` cannot: numpy scalars as numbers,
    anything else as its ``str``."""
    if isinstance(o, np.generic):
        return o.item()
    return str(o)
