"""The README's commands end to end on a fresh data folder: `srifty demo` (the main job),
then the Airflow walk-through ("Jobs through Airflow": `srifty ui`, then the what-if and
plan-and-train DAGs triggered with `srifty airflow`, watched to the end, the job in
MLflow), run from the README's own text. The walk-through's UI is also checked as a user
relies on it: on loopback only, its admin password in a file only its owner reads, and
nothing left running when SIGTERM stops it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from srifty_core import paths
from srifty_core.jobs.planning import _safe
from srifty_core.lifetime import free_port
from srifty_core.planner.whatif_report import report_path
from srifty_core.ui import PASSWORD_FILE
from tests.conftest import subprocess_env
from tests.test_ui import LOOPBACK, alive, listeners, tree

BIN = Path(sys.executable).parent
WALKTHROUGH = "**Jobs through Airflow.**"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`srifty demo` once, on a fresh data folder: (the folder, what it printed)."""
    root = tmp_path_factory.mktemp("demo") / "demo-data"
    proc = subprocess.run(
        [str(BIN / "srifty"), "--data-dir", str(root), "demo"],
        capture_output=True,
        text=True,
        timeout=1100,
        env=subprocess_env({"MLFLOW_TRACKING_URI": ""}),
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return root, proc.stdout


@pytest.mark.alone
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_demo_runs_the_whole_loop(demo: tuple[Path, str]) -> None:
    root, out = demo
    for stage in range(1, 9):
        assert f"[{stage}/8]" in out
    assert "champion: version 1" in out
    assert "preempted worker" in out and "re-planning run" in out, out[-4000:]
    assert "outcome: 40 of 40 iterations" in out
    assert "plan c0:" in out and "plan c1:" in out
    assert "case 6: no configuration meets the limits" in out
    assert "srifty-admin" in out
    assert (root / "mlflow" / "mlflow.db").is_file() and any((root / "runs").iterdir())


def walkthrough_blocks(readme: str) -> list[list[str]]:
    """The README walk-through's two bash blocks (the UI's terminal, then the other's),
    each as its command lines, comments dropped."""
    section = readme[readme.index(WALKTHROUGH) :]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[:2]
    return [[ln.split("  #")[0].strip() for ln in b.splitlines() if ln.strip()] for b in blocks]


def _runs(env: dict[str, str], dag_id: str) -> dict[str, str]:
    out = subprocess.run(
        [str(BIN / "srifty"), "airflow", "dags", "list-runs", dag_id, "-o", "json"],
        capture_output=True, text=True, env=env, check=True, timeout=120,
    ).stdout  # fmt: skip
    return {r["run_id"]: r["state"] for r in json.loads(out[out.index("[") :])}


def _db_runs(home: Path) -> dict[str, dict[str, str]]:
    """Every DAG's runs and their states, read from the data folder's metadata DB (SQLite)."""
    import sqlite3

    try:
        db = sqlite3.connect(f"file:{home / 'airflow.db'}?mode=ro", uri=True, timeout=10)
        with contextlib.closing(db):
            rows = db.execute("SELECT dag_id, run_id, state FROM dag_run").fetchall()
    except sqlite3.OperationalError:  # locked by a writer for longer than the timeout
        return {}
    out: dict[str, dict[str, str]] = {}
    for dag_id, run_id, state in rows:
        out.setdefault(dag_id, {})[run_id] = state
    return out


def _mlflow(port: int, path: str, **query: Any) -> Any:
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.alone
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_airflow_walkthrough_runs_as_written(demo: tuple[Path, str]) -> None:
    root, _ = demo
    ui_block, commands = walkthrough_blocks((paths.REPO_ROOT / "README.md").read_text())
    (ui_line,) = ui_block
    assert ui_line == ".venv/bin/srifty ui", ui_line
    assert commands and all(c.startswith(".venv/bin/srifty airflow ") for c in commands)
    env = subprocess_env({paths.ENV_VAR: str(root), "MLFLOW_TRACKING_URI": ""})
    a_port, m_port = free_port(), free_port()  # the README's 8080 and 5001 may be taken here
    ui = subprocess.Popen(
        [str(BIN / "srifty"), "ui", "--airflow-port", str(a_port), "--mlflow-port", str(m_port),
         "--password", "pw-test"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert ui.stdout is not None
        said = []
        for line in ui.stdout:
            said.append(line)
            if "Ctrl-C stops both" in line:
                break
        assert ui.poll() is None, "".join(said)
        # Airflow creates every DAG paused: the UI unpauses those one triggers (a triggered
        # run of a paused DAG would wait without a word), not those on a clock.
        (dags,) = [ln for ln in said if ln.startswith("DAGs you trigger, unpaused:")]
        unpaused, paused = dags.split(";", 1)
        for dag_id in ("srifty_plan_and_train", "srifty_what_if", "srifty_profile_model"):
            assert dag_id in unpaused, dags
        assert "srifty_probe_sweep" in paused and "srifty_catalog_refresh" in paused, dags
        pw = paths.airflow_home(root) / PASSWORD_FILE
        assert json.loads(pw.read_text()) == {"admin": "pw-test"}
        assert stat.S_IMODE(pw.stat().st_mode) == 0o600, oct(pw.stat().st_mode)
        before = {d: _runs(env, d) for d in ("srifty_what_if", "srifty_plan_and_train")}
        for command in commands:  # as written, from the repository root
            argv = shlex.split(command)
            argv[0] = str(BIN / Path(argv[0]).name)
            proc = subprocess.run(
                argv, capture_output=True, text=True, env=env, cwd=paths.REPO_ROOT,
                timeout=300, check=False,
            )  # fmt: skip
            assert proc.returncode == 0, f"{command}\n{proc.stdout}{proc.stderr}"[-4000:]
        # Wait for both runs to end, reading their states from the metadata DB: polling
        # with the README's list-runs lines started two CLIs (seconds of CPU each) every
        # few seconds, beside the runs on a 2-core host. The README's lines then say how
        # they ended.
        home = paths.airflow_home(root)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            in_db = _db_runs(home)
            new = {d: {r: s for r, s in in_db.get(d, {}).items() if r not in seen}
                   for d, seen in before.items()}  # fmt: skip
            states = [s for runs in new.values() for s in runs.values()]
            if all(runs for runs in new.values()) and all(
                s in ("success", "failed") for s in states
            ):
                break
            time.sleep(2)
        new = {
            d: {r: s for r, s in _runs(env, d).items() if r not in seen}
            for d, seen in before.items()
        }
        assert all(len(runs) == 1 for runs in new.values()), new
        ((what_if_run, what_if_state),) = new["srifty_what_if"].items()
        ((job_run, job_state),) = new["srifty_plan_and_train"].items()
        logs = {
            p.parent.name.removeprefix("task_id=") + "/" + p.name: p.read_text(errors="replace")
            for p in (home / "logs").glob(f"dag_id=srifty_plan_and_train/run_id={job_run}/*/*")
        }
        assert (what_if_state, job_state) == ("success", "success"), (new, sorted(logs))
        # The README's places: the what-if report and the job's run folder.
        report = report_path(what_if_run, root).with_name("report.md")
        assert report.is_file(), sorted((root / "reports").rglob("*"))
        outcome = json.loads((root / "runs" / _safe(job_run) / "outcome.json").read_text())
        assert outcome["iterations"] == outcome["target_iterations"] == 40, outcome
        # Task logs that say what was planned, launched, decided and released.
        said_by = {"plan": "planned c0", "provision": "launched", "monitor": "finished",
                   "release": "released"}  # fmt: skip
        for task, words in said_by.items():
            text = "".join(v for k, v in logs.items() if k.startswith(f"{task}/"))
            assert words in text, f"{task}'s log lacks {words!r}: {text[-2000:]}"
        # The job in MLflow's srifty-jobs experiment, as the MLflow UI shows it.
        exp = _mlflow(m_port, "experiments/get-by-name", experiment_name="srifty-jobs")
        req = urllib.request.Request(
            f"http://127.0.0.1:{m_port}/api/2.0/mlflow/runs/search",
            data=json.dumps({
                "experiment_ids": [exp["experiment"]["experiment_id"]],
                "filter": f"tags.`srifty.airflow_run` = '{job_run}'",
            }).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=30) as resp:
            found = json.loads(resp.read()).get("runs", [])
        assert found, f"no MLflow run tagged with the DAG run {job_run}"
        # Every server on loopback only (a log server starts beside its component's first
        # heartbeat: long since, by now); then SIGTERM to `srifty ui` alone stops them all.
        running = tree(ui.pid)
        listening = listeners(running)
        assert {port for _, _, port in listening} >= {a_port, m_port}, listening
        assert not [x for x in listening if x[1] not in LOOPBACK], listening
        ui.send_signal(signal.SIGTERM)
        ui.wait(timeout=90)
        assert ui.returncode == 0
        assert not alive(running, grace_s=10), "processes left after SIGTERM"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ui.pid, signal.SIGTERM)
        try:
            ui.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()
