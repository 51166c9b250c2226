"""Run srifty_model_refresh for real with dag.test() on a small synthetic probe store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.predictors.bw_rows import write_store

pytestmark = pytest.mark.airflow


def test_model_refresh_schedule(dagbag: Any) -> None:
    dag = dagbag.get_dag("srifty_model_refresh")
    assert [t.task_id for t in dag.topological_sort()] == [
        "load_data",
        "tune_and_fit",
        "evaluate",
        "register",
        "promote",
    ]
    assert type(dag.timetable).__name__ == "AssetOrTimeSchedule"


def test_model_refresh_registers_and_promotes(dagbag: Any, data_dir: Path) -> None:
    from srifty_core.predictors.registry import CHAMPION, alias_version, load_champion

    write_store(allocations=3)
    dag = dagbag.get_dag("srifty_model_refresh")
    run = dag.test(
        run_conf={"since_days": None, "half_life_days": None, "budget_s": 5, "max_trials": 1}
    )
    assert run.state == "success"
    assert alias_version(CHAMPION) == "1"
    assert load_champion().bandwidth_cap("g4dn.xlarge", 2) > 0


def test_model_refresh_on_an_empty_store_fails_and_registers_nothing(
    dagbag: Any, data_dir: Path
) -> None:
    from srifty_core.predictors.registry import CHAMPION, alias_version

    dag = dagbag.get_dag("srifty_model_refresh")
    run = dag.test(run_conf={"budget_s": 5, "max_trials": 1})
    assert run.state == "failed"
    assert alias_version(CHAMPION) is None
