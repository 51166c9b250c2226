"""The deployment files, read for what they mean (no Docker engine here): services and what
they wait for, healthchecks, shared keys, no secret literals, loopback-only ports, a
non-root image that installs the lock before the project, and what the build context
leaves out."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from srifty_core import paths

DOCKER = paths.REPO_ROOT / "docker"
SECRETS = (
    "POSTGRES_PASSWORD",
    "AIRFLOW_FERNET_KEY",
    "AIRFLOW_SECRET_KEY",
    "SRIFTY_JWT_SECRET",
    "MLFLOW_ADMIN_PASSWORD",
)
LONG_RUNNING = (
    "postgres",
    "redis",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
    "mlflow",
)


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return data


def _services() -> dict[str, Any]:
    services: dict[str, Any] = _compose()["services"]
    return services


def test_compose_references_only_what_it_defines() -> None:
    compose = _compose()
    services = compose["services"]
    volumes = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for dep in svc.get("depends_on") or {}:
            assert dep in services, f"{name} depends on undefined service {dep}"
            assert dep != name
        for mount in svc.get("volumes") or []:
            source = mount.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in volumes, f"{name} mounts undefined volume {source}"
            elif source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts missing file {source}"


def test_every_airflow_service_waits_for_the_migration_and_shares_the_keys() -> None:
    services = _services()
    airflow = {
        n: s for n, s in services.items() if n.startswith("airflow-") and n != "airflow-init"
    }
    assert set(airflow) == {
        "airflow-api-server",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "airflow-worker",
    }
    # the metadata DB and the pools the DAGs use (srifty_core.airflow_env.migrate)
    init = services["airflow-init"]["command"]
    assert init[:2] == ["python", "-c"] and "srifty_core.airflow_env import migrate" in init[2]
    assert services["airflow-init"]["restart"] == "no"
    assert "airflow-init" not in services["airflow-init"]["depends_on"]
    keys = None
    for name, svc in airflow.items():
        deps = svc["depends_on"]
        assert deps["airflow-init"]["condition"] == "service_completed_successfully", name
        assert deps["postgres"]["condition"] == "service_healthy", name
        env = svc["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:")
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].endswith("/execution/")
        shared = {
            k: env[k]
            for k in (
                "AIRFLOW__CORE__FERNET_KEY",
                "AIRFLOW__API__SECRET_KEY",
                "AIRFLOW__API_AUTH__JWT_SECRET",
                "MLFLOW_TRACKING_PASSWORD",
            )
        }
        keys = keys or shared
        assert shared == keys, f"{name} does not share the keys"
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_long_running_services_restart_and_report_their_health(name: str) -> None:
    svc = _services()[name]
    assert svc["restart"] == "unless-stopped"
    test = svc["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1


def test_no_secret_is_written_in_the_files() -> None:
    text = (DOCKER / "compose.yaml").read_text()
    for var in SECRETS:
        uses = re.findall(r"\$\{" + var + r"(:\?[^}]*)?\}", text)
        assert uses, f"{var} is not used"
        assert any(u.startswith(":?") for u in uses), f"{var} has no guard naming it"
    assert "airflow:airflow@" not in text  # the old literal Postgres password
    assert not re.search(r"(PASSWORD|SECRET|FERNET_KEY)\w*:\s*[\"']?[A-Za-z0-9_\-]{8,}", text)
    ini = (DOCKER / "mlflow-auth.ini").read_text()
    assert not re.search(r"^\s*admin_password\s*=", ini, re.M)


def test_only_loopback_ports_are_published() -> None:
    for name, svc in _services().items():
        for port in svc.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_mlflow_requires_sign_in() -> None:
    mlflow = _services()["mlflow"]
    command = mlflow["command"]
    assert command[command.index("--app-name") + 1] == "basic-auth"
    assert mlflow["environment"]["MLFLOW_AUTH_CONFIG_PATH"].endswith("docker/mlflow-auth.ini")
    assert "MLFLOW_AUTH_ADMIN_PASSWORD" in mlflow["environment"]


def test_the_image_runs_as_a_user_and_installs_the_lock_then_the_package() -> None:
    lines = (DOCKER / "Dockerfile").read_text().splitlines()
    base = next(x for x in lines if x.startswith("FROM"))
    assert base.split()[1] == "python:3.11-slim"
    users = [x.split()[1] for x in lines if x.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    text = "\n".join(lines)
    lock = text.index("-r requirements.lock")
    package = text.index("--no-deps -e .")
    assert text.index("COPY requirements.lock") < lock < package < text.index("USER ")


def test_the_build_context_leaves_out_the_venv_data_and_history() -> None:
    ignored = {
        line.strip()
        for line in (paths.REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "data", "docker/.env"} <= ignored


def test_image_gets_the_celery_provider_and_mlflow_auth_from_the_lock() -> None:
    """The CeleryExecutor's provider and MLflow's auth app are locked project dependencies
    (tests/dags/test_celery_executor.py runs the first), not extra installs in the image."""
    lock = (paths.REPO_ROOT / "requirements.lock").read_text().splitlines()
    pinned = {line.split("==")[0].lower() for line in lock if "==" in line}
    assert {"apache-airflow-providers-celery", "celery", "redis", "flask-wtf"} <= pinned
    installs = [
        line for line in (DOCKER / "Dockerfile").read_text().splitlines() if "pip install" in line
    ]
    for line in installs:
        assert any(
            x in line
            for x in ("'pip>=25'", "-r requirements.lock", "--no-deps -e .", "TORCH_INDEX_URL")
        ), line


def _worker_image() -> tuple[str, list[str]]:
    """The worker Dockerfile's text (continuation lines joined) and its final stage's lines."""
    text = (DOCKER / "worker.Dockerfile").read_text()
    joined = re.sub(r"[ \t]*\\\n\s*", " ", text)
    lines = [x for x in joined.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    last = max(i for i, x in enumerate(lines) if x.startswith("FROM "))
    return joined, lines[last:]


def test_the_worker_image_is_cuda_and_runs_as_a_user() -> None:
    _, final = _worker_image()
    image = final[0].split()[1]
    name, tag = image.split(":")
    assert name == "nvidia/cuda" and "runtime" in tag and "cudnn" in tag, image
    assert any("python3.11" in x and "apt-get install" in x for x in final)
    users = [x.split()[1] for x in final if x.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    entry = next(x for x in final if x.startswith("ENTRYPOINT "))
    assert "srifty_core.worker.worker" in entry or "torchrun" in entry
    # the venv where the start script (srifty_core/worker/rendezvous.py) looks for torchrun
    assert any("-m venv /opt/srifty" in x for x in final)


def test_the_worker_image_installs_this_checkouts_wheel_with_the_worker_extra_only() -> None:
    text, final = _worker_image()
    # the wheel is built from the checkout, not taken from a package index by name
    assert "COPY srifty_core " in text and "pip wheel --no-cache-dir --no-deps ." in text
    installs = [x for x in final if "pip install" in x]
    assert installs
    for line in installs:
        for cmd in line.split("&&"):
            if "pip install" not in cmd:
                continue
            # never Srifty by name from an index (anyone can publish that name there)
            assert not re.search(r"pip install\b.*\s['\"]?srifty([=<>\[\s'\"]|$)", cmd), cmd
            for heavy in ("airflow", "mlflow", "celery", "psycopg", "postgres", "[all]"):
                assert heavy not in cmd.lower(), cmd
    run = " ".join(installs)
    assert '"${whl}[worker]"' in run and "-c /tmp/requirements.lock" in run
    # torch's CUDA build: the index is a build argument (no address written here), the
    # version the lock's
    assert re.search(r'^ARG TORCH_INDEX_URL=""$', text, re.M)
    torch = '--index-url "${TORCH_INDEX_URL}" "$(grep \'^torch==\' /tmp/requirements.lock)"'
    assert torch in run
    # the build fails if Airflow, MLflow, Celery or Postgres drivers got in anyway
    assert "! pip list --format=freeze | grep -iE '^(apache-airflow|mlflow|celery|psycopg)'" in run


def test_the_worker_image_holds_no_secret() -> None:
    text, _ = _worker_image()
    assert not re.search(
        r"(PASSWORD|SECRET|TOKEN|ACCESS_KEY|FERNET_KEY|CREDENTIALS)\w*\s*[=:]", text, re.I
    )
    assert "AWS_" not in text  # a VM reads S3 with its instance profile
