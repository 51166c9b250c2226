"""Run srifty_catalog_refresh for real with dag.test()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.airflow


def test_catalog_refresh_runs_and_writes_the_report(dagbag: Any, data_dir: Path) -> None:
    dag = dagbag.get_dag("srifty_catalog_refresh")
    run = dag.test(run_conf={"regions": ["us-west-2"], "fail_on_error": True})
    assert run.state == "success"
    reports = sorted((data_dir / "reports" / "catalog").glob("*/report.json"))
    assert len(reports) == 1
    summary = json.loads(reports[0].read_text())["summary"]
    assert summary["regions"] == ["us-west-2"]
    from srifty_core.catalog import Catalog

    shipped = len(Catalog.load().by_region("us-west-2"))  # 36 with p5en.48xlarge
    assert summary["rows"] == shipped and summary["errors"] == 0
    assert {f["region"] for f in json.loads(reports[0].read_text())["findings"]} == {"us-west-2"}


def test_bad_conf_names_the_field(dagbag: Any) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.get_dag("srifty_catalog_refresh")
    with pytest.raises(ParamValidationError, match="regions"):
        dag.test(run_conf={"regions": ["nowhere"]})
