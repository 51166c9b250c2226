"""MLflow set-up shared by every job that tracks runs (profiles, bandwidth models, plans).

Default store: SQLite at ``<data dir>/mlflow/mlflow.db`` with artifacts in
``<data dir>/mlflow/artifacts``; ``MLFLOW_TRACKING_URI`` (or the ``tracking_uri`` argument)
points anywhere else. Experiments are created with an explicit artifact location so nothing
lands in ``./mlruns`` of the current directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from srifty_core import paths


def default_tracking_uri(root: Path | None = None) -> str:
    folder = paths.mlflow_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


_set_by_us: str | None = None
"""The default URI this process last gave MLflow. ``mlflow.set_tracking_uri`` also exports it
as ``MLFLOW_TRACKING_URI``; that value is ours, not the user's, so it must not pin later
calls to an old data folder."""


def resolve_tracking_uri(tracking_uri: str | None = None) -> tuple[str, bool]:
    """(URI, is the default local store): the argument, else a user's ``MLFLOW_TRACKING_URI``,
    else SQLite under the data folder."""
    if tracking_uri:
        return tracking_uri, False
    default = default_tracking_uri()
    env = os.environ.get("MLFLOW_TRACKING_URI", "")
    # The default store, exported by a parent process that set it (the demo runs Airflow
    # in child processes), is still the default: artifacts go under the data folder.
    if env and env not in (_set_by_us, default):
        return env, False
    return default, True


def setup_experiment(name: str, tracking_uri: str | None = None) -> str:
    """Point MLflow at the store and return the id of experiment ``name`` (created if new)."""
    global _set_by_us
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    uri, local = resolve_tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(uri)
    if local:
        _set_by_us = uri
    existing = mlflow.get_experiment_by_name(name)
    if existing is not None:
        return str(existing.experiment_id)
    if not local:  # a tracking server decides where artifacts go
        return str(mlflow.create_experiment(name))
    artifacts = (paths.mlflow_dir() / "artifacts").resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    return str(mlflow.create_experiment(name, artifact_location=artifacts.as_uri()))
