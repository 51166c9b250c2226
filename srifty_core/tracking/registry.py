"""MLflow's model registry: log a run whose model is logged from code and registered as a
new version; read versions, aliases and artifacts back; move aliases and set tags.

What the model is (its code file, its artifacts, how it predicts for the signature) is
the caller's, passed in (``CodeModel``); this module only talks to MLflow. ``ModelRegistry``
reads through an ``MlflowClient``: a version or run that is not there is ``None``, an
artifact that cannot be downloaded is ``None``, and only MLflow's own failures are
translated (to ``SriftyError`` where a caller has to say so). MLflow is imported when a
function runs; MLflow's notices printed while logging go to the log at INFO.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core.errors import SriftyError
from srifty_core.tracking import store
from srifty_core.tracking.runs import Dataset, log_dataset

if TYPE_CHECKING:
    import pandas as pd

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelVersion:
    """A registered model version: its number, the run that logged it, its tags."""

    version: str
    run_id: str | None
    tags: Mapping[str, str]


def _version(mv: Any) -> ModelVersion:
    run_id = str(mv.run_id) if mv.run_id else None
    tags = {str(k): str(v) for k, v in (mv.tags or {}).items()}
    return ModelVersion(str(mv.version), run_id, tags)


class ModelRegistry:
    """The registered models of one store (an ``MlflowClient`` inside)."""

    def __init__(self, client: Any, tracking_uri: str | None = None) -> None:
        self._client = client
        self.tracking_uri = tracking_uri
        """The store's URI (``store.resolve_tracking_uri``), for downloads."""

    @classmethod
    def reader(cls, tracking_uri: str | None = None) -> ModelRegistry:
        """For reading (``store.reader``: creates no experiment, leaves MLflow's
        process-wide tracking URI alone)."""
        client, uri = store.reader(tracking_uri)
        return cls(client, uri)

    @classmethod
    def writer(cls, experiment: str, tracking_uri: str | None = None) -> ModelRegistry:
        """For moving aliases and setting tags (``store.writer``: the experiment is
        created if new)."""
        uri, _ = store.resolve_tracking_uri(tracking_uri)
        client, _ = store.writer(experiment, tracking_uri)
        return cls(client, uri)

    def by_alias(self, name: str, alias: str) -> ModelVersion | None:
        """The version of model ``name`` holding ``alias``, or None."""
        from mlflow.exceptions import MlflowException

        try:
            return _version(self._client.get_model_version_by_alias(name, alias))
        except MlflowException:
            return None

    def version(self, name: str, version: str) -> ModelVersion | None:
        """Version ``version`` of model ``name``, or None."""
        from mlflow.exceptions import MlflowException

        try:
            return _version(self._client.get_model_version(name, version))
        except MlflowException:
            return None

    def run_value(self, run_id: str, key: str) -> str | None:
        """The run's parameter ``key``, else its tag ``key``; None without either (or
        without the run)."""
        from mlflow.exceptions import MlflowException

        try:
            data = self._client.get_run(run_id).data
        except MlflowException:
            return None
        value = data.params.get(key) or data.tags.get(key)
        return None if value is None else str(value)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self._client.set_registered_model_alias(name, alias, version)

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self._client.set_model_version_tag(name, version, key, value)

    def download_root(self, name: str, version: str) -> str:
        """Where version ``version`` of model ``name`` lies (its artifact URI, no trailing
        slash); ``SriftyError`` when the store has no such version."""
        from mlflow.exceptions import MlflowException

        try:
            return str(self._client.get_model_version_download_uri(name, version)).rstrip("/")
        except MlflowException as exc:
            what = f"version {version} of model {name!r}"
            raise SriftyError(f"{what}: not in the MLflow store ({exc.message})") from None

    def download(self, artifact_uri: str, dst: Path) -> Path | None:
        """Download one artifact (a file or a folder) into ``dst``; its local path, or None
        when it cannot be downloaded."""
        from mlflow.artifacts import download_artifacts
        from mlflow.exceptions import MlflowException

        try:
            local = download_artifacts(
                artifact_uri=artifact_uri, dst_path=str(dst), tracking_uri=self.tracking_uri
            )
        except (MlflowException, OSError):
            return None
        return Path(local) if local else None


@dataclass(frozen=True)
class CodeModel:
    """A model to log *from code* (MLflow's models from code: the source file ``code`` is
    stored, nothing is pickled) and register as a new version of ``name``."""

    name: str
    code: Path
    artifacts: Mapping[str, Path]
    """The model's artifacts by name (files or folders), stored beside the code."""
    pip_requirements: Sequence[str]
    tags: Mapping[str, str] = field(default_factory=dict)
    """Tags of the logged model (and of the registered version)."""
    input_example: pd.DataFrame | None = None
    predict: Callable[[pd.DataFrame], Any] | None = None
    """With ``input_example``: the model's output for it, for the signature."""
    artifact_path: str = "model"


def log_code_model(
    experiment: str,
    run_name: str,
    model: CodeModel,
    *,
    tags: Mapping[str, str],
    params: Mapping[str, str],
    metrics: Mapping[str, float],
    files: Sequence[Path] = (),
    json_files: Mapping[str, Any] | None = None,
    dataset: Dataset | None = None,
    tracking_uri: str | None = None,
) -> tuple[str, str]:
    """One run of ``experiment``: tags, params (one batch), ``dataset`` as its input, the
    metrics (before the model: ``log_model`` links the run's metrics to the logged model),
    ``files`` and ``json_files`` (name -> object, written as indented JSON) as artifacts,
    then ``model`` logged from code (a signature when it has an input example) and
    registered. Returns (run id, version)."""
    experiment_id = store.setup_experiment(experiment, tracking_uri)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow
    import mlflow.pyfunc

    signature = None
    if model.input_example is not None and model.predict is not None:
        from mlflow.models import infer_signature

        example = model.input_example.reset_index(drop=True)
        with warnings.catch_warnings():  # the hint that integer columns cannot hold NaN
            warnings.simplefilter("ignore", UserWarning)
            signature = infer_signature(example, model.predict(example))
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name) as run:
        mlflow.set_tags(dict(tags))
        mlflow.log_params(dict(params))  # one batch
        if dataset is not None:
            log_dataset(dataset)
        mlflow.log_metrics(dict(metrics))
        for path in files:
            mlflow.log_artifact(str(path))
        with tempfile.TemporaryDirectory() as tmp:
            for name, obj in (json_files or {}).items():
                p = Path(tmp) / name
                p.write_text(json.dumps(obj, indent=1, default=str))
                mlflow.log_artifact(str(p))
        with warnings.catch_warnings(), _notices_as_info():  # MLflow's hints, pandas'
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            info = mlflow.pyfunc.log_model(
                name=model.artifact_path,
                python_model=str(model.code),
                artifacts={k: str(v) for k, v in model.artifacts.items()},
                signature=signature,
                input_example=model.input_example,
                pip_requirements=list(model.pip_requirements),
                registered_model_name=model.name,
                tags=dict(model.tags),
            )
        return str(run.info.run_id), str(info.registered_model_version)


@contextlib.contextmanager
def _notices_as_info() -> Iterator[None]:
    """MLflow prints its notices ("Successfully registered model ...") to stderr, which an
    Airflow task logs as errors: inside this block they are logged at INFO instead."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stderr(buffer):
            yield
    finally:
        for line in buffer.getvalue().splitlines():
            if line.strip():
                _log.info("MLflow: %s", line.strip())
