"""How a registered bandwidth model is stored and loaded: a model logged from code (no
pickle), read back from its predictor folder alone, never through pyfunc or a pickle; one
version per data version; a clear error for a version without its predictor."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np
import pytest

from srifty_core.errors import SriftyError
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.refresh.config import RefreshConfig
from srifty_core.predictors.refresh.pipeline import refresh_bandwidth_model
from srifty_core.predictors.refresh.register import input_example
from tests.predictors.bw_rows import make_probes, write_store


def client() -> Any:
    """An ``MlflowClient`` on the test's store (the bandwidth models' experiment made)."""
    from srifty_core.predictors.registry import EXPERIMENT
    from srifty_core.tracking.store import writer

    return writer(EXPERIMENT)[0]


def _fit(folder: Path) -> tuple[BandwidthModel, Any]:
    """A small fitted model saved in ``folder``, and the rows it was fitted on."""
    df = make_probes(allocations=2, worlds=(2, 4), concurrency=(1,), repeats=1)
    small = {"n_estimators": 10, "max_depth": 3}
    model = BandwidthModel(small_params=small, large_params=small).fit(df)
    model.save(folder)
    return model, df


def _register(model_dir: Path, df: Any, data_version: str = "dv-1") -> str:
    from srifty_core.predictors.registry import log_fit, promote

    _, version = log_fit(
        model_dir=model_dir,
        params={"rows": len(df)},
        metrics={"cv_mape_small": 5.0, "cv_mape_large": 4.0},
        tags={"data_version": data_version},
        artifacts={},
        json_artifacts={},
        run_name="test",
        input_example=input_example(df),
    )
    promote(version)
    return version


def _model_root(version: str) -> Path:
    """The local folder of a version's logged model (the store is local in tests)."""
    from srifty_core.predictors.registry import MODEL_NAME

    uri = client().get_model_version_download_uri(MODEL_NAME, version)
    return Path(url2pathname(urlparse(uri).path))


