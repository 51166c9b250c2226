from __future__ import annotations

import json
from pathlib import Path

import pytest

from srifty_core.cli import main
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs.progress import ProgressLog, ProgressRecord
from srifty_core.worker.checkpoint import load_checkpoint


def test_monitor_reads_a_log_and_decides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ProgressLog(tmp_path / "progress.jsonl") as log:
        for i in range(1, 21):
            log.append(ProgressRecord(i, 1000.0 + i, 1.0, 100, "c0"))
    # 100 samples/s, 20 of 100 iterations done after 21 s: 80 more seconds.
    assert main(["monitor", str(tmp_path), "--iterations", "100", "--time-limit", "200",
                 "--now", "1020"]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith("continue: on track")
    args = ["monitor", str(tmp_path), "--iterations", "100", "--time-limit", "60"]
    assert main([*args, "--now", "1020", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["action"] == "replan" and out["iterations_done"] == 20
    assert main(["monitor", str(tmp_path / "nothing"), "--iterations", "5"]) == 2


def test_monitor_of_a_finished_run_counts_time_to_its_last_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that finished long ago: elapsed time and spend end at its last record, not
    at the moment `srifty monitor` is asked (without --now)."""
    with ProgressLog(tmp_path / "progress.jsonl") as log:
        for i in range(1, 21):
            log.append(ProgressRecord(i, 1000.0 + i, 1.0, 100, "c0"))
    args = ["monitor", str(tmp_path), "--iterations", "20", "--usd-per-hour", "3.6"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reason"] == "finished" and out["iterations_done"] == 20
    assert out["elapsed_s"] == pytest.approx(20.0)  # the first step's start to the last's end
    assert out["spent_usd"] == pytest.approx(0.02)
    assert main(args) == 0
    assert "iterations 20/20, elapsed 20 s" in capsys.readouterr().out


def test_train_a_plan_on_local_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = TrainPlan(
        model="dlrm", size="tiny", global_batch=6, iterations=4, local_batches=(2, 4),
        run_dir=str(tmp_path / "run"),
    )  # fmt: skip
    path = plan.save(tmp_path / "plan.json")
    assert main(["train", str(path), "--provider", "local", "--no-progress", "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert "done: 4 iterations" in out and "c0: local batches [2, 4]" in out
    ck = load_checkpoint(plan.checkpoint_path)
    assert ck is not None and ck.iteration == 4
