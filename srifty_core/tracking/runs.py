"""MLflow runs: create them, log params, metrics, tags and artifacts to them, end them.

Two ways in. ``RunLog`` addresses runs by id through an ``MlflowClient`` (the steps of a
job run in different processes, so there is no active-run stack to rely on), and sends
values in ``log_batch`` calls, never a call per value. ``log_run`` records a whole run in
one go (MLflow's fluent API: start, tags, params, metrics, files, end). Every tag Srifty
sets is ``srifty.<name>`` (``srifty_tags``). MLflow is imported when a function runs.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core.tracking import store

if TYPE_CHECKING:
    import pandas as pd

TAG_PREFIX = "srifty."
"""Every tag Srifty sets on a run is ``srifty.<name>`` (``srifty.kind`` says which job made
the run: ``job``, ``replan``, ``compute-profile``, ``bandwidth-model``), so one filter
(``tags.`srifty.kind` = 'job'``) finds a kind of run and nothing collides with MLflow's
own ``mlflow.*`` tags."""
PARENT_RUN_TAG = "mlflow.parentRunId"
"""The tag that nests a run under another in MLflow's views."""


def log_to_active_run(metrics: Mapping[str, float], dicts: Mapping[str, Any]) -> bool:
    """Log ``metrics`` and each of ``dicts`` (an artifact file name -> a JSON-able value) to
    the active MLflow run of this process; False when none is active. MLflow is not
    imported here: a process that has not imported it has no active run."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or mlflow.active_run() is None:
        return False
    mlflow.log_metrics(dict(metrics))
    for name, value in dicts.items():
        mlflow.log_dict(value, name)
    return True


def srifty_tags(**values: object) -> dict[str, str]:
    """``{"srifty.<name>": str(value)}`` for each given value."""
    return {f"{TAG_PREFIX}{k}": str(v) for k, v in values.items()}


@dataclass(frozen=True)
class MetricPoint:
    """One value of a metric's history: at ``timestamp_ms``, training step ``step``."""

    key: str
    value: float
    timestamp_ms: int
    step: int


class RunLog:
    """The runs of one experiment, addressed by id (an ``MlflowClient`` inside)."""

    def __init__(self, client: Any, experiment_id: str) -> None:
        self._client = client
        self.experiment_id = experiment_id

    @classmethod
    def open(cls, experiment: str, tracking_uri: str | None = None) -> RunLog:
        """The runs of ``experiment`` (created if new) in the store (``store.writer``)."""
        client, experiment_id = store.writer(experiment, tracking_uri)
        return cls(client, experiment_id)

    def create_run(self, run_name: str, tags: Mapping[str, str]) -> str:
        """A new running run; its id."""
        run = self._client.create_run(self.experiment_id, run_name=run_name, tags=dict(tags))
        return str(run.info.run_id)

    def log_batch(
        self,
        run_id: str,
        *,
        metrics: Mapping[str, float] | None = None,
        params: Mapping[str, object] | None = None,
        tags: Mapping[str, str] | None = None,
        step: int = 0,
        timestamp_ms: int | None = None,
    ) -> None:
        """One ``MlflowClient.log_batch`` call for the run's metrics, params and tags (MLflow
        takes at most 1000 metrics, 100 params and 100 tags per call: larger sets are sent
        in chunks). Non-finite metrics are left out."""
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
            self._client.log_batch(run_id, metrics=ms[:1000], params=ps[:100], tags=ts_[:100])
            ms, ps, ts_ = ms[1000:], ps[100:], ts_[100:]

    def log_history(self, run_id: str, points: Iterable[MetricPoint]) -> None:
        """Metric histories as they are (each point its own time and step), 1000 points a
        call."""
        from mlflow.entities import Metric

        history = [Metric(p.key, p.value, p.timestamp_ms, p.step) for p in points]
        for k in range(0, len(history), 1000):
            self._client.log_batch(run_id, metrics=history[k : k + 1000])

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        """``text`` as the run's artifact ``artifact_file``."""
        self._client.log_text(run_id, text, artifact_file)

    def log_artifact(self, run_id: str, path: Path) -> None:
        """The file ``path`` as an artifact of the run (its name kept)."""
        self._client.log_artifact(run_id, str(path))

    def end(self, run_id: str, status: str = "FINISHED") -> None:
        """End the run as ``status`` (``FINISHED``, ``FAILED``)."""
        self._client.set_terminated(run_id, status)


@dataclass(frozen=True)
class Dataset:
    """A table logged as a run's MLflow dataset input: its schema, row count and digest
    (``digest``: given, else MLflow's), not the rows."""

    frame: pd.DataFrame
    name: str
    source: str
    targets: str | None = None
    digest: str | None = None
    context: str = "training"


def log_dataset(dataset: Dataset) -> None:
    """``dataset`` as an input of the active run (fluent API)."""
    import warnings

    import mlflow
    from mlflow.data.pandas_dataset import from_pandas

    with warnings.catch_warnings():  # MLflow's hint about integer columns
        warnings.simplefilter("ignore", UserWarning)
        logged = from_pandas(
            dataset.frame,
            source=dataset.source,
            targets=dataset.targets,
            name=dataset.name,
            digest=dataset.digest,
        )
    mlflow.log_input(logged, context=dataset.context)


def log_run(
    experiment: str,
    run_name: str,
    *,
    tags: Mapping[str, str],
    params: Mapping[str, object],
    metrics: Mapping[str, float],
    files: Sequence[Path] = (),
    tracking_uri: str | None = None,
) -> str:
    """Record one finished run of ``experiment``: its tags, params (one batch), metrics and
    ``files`` as artifacts. Returns the run id."""
    experiment_id = store.setup_experiment(experiment, tracking_uri)
    import mlflow

    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name) as run:
        mlflow.set_tags(dict(tags))
        mlflow.log_params(dict(params))
        mlflow.log_metrics(dict(metrics))
        for path in files:
            mlflow.log_artifact(str(path))
        return str(run.info.run_id)
