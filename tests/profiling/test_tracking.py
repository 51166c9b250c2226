from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.report import EXPERIMENT, log_profile, plot_profile, summary_text
from tests.profiling.test_profile_contract import make_profile


@pytest.fixture(scope="module")
def made_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder whose default MLflow store was created (tables made and marked), once
    for the module: the tests below copy it where they need a store, and pay MLflow's table
    creation once. Creating it under a lock is the last test's subject; it makes its own."""
    from srifty_core import paths
    from srifty_core.tracking.store import resolve_tracking_uri

    root = tmp_path_factory.mktemp("made-store")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(paths.ENV_VAR, str(root))
        mp.setenv("MLFLOW_TRACKING_URI", "")
        resolve_tracking_uri()
    return root


def _copy_store(made_store: Path, root: Path) -> None:
    import shutil

    shutil.copytree(made_store, root, dirs_exist_ok=True)


def test_profile_is_logged_to_a_real_mlflow_store(
    data_dir: Path, tmp_path: Path, made_store: Path
) -> None:
    from mlflow.tracking import MlflowClient

    _copy_store(made_store, data_dir)
    p = make_profile()
    run_id = log_profile(p)
    client = MlflowClient()
    assert client.get_experiment_by_name(EXPERIMENT) is not None
    run = client.get_run(run_id)
    assert run.data.params["model"] == "resnet18"
    assert run.data.params["batch_sizes"] == "1,8,32,256"
    assert run.data.metrics["b_max"] == 256
    assert run.data.metrics["n_buckets"] == 2
    names = {a.path for a in client.list_artifacts(run_id)}
    assert names == {"profile.json", "latency_vs_batch.png"}
    local = client.download_artifacts(run_id, "profile.json", str(tmp_path))
    assert ComputeProfile.from_json(Path(local).read_text()) == p
    # the store is under the data folder, not the working directory
    assert (data_dir / "mlflow" / "mlflow.db").is_file()
    assert not Path("mlruns").exists()


def test_plot_and_summary(tmp_path: Path) -> None:
    p = make_profile()
    png = plot_profile(p, tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = summary_text(p)
    assert "B_max 256" in text and "2 DDP bucket(s)" in text
    assert "1.21KB/sample" in text  # 1234.5 bytes: not "0.00 MiB"
    assert "per step" not in text  # nothing measured beyond the passes
    measured = dataclasses.replace(p, copy_bytes_per_s=4000 / 0.002, optimizer_step_s=0.0031)
    text = summary_text(measured)
    assert "DDP pass over the gradients 2.00 ms" in text and "optimizer step 3.10 ms" in text


def test_tracking_uri_follows_the_data_dir_but_respects_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made_store: Path
) -> None:
    from srifty_core import paths
    from srifty_core.tracking.store import resolve_tracking_uri, setup_experiment

    for folder in ("a", "b"):
        _copy_store(made_store, tmp_path / folder)
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "a"))
    setup_experiment("x")
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "b"))
    uri, local = resolve_tracking_uri()
    assert local and str(tmp_path / "b") in uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5001")
    assert resolve_tracking_uri() == ("http://127.0.0.1:5001", False)


def test_the_default_store_exported_by_a_parent_is_still_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made_store: Path
) -> None:
    """A child process (an Airflow task the demo started) inherits the parent's exported
    default URI: its experiments must still keep their artifacts under the data folder."""
    from srifty_core import paths
    from srifty_core.tracking.store import (
        default_tracking_uri,
        resolve_tracking_uri,
        setup_experiment,
    )

    _copy_store(made_store, tmp_path / "d")
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "d"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", default_tracking_uri())
    assert resolve_tracking_uri() == (default_tracking_uri(), True)
    import mlflow

    exp = mlflow.get_experiment(setup_experiment("inherited"))
    assert exp.artifact_location.startswith((tmp_path / "d").as_uri())


def test_the_default_store_is_created_once_under_a_lock(data_dir: Path) -> None:
    """Two processes opening a fresh data folder's store at once raced in MLflow's table
    creation: the first opening waits for the lock, creates every table, and marks it."""
    import os
    import subprocess
    import sys
    import time

    from filelock import FileLock

    folder = data_dir / "mlflow"
    folder.mkdir()
    code = (
        "from srifty_core.tracking.store import resolve_tracking_uri; print(resolve_tracking_uri())"
    )
    with FileLock(str(folder / "mlflow.db.lock")):
        proc = subprocess.Popen(
            [sys.executable, "-c", code], env=dict(os.environ), stdout=subprocess.PIPE, text=True
        )
        time.sleep(3.0)
        assert proc.poll() is None  # waiting for the lock another process holds
        assert not (folder / "mlflow.db.ready").exists()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "mlflow.db" in out
    assert (folder / "mlflow.db.ready").exists()
    import sqlite3

    with sqlite3.connect(folder / "mlflow.db") as con:
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
    assert {"experiments", "registered_models"} <= tables
