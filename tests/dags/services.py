"""The local servers the DAG tests run Airflow against: Postgres (metadata DB, Celery result
backend) and Redis (Celery broker). The fixtures using them are in ``conftest.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

POSTGRES_HOST, POSTGRES_PORT = "127.0.0.1", 5432
POSTGRES_USERS = ("postgres", "root")
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_DB = 3
"""The Redis database the tests use as Celery broker; runs are kept apart by their queues."""


@dataclass(frozen=True)
class PostgresDB:
    """One database on the local server, and the role that owns it."""

    name: str
    user: str
    host: str = POSTGRES_HOST
    port: int = POSTGRES_PORT

    @property
    def address(self) -> str:
        """``user@host:port/name``, for SQLAlchemy URLs of any driver."""
        return f"{self.user}@{self.host}:{self.port}/{self.name}"

    @property
    def url(self) -> str:
        """Airflow's ``sql_alchemy_conn`` for this database."""
        return f"postgresql+psycopg2://{self.address}"

    def connect(self) -> Any:
        """A psycopg2 connection (autocommit) to this database."""
        import psycopg2

        conn = psycopg2.connect(
            host=self.host, port=self.port, user=self.user, dbname=self.name, connect_timeout=5
        )
        conn.autocommit = True
        return conn

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of one statement, on a connection of its own."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall())
        finally:
            conn.close()


def admin_connection() -> tuple[Any, str]:
    """An autocommit connection to the server's ``postgres`` database, and its role; skips
    the test when no role in ``POSTGRES_USERS`` gets in."""
    psycopg2 = pytest.importorskip("psycopg2")
    errors = []
    for user in POSTGRES_USERS:
        try:
            conn = psycopg2.connect(
                host=POSTGRES_HOST,
                port=POSTGRES_PORT,
                user=user,
                dbname="postgres",
                connect_timeout=3,
            )
        except psycopg2.OperationalError as exc:
            errors.append(f"{user}: {str(exc).strip()}")
            continue
        conn.autocommit = True
        return conn, user
    pytest.skip(
        f"no Postgres server accepts us on {POSTGRES_HOST}:{POSTGRES_PORT} ({'; '.join(errors)})"
    )


def fresh(dagbag: Any, dag_id: str) -> Any:
    """A private copy of a parsed DAG for ``dag.test``: in-process runs update the DAG
    object's params with the run's conf, so a test reusing the session's DagBag object
    would see the previous test's conf as defaults (each Airflow task process parses its
    own copy, so this is a test-only concern). A deep copy is no substitute: operators
    compare arguments with Airflow's NOTSET sentinel by identity."""
    from airflow.dag_processing.dagbag import DagBag

    from srifty_core import paths

    path = dagbag.get_dag(dag_id).fileloc
    dag = DagBag(dag_folder=str(paths.DAGS_DIR / path.rsplit("/", 1)[-1])).get_dag(dag_id)
    assert dag is not None, f"{dag_id} did not parse again"
    return dag


def check_trigger(dag: Any, conf: dict[str, Any]) -> None:
    """What refuses a bad trigger before a run is created, without the run: the run's
    creation (``dag.test``, the API, the scheduler) merges the conf into the serialized DAG's
    params and validates them, raising ``ParamValidationError`` naming the field. A
    ``dag.test`` call first parses and syncs every DAG file (a second or more of CPU), so
    the tests check one bad trigger per DAG through it and the other cases here."""
    from airflow.serialization.serialized_objects import DagSerialization

    params = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).params
    params.deep_merge(conf).validate()
