"""The bandwidth model in MLflow: one run per fit, one registered model, two aliases.

- Registered model ``MODEL_NAME`` (``srifty-busbw``). Each version is an MLflow model logged
  *from code* (``mlflow.pyfunc.log_model(python_model=<path of pyfunc.py>)``, MLflow's
  "models from code"): MLflow stores that source file, not a cloudpickle, beside the artifact
  ``predictor``, the saved ``BandwidthModel`` folder (both XGBoost boosters as XGBoost JSON;
  the MTU, caps and feature encoding as JSON). The version has a signature (the feature
  columns in, busbw out) and an input example, so MLflow's model view shows what it takes,
  and ``mlflow.pyfunc.load_model`` serves it where srifty is installed. The other way
  MLflow 3.17 offers, ``create_model_version(source=<run artifact folder>)``, registers a bare
  folder: no ``MLmodel``, no logged model, nothing for the model view to show.
- Loading (``load_champion``, ``load_version``) never goes through pyfunc and runs no code
  from the store: alias -> version -> its artifact location (``MlflowClient``); its
  ``MLmodel`` is read as plain YAML (``yaml.safe_load``) for the ``predictor`` path; only that
  folder is downloaded, into a temporary folder, and read by ``BandwidthModel.load`` (JSON
  and XGBoost JSON, no pickle). A ``python_model.pkl`` (versions logged before models from
  code have one) or any other file beside it is never opened. Without ``mlflow.pyfunc`` (and
  its requirement checks) a load costs the ``mlflow`` and ``xgboost`` imports, two store
  queries and a few small files.
- The champion is also kept as a local copy (``champion_cache``: the version's predictor
  folder and a ``champion.json`` pointer with its checksums), written by ``promote`` (the
  code that moves the alias) and by any ``load_champion`` that had to ask the store.
  ``load_champion`` reads the copy without importing MLflow when it is still the champion's
  (the rules, per kind of store, are in ``champion_cache``), and otherwise asks the store
  as above (``refresh=True``: always). ``load_champion_with_source`` also says which
  version it used and from where.
- Metrics are logged on the run before the model: ``log_model`` links the run's metrics to
  the logged model, so the model view lists them too. The decision's metrics
  (``record_decision``) come later and stay on the run.
- Aliases: a new fit's version becomes ``challenger``; ``promote`` moves ``champion`` to it
  only when the decision (``refresh.decide``) says its held-out MAPE is no worse than the
  champion's on the same held-out rows. Nothing else moves ``champion``.
- Data version: every version carries the ``data_version`` tag of the rows it was fitted
  on (``champion_data_version`` reads it, or the run's parameter for older versions); a
  refresh of the champion's very rows registers nothing (``refresh.register``).
- Store: ``srifty_core.tracking`` (SQLite + local artifacts under the data folder unless
  ``MLFLOW_TRACKING_URI`` or ``tracking_uri`` says otherwise).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from srifty_core.errors import ConfigError, SriftyError
from srifty_core.predictors import champion_cache
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.champion_cache import ChampionSource
from srifty_core.predictors.features import LABEL
from srifty_core.tracking import resolve_tracking_uri

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import pandas as pd

MODEL_NAME = "srifty-busbw"
EXPERIMENT = "srifty-bandwidth-models"
CHAMPION = "champion"
CHALLENGER = "challenger"
PREDICTOR_ARTIFACT = "predictor"
"""The artifact of each version that holds the saved ``BandwidthModel`` folder."""
PYFUNC_CODE = Path(__file__).with_name("pyfunc.py")
"""The model's code, logged as source (models from code)."""
DATA_VERSION_TAG = "data_version"


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


def _reader(tracking_uri: str | None) -> tuple[Any, str]:
    """(``MlflowClient``, tracking URI) for reading the registry: unlike ``client`` it
    creates no experiment and leaves MLflow's process-wide tracking URI alone."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    uri, _ = resolve_tracking_uri(tracking_uri)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri), uri


def _by_alias(c: Any, alias: str) -> Any:
    """The ``ModelVersion`` holding ``alias``, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(MODEL_NAME, alias)
    except MlflowException:
        return None


