"""Run srifty_model_refresh for real with dag.test() on a small synthetic probe store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from srifty_core.errors import ConfigError
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
        "remove_staging",
    ]
    assert dag.get_task("load_data").is_setup and dag.get_task("remove_staging").is_teardown
    assert type(dag.timetable).__name__ == "AssetTriggeredTimetable"  # once per new data


@pytest.mark.slow
def test_model_refresh_registers_and_promotes(dagbag: Any, data_dir: Path) -> None:
    from srifty_core.predictors.registry import (
        CHALLENGER,
        CHAMPION,
        alias_version,
        load_champion,
    )

    write_store(allocations=3)
    dag = dagbag.get_dag("srifty_model_refresh")
    run = dag.test(run_conf={"since_days": None, "half_life_days": None, "n_trials": 1})
    assert run.state == "success"
    assert alias_version(CHAMPION) == "1"
    assert load_champion().bandwidth_cap("g4dn.xlarge", 2) > 0
    assert not list((data_dir / "models" / "bandwidth").iterdir())  # staging removed
    # the same data again: the run succeeds and registers nothing
    again = dag.test(run_conf={"since_days": None, "half_life_days": None, "n_trials": 1})
    assert again.state == "success"
    assert alias_version(CHAMPION) == "1" and alias_version(CHALLENGER) == "1"
    assert not list((data_dir / "models" / "bandwidth").iterdir())


def test_model_refresh_on_an_empty_store_fails_and_registers_nothing(
    dagbag: Any, data_dir: Path
) -> None:
    from srifty_core.predictors.registry import CHAMPION, alias_version

    dag = dagbag.get_dag("srifty_model_refresh")
    run = dag.test(run_conf={"n_trials": 1})
    assert run.state == "failed"
    assert alias_version(CHAMPION) is None


def test_model_refresh_rejects_the_old_time_budget(
    dagbag: Any, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srifty_core.predictors.refresh.config import TUNE_ROWS, check_tuning_options
    from srifty_core.predictors.registry import CHAMPION, alias_version

    write_store(allocations=3)
    dag = dagbag.get_dag("srifty_model_refresh")
    assert "budget_s" not in dag.params and dag.params["n_trials"] == 30
    assert dag.params["tune_rows"] == TUNE_ROWS  # the DAG file cannot import it (parse time)
    for t in dag.tasks:  # a config error does not heal on retry: no retry delay here
        monkeypatch.setattr(t, "retries", 0)
    run = dag.test(run_conf={"budget_s": 120})
    assert run.state == "failed"
    assert alias_version(CHAMPION) is None
    with pytest.raises(ConfigError, match=r"'budget_s' was removed.*n_trials"):
        check_tuning_options({"budget_s": 120}, "run conf")
