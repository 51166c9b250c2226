from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import pytest

from srifty_core import paths
from srifty_core.catalog import Market, Price, PriceObservation, write_overlay
from srifty_core.cli import main


def test_catalog_table_prints_the_real_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--family", "g4dn", "--region", "us-east-1"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("g4dn.")]
    assert len(lines) == 7
    xlarge = next(ln.split() for ln in lines if ln.startswith("g4dn.xlarge "))
    assert xlarge[:6] == ["g4dn.xlarge", "us-east-1", "4", "16", "T4", "1"]
    assert "0.5260" in xlarge
    assert "prices observed 2025-05-31 .. 2026-04-02" in out
    assert "us-west-2" not in out


def test_catalog_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--family", "p4d", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["region"] for r in rows} == {"us-east-1", "us-west-2"}
    assert all(r["name"] == "p4d.24xlarge" and r["gpus_per_vm"] == 8 for r in rows)


def test_unknown_family_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--family", "g4d"]) == 2
    err = capsys.readouterr().err
    assert "unknown instance family 'g4d'" in err and "g4dn" in err


def test_data_dir_option_reaches_the_overlay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "elsewhere"
    obs = PriceObservation(
        "g4dn.xlarge", "us-east-1", Market.ON_DEMAND, None, Price(0.4242, date(2026, 11, 1), "t")
    )
    write_overlay(paths.price_overlay_dir(root) / "t.csv", [obs])
    assert (
        main(["--data-dir", str(root), "catalog", "--family", "g4dn", "--region", "us-east-1"]) == 0
    )
    assert "0.4242" in capsys.readouterr().out
    assert main(["--data-dir", str(root), "catalog", "--family", "g4dn", "--no-overlays"]) == 0
    assert "0.4242" not in capsys.readouterr().out


