"""`srifty airflow ARGS`: the airflow CLI on the data folder's Airflow, as the README's
walk-through uses it (the walk-through itself: tests/test_demo.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from srifty_core import paths
from srifty_core.airflow_env import MIGRATED_STAMP
from srifty_core.cli import _airflow_args
from tests.conftest import subprocess_env

SRIFTY = str(Path(sys.executable).with_name("srifty"))


def test_everything_after_airflow_goes_to_airflow_untouched() -> None:
    assert _airflow_args(["airflow", "dags", "trigger", "x", "--conf", "{}"]) == [
        "dags", "trigger", "x", "--conf", "{}",
    ]  # fmt: skip
    assert _airflow_args(["--data-dir", "d", "airflow", "--help"]) == ["--help"]
    assert _airflow_args(["--data-dir=d", "airflow"]) == []
    assert _airflow_args(["plan", "airflow"]) is None
    assert _airflow_args(["train", "p.json", "--", "airflow"]) is None


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_srifty_airflow_runs_the_cli_on_the_data_folder(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    env = subprocess_env({paths.ENV_VAR: "", "AIRFLOW_HOME": str(tmp_path / "elsewhere")})

    def srifty_airflow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SRIFTY, "--data-dir", str(root), "airflow", *args],
            capture_output=True, text=True, env=env, timeout=240, check=False,
        )  # fmt: skip

    # The repository's DAGs and the data folder's home, whatever the caller's environment.
    got = srifty_airflow("config", "get-value", "core", "dags_folder")
    assert got.returncode == 0 and got.stdout.strip() == str(paths.DAGS_DIR), got.stderr
    home = paths.airflow_home(root)
    assert not (home / MIGRATED_STAMP).exists()  # no DB needed, none made
    # A fresh folder: the metadata DB is made first, so a DB command works at once (it
    # said "Database migration required" before).
    got = srifty_airflow("pools", "list", "-o", "plain")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "srifty_local_host" in got.stdout  # Srifty's pools too
    assert (home / "airflow.db").is_file() and (home / MIGRATED_STAMP).is_file()
    assert "graphviz" not in got.stderr
    # airflow's own exit code comes back
    assert srifty_airflow("dags", "trigger", "no_such_dag").returncode != 0


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_two_first_calls_at_once_both_work(tmp_path: Path) -> None:
    """Two `srifty airflow` on a fresh data folder at once: the metadata DB is made once,
    under a lock (before, the second failed with SQLite's "database is locked")."""
    root = tmp_path / "fresh"
    env = subprocess_env({paths.ENV_VAR: ""})
    argv = [SRIFTY, "--data-dir", str(root), "airflow", "pools", "list", "-o", "plain"]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
        assert "srifty_local_host" in out
