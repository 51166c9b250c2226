"""The one place that decides where Srifty keeps its data.

The data folder is, in order of precedence: the ``data_dir`` argument (the CLI's
``--data-dir``), the environment variable ``SRIFTY_DATA_DIR``, or the default: ``data/`` at
the repository root when running from a source tree (a checkout, an editable install),
else ``$XDG_DATA_HOME/srifty`` (``~/.local/share/srifty``) for an installed wheel.
Everything Srifty writes lives under it (probe store, compute profiles, MLflow store,
Airflow's home for the demo, reports, price overlays).

The shipped catalog, reference tables and reference profiles are package data
(``srifty_core/shipped/``, found through ``importlib.resources``), read whatever the data
folder and however the package was installed.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

from srifty_core.errors import ConfigError

ENV_VAR = "SRIFTY_DATA_DIR"
RUN_STORAGE_ENV = "SRIFTY_RUN_STORAGE"
"""Deployment setting: where run folders live when Airflow and the training VMs share
object storage (``s3://bucket/prefix``); unset: the data folder's ``runs/``."""

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The repository (or source tree) this package was installed from in editable mode (for
an installed wheel: the folder it was installed into)."""

SHIPPED_DATA_DIR = Path(str(files("srifty_core") / "shipped"))
"""The data that ships inside the package (read-only; ``pyproject.toml``'s package data
lists it, ``tests/test_packaging.py`` checks that the wheel carries all of it)."""
CATALOG_DIR = SHIPPED_DATA_DIR / "catalog"
"""Shipped instance catalog: EC2 GPU types, zone spot prices, GPU specs (read-only)."""
REFERENCE_DIR = SHIPPED_DATA_DIR / "reference"
"""Shipped public reference tables (nccl-tests results) used for calibration."""
REFERENCE_PROFILES_DIR = SHIPPED_DATA_DIR / "reference_profiles"
"""Shipped reference compute profiles of the case studies' models (``srifty_core.case_studies``;
made by ``benchmarks/case_studies.py --reprofile``)."""
DAGS_DIR = REPO_ROOT / "dags"
PLUGINS_DIR = REPO_ROOT / "plugins"


def in_source_tree() -> bool:
    """Whether this package runs from a source tree (a checkout or an editable install)
    rather than from an installed wheel."""
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "srifty_core").is_dir()


def default_data_dir() -> Path:
    """``<repo>/data`` in a source tree, else ``$XDG_DATA_HOME/srifty`` (default
    ``~/.local/share/srifty``): never inside an installed package."""
    if in_source_tree():
        return REPO_ROOT / "data"
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return (base / "srifty").resolve()


def run_storage() -> str | None:
    """The shared run storage (``$SRIFTY_RUN_STORAGE``: an fsspec URI such as
    ``s3://bucket/prefix``, no trailing ``/``), or ``None`` for the data folder. A
    deployment setting, read only here: never taken from a trigger conf."""
    value = os.environ.get(RUN_STORAGE_ENV, "").strip().rstrip("/")
    if not value:
        return None
    if "://" not in value or value.startswith("file://"):
        raise ConfigError(
            f"{RUN_STORAGE_ENV}: a URI such as s3://bucket/prefix, got {value!r} (leave it "
            "unset to keep run folders in the data folder)"
        )
    return value


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The data folder: ``override``, else ``$SRIFTY_DATA_DIR``, else
    ``default_data_dir()``."""
    if override is not None and str(override) != "":
        return Path(override).expanduser().resolve()
    env = os.environ.get(ENV_VAR, "")
    if env:
        return Path(env).expanduser().resolve()
    return default_data_dir()


def probe_store_dir(root: Path | None = None) -> Path:
    """Parquet probe store (allreduce measurements)."""
    return (root or data_dir()) / "probes"


def profiles_dir(root: Path | None = None) -> Path:
    """Compute profiles, one JSON per model and device type."""
    return (root or data_dir()) / "profiles"


def mlflow_dir(root: Path | None = None) -> Path:
    """Default MLflow store: ``mlflow.db`` (SQLite) and ``artifacts/``."""
    return (root or data_dir()) / "mlflow"


def model_cache_dir(root: Path | None = None) -> Path:
    """Local copies of registered models, one folder per MLflow store (the champion
    bandwidth model's: ``predictors.champion_cache``)."""
    return (root or data_dir()) / "models" / "cache"


def airflow_home(root: Path | None = None) -> Path:
    """Airflow's home for the demo (SQLite metadata DB, logs)."""
    return (root or data_dir()) / "airflow"


def reports_dir(root: Path | None = None) -> Path:
    """Reports written by jobs (catalog validation, plans, benchmarks)."""
    return (root or data_dir()) / "reports"


def price_overlay_dir(root: Path | None = None) -> Path:
    """Newer price observations (CSV) merged over the shipped catalog."""
    return (root or data_dir()) / "prices"


def cloud_dir(root: Path | None = None) -> Path:
    """Provider state: allocations launched and the worker processes they run."""
    return (root or data_dir()) / "cloud"
