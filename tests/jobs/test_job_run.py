"""A whole job from the shell with the DAG's own steps (``jobs.job_run``): planned,
provisioned on local workers, one taken back mid-run, re-planned onto the survivor,
finished after exactly N iterations, and nothing left running."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from srifty_core.cloud.local import LocalProvider, pid_alive
from srifty_core.jobs.job_run import run_job
from srifty_core.runs.progress import read_progress

PARAMS: dict[str, Any] = {
    "model": "dlrm", "size": "tiny", "global_batch": 16, "iterations": 20,
    "offers": [{"type": "local.cpu", "market": "on-demand", "quota": 2, "price": 0.1}],
    "objective": "time", "provider": "local", "budget_usd": 10.0, "checkpoint_every": 5,
    "step_sleep_s": 0.05,
}  # fmt: skip
ROOT = Path(__file__).resolve().parents[2]


def _reclaim_one(provider: LocalProvider, progress: Path, after: int) -> list[str]:
    taken: list[str] = []

    def reclaim() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            recs = read_progress(progress)
            states = sorted(provider.state_dir.glob("local-*.json"))
            if recs and recs[-1].iteration >= after and states:
                alloc = provider.get_allocation(states[-1].stem)
                taken.append(alloc.instance_ids[0])
                provider.interrupt(alloc.instance_ids[0])
                return
            time.sleep(0.02)

    threading.Thread(target=reclaim, daemon=True).start()
    return taken


@pytest.mark.slow
def test_a_job_from_the_shell_replans_on_a_preemption_and_releases_everything(
    ready_to_plan: Path,
) -> None:
    provider = LocalProvider()
    taken = _reclaim_one(provider, ready_to_plan / "runs" / "t1" / "progress.jsonl", 6)
    run = run_job(PARAMS, run_key="t1", provider=provider, poll_s=0.1, timeout_s=240)
    assert taken
    first, second = run.configurations
    assert first.status == "replan" and first.local_batches == (8, 8)
    assert second.status == "finished" and second.local_batches == (16,)
    recs = read_progress(ready_to_plan / "runs" / "t1" / "progress.jsonl")
    assert sorted({r.iteration for r in recs}) == list(range(1, 21))
    assert run.outcome
    for state in provider.state_dir.glob("local-*.json"):  # every allocation released
        alloc = json.loads(state.read_text())
        assert all(s != "running" for s in alloc["instances"].values()), alloc
        assert not any(pid_alive(p["pid"], p["start_ticks"]) for p in alloc["processes"])


@pytest.mark.slow
def test_srifty_train_job_runs_your_script_with_the_dags_steps(
    ready_to_plan: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from srifty_core.cli import main
    from srifty_core.profiling.config import ProfilerConfig
    from srifty_core.profiling.job import run_profile_job

    monkeypatch.chdir(ROOT)
    model = "examples/digits/model.py:build"
    quick = ProfilerConfig(
        batch_sizes=(1, 8, 16), repeats=2, warmup=1, refine=0, threads=1, share_host=1
    )
    run_profile_job(model, "tiny", quick, log_to_mlflow=False)
    job = ready_to_plan / "job.yaml"
    one = [{**PARAMS["offers"][0], "quota": 1}]  # one rank runs it: the DAG's steps the same
    job.write_text(yaml.safe_dump({**PARAMS, "model": model, "iterations": 8, "step_sleep_s": 0,
                                   "offers": one}))  # fmt: skip
    script = [sys.executable, str(ROOT / "examples" / "digits" / "train.py")]
    assert main(["train", "--job", str(job), "--no-progress", "--", *script]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"^c0: \d x local\.cpu \(on-demand\), local batches \[[\d, ]+\]: finished", out, re.M
    ), out
    (run_dir,) = [p for p in (ready_to_plan / "runs").iterdir() if p.is_dir()]
    assert json.loads((run_dir / "result.json").read_text())["iterations"] == 8
    recs = read_progress(run_dir / "progress.jsonl")
    assert [r.iteration for r in recs] == list(range(1, 9)) and recs[-1].loss is not None


def test_train_takes_a_plan_or_a_job_not_both(capsys: pytest.CaptureFixture[str]) -> None:
    from srifty_core.cli import main

    assert main(["train"]) == 2
    assert "give a plan file or --job" in capsys.readouterr().err


@pytest.mark.slow
def test_two_jobs_started_in_the_same_second_never_share_a_run_folder(
    ready_to_plan: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job from the shell gets a run folder of its own, made and held from creation: a
    job started in the same second as one that is still running trains elsewhere (before,
    both trained in ``runs/shell__<second>``: doubled records, one checkpoint from two)."""
    import subprocess
    import types

    from srifty_core.jobs import job_run
    from srifty_core.jobs.local_run import TrainingError, run_folder_lock

    second = "20260101T000000"
    clock = types.SimpleNamespace(
        strftime=lambda *_: second, monotonic=time.monotonic, sleep=time.sleep
    )
    monkeypatch.setattr(job_run, "time", clock)
    runs = ready_to_plan / "runs"
    first = runs / f"shell__{second}"  # the folder of a job started that second, running
    first.mkdir(parents=True)
    (first / "progress.jsonl").write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from srifty_core.jobs.local_run import run_folder_lock\n"
         "with run_folder_lock(Path(sys.argv[1])):\n"
         "    print('held', flush=True); time.sleep(300)\n", str(first)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    held: list[bool] = []

    def try_to_take(_: Any) -> None:  # a second job on this job's folder is refused
        if not held:
            (mine,) = [p for p in runs.iterdir() if p.is_dir() and p != first]
            try:
                with run_folder_lock(mine):
                    held.append(False)
            except TrainingError:
                held.append(True)

    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        one = [{**PARAMS["offers"][0], "quota": 1}]  # one rank: the folder is the subject
        run = run_job({**PARAMS, "iterations": 6, "offers": one}, provider=LocalProvider(),
                      poll_s=0.1, on_poll=try_to_take, timeout_s=240)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert (first / "progress.jsonl").read_text() == ""  # the other job's folder untouched
    (mine,) = [p for p in runs.iterdir() if p.is_dir() and p != first]
    assert mine.name.startswith(f"shell__{second}-")
    assert Path(run.outcome["run_dir"]).resolve() == mine.resolve()
    assert [r.iteration for r in read_progress(mine / "progress.jsonl")] == list(range(1, 7))
    assert held == [True]
    with run_folder_lock(mine):  # released at the end
        pass


