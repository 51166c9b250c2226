"""Workers started on this host get an allow-listed environment: never the launcher's
secrets, whatever their names."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from srifty_core.worker_env import EXTRA_ENV, is_secret, scrubbed


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
        "SRIFTY_JWT_SECRET",
    ],
)
def test_secrets_are_dropped(name: str) -> None:
    assert is_secret(name)
    assert name not in scrubbed({name: "x", "PATH": "/usr/bin"})


@pytest.mark.parametrize(
    "name",
    [
        # names that do not say they hold a secret (the old deny-list passed them on)
        "DATABASE_URL",
        "GH_PAT",
        "DEPLOY_PASSWD",
        "SSH_AUTH_SOCK",
        "MLFLOW_TRACKING_URI",
        "AWS_PROFILE",
        "KUBECONFIG",
        "PGPASSFILE",
        "SLACK_WEBHOOK_URL",
        "SOMETHING_ELSE",
    ],
)
def test_what_is_not_on_the_allow_list_is_dropped(name: str) -> None:
    assert scrubbed({name: "postgresql://app:hunter2@db/app", "PATH": "/usr/bin"}) == {
        "PATH": "/usr/bin"
    }


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "PYTHONPATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "XDG_DATA_HOME",
        "OMP_NUM_THREADS",
        "SRIFTY_DATA_DIR",
        "SRIFTY_DIE_WITH_PID",
        "SRIFTY_RUN_STORAGE",
        "MASTER_ADDR",
        "HTTPS_PROXY",
        "CUDA_VISIBLE_DEVICES",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "TORCH_HOME",
        "TOKENIZERS_PARALLELISM",
    ],
)
def test_what_workers_need_is_kept(name: str) -> None:
    assert scrubbed({name: "v"}) == {name: "v"}


def test_a_value_with_a_password_is_dropped_even_under_an_allowed_name() -> None:
    env = {"HTTPS_PROXY": "http://me:hunter2@proxy:3128", "HTTP_PROXY": "http://proxy:3128"}
    assert scrubbed(env) == {"HTTP_PROXY": "http://proxy:3128"}


def test_the_deployment_can_pass_more_names() -> None:
    env = {EXTRA_ENV: "MLFLOW_TRACKING_URI, WANDB_MODE", "MLFLOW_TRACKING_URI": "http://mlflow"}
    env |= {"WANDB_MODE": "offline", "DATABASE_URL": "sqlite://"}
    kept = scrubbed(env)
    assert kept["MLFLOW_TRACKING_URI"] == "http://mlflow" and kept["WANDB_MODE"] == "offline"
    assert "DATABASE_URL" not in kept


def test_a_local_worker_sees_only_the_allowed_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local provider (local training and probe workers) starts ranks with it."""
    from srifty_core.cloud.base import LaunchRequest
    from srifty_core.cloud.local import LOCAL_CPU, LocalProvider

    for name, value in {
        "DATABASE_URL": "postgresql://app:hunter2@db/app",
        "GH_PAT": "ghp_x",
        "DEPLOY_PASSWD": "x",
        "SSH_AUTH_SOCK": "/tmp/agent.sock",
        "MLFLOW_TRACKING_URI": "http://admin:pw@mlflow:5000",
        "OMP_NUM_THREADS": "3",
    }.items():
        monkeypatch.setenv(name, value)
    p = LocalProvider(tmp_path / "cloud")
    a = p.launch(LaunchRequest(LOCAL_CPU, count=1))
    out = tmp_path / "env.json"
    code = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    try:
        p.run(a, [sys.executable, "-c", code, str(out)])
        end = time.monotonic() + 60
        while any(c is None for c in p.exit_codes(a).values()) and time.monotonic() < end:
            time.sleep(0.1)
        assert p.exit_codes(a) == {0: 0}
    finally:
        p.release(a)
    seen = json.loads(out.read_text())
    leaked = {"DATABASE_URL", "GH_PAT", "DEPLOY_PASSWD", "SSH_AUTH_SOCK", "MLFLOW_TRACKING_URI"}
    assert leaked & set(seen) == set()
    assert seen["OMP_NUM_THREADS"] == "3" and seen["RANK"] == "0" and "PATH" in seen
