"""Run srifty_what_if for real with dag.test(): a request, two scenarios and one more VM
per type, planned on the probe table (the planning test data of `srifty plan`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.planner.test_cli_plan import write_planning_data

pytestmark = pytest.mark.airflow


def test_what_if_writes_the_report(dagbag: Any, data_dir: Path) -> None:
    request = yaml.safe_load(write_planning_data(data_dir).read_text())
    dag = dagbag.get_dag("srifty_what_if")
    run = dag.test(
        run_conf={
            "request": request,
            "scenarios": ["quota[g4dn.xlarge]=2", "budget_usd=40"],
            "one_more_vm": True,
            "bandwidth": "probes",
        }
    )
    assert run.state == "success"
    (report,) = (data_dir / "reports" / "what_if").glob("*/report.json")
    out = json.loads(report.read_text())
    assert [a["scenario"] for a in out["what_if"]] == ["quota[g4dn.xlarge]=2", "budget_usd=40"]
    assert len(out["one_more_vm"]) == 2  # one per offered type
    assert out["base"]["best"] is not None and out["simulations"]["reused"] > 0
    assert (report.parent / "report.md").read_text().startswith("# What-if report")


def test_a_bad_scenario_fails_at_once_naming_it(dagbag: Any, data_dir: Path) -> None:
    request = yaml.safe_load(write_planning_data(data_dir).read_text())
    dag = dagbag.get_dag("srifty_what_if")
    run = dag.test(
        run_conf={"request": request, "scenarios": ["qouta[g4dn.xlarge]=2"], "bandwidth": "probes"}
    )
    assert run.state == "failed"
    assert not list((data_dir / "reports").glob("what_if/*/report.json"))


def test_a_fresh_install_plans_on_the_public_tables(dagbag: Any, data_dir: Path) -> None:
    """No champion yet (nothing probed or refreshed): the DAG plans as `srifty plan` does,
    on the model of the shipped public nccl-tests tables, instead of failing."""
    request = {
        "model": "resnet50",
        "global_batch": 1024,
        "iterations": 400,
        "offers": [
            {"type": "p3.8xlarge", "market": "spot", "quota": 2},
            {"type": "g4dn.8xlarge", "market": "on-demand", "quota": 8},
        ],
    }
    dag = dagbag.get_dag("srifty_what_if")
    conf = {"request": request, "scenarios": ["budget_usd=8"], "bandwidth": "champion"}
    run = dag.test(run_conf=conf)
    assert run.state == "success"
    (report,) = (data_dir / "reports" / "what_if").glob("*/report.json")
    out = json.loads(report.read_text())
    assert out["bandwidth_model"]["kind"] == "public"
    assert out["base"]["best"] is not None