def test_validate_writes_the_report(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--validate", "--region", "us-east-1"]) == 0
    assert "0 errors" in capsys.readouterr().out
    assert list((data_dir / "reports" / "catalog").glob("*/report.md"))


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "srifty"
    proc = subprocess.run(
        [str(exe), "catalog", "--family", "g4dn", "--region", "us-east-1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "g4dn.metal" in proc.stdout


def test_bad_values_are_one_line_errors_naming_the_option(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from srifty_core.runs.progress import ProgressLog, ProgressRecord

    with ProgressLog(data_dir / "run" / "progress.jsonl") as log:
        for i in range(1, 5):
            log.append(ProgressRecord(i, float(i), 0.1, 8, "c0"))
    cases = [
        (["probe", "--day", "2026-13-45"], "--day"),
        (["profile", "--model", "resnet18", "--size", "tiny", "--threads", "0"], "threads"),
        (["monitor", str(data_dir / "run"), "--iterations", "10", "--budget", "0"], "--budget"),
        (["monitor", str(data_dir / "run"), "--iterations", "10", "--time-limit", "-5"], "--time"),
    ]
    for argv, name in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("srifty: error:") and name in err and "\n" not in err, err


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["plan", "r.yaml", "--seed", "x"], "--seed"),
        (["plan", "r.yaml", "--method", "fastest"], "--method"),
        (["monitor", "run", "--iterations", "5", "--now", "later"], "--now"),
        (["profile"], "--model"),
        (["nope"], "COMMAND"),
    ],
)
def test_a_flag_argparse_refuses_is_one_line_not_the_usage(
    argv: list[str], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith("srifty") and ": error: " in err and name in err, err


def test_a_bad_model_to_profile_is_one_line_without_a_progress_bar(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", "--model", "nope", "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("srifty: error: model: unknown model 'nope'") and err.count("\n") == 1, (
        err
    )


def test_mlflow_info_lines_do_not_join_an_error(data_dir: Path, tmp_path: Path) -> None:
    """`srifty plan` without a champion model: MLflow creates its store (INFO lines on
    stderr) before it finds none; the plan falls back to the public bandwidth model and
    says why on stdout, and stderr carries none of MLflow's lines."""
    import dataclasses

    import yaml

    from srifty_core.profiling.store import ProfileStore, load_reference_profile

    profile, _ = load_reference_profile("alexnet")
    ProfileStore().save(dataclasses.replace(profile, size="full", device_type="T4"))
    request = tmp_path / "r.yaml"
    request.write_text(yaml.safe_dump({
        "model": "alexnet", "global_batch": 64, "iterations": 10,
        "offers": [{"type": "g4dn.xlarge", "quota": 2}],
    }))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_LOGGING_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-m", "srifty_core.cli", "plan", str(request)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    assert "no 'champion' version" in proc.stdout and "nccl-tests" in proc.stdout


GOOD_PLAN = {
    "model": "dlrm", "size": "tiny", "global_batch": 4, "iterations": 2,
    "local_batches": [2, 2], "run_dir": "runs/r",
}  # fmt: skip


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"model": "dlrm",', "plan.json: not valid JSON (line 1, column 18"),
        (b"[1, 2]", "plan.json: a train plan is a JSON object, got list"),
        (b"\xff\xfe\x00\x01" * 30, "plan.json: not UTF-8 text"),
        (json.dumps(GOOD_PLAN | {"lrr": 0.1}).encode(), "lrr: unknown train plan field 'lrr'"),
        (json.dumps({k: v for k, v in GOOD_PLAN.items() if k != "run_dir"}).encode(),
         "run_dir: missing"),
        (json.dumps(GOOD_PLAN | {"model": "nope"}).encode(), "model: unknown model 'nope'"),
        (json.dumps(GOOD_PLAN | {"size": "huge"}).encode(), "size: must be one of tiny"),
        (json.dumps(GOOD_PLAN | {"run_dir": 5}).encode(), "run_dir: must be a non-empty string"),
        (json.dumps(GOOD_PLAN | {"extra": [1]}).encode(), "extra: must be a mapping"),
        (json.dumps(GOOD_PLAN | {"lr": float("nan")}).encode(), "lr: must be a finite number"),
        (json.dumps(GOOD_PLAN | {"model": "hf:gpt2,seq=99999"}).encode(),
         "seq 99999 is over the config's position limit 1024"),
    ],
)  # fmt: skip
def test_a_train_plan_file_that_is_no_plan_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    """Each of these was a traceback (``JSONDecodeError``, ``UnicodeDecodeError``, a
    ``TypeError`` of the constructor) or reached the workers before failing."""
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    assert main(["train", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "runs").exists()


def test_a_missing_train_plan_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:  # fmt: skip
    assert main(["train", str(tmp_path / "nope.json")]) == 2
    assert (
        capsys.readouterr().err
        == f"srifty: error: train plan file not found: {tmp_path}/nope.json\n"
    )


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["--iterations", "0"], "--iterations: must be at least 1"),
        (["--iterations", "-5"], "--iterations"),
        (["--iterations", "9", "--window", "0"], "--window: must be a positive number"),
        (["--iterations", "9", "--window", "-3"], "--window"),
        (["--iterations", "9", "--budget", "nan"], "--budget"),
        (["--iterations", "9", "--usd-per-hour", "-1"], "--usd-per-hour: must be a number >= 0"),
        (["--iterations", "9", "--usd-per-hour", "nan"], "--usd-per-hour"),
        (["--iterations", "9", "--now", "nan"], "--now"),
    ],
)
def test_bad_monitor_options_are_named_before_the_log_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], name: str
) -> None:
    from srifty_core.runs.progress import ProgressLog, ProgressRecord

    with ProgressLog(tmp_path / "progress.jsonl") as log:
        for i in range(1, 5):
            log.append(ProgressRecord(i, 1000.0 + i, 1.0, 8, "c0"))
    assert main(["monitor", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and name in err, err


@pytest.mark.parametrize(
    "bad",
    [
        '{"iteration": "six", "wall_time": 1.0, "step_s": 1.0, "samples": 8, "config_id": "c0"}',
        '{"iteration": 6, "wall_time": 1.0, "step_s": 1.0, "samples": null, "config_id": "c0"}',
        '{"iteration": 6}',
        '{"iteration": 6, "wall_time": 1.0, "step_s": NaN, "samples": 8, "config_id": "c0"}',
        '{"iteration": 6, "wall_time": Infinity, "step_s": 1, "samples": 8, "config_id": "c0"}',
        "[1, 2]",
    ],
)
def test_a_progress_record_of_the_wrong_shape_is_one_line_naming_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    good = [
        json.dumps({"iteration": i, "wall_time": 1000.0 + i, "step_s": 1.0, "samples": 8,
                    "config_id": "c0"})
        for i in range(1, 5)
    ]  # fmt: skip
    (tmp_path / "progress.jsonl").write_text("\n".join([*good, bad, good[0]]) + "\n")
    assert main(["monitor", str(tmp_path), "--iterations", "9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "progress.jsonl" in err, err


def test_train_on_a_run_folder_with_a_damaged_log_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was a ``ValueError`` traceback from the resume check (``progress.ProgressRecord``)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "progress.jsonl").write_text('{"iteration": "x", "wall_time": null}\n{}\n')
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(GOOD_PLAN | {"run_dir": str(run)}))
    assert main(["train", str(plan), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run}/progress.jsonl: a progress record with" in err, err


def test_a_data_dir_that_is_a_file_is_one_line_naming_the_path(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # data_dir: the variable main() sets is restored after the test
    """Was a ``NotADirectoryError`` traceback; a read-only or full data folder is the same
    kind of error (``OSError`` with a path) and gets the same line."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["--data-dir", str(afile), "catalog", "--validate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"srifty: error: {afile}/") and err.count("\n") == 1, err
    assert "Not a directory" in err


def test_a_profile_that_fails_late_is_still_one_line_on_a_log(
    data_dir: Path, tmp_path: Path
) -> None:
    """Off a terminal progress is one plain line per stage (no bar redraws, which were 15
    lines of control characters before the error of a profile that could not be
    written), and the error stays one line, the last. An output path that cannot be a
    file is refused before any stage (``outputs``); one whose folder takes no file fails
    at the write, late."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    argv = [sys.executable, "-m", "srifty_core.cli", "profile", "--model", "dlrm", "--size",
            "tiny", "--max-batch", "8", "--probes", "2", "--repeats", "2", "--warmup", "0",
            "--refine", "0", "--threads", "1", "--no-mlflow",
            "--share-host", "1",  # no host-sharing runs: stages, not what they measure
            "--out"]  # fmt: skip
    early = subprocess.run([*argv, str(afile / "p.json")], capture_output=True, text=True,
                           check=False, timeout=300)  # fmt: skip
    assert early.returncode == 2
    (line,) = early.stderr.splitlines()  # no stage: refused before profiling
    assert line.startswith(f"srifty: error: --out: {afile}")
    proc = subprocess.run(
        [*argv, "/proc/self/p.json"], capture_output=True, text=True, check=False, timeout=300
    )
    assert proc.returncode == 2
    *stages, error = proc.stderr.splitlines()
    assert error.startswith("srifty: error: --out: cannot write /proc/self/p.json")
    assert "\r" not in proc.stderr
    assert stages and all(line.startswith("profile dlrm: ") for line in stages), stages
    names = [line.split(": ")[1] for line in stages]
    assert len(names) == len(set(names))  # a line per stage, not per step
    ok = subprocess.run([*proc.args[:-1], str(tmp_path / "p.json")], capture_output=True,
                        text=True, check=False, timeout=300)  # fmt: skip
    assert ok.returncode == 0 and "\r" not in ok.stderr
    lines = ok.stderr.splitlines()
    assert lines[-1].startswith("profile dlrm: done [") and "B_max search" in lines[0]


def test_train_runs_the_command_after_the_double_dash_on_every_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`srifty train PLAN -- COMMAND`: the options before `--` are srifty's, everything
    after it is the script's (its own `--lr` included)."""
    root = Path(__file__).resolve().parents[1]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "model": "examples/digits/model.py:build", "size": "tiny", "global_batch": 16,
        "iterations": 6, "local_batches": [10, 6], "run_dir": str(tmp_path / "run"),
        "checkpoint_every": 3,
    }))  # fmt: skip
    script = str(root / "examples" / "digits" / "train.py")
    code = main(["train", str(plan), "--no-progress", "--no-mlflow", "--", "python", script,
                 "--lr", "0.05"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "iterations 0..6, finished" in out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["iterations"] == 6
    saved = json.loads((tmp_path / "run" / "plan-c0.json").read_text())
    assert saved["entrypoint"] == ["python", script, "--lr", "0.05"]


@pytest.mark.slow
def test_ctrl_c_on_train_is_one_line_exit_130_and_stops_the_ranks(tmp_path: Path) -> None:
    """Ctrl-C on `srifty train` (off a terminal, so its stage lines are on): no 'done'
    line for the job it did not finish, no traceback, one line, the shell's 130, and none
    of its ranks left running."""
    import signal

    import psutil

    run = tmp_path / "run"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "model": "dlrm", "size": "tiny", "global_batch": 4, "iterations": 500,
        "local_batches": [2, 2], "run_dir": str(run), "step_sleep_s": 0.2,
        "checkpoint_every": 5,
    }))  # fmt: skip
    # Ctrl-C as from a terminal: SIGINT at its default in the child, whatever disposition
    # this test's process has (a child inherits an ignored SIGINT: a shell's background
    # job starts with one); in two full parallel runs the command ignored the signal
    proc = subprocess.Popen(
        [sys.executable, "-m", "srifty_core.cli", "train", str(plan), "--no-mlflow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    ranks: list[psutil.Process] = []
    try:
        _wait_for_records(proc, run / "progress.jsonl", 3)
        ranks = psutil.Process(proc.pid).children(recursive=True)  # the ranks and theirs
        assert len(ranks) >= 2
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and ": done [" not in err, err
    assert err.splitlines()[-1] == "srifty: interrupted", err
    _, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, f"ranks still running after Ctrl-C: {[p.pid for p in alive]}"


def test_the_demo_takes_as_long_in_its_help_as_in_the_readme() -> None:
    """The README and `srifty demo --help` give the demo one duration."""
    import re

    from srifty_core.cli.parser import build_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    said = re.search(r"`scripts/demo` .*?[Ii]n about (\w+) minutes", readme, re.S)
    assert said is not None
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    helped = re.search(r"about (\w+) minutes", sub.choices["demo"].description)  # type: ignore[attr-defined]
    assert helped is not None and helped[1] == said[1]


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_with_one_line_naming_it(tmp_path: Path) -> None:
    """A local rank killed outside a preemption (no notice from the provider): the job
    ends with one line saying which rank died and how, that only a preemption is re-planned
    on the survivors, and that running the plan again resumes; no rank is left running."""
    import signal

    import psutil

    run = tmp_path / "run"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "model": "dlrm", "size": "tiny", "global_batch": 4, "iterations": 500,
        "local_batches": [2, 2], "run_dir": str(run), "step_sleep_s": 0.2,
        "checkpoint_every": 5,
    }))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "srifty_core.cli", "train", str(plan), "--no-mlflow",
         "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    ranks: dict[str, psutil.Process] = {}
    try:
        _wait_for_records(proc, run / "progress.jsonl", 3)
        for p in psutil.Process(proc.pid).children():
            with contextlib.suppress(psutil.Error):
                if "RANK" in p.environ():
                    ranks[p.environ()["RANK"]] = p
        assert set(ranks) == {"0", "1"}  # the last rank killed, the first named alive
        ranks["1"].send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err
    assert "rank 1 was killed by SIGKILL" in err, err
    assert "re-planned on the survivors" in err and "again to resume" in err, err
    _, alive = psutil.wait_procs(list(ranks.values()), timeout=30)
    assert not alive


