"""The training-progress monitor as a deferrable sensor and its trigger.

Thin adapters over ``srifty_core.jobs.monitor_step.Monitor`` (the monitor's step, the
one ``srifty train`` steps too: ``jobs.monitor_loop``), with the same retry rules
(``monitor_loop.Retry``), its waits awaited in the triggerer's event loop. The
trigger makes one ``Monitor`` for the configuration (the provider and its client, the
allocations and the progress log's read position are kept between steps) and steps it
every ``poll_s``. The cloud's state (instances taken back, workers ended) is read in the
triggerer's event loop through the provider's async hook (``cloud_watch.AsyncObserver``:
EC2 through ``EC2Hook.get_async_conn``, aiobotocore; the local provider in a thread); the
rest of a step runs in a thread and reads only what is new: the steps logged since the
last one and the small state file rank 0 replaces each step (never the checkpoint, never
torch), and logs the window's metrics to the job's MLflow run. A step
that fails with a transient error (a file system or network hiccup, the provider's API
throttling) is retried with exponential backoff; ``max_failures`` failures in a row, or a
deterministic error (the workers died, a bad plan), end the monitor with an error event.
The sensor defers with a timeout from the job's time limit (plus ``margin_s``), so a job
that never ends fails the sensor instead of holding it forever.

Nothing here imports ``srifty_core`` at parse time.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.triggers.base import BaseTrigger, TriggerEvent

TRIGGER_PATH = "srifty_monitor.TrainingProgressTrigger"
MAX_BACKOFF_S = 300.0
FIRST_WAIT_S = 1.0
"""The trigger's first wait between two steps; each wait doubles up to ``poll_s``. A short
job (a local one, the demo's) is seen to end within a second or two of its end, not up to
``poll_s`` later; a long one is stepped every ``poll_s`` after its first few steps."""


def make_monitor(
    job_path: str, allocation_ids: list[str], params: dict[str, Any], started_at: float
) -> tuple[Any, Any]:
    """The configuration's ``Monitor`` (logging live metrics to its MLflow run) and the
    ``AsyncObserver`` that reads its allocations' cloud state in the event loop."""
    from srifty_core.jobs import job_log
    from srifty_core.jobs.cloud_watch import AsyncObserver
    from srifty_core.jobs.job import JobPlan, JobSpec
    from srifty_core.jobs.monitor_step import Monitor

    live = job_log.live_metrics(JobPlan.load(job_path))
    spec = JobSpec.from_params(params)
    monitor = Monitor(job_path, allocation_ids, spec, started_at, live=live)
    return monitor, AsyncObserver(monitor.provider)


def is_deterministic(exc: BaseException) -> bool:
    """Errors a retry would meet again (``monitor_loop.is_deterministic``)."""
    from srifty_core.jobs.monitor_loop import is_deterministic as deterministic

    return deterministic(exc)


class TrainingProgressTrigger(BaseTrigger):
    """Fires once the job is no longer running, or the monitor failed for good."""

    def __init__(
        self,
        job_path: str,
        allocation_ids: list[str],
        params: dict[str, Any],
        started_at: float,
        poll_s: float = 5.0,
        max_failures: int = 6,
    ) -> None:
        super().__init__()
        self.job_path = job_path
        self.allocation_ids = list(allocation_ids)
        self.params = params
        self.started_at = started_at
        self.poll_s = poll_s
        self.max_failures = max_failures

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return TRIGGER_PATH, {
            "job_path": self.job_path,
            "allocation_ids": self.allocation_ids,
            "params": self.params,
            "started_at": self.started_at,
            "poll_s": self.poll_s,
            "max_failures": self.max_failures,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from srifty_core.jobs.monitor_loop import Retry

        monitor: Any = None
        observe: Any = None
        # monitor_loop.watch's rules, with the waits awaited in the triggerer's event loop
        retry = Retry(self.poll_s, self.max_failures, MAX_BACKOFF_S)
        wait_s = min(FIRST_WAIT_S, self.poll_s)
        while True:
            try:
                if monitor is None:
                    monitor, observe = await asyncio.to_thread(
                        make_monitor, self.job_path, self.allocation_ids, self.params,
                        self.started_at,
                    )  # fmt: skip
                # The cloud through the provider's async hook (EC2: aiobotocore) in this
                # loop; the run folder's files and MLflow in a thread.
                cloud = await observe(monitor.allocations)
                result = (await asyncio.to_thread(monitor.step, None, cloud)).to_dict()
            except Exception as exc:
                delay = retry.failed(exc)
                error = retry.describe(exc)
                if delay is None:
                    deterministic = is_deterministic(exc)
                    event = {"status": "error", "error": error, "deterministic": deterministic}
                    yield TriggerEvent(event)
                    return
                self.log.warning("monitor step failed (%s); retrying in %.1f s", error, delay)
                await asyncio.sleep(delay)
                continue
            retry.succeeded()
            if result["status"] != "running":
                yield TriggerEvent(result)
                return
            await asyncio.sleep(wait_s)
            wait_s = min(2.0 * wait_s, self.poll_s)


def deferral_timeout(params: dict[str, Any], default_s: float, margin_s: float) -> timedelta:
    """How long the monitor may wait: the job's time limit (what is left of it, for a
    re-plan) plus ``margin_s``; ``default_s`` when the job has no time limit."""
    limit = params.get("time_limit_s")
    if isinstance(limit, (int, float)) and math.isfinite(limit) and limit > 0:
        return timedelta(seconds=float(limit) + margin_s)
    return timedelta(seconds=default_s)


class TrainingProgressSensor(BaseSensorOperator):
    """Defers to ``TrainingProgressTrigger``; returns the monitor's final result.

    The deferral times out after the job's ``time_limit_s`` plus ``margin_s`` (``timeout``
    when the job has none): the sensor then fails with ``AirflowSensorTimeout`` and the
    teardown releases the VMs."""

    template_fields = ("job_path", "allocation_ids", "started_at")

    def __init__(
        self,
        *,
        job_path: Any,
        allocation_ids: Any,
        started_at: Any,
        poll_s: float = 5.0,
        margin_s: float = 600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_path = job_path
        self.allocation_ids = allocation_ids
        self.started_at = started_at
        self.poll_s = poll_s
        self.margin_s = margin_s

    def execute(self, context: Any) -> None:
        params = dict(context["params"])
        self.defer(
            trigger=TrainingProgressTrigger(
                str(self.job_path),
                [str(a) for a in self.allocation_ids],
                params,
                float(self.started_at),
                self.poll_s,
            ),
            method_name="execute_complete",
            timeout=deferral_timeout(params, float(self.timeout), self.margin_s),
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") == "error":
            message = f"training monitor failed: {event['error']}"
            if event.get("deterministic"):  # the workers died, a bad plan: a retry fails alike
                from airflow.sdk.exceptions import AirflowFailException

                raise AirflowFailException(message)
            raise RuntimeError(message)  # the cloud or the file system kept failing: retry
        self.log.info(
            "%s %s: %s (%s iterations done, %.0f s, $%.4f spent)",
            event.get("config_id", ""), event.get("status"), event.get("reason"),
            event.get("iterations_done"), float(event.get("elapsed_s") or 0.0),
            float(event.get("spent_usd") or 0.0),
        )  # fmt: skip
        return event
