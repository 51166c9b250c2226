"""The monitor trigger serializes, deserializes, fires on the job's outcome, rides out
transient errors, and the sensor gives up at its timeout."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from srifty_core import paths
from srifty_core.jobs import orchestrate as orc

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
    trigger = plugin.TrainingProgressTrigger("/p/job-c0.json", ["local-1"], PARAMS, 12.5, 0.5, 3)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert kwargs["params"] == PARAMS and kwargs["started_at"] == 12.5
    assert kwargs["max_failures"] == 3


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


def test_a_persistent_failure_ends_the_monitor_and_the_sensor_raises(
    plugin: Any, data_dir: Path
) -> None:
    missing = "/missing/job-c0.json"  # FileNotFoundError: transient, retried, then given up
    trigger = plugin.TrainingProgressTrigger(
        missing, ["local-x"], PARAMS, time.time(), poll_s=0.01, max_failures=3
    )
    event = asyncio.run(asyncio.wait_for(_first_event(trigger), timeout=30))
    assert event.payload["status"] == "error" and "job-c0.json" in event.payload["error"]
    assert "after 3 failed steps in a row" in event.payload["error"]
    assert event.payload["deterministic"] is False
    sensor = plugin.TrainingProgressSensor(
        task_id="m", job_path="p", allocation_ids=["a"], started_at=0.0
    )
    with pytest.raises(RuntimeError, match="training monitor failed"):
        sensor.execute_complete({}, event.payload)
    assert sensor.execute_complete({}, {"status": "finished"}) == {"status": "finished"}


class _Flaky:
    """A monitor whose first steps fail as a shared file system may, and its cloud reader,
    whose first reads fail as a cloud API may (a fake: the errors are the point)."""

    def __init__(
        self,
        errors: list[BaseException],
        final: dict[str, Any],
        cloud_errors: list[BaseException] | None = None,
    ) -> None:
        self.errors, self.final, self.steps = errors, final, 0
        self.cloud_errors, self.reads = list(cloud_errors or []), 0
        self.allocations: list[Any] = []

    async def observe(self, allocations: list[Any]) -> str:
        self.reads += 1
        if self.cloud_errors:
            raise self.cloud_errors.pop(0)
        return "view"

    def step(self, now: float | None = None, cloud: Any = None) -> Any:
        assert now is None and cloud == "view"
        self.steps += 1
        if self.errors:
            raise self.errors.pop(0)
        final = self.final

        class _Result:
            def to_dict(self) -> dict[str, Any]:
                return dict(final)

        return _Result()


def test_a_transient_error_in_a_step_does_not_end_the_monitor(
    plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    flaky = _Flaky(
        [OSError("stale file handle"), TimeoutError("MLflow")],
        {"status": "finished"},
        cloud_errors=[ConnectionError("EC2 API unreachable")],
    )
    monkeypatch.setattr(plugin, "make_monitor", lambda *a: (flaky, flaky.observe))
    trigger = plugin.TrainingProgressTrigger("/p/job-c0.json", ["a"], PARAMS, 0.0, poll_s=0.01)
    event = asyncio.run(asyncio.wait_for(_first_event(trigger), timeout=30))
    # 3 failures in a row (< max_failures), then a good step ends it
    assert event.payload == {"status": "finished"} and flaky.reads == 4 and flaky.steps == 3


def test_a_deterministic_error_ends_the_monitor_at_once(
    plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = orc.TrainingFailed("workers exited at iteration 2 of 3 without a preemption")
    flaky = _Flaky([dead], {"status": "finished"})
    monkeypatch.setattr(plugin, "make_monitor", lambda *a: (flaky, flaky.observe))
    trigger = plugin.TrainingProgressTrigger("/p/job-c0.json", ["a"], PARAMS, 0.0, poll_s=0.01)
    event = asyncio.run(asyncio.wait_for(_first_event(trigger), timeout=30))
    assert event.payload["status"] == "error" and "TrainingFailed" in event.payload["error"]
    assert flaky.steps == 1 and event.payload["deterministic"] is True
    # ... and the sensor fails without a retry (a persistent transient failure may retry).
    from airflow.sdk.exceptions import AirflowFailException

    sensor = plugin.TrainingProgressSensor(
        task_id="m", job_path="p", allocation_ids=["a"], started_at=0.0
    )
    with pytest.raises(AirflowFailException, match="TrainingFailed"):
        sensor.execute_complete({}, event.payload)


def test_the_sensor_defers_with_the_jobs_time_limit_and_gives_up_at_it(plugin: Any) -> None:
    from datetime import timedelta

    from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason
    from airflow.sdk.exceptions import AirflowSensorTimeout, TaskDeferred

    sensor = plugin.TrainingProgressSensor(
        task_id="m", job_path="/p/job-c0.json", allocation_ids=["a"], started_at=1.0,
        timeout=3600, margin_s=60,
    )  # fmt: skip
    with pytest.raises(TaskDeferred) as limited:
        sensor.execute({"params": {**PARAMS, "time_limit_s": 900.0}})
    assert limited.value.timeout == timedelta(seconds=960)  # the job's limit plus the margin
    with pytest.raises(TaskDeferred) as unlimited:
        sensor.execute({"params": PARAMS})
    assert unlimited.value.timeout == timedelta(seconds=3600)  # the sensor's own timeout
    # The scheduler ends a deferral that outlived its timeout with this; the sensor fails.
    with pytest.raises(AirflowSensorTimeout):
        sensor.resume_execution(
            TRIGGER_FAIL_REPR, {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, {}
        )


def test_plugin_module_imports_no_srifty_runtime_at_parse() -> None:
    import subprocess

    code = (
        f"import sys; sys.path.insert(0, {str(paths.PLUGINS_DIR)!r}); import srifty_monitor; "
        "print('srifty_core.jobs.orchestrate' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_trigger_and_its_monitor_step_never_import_torch(tmp_path: Path) -> None:
    """What the triggerer loads (the plugin, the monitor's step, the live MLflow sink) and a
    step on a running job (a plan, a progress log, a state file) stay free of torch."""
    import subprocess

    code = f"""
import json, sys, time
sys.path.insert(0, {str(paths.PLUGINS_DIR)!r})
import srifty_monitor
from srifty_core.jobs import job_log, monitor_step, orchestrate
from srifty_core.cloud.base import LaunchRequest
from srifty_core.cloud.local import LocalProvider
from srifty_core.jobs.job import JobPlan, JobSpec, Launch
from srifty_core.runs.progress import ProgressLog, ProgressRecord, TrainState, write_state
run = {str(tmp_path)!r}
json.dump({{"iterations": 3, "global_batch": 4, "run_dir": run, "config_id": "c0"}},
          open(run + "/plan-c0.json", "w"))
job = JobPlan("c0", "local", "local", run + "/plan-c0.json",
              (Launch("local.cpu", "on-demand", 1, 1, 4),), 0.1, {{"t_iter_s": 0.01}}, ("x",))
job.save(__import__("pathlib").Path(run) / "job-c0.json")
provider = LocalProvider(__import__("pathlib").Path(run) / "cloud")
alloc = provider.launch(LaunchRequest("local.cpu", count=1))
t0 = time.time() - 1
with ProgressLog(run + "/progress.jsonl") as log:
    for i in range(1, 4):
        log.append(ProgressRecord(i, t0 + 0.1 * i, 0.01, 4, "c0"))
write_state(run + "/state.json", TrainState(3, time.time(), "c0", 3, 0.5))
spec = JobSpec.from_params({PARAMS!r})
seen = []
m = monitor_step.Monitor(run + "/job-c0.json", [alloc.id], spec, t0, provider=provider,
                         live=lambda metrics, step, at: seen.append(metrics))
from srifty_core.jobs.cloud_watch import AsyncObserver
view = __import__("asyncio").run(AsyncObserver(provider)(m.allocations))
r = m.step(cloud=view)
print(r.status, r.iterations_done, sorted(seen[0]) if seen else None, "torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    status, done, *rest = out.stdout.split(maxsplit=2)
    assert (status, done) == ("running", "3")  # no worker ran, so none has exited yet
    assert "live_loss" in rest[0] and "live_t_iter_error_pct" in rest[0]
    assert out.stdout.split()[-1] == "False"


def test_the_waits_between_steps_start_short_and_double_up_to_poll_s(
    plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short job is seen to end soon after it ends; a long one is stepped every poll_s."""

    class Running:
        steps = 0

        async def observe(self, allocations: Any) -> None:
            return None

        def step(self, now: Any, cloud: Any) -> Any:
            self.steps += 1
            status = "running" if self.steps < 6 else "finished"
            return type("R", (), {"to_dict": lambda _: {"status": status}})()

        allocations = ()

    job = Running()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(plugin, "make_monitor", lambda *a: (job, job.observe))
    monkeypatch.setattr(plugin.asyncio, "sleep", sleep)
    trigger = plugin.TrainingProgressTrigger("/p/job-c0.json", ["a"], PARAMS, 0.0, poll_s=5.0)
    event = asyncio.run(asyncio.wait_for(_first_event(trigger), timeout=30))
    assert event.payload == {"status": "finished"} and job.steps == 6
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