def test_how_the_ranks_ended_names_each_rank_grouped_by_how() -> None:
    """The end-to-end case above kills the last of two ranks; a rank between others is
    named as well, and the others are grouped by how they ended."""
    from srifty_core.jobs.local_run import describe_exits

    assert describe_exits({0: 1, 1: -9, 2: 1}) == (
        "ranks 0, 2 exited with 1, rank 1 was killed by SIGKILL"
    )
    assert describe_exits({0: None, 1: -9, 2: -15, 3: 0}) == (
        "rank 0 still ran, rank 1 was killed by SIGKILL, rank 2 was killed by SIGTERM, "
        "rank 3 exited with 0"
    )


def _wait_for_records(proc: subprocess.Popen[str], log: Path, n: int) -> None:
    """Wait (at most 240 s) until ``log`` holds ``n`` records; ``proc`` must still run."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= n:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()


N_JOB = 30
"""Iterations of ``JOB``: 7.5 s of its steps' sleep alone. The first driver's ranks are
stopped (SIGSTOP) while the second, refused driver starts and ends, so however loaded the
host, the first is still mid-run then (its stall window is minutes); they go on before it
is killed, and its rerun has the rest to train."""
JOB: dict[str, object] = {
    "model": "dlrm", "size": "tiny", "global_batch": 16, "iterations": N_JOB,
    "offers": [{"type": "local.cpu", "market": "on-demand", "quota": 2, "price": 0.1}],
    "objective": "time", "provider": "local", "checkpoint_every": 5, "step_sleep_s": 0.25,
}  # fmt: skip


@pytest.mark.slow
def test_a_killed_train_job_run_again_resumes_its_run_in_the_same_folder(
    ready_to_plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 48: `srifty train --job JOB.yaml` killed (SIGKILL), then run again, started
    over at 0 in a new run folder. Now the rerun takes the unfinished run over: the same
    folder, resumed from its checkpoint, the log 1..N once each as written, nothing of the
    killed driver left 'running'. While the driver lives, the same job is refused in one
    line naming its folder; once finished, the run is no longer one to resume."""
    import signal

    import psutil
    import yaml

    from srifty_core.jobs.job_run import unfinished_run

    monkeypatch.chdir(tmp_path)  # the job's identity holds the folder it is run from
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    argv = [sys.executable, "-m", "srifty_core.cli", "train", "--job", str(job), "--no-progress",
            "--no-mlflow"]  # fmt: skip
    runs = ready_to_plan / "runs"
    ranks: list[psutil.Process] = []
    driver = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(runs.glob("*/progress.jsonl")) and time.monotonic() < deadline:
            assert driver.poll() is None, driver.communicate()
            time.sleep(0.2)
        (log,) = runs.glob("*/progress.jsonl")
        _wait_for_records(driver, log, 6)
        ranks = [p for p in psutil.Process(driver.pid).children() if _is_rank(p)]
        assert len(ranks) == 2, ranks
        for p in ranks:  # held mid-run: the first job cannot end while the second runs
            p.suspend()
        second = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
        alive = driver.poll() is None
    finally:
        for p in ranks:  # training again when its driver is killed, as before the hold
            with contextlib.suppress(psutil.Error):
                p.resume()
        driver.send_signal(signal.SIGKILL)
        driver.communicate()
    assert second.returncode == 2 and len(second.stderr.splitlines()) == 1, second.stderr
    assert f"run folder {log.parent} is in use" in second.stderr, second.stderr
    assert alive, "the first job ended before the second was refused"
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert rerun.returncode == 0, rerun.stderr
    assert [p.parent for p in runs.glob("*/progress.jsonl")] == [log.parent]  # no new folder
    assert f"run folder: {log.parent} (this job's unfinished run: resuming after" in rerun.stdout
    written = [json.loads(line)["iteration"] for line in log.read_text().splitlines()]
    assert written == list(range(1, N_JOB + 1)), written  # as written: none twice, none lost
    assert json.loads((log.parent / "outcome.json").read_text())["iterations"] == N_JOB
    for state in (ready_to_plan / "cloud" / "local").glob("*.json"):
        assert "running" not in json.loads(state.read_text())["instances"].values(), state
    assert unfinished_run(yaml.safe_load(job.read_text())) is None  # finished: a new run next


def _is_rank(p: object) -> bool:
    """Whether ``p`` (a ``psutil.Process``) is a training rank (the local provider sets
    its ``RANK``)."""
    import psutil

    assert isinstance(p, psutil.Process)
    try:
        return "RANK" in p.environ()
    except psutil.Error:
        return False
