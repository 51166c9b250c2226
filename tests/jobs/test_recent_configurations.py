"""The configurations recent plans chose, read back from the MLflow job runs (what the
probe sweep's mix choice starts from)."""

from __future__ import annotations

from pathlib import Path

from srifty_core.jobs.job_log import EXPERIMENT, recent_configurations
from srifty_core.tracking.runs import RunLog, srifty_tags


def test_recent_configurations_are_the_job_and_replan_runs_with_a_plan(data_dir: Path) -> None:
    assert recent_configurations() == []  # no job experiment yet
    runs = RunLog.open(EXPERIMENT)
    runs.create_run("job a", srifty_tags(kind="job", configuration="1xa.1@8+1xb.4@4"))
    runs.create_run("no plan", srifty_tags(kind="job"))
    runs.create_run("re-plan", srifty_tags(kind="replan", configuration="2xa.1@8"))
    assert sorted(recent_configurations()) == ["1xa.1@8+1xb.4@4", "2xa.1@8"]
    assert recent_configurations(days=-1) == []  # started before the window