class _Poison:
    """Unpickling it creates ``marker``: what a tampered artifact store could plant."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (str(self.marker),))


def _as_pickled_pyfunc(mlmodel: Path) -> None:
    """Rewrite ``MLmodel`` as a pickled python model's (``python_model.pkl``), the way
    versions were logged before models from code."""
    import yaml

    meta = yaml.safe_load(mlmodel.read_text())
    flavor = meta["flavors"]["python_function"]
    flavor.pop("model_code_path", None)
    flavor |= {"loader_module": "mlflow.pyfunc.model", "python_model": "python_model.pkl"}
    mlmodel.write_text(yaml.safe_dump(meta))


def test_a_registered_model_loads_and_predicts_as_the_saved_one(tmp_path: Path) -> None:
    import yaml

    from srifty_core.predictors.registry import (
        MODEL_NAME,
        PREDICTOR_ARTIFACT,
        load_champion,
        load_version,
    )

    saved, df = _fit(tmp_path / "model")
    version = _register(tmp_path / "model", df)
    champion = load_champion()
    queries = make_probes(allocations=1, seed=3)
    assert np.array_equal(champion.predict(queries), saved.predict(queries))
    assert np.array_equal(load_version(version).predict(queries), saved.predict(queries))
    assert champion.caps_.to_dict() == saved.caps_.to_dict() and champion.mtu == saved.mtu

    # a standard MLflow model: code, not a pickle; signature, input example, linked metrics
    root = _model_root(version)
    assert not list(root.rglob("*.pkl"))
    meta = yaml.safe_load((root / "MLmodel").read_text())
    flavor = meta["flavors"]["python_function"]
    assert flavor["loader_module"] == "mlflow.pyfunc.loaders.code_model"
    assert "python_model" not in flavor and (root / "pyfunc.py").is_file()
    assert (root / flavor["artifacts"][PREDICTOR_ARTIFACT]["path"] / "model.json").is_file()
    inputs = [c["name"] for c in json.loads(meta["signature"]["inputs"])]
    assert "buffer_bytes" in inputs and "instance_type" in inputs
    assert (root / "input_example.json").is_file()
    c = client()
    mv = c.get_model_version(MODEL_NAME, version)
    assert mv.tags["data_version"] == "dv-1"
    logged = c.get_logged_model(meta["model_id"])
    assert {m.key for m in logged.metrics} >= {"cv_mape_small", "cv_mape_large"}


def test_a_pickle_beside_the_artifacts_is_never_unpickled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srifty_core.predictors.registry import load_champion

    saved, df = _fit(tmp_path / "model")
    version = _register(tmp_path / "model", df)
    root = _model_root(version)

    # the poison is live: unpickling it creates its marker
    probe = tmp_path / "probe-marker"
    pickle.loads(pickle.dumps(_Poison(probe)))
    assert probe.exists()

    # plant it where pyfunc would unpickle it (an MLmodel of a pickled python model), and in
    # the predictor folder itself
    marker = tmp_path / "marker"
    blob = pickle.dumps(_Poison(marker))
    (root / "python_model.pkl").write_bytes(blob)
    (root / "artifacts" / "model" / "model.pkl").write_bytes(blob)
    _as_pickled_pyfunc(root / "MLmodel")
    queries = make_probes(allocations=1, seed=3)
    # from the store (refresh), and from the local copy promote wrote
    assert np.array_equal(load_champion(refresh=True).predict(queries), saved.predict(queries))
    assert np.array_equal(load_champion().predict(queries), saved.predict(queries))
    assert not marker.exists()

    # where it lies, MLflow's pyfunc loader (what load_champion used to call) unpickles it
    import mlflow.pyfunc

    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "true")  # MLflow 3.17's default
    with pytest.raises(AttributeError):  # what it unpickled (None) is no python model
        mlflow.pyfunc.load_model(str(root))
    assert marker.exists()


def test_a_version_without_its_predictor_is_a_clear_error(tmp_path: Path) -> None:
    from srifty_core.predictors.registry import MODEL_NAME, load_champion, load_version

    _, df = _fit(tmp_path / "model")
    version = _register(tmp_path / "model", df)
    shutil.rmtree(_model_root(version) / "artifacts" / "model")
    with pytest.raises(SriftyError, match=rf"version {version} of model .*no bandwidth predictor"):
        load_champion(refresh=True)  # the store (the local copy promote wrote still loads)
    with pytest.raises(SriftyError, match=r"version 9 of model .*not in the MLflow store"):
        load_version("9")

    # a version whose source is a bare folder (no MLmodel)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "notes.txt").write_text("no model here")
    mv = client().create_model_version(MODEL_NAME, bare.as_uri())
    with pytest.raises(SriftyError, match=rf"version {mv.version} of model .*no MLmodel"):
        load_version(str(mv.version))


def test_the_same_data_refreshed_twice_makes_one_version(data_dir: Path) -> None:
    from srifty_core.predictors.registry import (
        CHAMPION,
        MODEL_NAME,
        alias_version,
        champion_data_version,
    )

    # local.cpu: no network_gbps, so the input example has missing values
    write_store(allocations=3, types=("local.cpu",), worlds=(2,), concurrency=(1,))
    config = RefreshConfig(since=None, half_life=None, n_trials=1, n_splits=2)
    first = refresh_bandwidth_model(config)
    second = refresh_bandwidth_model(config)
    assert first.promotion["registered"] and first.promotion["version"] == "1"
    assert not second.promotion["registered"] and second.promotion["version"] is None
    assert "same data" in second.promotion["reason"]
    versions = client().search_model_versions(f"name='{MODEL_NAME}'")
    assert [str(v.version) for v in versions] == ["1"] and alias_version(CHAMPION) == "1"
    assert champion_data_version() == ("1", first.fit["data_version"])
    # the staging folders went with the refreshes
    assert not first.staging.exists() and not second.staging.exists()
