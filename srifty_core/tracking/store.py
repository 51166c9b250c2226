"""The MLflow store every tracking job uses: its URI, its experiments, its clients.

Default store: SQLite at ``<data dir>/mlflow/mlflow.db`` with artifacts in
``<data dir>/mlflow/artifacts``; ``MLFLOW_TRACKING_URI`` (or the ``tracking_uri`` argument)
points anywhere else. Experiments are created with an explicit artifact location so nothing
lands in ``./mlruns`` of the current directory. MLflow itself is imported inside the
functions that need it (importing this module stays light).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
    _create_once(paths.mlflow_dir(), default)
    return default, True


def _create_once(folder: Path, uri: str) -> None:
    """MLflow creates a SQLite store's tables when a client first opens it, and two
    processes doing that at once race (the second fails: "table ... already exists"; two
    `srifty plan` started together on a fresh data folder did). The first opening of the
    default store in a data folder therefore happens under a file lock, and a marker beside
    the database says it is done (one ``stat`` after that)."""
    marker = folder / "mlflow.db.ready"

    def ready() -> bool:  # a database deleted since is made again, under the lock
        return marker.exists() and (folder / "mlflow.db").exists()

    if ready():
        return
    from filelock import FileLock

    with FileLock(str(folder / "mlflow.db.lock")):
        if ready():
            return
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_experiments(max_results=1)  # the tracking tables
        client.search_registered_models(max_results=1)  # and the registry's
        marker.touch()


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


def writer(experiment: str, tracking_uri: str | None = None) -> tuple[Any, str]:
    """(``MlflowClient`` on the store MLflow now points at, id of ``experiment``): for
    writing runs and model versions; points MLflow's process-wide tracking URI at the
    store (``setup_experiment``)."""
    experiment_id = setup_experiment(experiment, tracking_uri)
    from mlflow.tracking import MlflowClient

    return MlflowClient(), experiment_id


def reader(tracking_uri: str | None = None) -> tuple[Any, str]:
    """(``MlflowClient``, tracking URI) for reading: unlike ``writer`` it creates no
    experiment and leaves MLflow's process-wide tracking URI alone."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    uri, _ = resolve_tracking_uri(tracking_uri)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri), uri
