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
- Store: ``srifty_core.tracking.store`` (SQLite + local artifacts under the data folder
  unless ``MLFLOW_TRACKING_URI`` or ``tracking_uri`` says otherwise). The MLflow calls
  themselves are ``srifty_core.tracking.registry``'s; this module says what is logged and
  read, and never imports MLflow.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from srifty_core.errors import ConfigError, SriftyError
from srifty_core.predictors import champion_cache
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.champion_cache import ChampionSource
from srifty_core.predictors.features import LABEL
from srifty_core.tracking.registry import CodeModel, ModelRegistry, ModelVersion, log_code_model
from srifty_core.tracking.runs import Dataset, RunLog, srifty_tags
from srifty_core.tracking.store import resolve_tracking_uri

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


def _writer(tracking_uri: str | None) -> ModelRegistry:
    """The registry, for moving aliases and setting tags (the experiment is created if new)."""
    return ModelRegistry.writer(EXPERIMENT, tracking_uri)


def alias_version(alias: str, tracking_uri: str | None = None) -> str | None:
    """The model version holding ``alias``, or None."""
    mv = ModelRegistry.reader(tracking_uri).by_alias(MODEL_NAME, alias)
    return None if mv is None else mv.version


def champion_data_version(tracking_uri: str | None = None) -> tuple[str, str | None] | None:
    """(champion version, the data version it was fitted on), or None without a champion.
    The data version is the version's ``data_version`` tag, else its run's parameter (older
    versions), else None."""
    reg = ModelRegistry.reader(tracking_uri)
    mv = reg.by_alias(MODEL_NAME, CHAMPION)
    if mv is None:
        return None
    data_version = mv.tags.get(DATA_VERSION_TAG)
    if data_version is None and mv.run_id:
        data_version = reg.run_value(mv.run_id, DATA_VERSION_TAG)
    return mv.version, data_version


def load_version(version: str, tracking_uri: str | None = None) -> BandwidthModel:
    """The ``BandwidthModel`` of one registered version (read as the module docstring says:
    no pyfunc, no pickle). ``SriftyError`` when the version or its predictor is missing."""
    return _load(ModelRegistry.reader(tracking_uri), str(version))


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
    reg = ModelRegistry.reader(uri)
    mv = reg.by_alias(MODEL_NAME, CHAMPION)
    if mv is None:
        raise NoChampionError(
            f"no {CHAMPION!r} version of model {MODEL_NAME!r} in the MLflow store; "
            "fit one with `srifty fit-bandwidth`"
        )
    version = mv.version
    run_id, data_version = _meta(mv)
    with tempfile.TemporaryDirectory(prefix="srifty-busbw-") as tmp:
        folder = _download(reg, version, Path(tmp))
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


def _meta(mv: ModelVersion) -> tuple[str | None, str | None]:
    """(run id, data version) of a model version, for the local copy's pointer."""
    return mv.run_id, mv.tags.get(DATA_VERSION_TAG)


def _load(reg: ModelRegistry, version: str) -> BandwidthModel:
    """Download version ``version``'s predictor folder (and nothing else) and read it."""
    with tempfile.TemporaryDirectory(prefix="srifty-busbw-") as tmp:
        folder = _download(reg, version, Path(tmp))
        return _read(folder, f"version {version} of model {MODEL_NAME!r}")


def _read(folder: Path, what: str) -> BandwidthModel:
    """``BandwidthModel.load`` of a predictor folder, its errors as ``SriftyError``."""
    try:
        return BandwidthModel.load(folder)
    except (ConfigError, OSError, KeyError, ValueError, TypeError) as exc:
        raise SriftyError(f"{what}: its bandwidth predictor cannot be read ({exc})") from None


def _download(reg: ModelRegistry, version: str, tmp: Path) -> Path:
    """Download version ``version``'s predictor folder (and nothing else) under ``tmp``;
    returns the folder."""
    what = f"version {version} of model {MODEL_NAME!r}"
    root = reg.download_root(MODEL_NAME, version)
    mlmodel = reg.download(f"{root}/MLmodel", tmp)
    if mlmodel is None:
        raise SriftyError(
            f"{what} has no MLmodel at {root}: not a bandwidth model logged by srifty"
        )
    sub = _predictor_path(mlmodel, what)
    folder = reg.download(f"{root}/{sub}", tmp / PREDICTOR_ARTIFACT)
    if folder is None or not (folder / "model.json").is_file():
        raise SriftyError(
            f"{what} has no bandwidth predictor files (model.json, boosters) at "
            f"{root}/{sub}; register it again with `srifty fit-bandwidth`"
        )
    return folder


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
    model = CodeModel(
        name=MODEL_NAME,
        code=PYFUNC_CODE,
        artifacts={PREDICTOR_ARTIFACT: model_dir},
        pip_requirements=_pip_requirements(),
        tags=dict(tags),
        input_example=input_example,
        predict=None if input_example is None else BandwidthModel.load(model_dir).predict,
    )
    dataset = None
    if training_data is not None:
        dataset = Dataset(
            training_data,
            name="probes",
            source=data_source or "probe store",
            targets=LABEL,
            digest=tags.get("data_version"),
        )
    run_id, version = log_code_model(
        EXPERIMENT,
        run_name,
        model,
        tags={**srifty_tags(kind="bandwidth-model"), **tags},
        params={k: _param(v) for k, v in params.items()},
        metrics={k: float(v) for k, v in metrics.items() if v == v},  # no NaN
        files=list(artifacts.values()),
        json_files=json_artifacts,
        dataset=dataset,
        tracking_uri=tracking_uri,
    )
    reg = _writer(tracking_uri)
    reg.set_alias(MODEL_NAME, CHALLENGER, version)
    reg.set_version_tag(MODEL_NAME, version, "run_id", run_id)
    for key, value in tags.items():
        reg.set_version_tag(MODEL_NAME, version, key, value)
    return run_id, version


def promote(version: str, tracking_uri: str | None = None) -> None:
    """Give ``version`` the ``champion`` alias, and point this machine's local copy at it
    (``champion_cache``): the pointer is removed before the alias moves and written again
    once the version's predictor is copied, so the pointer left behind never names the
    previous champion. Copying is best effort: without a pointer the next load asks the
    store and writes it."""
    uri, _ = resolve_tracking_uri(tracking_uri)
    reg = _writer(tracking_uri)
    with contextlib.suppress(OSError):
        champion_cache.forget(uri, MODEL_NAME)
    reg.set_alias(MODEL_NAME, CHAMPION, version)
    with (
        contextlib.suppress(SriftyError, OSError),
        tempfile.TemporaryDirectory(prefix="srifty-busbw-") as tmp,
    ):
        mv = reg.version(MODEL_NAME, str(version))
        if mv is None:
            return
        run_id, data_version = _meta(mv)
        folder = _download(reg, str(version), Path(tmp))
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
    reg = _writer(tracking_uri)
    promoted = str(bool(decision["promote"])).lower()
    reg.set_version_tag(MODEL_NAME, version, "promoted", str(bool(decision["promote"])))
    reg.set_version_tag(MODEL_NAME, version, "decision", str(decision["reason"]))
    metrics = {
        key: float(value)
        for key in ("challenger_holdout_mape", "champion_holdout_mape")
        if (value := decision.get(key)) is not None and value == value
    }
    tags = srifty_tags(promoted=promoted, decision=decision["reason"])
    RunLog.open(EXPERIMENT, tracking_uri).log_batch(run_id, metrics=metrics, tags=tags)


def _param(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    return text[:6000]
