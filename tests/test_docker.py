"""The deployment files: the compose file is consistent and the image installs the lock."""

from __future__ import annotations

from typing import Any

import yaml

from srifty_core import paths

DOCKER = paths.REPO_ROOT / "docker"


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return data


def test_compose_references_only_what_it_defines() -> None:
    compose = _compose()
    services = compose["services"]
    volumes = set(compose.get("volumes") or {})
    assert {"postgres", "redis", "mlflow", "airflow-worker", "airflow-scheduler"} <= set(services)
    for name, svc in services.items():
        for dep in svc.get("depends_on") or {}:
            assert dep in services, f"{name} depends on undefined service {dep}"
        for mount in svc.get("volumes") or []:
            source = mount.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in volumes, f"{name} mounts undefined volume {source}"
            elif source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts missing file {source}"


def test_airflow_services_use_celery_and_postgres() -> None:
    services = _compose()["services"]
    airflow = {n: s for n, s in services.items() if n.startswith("airflow-")}
    assert {"airflow-api-server", "airflow-dag-processor", "airflow-triggerer"} <= set(airflow)
    for name, svc in airflow.items():
        env = svc["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:")
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql://")
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].endswith("/execution/")
    assert "postgresql" in " ".join(services["mlflow"]["command"])


def test_dockerfile_installs_the_lock_then_the_package() -> None:
    lines = (DOCKER / "Dockerfile").read_text().splitlines()
    base = next(x for x in lines if x.startswith("FROM"))
    assert base.split()[1] == "python:3.11-slim"
    text = "\n".join(lines)
    lock = text.index("-r requirements.lock")
    package = text.index("--no-deps -e .")
    assert text.index("COPY requirements.lock") < lock < package


def test_image_gets_the_celery_provider_from_the_lock() -> None:
    """The CeleryExecutor's provider is a locked project dependency (the one
    tests/dags/test_celery_executor.py runs), not an extra install in the image."""
    lock = (paths.REPO_ROOT / "requirements.lock").read_text().splitlines()
    pinned = {line.split("==")[0].lower() for line in lock if "==" in line}
    assert {"apache-airflow-providers-celery", "celery", "redis"} <= pinned
    installs = [
        line for line in (DOCKER / "Dockerfile").read_text().splitlines() if "pip install" in line
    ]
    for line in installs:
        assert any(x in line for x in ("'pip>=25'", "-r requirements.lock", "--no-deps -e .")), line
