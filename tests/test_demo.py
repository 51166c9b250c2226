"""The README's main command end to end: `srifty demo` on a fresh data folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env


@pytest.mark.alone
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_demo_runs_the_whole_loop(tmp_path: Path) -> None:
    root = tmp_path / "demo-data"
    exe = Path(sys.executable).with_name("srifty")
    proc = subprocess.run(
        [str(exe), "--data-dir", str(root), "demo"],
        capture_output=True,
        text=True,
        timeout=1100,
        env=subprocess_env({"MLFLOW_TRACKING_URI": ""}),
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-6000:]
    for stage in range(1, 9):
        assert f"[{stage}/8]" in out
    assert "champion: version 1" in out
    assert "preempted worker" in out and "re-planning run" in out, out[-4000:]
    assert "outcome: 40 of 40 iterations" in out
    assert "plan c0:" in out and "plan c1:" in out
    assert "case 6: no configuration meets the limits" in out
    assert "srifty-admin" in out
    assert (root / "mlflow" / "mlflow.db").is_file() and any((root / "runs").iterdir())
