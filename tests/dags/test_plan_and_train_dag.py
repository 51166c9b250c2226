"""Run srifty_plan_and_train for real with dag.test() on local workers with a tiny model."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from srifty_core.cloud.local import LocalProvider, pid_alive
from srifty_core.runtime.progress import read_progress

pytestmark = pytest.mark.airflow

DAG_ID = "srifty_plan_and_train"
N = 30
CONF: dict[str, Any] = {
    "model": "dlrm",
    "size": "tiny",
    "global_batch": 8,
    "iterations": N,
    "workers": 2,
    "provider": "local",
    "checkpoint_every": 5,
}


def _allocations(provider: LocalProvider) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(provider.state_dir.glob("local-*.json"))]


def _nothing_left_running(provider: LocalProvider) -> None:
    states = _allocations(provider)
    assert states, "nothing was provisioned"
    for s in states:
        assert all(v != "running" for v in s["instances"].values()), s["instances"]
        assert not any(pid_alive(p["pid"], p["start_ticks"]) for p in s["processes"])


def _runs_dirs(data_dir: Path) -> list[Path]:
    return sorted(p for p in (data_dir / "runs").iterdir() if p.is_dir())


def test_plan_and_train_runs_to_the_last_iteration(dagbag: Any, data_dir: Path) -> None:
    run = dagbag.get_dag(DAG_ID).test(run_conf=CONF)
    assert run.state == "success"
    (run_dir,) = _runs_dirs(data_dir)
    recs = read_progress(run_dir / "progress.jsonl")
    assert [r.iteration for r in recs] == list(range(1, N + 1))
    _nothing_left_running(LocalProvider())
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["finished"] == "success" and states["release"] == "success"
    assert states["child_conf"] == "skipped" and states["trigger_replan"] == "skipped"


@pytest.mark.slow
def test_a_preemption_triggers_a_resuming_child_run(dagbag: Any, data_dir: Path) -> None:
    provider = LocalProvider()
    seen: list[str] = []

    def reclaim() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            runs = (data_dir / "runs").glob("*/progress.jsonl")
            if any(len(read_progress(p)) >= 5 for p in runs):
                (state,) = _allocations(provider)
                iid = state["allocation"]["instance_ids"][1]
                provider.interrupt(iid)
                seen.append(iid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=reclaim, daemon=True)
    killer.start()
    dag = dagbag.get_dag(DAG_ID)
    run = dag.test(run_conf={**CONF, "step_sleep_s": 0.3, "budget_usd": 5.0})
    killer.join(timeout=5)
    assert seen, "the job ended before it could be interrupted"
    assert run.state == "success"
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["trigger_replan"] == "success" and states["finished"] == "skipped"
    assert states["release"] == "success"
    _nothing_left_running(provider)

    from airflow.models.dagrun import DagRun

    children = [r for r in DagRun.find(dag_id=DAG_ID) if (r.conf or {}).get("resume")]
    children = [r for r in children if r.conf["resume"]["parent_run_id"] == run.run_id]
    assert len(children) == 1
    conf = children[0].conf
    (run_dir,) = _runs_dirs(data_dir)
    done = conf["resume"]["iterations_done"]
    assert 5 <= done < N and conf["iterations"] == N - done
    assert conf["workers"] == 1 and conf["budget_usd"] == pytest.approx(5.0)
    assert conf["resume"]["checkpoint"] == str(run_dir / "checkpoint.pt")
    assert conf["resume"]["depleted"] == ["local.cpu"]


def test_bad_trigger_names_the_field(dagbag: Any) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.get_dag(DAG_ID)
    with pytest.raises(ParamValidationError, match="provider"):
        dag.test(run_conf={**CONF, "provider": "gcp"})
    with pytest.raises(ParamValidationError, match="global_batch"):
        dag.test(run_conf={**CONF, "global_batch": 0})
    with pytest.raises(ParamValidationError, match="resume"):
        dag.test(run_conf={**CONF, "resume": {"iterations_done": 3}})
