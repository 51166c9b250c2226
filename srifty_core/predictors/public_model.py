"""The bus-bandwidth model fitted on the shipped public nccl-tests tables, fitted once and
kept: what planning uses before a deployment has probed anything.

Contract: ``public_model(rows)`` returns ``BandwidthModel().fit(rows)``, from the data
folder's model cache (``paths.model_cache_dir()/public/<key>/``, ``BandwidthModel.save``'s
folder: JSON and XGBoost JSON, never a pickle) when one was fitted on the same rows by the
same fitting code, else fitted now (about 3 s) and kept. The key is a digest of the rows
and of every source file of ``srifty_core.predictors``, so a change to either fits again.
A folder that cannot be read is fitted again and replaced; one is written whole or not at
all (a temporary folder renamed into place).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from srifty_core import paths
from srifty_core.predictors.bandwidth import BandwidthModel

if TYPE_CHECKING:
    import pandas as pd

_CODE = Path(__file__).resolve().parent


def cache_key(rows: pd.DataFrame) -> str:
    """A digest of ``rows`` (columns, index and values) and of the fitting code."""
    import pandas as pd

    h = hashlib.sha256()
    h.update("\x1f".join(map(str, rows.columns)).encode())
    h.update(pd.util.hash_pandas_object(rows, index=True).to_numpy().tobytes())
    for source in sorted(_CODE.rglob("*.py")):
        h.update(source.relative_to(_CODE).as_posix().encode())
        h.update(source.read_bytes())
    return h.hexdigest()[:24]


def public_model(rows: pd.DataFrame, root: Path | None = None) -> BandwidthModel:
    """``BandwidthModel().fit(rows)``, kept under ``root`` (default: the data folder)."""
    folder = paths.model_cache_dir(root) / "public" / cache_key(rows)
    if (folder / "model.json").is_file():
        try:
            return BandwidthModel.load(folder)
        except Exception:  # a damaged copy is fitted again, never fatal
            shutil.rmtree(folder, ignore_errors=True)
    model = BandwidthModel().fit(rows)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
        model.save(tmp)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process kept the same fit first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # a read-only data folder: planning goes on, fitting each time
    return model
