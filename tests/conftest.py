"""Shared fixtures: an isolated data folder for every test, and one Airflow home per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from srifty_core import paths
from srifty_core.airflow_env import airflow_environment, migrate


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test writes into its own data folder, never into the repository's data/."""
    root = tmp_path / "srifty-data"
    root.mkdir()
    monkeypatch.setenv(paths.ENV_VAR, str(root))
    # MLflow exports the URI it was last given; start each test from the default store.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    return root


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private AIRFLOW_HOME (SQLite, examples off, small parallelism, the repo's dags/ and
    plugins/), migrated once per test session.

    The variables go into this process's environment before anything imports Airflow, so
    ``dag.test()`` in a test runs against this home.
    """
    home = tmp_path_factory.mktemp("airflow-home")
    env = airflow_environment(home)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        migrate(env)
        yield home


@pytest.fixture(scope="session")
def dagbag(airflow_home: Path) -> object:
    """Every DAG in dags/, parsed once by Airflow's own DagBag."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(paths.DAGS_DIR))


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``extra``, for child interpreters."""
    return {**os.environ, **(extra or {})}
