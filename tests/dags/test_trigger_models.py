"""A DAG trigger names a model as data, never as code to run here: a file path in a conf is
refused with one line before anything imports it (``workload.registered_model``), in the
plan-and-train, profiling and what-if DAGs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dags.services import fresh
from tests.dags.test_plan_and_train_ec2 import CONF as EC2_CONF
from tests.planner.test_cli_plan import write_planning_data

pytestmark = pytest.mark.airflow

SPY = """
from pathlib import Path

Path({marker!r}).write_text("imported")


def build():
    from torch import nn

    import torch

    def batch(b, gen):
        return torch.randn(b, 8, generator=gen), torch.randint(0, 3, (b,), generator=gen)

    return nn.Linear(8, 3), batch, lambda m, x: nn.functional.cross_entropy(m(x[0]), x[1])
"""


@pytest.fixture
def spy(tmp_path: Path) -> tuple[str, Path]:
    """A factory file that leaves a marker when anything imports it."""
    marker = tmp_path / "imported"
    path = tmp_path / "evil.py"
    path.write_text(SPY.format(marker=str(marker)))
    return f"{path}:build", marker


def _refused(run: Any, task_id: str, model: str, logged: str) -> None:
    assert run.state == "failed"
    ti = run.get_task_instance(task_id)
    assert ti.state == "failed" and ti.try_number == 1  # deterministic: no retry
    said = f"model: {model!r} is a file path: a trigger may name only a registered model"
    # the whole reason on the line that names the model
    assert any(said in ln and "SRIFTY_TRIGGER_MODELS" in ln for ln in logged.splitlines())


def test_plan_and_train_refuses_a_file_path(
    dagbag: Any, ready_to_plan: Path, spy: tuple[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    """GPU offers without a profile of the model: the plan would count its operators."""
    model, marker = spy
    run = fresh(dagbag, "srifty_plan_and_train").test(run_conf={**EC2_CONF, "model": model})
    _refused(run, "plan", model, "".join(capfd.readouterr()))
    assert not marker.exists()


def test_profile_model_refuses_a_file_path(
    dagbag: Any, spy: tuple[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    model, marker = spy
    conf = {"model": model, "size": "tiny", "device_types": ["cpu"], "probes": 2, "repeats": 2}
    run = fresh(dagbag, "srifty_profile_model").test(run_conf={**conf, "max_batch": 4})
    logged = "".join(capfd.readouterr())
    assert not marker.exists()
    said = f"model: {model!r} is a file path: a trigger may name only a registered model"
    assert run.state == "failed" and said in logged


def test_what_if_refuses_a_file_path(
    dagbag: Any, data_dir: Path, spy: tuple[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    model, marker = spy
    request = yaml.safe_load(write_planning_data(data_dir).read_text())
    conf = {"request": {**request, "model": model}, "scenarios": ["budget_usd=40"]}
    run = fresh(dagbag, "srifty_what_if").test(run_conf={**conf, "bandwidth": "probes"})
    _refused(run, "what_if", model, "".join(capfd.readouterr()))
    assert not marker.exists()
