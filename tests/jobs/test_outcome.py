"""One outcome per job (``jobs.outcome``): ``outcome.json`` in the run folder with the
time and the cost by what they include, the same numbers printed by ``srifty train`` and
logged to the job's MLflow run, the run folder printed, rank 0's output shown; plan-file
runs tracked in MLflow as the DAG's are, ``--no-mlflow`` skipping it and a tracking store
that cannot be reached failing nothing."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from srifty_core.cli import main
from srifty_core.jobs.emulated_job import make_provider
from srifty_core.jobs.job_run import run_job
from srifty_core.jobs.outcome import OUTCOME_FILE, Outcome
from tests.jobs.test_emulated_job import PARAMS, PREEMPT


def _run_dir(data: Path) -> Path:
    (run_dir,) = [p for p in (data / "runs").iterdir() if p.is_dir()]
    return run_dir


def _job_runs() -> list[Any]:
    from mlflow.tracking import MlflowClient

    from srifty_core.jobs.job_log import EXPERIMENT
    from srifty_core.tracking.store import setup_experiment

    exp = setup_experiment(EXPERIMENT)
    return list(MlflowClient().search_runs([exp], "tags.`srifty.kind` = 'job'"))


def test_an_emulated_job_reports_one_outcome_in_its_folder_its_output_and_mlflow(
    ready_to_plan: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = ready_to_plan / "job.yaml"
    job.write_text(yaml.safe_dump(PARAMS))
    assert main(["train", "--job", str(job), "--preempt", PREEMPT, "--no-progress"]) == 0
    out = capsys.readouterr().out
    run_dir = _run_dir(ready_to_plan)
    d = json.loads((run_dir / OUTCOME_FILE).read_text())
    assert d["iterations"] == 300 and d["configurations"] == ["c0", "c1"], d
    # by what they include: the training the limits count; the wall time and the bill of
    # every VM from launch to release, with the launches and the re-plan among them
    assert 0 < d["training_s"] < d["wall_s"] and 0 < d["training_usd"] < d["billed_usd"], d
    # printed: the same numbers, the run folder; the emulator's own account agrees
    assert f"time: {d['training_s']:.0f} s training" in out and f"{d['wall_s']:.0f} s wall" in out
    assert f"cost: ${d['training_usd']:.2f} training" in out, out
    assert f"${d['billed_usd']:.2f} billed" in out and f"run folder: {run_dir} (" in out
    assert f"{d['wall_s']:.0f} s of simulated time, ${d['billed_usd']:.2f} billed" in out
    assert "elapsed_s" not in out and "cost_usd" not in out  # no total without its meaning
    # the job's MLflow run: the same numbers
    (mine,) = _job_runs()
    m = mine.data.metrics
    for key in ("training_s", "training_usd", "wall_s", "billed_usd"):
        assert m[f"outcome_{key}"] == pytest.approx(d[key]), key
    assert mine.info.status == "FINISHED"


def test_no_mlflow_tracks_nothing_and_an_unreachable_store_fails_nothing(
    ready_to_plan: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    params = {**PARAMS, "iterations": 40}
    run = run_job(params, run_key="quiet", provider=make_provider(params), poll_s=5.0,
                  timeout_s=300, track=False)  # fmt: skip
    written = Outcome.from_dict(json.loads((ready_to_plan / "runs" / "quiet" / OUTCOME_FILE)
                                           .read_text()))  # fmt: skip
    assert Outcome.from_dict(run.outcome) == written and written.iterations == 40
    assert written.wall_s is not None and written.billed_usd is not None
    assert _job_runs() == []
    # a tracking server nobody answers: one warning, and the job runs to its end
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with caplog.at_level(logging.WARNING, logger="srifty_core.jobs.job_log"):
        run = run_job(params, run_key="dark", provider=make_provider(params), poll_s=5.0,
                      timeout_s=300)  # fmt: skip
    assert run.outcome["iterations"] == 40
    assert (ready_to_plan / "runs" / "dark" / OUTCOME_FILE).is_file()
    warned = [r.getMessage() for r in caplog.records if "MLflow: could not" in r.getMessage()]
    assert len(warned) == 1 and "record the plan" in warned[0], warned


@pytest.mark.slow
def test_a_plan_file_prints_its_folder_and_rank_0s_output_and_is_tracked(
    ready_to_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from srifty_core.planner.schema.train_plan import TrainPlan

    run_dir = ready_to_plan / "runs" / "plan"
    plan = TrainPlan(model="dlrm", size="tiny", global_batch=6, iterations=12,
                     local_batches=(2, 4), run_dir=str(run_dir))  # fmt: skip
    path = plan.save(tmp_path / "plan.json")
    assert main(["train", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    logs = run_dir / "logs" / "c0"
    assert out.startswith(f"run folder: {run_dir}; the ranks' output: {logs}/rank-*.log\n")
    assert {"rank-0.log", "rank-1.log"} <= {p.name for p in logs.iterdir()}
    assert f"rank 0's output (the last lines of {logs / 'rank-0.log'}):" in out
    assert "worker: rank 0 of 2" in out  # what rank 0 printed, shown
    d = json.loads((run_dir / OUTCOME_FILE).read_text())
    assert d["iterations"] == 12 and d["provider"] == "local" and d["billed_usd"] is None
    assert f"time: {d['training_s']:.0f} s training" in out and f"{d['wall_s']:.0f} s wall" in out
    assert "not billed: local workers" in out and f"run folder: {run_dir} (" in out
    # recalibrated at no price (a plan file's workers cost 0 unless the limits say)
    from srifty_core.jobs.recalibration import read_run

    state = read_run(run_dir)
    assert state is not None and state["calibration"].windows >= 1, state
    # tracked as a DAG run is: the job's run, its plan, decisions and outcome
    from mlflow.tracking import MlflowClient

    (mine,) = _job_runs()
    assert mine.info.status == "FINISHED" and mine.data.metrics["outcome_iterations"] == 12
    assert mine.data.params["model"] == "dlrm" and mine.data.params["provider"] == "local"
    files = {a.path for a in MlflowClient().list_artifacts(mine.info.run_id, "c0")}
    assert {"c0/plan.json", "c0/decisions.jsonl"} <= files, files


# A plan file preempted, tracked (one job run, its re-plan nested):
# ``test_local_run.test_a_plan_file_preempted_is_one_job_run_with_its_replan_nested``, on the
# preempted run that module shares among its tests.