def alias_version(alias: str, tracking_uri: str | None = None) -> str | None:
    """The model version holding ``alias``, or None."""
    mv = _by_alias(_reader(tracking_uri)[0], alias)
    return None if mv is None else str(mv.version)


def champion_data_version(tracking_uri: str | None = None) -> tuple[str, str | None] | None:
    """(champion version, the data version it was fitted on), or None without a champion.
    The data version is the version's ``data_version`` tag, else its run's parameter (older
    versions), else None."""
    c, _ = _reader(tracking_uri)
    mv = _by_alias(c, CHAMPION)
    if mv is None:
        return None
    data_version = (mv.tags or {}).get(DATA_VERSION_TAG)
    if data_version is None and mv.run_id:
        from mlflow.exceptions import MlflowException

        try:
            data = c.get_run(mv.run_id).data
        except MlflowException:
            data = None
        if data is not None:
            data_version = data.params.get(DATA_VERSION_TAG) or data.tags.get(DATA_VERSION_TAG)
    return str(mv.version), data_version


def load_version(version: str, tracking_uri: str | None = None) -> BandwidthModel:
    """The ``BandwidthModel`` of one registered version (read as the module docstring says:
    no pyfunc, no pickle). ``SriftyError`` when the version or its predictor is missing."""
    c, uri = _reader(tracking_uri)
    return _load(c, str(version), uri)


def load_champion(tracking_uri: str | None = None, *, refresh: bool = False) -> BandwidthModel:
    """The champion bandwidth predictor (implements ``predictors.base.BandwidthPredictor``):
    ``predict(features) -> busbw bytes/s`` and ``bandwidth_cap(instance_type, world_size)``.
    From the local copy when it is still the champion's (``champion_cache``), else from the
    store (``refresh``: always from the store), which writes the copy again.

    Raises ``NoChampionError`` when no version is champion yet (run ``srifty fit-bandwidth``).
    """
    return load_champion_with_source(tracking_uri, refresh=refresh)[0]


def load_champion_with_source(
    tracking_uri: str | None = None, *, refresh: bool = False
) -> tuple[BandwidthModel, ChampionSource]:
    """``load_champion``, and which version it used and from where (local copy or store,
    and why the copy was not used)."""
    uri, _ = resolve_tracking_uri(tracking_uri)
    why = "refresh asked for"
    if not refresh:
        hit = champion_cache.lookup(uri, MODEL_NAME, CHAMPION)
        if isinstance(hit, champion_cache.Hit):
            try:
                return _read(hit.folder, f"local copy of version {hit.pointer.version}"), hit.source
            except SriftyError as exc:
                why = str(exc)
        else:
            why = hit
    c, _ = _reader(uri)
    mv = _by_alias(c, CHAMPION)
    if mv is None:
        raise NoChampionError(
            f"no {CHAMPION!r} version of model {MODEL_NAME!r} in the MLflow store; "
            "fit one with `srifty fit-bandwidth`"
        )
    version = str(mv.version)
    run_id, data_version = _meta(mv)
    with tempfile.TemporaryDirectory(prefix="srifty-busbw-") as tmp:
        folder = _download(c, version, uri, Path(tmp))
        model = _read(folder, f"version {version} of model {MODEL_NAME!r}")
        try:
            champion_cache.store(
                uri,
                MODEL_NAME,
                version,
                folder,
                written_by="load",
                run_id=run_id,
                data_version=data_version,
            )
            note = "local copy written"
        except OSError as exc:
            note = f"local copy not written: {exc}"
    source = ChampionSource(
        model=MODEL_NAME,
        version=version,
        store=champion_cache.public_uri(uri),
        origin="MLflow store",
        checked=f"asked just now ({why}; {note})",
        run_id=run_id,
        data_version=data_version,
    )
    return model, source


def _meta(mv: Any) -> tuple[str | None, str | None]:
    """(run id, data version) of a ``ModelVersion``, for the local copy's pointer."""
    data_version = (mv.tags or {}).get(DATA_VERSION_TAG)
    run_id = str(mv.run_id) if mv.run_id else None
    return run_id, None if data_version is None else str(data_version)


