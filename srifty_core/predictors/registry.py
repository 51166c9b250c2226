"""The bandwidth model in MLflow: one run per fit, one registered model, two aliases.

- Registered model ``MODEL_NAME`` (``srifty-busbw``). Each version is an MLflow *pyfunc*
  whose artifact ``predictor`` is the saved ``BandwidthModel`` folder (both XGBoost
  boosters as JSON, the MTU, the caps, the feature encoding): ``load_champion`` rebuilds the
  full predictor from it, offline.
- Aliases: a new fit's version becomes ``challenger``; ``promote`` moves ``champion`` to it
  only when the decision (``refresh.decide``) says its held-out MAPE is no worse than the
  champion's on the same held-out rows. Nothing else moves ``champion``.
- Store: ``srifty_core.tracking`` (SQLite + local artifacts under the data folder unless
  ``MLFLOW_TRACKING_URI`` or ``tracking_uri`` says otherwise).
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core.errors import SriftyError
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.pyfunc import PREDICTOR_ARTIFACT

if TYPE_CHECKING:
    pass

MODEL_NAME = "srifty-busbw"
EXPERIMENT = "srifty-bandwidth-models"
CHAMPION = "champion"
CHALLENGER = "challenger"


class NoChampionError(SriftyError, LookupError):
    """No version of the bandwidth model carries the ``champion`` alias yet."""


def _pip_requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("xgboost-cpu", "pandas", "numpy"):
        try:
            out.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            out.append(pkg)
    return out


def client(tracking_uri: str | None = None) -> Any:
    """An ``MlflowClient`` on the store (the experiment is created if new)."""
    from srifty_core.tracking import setup_experiment

    setup_experiment(EXPERIMENT, tracking_uri)
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def alias_version(alias: str, tracking_uri: str | None = None) -> str | None:
    """The model version holding ``alias``, or None."""
    from mlflow.exceptions import MlflowException

    c = client(tracking_uri)
    try:
        mv = c.get_model_version_by_alias(MODEL_NAME, alias)
    except MlflowException:
        return None
    return str(mv.version)


def load_version(version: str, tracking_uri: str | None = None) -> BandwidthModel:
    """The ``BandwidthModel`` of one registered version."""
    return _load(f"models:/{MODEL_NAME}/{version}", tracking_uri)


def load_champion(tracking_uri: str | None = None) -> BandwidthModel:
    """The champion bandwidth predictor (implements ``predictors.base.BandwidthPredictor``):
    ``predict(features) -> busbw bytes/s`` and ``bandwidth_cap(instance_type, world_size)``.

    Raises ``NoChampionError`` when no version is champion yet (run ``srifty fit-bandwidth``).
    """
    if alias_version(CHAMPION, tracking_uri) is None:
        raise NoChampionError(
            f"no {CHAMPION!r} version of model {MODEL_NAME!r} in the MLflow store; "
            "fit one with `srifty fit-bandwidth`"
        )
    return _load(f"models:/{MODEL_NAME}@{CHAMPION}", tracking_uri)


def _load(uri: str, tracking_uri: str | None) -> BandwidthModel:
    client(tracking_uri)
    import mlflow.pyfunc

    wrapper = mlflow.pyfunc.load_model(uri).unwrap_python_model()
    model = wrapper.model
    if not isinstance(model, BandwidthModel):
        raise SriftyError(f"{uri} does not hold a bandwidth model")
    return model


def log_fit(
    *,
    model_dir: Path,
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    artifacts: Mapping[str, Path],
    json_artifacts: Mapping[str, Any],
    run_name: str,
    tracking_uri: str | None = None,
) -> tuple[str, str]:
    """Log one fit as a run (params, metrics, tags, files), register its predictor as a new
    version of ``MODEL_NAME`` and give it the ``challenger`` alias. Returns (run id,
    version)."""
    from srifty_core.tracking import setup_experiment

    experiment_id = setup_experiment(EXPERIMENT, tracking_uri)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow
    import mlflow.pyfunc

    from srifty_core.predictors.pyfunc import BusbwPyfunc

    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name) as run:
        mlflow.set_tags({"kind": "bandwidth-model", **tags})
        mlflow.log_params({k: _param(v) for k, v in params.items()})
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v == v})  # no NaN
        for path in artifacts.values():
            mlflow.log_artifact(str(path))
        with tempfile.TemporaryDirectory() as tmp:
            for name, obj in json_artifacts.items():
                p = Path(tmp) / name
                p.write_text(json.dumps(obj, indent=1, default=str))
                mlflow.log_artifact(str(p))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*type hints.*")
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=BusbwPyfunc(),
                artifacts={PREDICTOR_ARTIFACT: str(model_dir)},
                pip_requirements=_pip_requirements(),
                registered_model_name=MODEL_NAME,
            )
        version = str(info.registered_model_version)
        run_id = str(run.info.run_id)
    c = client(tracking_uri)
    c.set_registered_model_alias(MODEL_NAME, CHALLENGER, version)
    c.set_model_version_tag(MODEL_NAME, version, "run_id", run_id)
    return run_id, version


def promote(version: str, tracking_uri: str | None = None) -> None:
    """Give ``version`` the ``champion`` alias."""
    client(tracking_uri).set_registered_model_alias(MODEL_NAME, CHAMPION, version)


def record_decision(
    run_id: str,
    version: str,
    decision: Mapping[str, Any],
    tracking_uri: str | None = None,
) -> None:
    """Put the promotion decision on the run (tags, metrics) and on the model version."""
    c = client(tracking_uri)
    c.set_tag(run_id, "promoted", str(bool(decision["promote"])).lower())
    c.set_tag(run_id, "decision", str(decision["reason"]))
    c.set_model_version_tag(MODEL_NAME, version, "promoted", str(bool(decision["promote"])))
    c.set_model_version_tag(MODEL_NAME, version, "decision", str(decision["reason"]))
    for key in ("challenger_holdout_mape", "champion_holdout_mape"):
        value = decision.get(key)
        if value is not None and value == value:
            c.log_metric(run_id, key, float(value))


def _param(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    return text[:6000]