def test_a_job_is_known_by_its_resolved_request_and_where_it_is_run_from(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun of `srifty train --job` resumes the newest unfinished run of the same job:
    the same resolved request (defaults written out or not) run from the same folder; a
    changed field or another folder is another job, and a finished run is never resumed."""
    import os

    from srifty_core.jobs.job_run import _record_request, job_identity, unfinished_run

    same = job_identity(PARAMS, "a")
    assert job_identity({**PARAMS, "seed": 0, "precision": "fp32"}, "a") == same
    assert (
        job_identity({**PARAMS, "resume": {"checkpoint": "x", "iterations_done": 1}}, "a") == same
    )
    assert job_identity({**PARAMS, "iterations": 21}, "a") != same
    assert job_identity({**PARAMS, "entrypoint": ["python", "train.py"]}, "a") != same
    assert job_identity(PARAMS, "b") != same
    monkeypatch.chdir(tmp_path)
    runs = data_dir / "runs"
    assert unfinished_run(PARAMS) is None  # no run folders at all
    for k, (name, params) in enumerate([
        ("old", PARAMS), ("unfinished", PARAMS), ("other", {**PARAMS, "iterations": 21}),
        ("finished", PARAMS),
    ]):  # fmt: skip
        (runs / name).mkdir(parents=True)
        _record_request(runs / name, params)
        os.utime(runs / name / "request.json", (1000.0 + k, 1000.0 + k))
    (runs / "finished" / "outcome.json").write_text("{}")
    (runs / "no-request").mkdir()
    assert unfinished_run(PARAMS) == runs / "unfinished"
    assert unfinished_run({**PARAMS, "iterations": 21}) == runs / "other"
    (runs / "unfinished" / "outcome.json").write_text("{}")
    assert unfinished_run(PARAMS) == runs / "old"
    monkeypatch.chdir(runs)
    assert unfinished_run(PARAMS) is None  # run from another folder: another job


def test_a_rerun_plans_afresh_where_nothing_was_done_and_finishes_a_run_done_to_the_end(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two ends of taking an unfinished run over: with no checkpoint and no record the
    job is planned as asked (a first plan must meet the limits: no ``resume``), in the same
    folder; with a checkpoint of every iteration (the driver died before the outcome) the
    run is finished, not trained again."""
    from srifty_core.jobs.job_run import _record_request, resume_conf
    from srifty_core.jobs.local_run import plan_file_job
    from srifty_core.jobs.monitor import Limits
    from srifty_core.planner.schema.train_plan import TrainPlan

    monkeypatch.chdir(tmp_path)
    params = {**PARAMS, "iterations": 10}
    run = data_dir / "runs" / "killed"
    run.mkdir(parents=True)
    _record_request(run, params)
    assert resume_conf(params, run) == params  # nothing done: the job as asked
    plan = TrainPlan(
        model="dlrm", size="tiny", global_batch=16, iterations=10, local_batches=(8, 8),
        run_dir=str(run),
    )  # fmt: skip
    _, job = plan_file_job(plan, plan.save(run / "plan-c0.json"), Limits(10, 16))
    job.save(run / "job-c0.json")
    (run / "checkpoint.pt").write_bytes(b"the checkpoint of iteration 10")
    (run / "checkpoint.json").write_text(json.dumps({"iteration": 10, "config_id": "c0"}))
    (run / "decisions.jsonl").write_text(json.dumps({"elapsed_s": 12.5, "spent_usd": 0.1}) + "\n")
    lines: list[str] = []
    done = run_job(params, resume_unfinished=True, say=lines.append, track=False)
    assert done.configurations == () and done.outcome["status"] == "finished"
    assert done.outcome["training_s"] == 12.5
    assert json.loads((run / "outcome.json").read_text()) == done.outcome
    assert lines == [f"run folder: {run} (this job's run: every iteration was done)"]