def _load(c: Any, version: str, tracking_uri: str) -> BandwidthModel:
    """Download version ``version``'s predictor folder (and nothing else) and read it."""
    with tempfile.TemporaryDirectory(prefix="srifty-busbw-") as tmp:
        folder = _download(c, version, tracking_uri, Path(tmp))
        return _read(folder, f"version {version} of model {MODEL_NAME!r}")


def _read(folder: Path, what: str) -> BandwidthModel:
    """``BandwidthModel.load`` of a predictor folder, its errors as ``SriftyError``."""
    try:
        return BandwidthModel.load(folder)
    except (ConfigError, OSError, KeyError, ValueError, TypeError) as exc:
        raise SriftyError(f"{what}: its bandwidth predictor cannot be read ({exc})") from None


def _download(c: Any, version: str, tracking_uri: str, tmp: Path) -> Path:
    """Download version ``version``'s predictor folder (and nothing else) under ``tmp``;
    returns the folder."""
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    what = f"version {version} of model {MODEL_NAME!r}"
    try:
        root = str(c.get_model_version_download_uri(MODEL_NAME, version)).rstrip("/")
    except MlflowException as exc:
        raise SriftyError(f"{what}: not in the MLflow store ({exc.message})") from None
    try:
        mlmodel = download_artifacts(
            artifact_uri=f"{root}/MLmodel", dst_path=str(tmp), tracking_uri=tracking_uri
        )
    except (MlflowException, OSError):
        raise SriftyError(
            f"{what} has no MLmodel at {root}: not a bandwidth model logged by srifty"
        ) from None
    sub = _predictor_path(Path(mlmodel), what)
    try:
        folder = download_artifacts(
            artifact_uri=f"{root}/{sub}",
            dst_path=str(tmp / PREDICTOR_ARTIFACT),
            tracking_uri=tracking_uri,
        )
    except (MlflowException, OSError):
        folder = ""
    if not folder or not (Path(folder) / "model.json").is_file():
        raise SriftyError(
            f"{what} has no bandwidth predictor files (model.json, boosters) at "
            f"{root}/{sub}; register it again with `srifty fit-bandwidth`"
        )
    return Path(folder)


def _predictor_path(mlmodel: Path, what: str) -> str:
    """The ``predictor`` artifact's path inside the model (``MLmodel``, read as data)."""
    import yaml

    try:
        meta = yaml.safe_load(mlmodel.read_text())
        path = meta["flavors"]["python_function"]["artifacts"][PREDICTOR_ARTIFACT]["path"]
    except (yaml.YAMLError, OSError, KeyError, TypeError):
        raise SriftyError(
            f"{what}: its MLmodel names no {PREDICTOR_ARTIFACT!r} artifact; not a bandwidth "
            "model logged by srifty"
        ) from None
    parts = PurePosixPath(str(path)).parts
    if not parts or PurePosixPath(str(path)).is_absolute() or ".." in parts:
        raise SriftyError(f"{what}: its MLmodel gives a bad {PREDICTOR_ARTIFACT} path {path!r}")
    return "/".join(parts)


