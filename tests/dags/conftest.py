"""Fixtures for the DAG tests: a fresh database on the local Postgres server, and the local
Redis (the Celery broker). Each skips, saying why, when its server does not answer; CI has
both, so there the tests run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.dags.services import REDIS_DB, REDIS_HOST, REDIS_PORT, PostgresDB, admin_connection


@pytest.fixture()
def postgres_db() -> Iterator[PostgresDB]:
    """A fresh, empty database with a unique name; dropped afterwards (its sessions ended)."""
    admin, user = admin_connection()
    db = PostgresDB(name=f"srifty_test_{uuid.uuid4().hex[:10]}", user=user)
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{db.name}"')
    try:
        yield db
    finally:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (db.name,),
            )
            cur.execute(f'DROP DATABASE IF EXISTS "{db.name}"')
        admin.close()


@pytest.fixture()
def redis_server() -> Iterator[Any]:
    """A client of the tests' database on the local Redis; skips when none answers."""
    redis = pytest.importorskip("redis")
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        pytest.skip(f"no Redis server answers on {REDIS_HOST}:{REDIS_PORT} ({exc})")
    try:
        yield client
    finally:
        client.close()
