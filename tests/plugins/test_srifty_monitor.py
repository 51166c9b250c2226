"""The monitor trigger serializes, deserializes, and fires on the job's outcome."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from srifty_core import paths
from srifty_core.runtime import orchestrate as orc

pytestmark = pytest.mark.airflow


@pytest.fixture()
def plugin(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(paths.PLUGINS_DIR))
    return importlib.import_module("srifty_monitor")


PARAMS: dict[str, Any] = {
    "model": "dlrm",
    "size": "tiny",
    "global_batch": 4,
    "iterations": 3,
    "offers": [{"type": "local.cpu", "market": "on-demand", "quota": 1, "price": 0.1}],
    "checkpoint_every": 1,
}


def test_trigger_round_trips_through_its_classpath(plugin: Any) -> None:
    trigger = plugin.TrainingProgressTrigger("/p/job-c0.json", ["local-1"], PARAMS, 12.5, 0.5)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert kwargs["params"] == PARAMS and kwargs["started_at"] == 12.5


async def _first_event(trigger: Any) -> Any:
    async for event in trigger.run():
        return event
    return None


def test_trigger_fires_when_the_job_finished(plugin: Any, ready_to_plan: Path) -> None:
    spec = orc.JobSpec.from_params(PARAMS)
    plan_path = orc.plan_job(spec, "t", track=False)
    alloc = orc.provision(plan_path)
    try:
        t0 = orc.start_training(plan_path, alloc)
        trigger = plugin.TrainingProgressTrigger(str(plan_path), alloc, PARAMS, t0, 0.1)
        event = asyncio.run(asyncio.wait_for(_first_event(trigger), timeout=120))
    finally:
        orc.release(alloc)
    assert event.payload["status"] == orc.FINISHED
    assert event.payload["iterations_done"] == 3


def test_trigger_reports_a_failed_poll_and_the_sensor_raises(plugin: Any, data_dir: Path) -> None:
    missing = "/missing/job-c0.json"
    trigger = plugin.TrainingProgressTrigger(missing, ["local-x"], PARAMS, time.time())
    event = asyncio.run(asyncio.wait_for(_first_event(trigger), timeout=30))
    assert event.payload["status"] == "error" and "job-c0.json" in event.payload["error"]
    sensor = plugin.TrainingProgressSensor(
        task_id="m", job_path="p", allocation_ids=["a"], started_at=0.0
    )
    with pytest.raises(RuntimeError, match="training monitor failed"):
        sensor.execute_complete({}, event.payload)
    assert sensor.execute_complete({}, {"status": "finished"}) == {"status": "finished"}


def test_plugin_module_imports_no_srifty_runtime_at_parse() -> None:
    import subprocess

    code = (
        f"import sys; sys.path.insert(0, {str(paths.PLUGINS_DIR)!r}); import srifty_monitor; "
        "print('srifty_core.runtime.orchestrate' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