def log_fit(
    *,
    model_dir: Path,
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    artifacts: Mapping[str, Path],
    json_artifacts: Mapping[str, Any],
    run_name: str,
    input_example: pd.DataFrame | None = None,
    training_data: pd.DataFrame | None = None,
    data_source: str | None = None,
    tracking_uri: str | None = None,
) -> tuple[str, str]:
    """Log one fit as a run (params, metrics, tags, files), log its predictor as a model
    from code (module docstring; signature and ``input_example``: a few feature rows),
    register it as a new version of ``MODEL_NAME`` carrying ``tags``, and give it the
    ``challenger`` alias. ``training_data`` (the probe rows it was fitted on) is logged as
    the run's MLflow dataset input (context ``training``; schema, row count and a digest,
    the ``data_version`` tag when given; not the rows themselves), named after
    ``data_source``. Returns (run id, version)."""
    from srifty_core.tracking import setup_experiment, srifty_tags

    experiment_id = setup_experiment(EXPERIMENT, tracking_uri)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow
    import mlflow.pyfunc

    signature = None
    if input_example is not None:
        from mlflow.models import infer_signature

        example = input_example.reset_index(drop=True)
        with warnings.catch_warnings():  # the hint that integer columns cannot hold NaN
            warnings.simplefilter("ignore", UserWarning)
            signature = infer_signature(example, BandwidthModel.load(model_dir).predict(example))
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name) as run:
        mlflow.set_tags({**srifty_tags(kind="bandwidth-model"), **tags})
        mlflow.log_params({k: _param(v) for k, v in params.items()})  # one batch
        if training_data is not None:
            from mlflow.data.pandas_dataset import from_pandas

            with warnings.catch_warnings():  # MLflow's hint about integer columns
                warnings.simplefilter("ignore", UserWarning)
                dataset = from_pandas(
                    training_data,
                    source=data_source or "probe store",
                    targets=LABEL,
                    name="probes",
                    digest=tags.get("data_version"),
                )
            mlflow.log_input(dataset, context="training")
        # before the model: log_model links the run's metrics to the logged model
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v == v})  # no NaN
        for path in artifacts.values():
            mlflow.log_artifact(str(path))
        with tempfile.TemporaryDirectory() as tmp:
            for name, obj in json_artifacts.items():
                p = Path(tmp) / name
                p.write_text(json.dumps(obj, indent=1, default=str))
                mlflow.log_artifact(str(p))
        with warnings.catch_warnings(), _notices_as_info():  # MLflow's hints, pandas'
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=str(PYFUNC_CODE),
                artifacts={PREDICTOR_ARTIFACT: str(model_dir)},
                signature=signature,
                input_example=input_example,
                pip_requirements=_pip_requirements(),
                registered_model_name=MODEL_NAME,
                tags=dict(tags),
            )
        version = str(info.registered_model_version)
        run_id = str(run.info.run_id)
    c = client(tracking_uri)
    c.set_registered_model_alias(MODEL_NAME, CHALLENGER, version)
    c.set_model_version_tag(MODEL_NAME, version, "run_id", run_id)
    for key, value in tags.items():
        c.set_model_version_tag(MODEL_NAME, version, key, value)
    return run_id, version


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


def promote(version: str, tracking_uri: str | None = None) -> None:
    """Give ``version`` the ``champion`` alias, and point this machine's local copy at it
    (``champion_cache``): the pointer is removed before the alias moves and written again
    once the version's predictor is copied, so the pointer left behind never names the
    previous champion. Copying is best effort: without a pointer the next load asks the
    store and writes it."""
    from mlflow.exceptions import MlflowException

    uri, _ = resolve_tracking_uri(tracking_uri)
    c = client(tracking_uri)
    with contextlib.suppress(OSError):
        champion_cache.forget(uri, MODEL_NAME)
    c.set_registered_model_alias(MODEL_NAME, CHAMPION, version)
    with (
        contextlib.suppress(SriftyError, OSError, MlflowException),
        tempfile.TemporaryDirectory(prefix="srifty-busbw-") as tmp,
    ):
        run_id, data_version = _meta(c.get_model_version(MODEL_NAME, str(version)))
        folder = _download(c, str(version), uri, Path(tmp))
        champion_cache.store(
            uri,
            MODEL_NAME,
            str(version),
            folder,
            written_by="promote",
            run_id=run_id,
            data_version=data_version,
        )


def record_decision(
    run_id: str,
    version: str,
    decision: Mapping[str, Any],
    tracking_uri: str | None = None,
) -> None:
    """Put the promotion decision on the run (tags, metrics) and on the model version."""
    from srifty_core.tracking import log_batch, srifty_tags

    c = client(tracking_uri)
    promoted = str(bool(decision["promote"])).lower()
    c.set_model_version_tag(MODEL_NAME, version, "promoted", str(bool(decision["promote"])))
    c.set_model_version_tag(MODEL_NAME, version, "decision", str(decision["reason"]))
    metrics = {
        key: float(value)
        for key in ("challenger_holdout_mape", "champion_holdout_mape")
        if (value := decision.get(key)) is not None and value == value
    }
    tags = srifty_tags(promoted=promoted, decision=decision["reason"])
    log_batch(c, run_id, metrics=metrics, tags=tags)


def _param(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    return text[:6000]
