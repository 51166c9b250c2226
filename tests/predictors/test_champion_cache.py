"""The champion's local copy (``champion_cache``): a warm ``srifty plan`` never imports
MLflow; a damaged copy, an alias moved behind it or a stale pointer from a tracking server
sends the load to the store, which writes the copy again; a promotion points the copy at
the new champion at once."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from srifty_core.errors import ConfigError
from srifty_core.predictors import champion_cache
from srifty_core.predictors.bandwidth import BandwidthModel
from tests.planner.test_cli_plan import planning_data  # noqa: F401  (the fixture)
from tests.predictors.bw_rows import make_probes

SMALL = {"n_estimators": 10, "max_depth": 3}


@pytest.fixture(scope="module")
def store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder whose default MLflow store was created (its tables made), once for the
    module: creating it is a few seconds each test would otherwise pay again."""
    from srifty_core import paths
    from srifty_core.tracking.store import resolve_tracking_uri

    root = tmp_path_factory.mktemp("store-data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(paths.ENV_VAR, str(root))
        mp.setenv("MLFLOW_TRACKING_URI", "")
        resolve_tracking_uri()
    assert (root / "mlflow" / "mlflow.db.ready").is_file()
    return root


@pytest.fixture(autouse=True)
def made_store(data_dir: Path, store_template: Path) -> None:
    """This test's data folder starts with ``store_template``'s store (no experiment, no
    model in it yet): every test registers its own models into its own copy."""
    shutil.copytree(store_template, data_dir, dirs_exist_ok=True)


def client() -> Any:
    """An ``MlflowClient`` on the test's store (the bandwidth models' experiment made)."""
    from srifty_core.predictors.registry import EXPERIMENT
    from srifty_core.tracking.store import writer

    return writer(EXPERIMENT)[0]


def _register(folder: Path, seed: int, promote: bool = True) -> tuple[str, BandwidthModel]:
    """A small model fitted on probes drawn with ``seed``, registered (and promoted, by the
    refresh path's ``promote``); its version and the model."""
    from srifty_core.predictors.refresh.register import input_example
    from srifty_core.predictors.registry import log_fit
    from srifty_core.predictors.registry import promote as promote_version

    df = make_probes(allocations=2, worlds=(2, 4, 8, 16), concurrency=(1,), repeats=1, seed=seed)
    model = BandwidthModel(small_params=SMALL, large_params=SMALL).fit(df)
    model.save(folder)
    _, version = log_fit(
        model_dir=folder,
        params={"rows": len(df)},
        metrics={},
        tags={"data_version": f"dv-{seed}"},
        artifacts={},
        json_artifacts={},
        run_name=f"test-{seed}",
        input_example=input_example(df),
    )
    if promote:
        promote_version(version)
    return version, model


def _uri() -> str:
    from srifty_core.tracking.store import resolve_tracking_uri

    return resolve_tracking_uri()[0]


def _copy(version: str) -> Path:
    from srifty_core.predictors.registry import MODEL_NAME

    return champion_cache.entry_dir(_uri(), MODEL_NAME, None) / version


QUERIES = make_probes(allocations=1, worlds=(2, 8), seed=3)


def test_a_promotion_writes_the_copy_and_a_warm_load_reads_it(tmp_path: Path) -> None:
    from srifty_core.predictors.registry import MODEL_NAME, load_champion_with_source

    v1, m1 = _register(tmp_path / "m1", seed=0)
    pointer = champion_cache.read_pointer(_uri(), MODEL_NAME)
    assert pointer is not None and pointer.version == v1 and pointer.written_by == "promote"
    assert pointer.data_version == "dv-0" and pointer.run_id
    assert pointer.files == champion_cache.checksums(_copy(v1))
    model, source = load_champion_with_source()
    assert source.origin == "local copy" and source.version == v1
    assert "alias read from the local MLflow store" in source.checked and source.store == _uri()
    assert np.array_equal(model.predict(QUERIES), m1.predict(QUERIES))

    # a newly promoted champion: the pointer moves with the alias
    v2, m2 = _register(tmp_path / "m2", seed=1)
    assert v2 != v1
    model, source = load_champion_with_source()
    assert source.origin == "local copy" and source.version == v2
    assert np.array_equal(model.predict(QUERIES), m2.predict(QUERIES))

    assert not _copy(v1).exists()  # the previous champion's copy is gone

    # registered, not promoted: the champion and its copy stay
    v3, _ = _register(tmp_path / "m3", seed=2, promote=False)
    model, source = load_champion_with_source()
    assert source.origin == "local copy" and source.version == v2 != v3


def test_a_damaged_copy_is_reloaded_from_the_store_and_rewritten(tmp_path: Path) -> None:
    from srifty_core.predictors.registry import load_champion_with_source

    version, saved = _register(tmp_path / "m", seed=0)
    booster = _copy(version) / "small" / "booster.json"
    good = booster.read_bytes()
    booster.write_bytes(good.replace(b"[", b"[ ", 1))  # still JSON: only the checksum tells
    model, source = load_champion_with_source()
    assert source.origin == "MLflow store" and source.version == version
    assert "does not match its checksums" in source.checked
    assert "local copy written" in source.checked
    assert np.array_equal(model.predict(QUERIES), saved.predict(QUERIES))
    assert booster.read_bytes() == good
    assert load_champion_with_source()[1].origin == "local copy"

    # a file gone, or one too many: the same
    booster.unlink()
    assert load_champion_with_source()[1].origin == "MLflow store"
    (_copy(version) / "extra.json").write_text("{}")
    assert load_champion_with_source()[1].origin == "MLflow store"
    assert not (_copy(version) / "extra.json").exists()
    assert load_champion_with_source()[1].origin == "local copy"

    # asked to refresh: the store, whatever the copy
    model, source = load_champion_with_source(refresh=True)
    assert source.origin == "MLflow store" and "refresh asked for" in source.checked


def test_an_alias_moved_behind_the_copy_is_seen(tmp_path: Path) -> None:
    from srifty_core.predictors.registry import (
        CHAMPION,
        MODEL_NAME,
        load_champion_with_source,
    )

    v1, m1 = _register(tmp_path / "m1", seed=0)
    v2, _ = _register(tmp_path / "m2", seed=1)
    # moved back by hand (the MLflow UI, another process): not through promote
    client().set_registered_model_alias(MODEL_NAME, CHAMPION, v1)
    assert champion_cache.local_alias(_uri(), MODEL_NAME, CHAMPION) == v1
    model, source = load_champion_with_source()
    assert source.origin == "MLflow store" and source.version == v1
    assert f"local copy v{v2} is no longer champion: v{v1} is" in source.checked
    assert np.array_equal(model.predict(QUERIES), m1.predict(QUERIES))
    pointer = champion_cache.read_pointer(_uri(), MODEL_NAME)
    assert pointer is not None and pointer.version == v1 and pointer.written_by == "load"

    # the alias removed: no champion, whatever the copy says
    from srifty_core.predictors.registry import NoChampionError

    client().delete_registered_model_alias(MODEL_NAME, CHAMPION)
    with pytest.raises(NoChampionError):
        load_champion_with_source()


def test_a_tracking_server_copy_is_trusted_for_its_maximum_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srifty_core.predictors.registry import CHAMPION, MODEL_NAME, load_champion_with_source

    uri = "http://user:secret@127.0.0.1:9/"  # nothing listens: a load that asks fails
    saved = BandwidthModel(small_params=SMALL, large_params=SMALL).fit(
        make_probes(allocations=2, concurrency=(1,), repeats=1)
    )
    saved.save(tmp_path / "m")
    now = time.time()
    champion_cache.store(
        uri, MODEL_NAME, "4", tmp_path / "m", written_by="load", checked_at=now - 120
    )
    pointer = champion_cache.read_pointer(uri, MODEL_NAME)
    assert pointer is not None and "secret" not in json.dumps(pointer.to_json())

    model, source = load_champion_with_source(uri)  # 2 min < 10 min: no store asked
    assert source.origin == "local copy" and source.version == "4"
    assert "2 min ago" in source.checked and source.store == "http://127.0.0.1:9/"
    assert np.array_equal(model.predict(QUERIES), saved.predict(QUERIES))

    monkeypatch.setenv(champion_cache.MAX_AGE_ENV, "90s")
    why = champion_cache.lookup(uri, MODEL_NAME, CHAMPION, now=now)
    assert isinstance(why, str) and "over the 90 s" in why
    monkeypatch.setenv(champion_cache.MAX_AGE_ENV, "0")
    assert isinstance(champion_cache.lookup(uri, MODEL_NAME, CHAMPION), str)
    monkeypatch.setenv(champion_cache.MAX_AGE_ENV, "soon")
    with pytest.raises(ConfigError, match="SRIFTY_CHAMPION_MAX_AGE"):
        champion_cache.lookup(uri, MODEL_NAME, CHAMPION)
    monkeypatch.setenv(champion_cache.MAX_AGE_ENV, "1h")
    assert champion_cache.max_age_s() == 3600.0


def test_a_local_store_that_cannot_be_read_directly_is_asked(tmp_path: Path) -> None:
    from srifty_core.predictors.registry import CHAMPION, MODEL_NAME

    db = tmp_path / "other.db"
    sqlite3.connect(db).close()  # an SQLite file without MLflow's tables
    uri = f"sqlite:///{db}"
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.json").write_text("{}")
    champion_cache.store(uri, MODEL_NAME, "1", folder, written_by="load")
    why = champion_cache.lookup(uri, MODEL_NAME, CHAMPION)
    assert isinstance(why, str) and "could not be read directly" in why
    with pytest.raises(LookupError):
        champion_cache.local_alias(f"sqlite:///{tmp_path / 'missing.db'}", MODEL_NAME, CHAMPION)


@pytest.mark.usefixtures("planning_data")
def test_a_warm_plan_imports_no_mlflow(data_dir: Path, tmp_path: Path) -> None:
    from srifty_core.predictors.registry import MODEL_NAME

    version, _ = _register(tmp_path / "m", seed=0)
    argv = ["plan", str(data_dir / "req.yaml"), "--json"]

    def plan(as_program: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
        """The plan's JSON, and the exit code and heavy modules loaded in that process:
        as the `srifty` command (main() reads sys.argv) or called as main([...])."""
        call = f"sys.argv = ['srifty', *{argv!r}]; rc = main()" if as_program else (
            f"rc = main({argv!r})"
        )  # fmt: skip
        code = (
            "import json, sys\n"
            "from srifty_core.cli import main\n"
            f"{call}\n"
            "import xgboost.compat\n"
            "heavy = ('mlflow', 'sklearn', 'torch', 'airflow', 'scipy.stats')\n"
            "print(json.dumps({'rc': rc, 'heavy': [m for m in heavy if m in sys.modules],"
            " 'xgboost_sklearn': xgboost.compat.SKLEARN_INSTALLED}))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=os.environ.copy(),
            check=True,
        ).stdout.strip()
        head, _, last = out.rpartition("\n")
        return json.loads(head), json.loads(last)

    result, proc = plan()
    assert proc == {"rc": 0, "heavy": [], "xgboost_sklearn": False}
    assert result["bandwidth_model"]["origin"] == "local copy"
    assert result["bandwidth_model"]["version"] == version

    # main([...]) in a caller's process: no MLflow either, XGBoost imported as it is
    result, proc = plan(as_program=False)
    assert proc["rc"] == 0 and "mlflow" not in proc["heavy"] and proc["xgboost_sklearn"]
    assert result["bandwidth_model"]["origin"] == "local copy"

    # no copy: the store is asked (MLflow imported) and the copy written for the next plan
    shutil.rmtree(champion_cache.entry_dir(_uri(), MODEL_NAME))
    result, proc = plan()
    assert proc["rc"] == 0 and "mlflow" in proc["heavy"]
    assert result["bandwidth_model"]["origin"] == "MLflow store"
    assert plan()[1] == {"rc": 0, "heavy": [], "xgboost_sklearn": False}
