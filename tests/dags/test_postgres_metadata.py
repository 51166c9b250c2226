"""One DAG run with Postgres as Airflow's metadata DB (as in production).

Creates a fresh database on the local Postgres server, migrates it through
``srifty_core.airflow_env`` with ``sql_alchemy_conn``, runs ``airflow dags test`` in a
subprocess, reads the run's state from Postgres, and drops the database. Skipped, saying
why, when no Postgres server answers on 127.0.0.1:5432.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from srifty_core.airflow_env import airflow_environment, migrate, run_airflow

pytestmark = pytest.mark.airflow

HOST, PORT = "127.0.0.1", 5432
USERS = ("postgres", "root")


def _admin() -> tuple[Any, str]:
    psycopg2 = pytest.importorskip("psycopg2")
    errors = []
    for user in USERS:
        try:
            conn = psycopg2.connect(
                host=HOST, port=PORT, user=user, dbname="postgres", connect_timeout=3
            )
        except psycopg2.OperationalError as exc:
            errors.append(f"{user}: {str(exc).strip()}")
            continue
        conn.autocommit = True
        return conn, user
    pytest.skip(f"no Postgres server accepts us on {HOST}:{PORT} ({'; '.join(errors)})")


@pytest.fixture()
def postgres_db() -> Iterator[tuple[str, Any]]:
    """A fresh, empty database; dropped afterwards."""
    admin, user = _admin()
    name = f"srifty_test_{uuid.uuid4().hex[:10]}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg2://{user}@{HOST}:{PORT}/{name}", name
    finally:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


def test_catalog_refresh_runs_with_postgres_metadata(
    postgres_db: tuple[str, Any], tmp_path: Path
) -> None:
    import psycopg2

    url, name = postgres_db
    env = airflow_environment(tmp_path / "airflow-home", sql_alchemy_conn=url)
    migrate(env)
    conf = {"regions": ["us-east-1"], "fail_on_error": True}
    run_airflow(["dags", "test", "srifty_catalog_refresh", "-c", json.dumps(conf)], env, quiet=True)
    user = url.split("//", 1)[1].split("@", 1)[0]
    conn = psycopg2.connect(host=HOST, port=PORT, user=user, dbname=name)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT state FROM dag_run WHERE dag_id = %s", ("srifty_catalog_refresh",))
            states = [r[0] for r in cur.fetchall()]
    finally:
        conn.close()
    assert states == ["success"]
    assert not (tmp_path / "airflow-home" / "airflow.db").exists()  # not SQLite
