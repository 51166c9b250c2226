"""One DAG run with Postgres as Airflow's metadata DB (as in production).

Creates a fresh database on the local Postgres server (the ``postgres_db`` fixture),
migrates it through ``srifty_core.airflow_env`` with ``sql_alchemy_conn``, runs
``airflow dags test`` in a subprocess, reads the run's state from Postgres, and drops the
database. Skipped, saying why, when no Postgres server answers on 127.0.0.1:5432.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srifty_core.airflow_env import airflow_environment, migrate, run_airflow
from tests.dags.services import PostgresDB

pytestmark = pytest.mark.airflow


def test_catalog_refresh_runs_with_postgres_metadata(
    postgres_db: PostgresDB, tmp_path: Path
) -> None:
    env = airflow_environment(tmp_path / "airflow-home", sql_alchemy_conn=postgres_db.url)
    migrate(env)
    conf = {"regions": ["us-east-1"], "fail_on_error": True}
    run_airflow(["dags", "test", "srifty_catalog_refresh", "-c", json.dumps(conf)], env, quiet=True)
    rows = postgres_db.query(
        "SELECT state FROM dag_run WHERE dag_id = %s", ("srifty_catalog_refresh",)
    )
    states = [r[0] for r in rows]
    assert states == ["success"]
    assert not (tmp_path / "airflow-home" / "airflow.db").exists()  # not SQLite
