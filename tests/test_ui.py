"""`srifty ui` starts the Airflow and MLflow UIs for real, answers health checks with a
known admin password, and leaves nothing running when it stops."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from srifty_core.cloud.local import free_port
from srifty_core.ui import run_ui

pytestmark = pytest.mark.airflow


@pytest.mark.alone
@pytest.mark.slow
def test_ui_starts_both_servers_and_stops_them(data_dir: Path) -> None:
    a_port, m_port = free_port(), free_port()
    assert run_ui(airflow_port=a_port, mlflow_port=m_port, password="pw-test", once=True) == 0
    home = data_dir / "airflow"
    stored = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())
    assert stored == {"admin": "pw-test"}
    left = subprocess.run(
        ["pgrep", "-f", f"--port {m_port}|airflow standalone"], capture_output=True, text=True
    )
    assert left.stdout.strip() == ""
