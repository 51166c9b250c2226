"""MLflow set-up shared by every job that tracks runs (profiles, bandwidth models, plans).

Default store: SQLite at ``<data dir>/mlflow/mlflow.db`` with artifacts in
``<data dir>/mlflow/artifacts``; ``MLFLOW_TRACKING_URI`` (or the ``tracking_uri`` argument)
points anywhere else. Experiments are created with an explicit artifact location so nothing
lands in ``./mlruns`` of the current directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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


TAG_PREFIX = "srifty."
"""Every tag Srifty sets on a run is ``srifty.<name>`` (``srifty.kind`` says which job made
the run: ``job``, ``replan``, ``compute-profile``, ``bandwidth-model``), so one filter
(``tags.`srifty.kind` = 'job'``) finds a kind of run and nothing collides with MLflow's
own ``mlflow.*`` tags."""


def srifty_tags(**values: object) -> dict[str, str]:
    """``{"srifty.<name>": str(value)}`` for each given value."""
    return {f"{TAG_PREFIX}{k}": str(v) for k, v in values.items()}


def log_batch(
    client: Any,
    run_id: str,
    *,
    metrics: Mapping[str, float] | None = None,
    params: Mapping[str, object] | None = None,
    tags: Mapping[str, str] | None = None,
    step: int = 0,
    timestamp_ms: int | None = None,
) -> None:
    """One ``MlflowClient.log_batch`` call for the run's metrics, params and tags (MLflow
    takes at most 1000 metrics, 100 params and 100 tags per call: larger sets are sent in
    chunks). Non-finite metrics are left out."""
    import math
    import time

    from mlflow.entities import Metric, Param, RunTag

    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    ms = [
        Metric(k, float(v), ts, step)
        for k, v in (metrics or {}).items()
        if v is not None and math.isfinite(float(v))
    ]
    ps = [Param(k, str(v)[:6000]) for k, v in (params or {}).items()]
    ts_ = [RunTag(k, str(v)[:5000]) for k, v in (tags or {}).items()]
    while ms or ps or ts_:
        client.log_batch(run_id, metrics=ms[:1000], params=ps[:100], tags=ts_[:100])
        ms, ps, ts_ = ms[1000:], ps[100:], ts_[100:]
