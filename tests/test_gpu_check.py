"""The GPU check's code path on the CPU (the real check needs an NVIDIA GPU): a tiny
profile and the training run of a plan through the runtime's worker, launched as torchrun
would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.alone
@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_and_trains_a_plan_through_the_worker(
    tmp_path: Path, data_dir: Path
) -> None:
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "gpu_check.py"),
        *("--device", "cpu", "--models", "resnet18", "--size", "tiny", "--max-batch", "16"),
        *("--budget-s", "20", "--no-event-check", "--out", str(tmp_path)),
        *("--train-model", "resnet18", "--train-batch", "8", "--train-iterations", "6"),
    ]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    train = result["train"]
    assert train["status"] == "ok" and train["exit_code"] == 0
    assert train["records"] == 6 and train["last_iteration"] == 6
    assert train["checkpoint_iteration"] == 6 and train["steady_iteration_s"] > 0
    assert "on cpu (gloo)" in train["worker_log_tail"]
