"""Workers started on this host do not inherit the launcher's secrets."""

from __future__ import annotations

import pytest

from srifty_core.worker_env import is_secret, scrubbed


@pytest.mark.parametrize(
    "name",
    [
        "AIRFLOW_CONN_AWS_DEFAULT",
        "AIRFLOW_VAR_API",
        "AIRFLOW__CORE__FERNET_KEY",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CELERY__RESULT_BACKEND",
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SESSION_TOKEN",
        "MLFLOW_TRACKING_PASSWORD",
        "HF_TOKEN",
        "GITHUB_TOKEN",
        "DB_PASSWORD",
        "my_api_key",
    ],
)
def test_secrets_are_dropped(name: str) -> None:
    assert is_secret(name)
    assert name not in scrubbed({name: "x", "PATH": "/usr/bin"})


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "PYTHONPATH",
        "HOME",
        "OMP_NUM_THREADS",
        "SRIFTY_DATA_DIR",
        "SRIFTY_DIE_WITH_PID",
        "MASTER_ADDR",
        "AWS_DEFAULT_REGION",
        "MLFLOW_TRACKING_URI",
        "LANG",
        "HTTPS_PROXY",
        "CUDA_VISIBLE_DEVICES",
    ],
)
def test_what_workers_need_is_kept(name: str) -> None:
    assert not is_secret(name)
    assert scrubbed({name: "v"}) == {name: "v"}
