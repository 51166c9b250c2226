"""The training-progress monitor as a deferrable sensor and its trigger.

Thin adapters: the decision is ``srifty_core.runtime.orchestrate.poll`` (the monitor's
step); the trigger calls it every ``poll_s`` in a thread of the triggerer and fires when
the job finished or must re-plan, and the sensor hands that result on as its XCom value.
Nothing here imports ``srifty_core`` at parse time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.triggers.base import BaseTrigger, TriggerEvent

TRIGGER_PATH = "srifty_monitor.TrainingProgressTrigger"


def poll_once(
    job_path: str, allocation_ids: list[str], params: dict[str, Any], started_at: float
) -> dict[str, Any]:
    """One monitor step as a JSON-able dict (``status``: running, finished or replan)."""
    from srifty_core.runtime.orchestrate import JobSpec, poll

    return poll(job_path, allocation_ids, JobSpec.from_params(params), started_at).to_dict()


class TrainingProgressTrigger(BaseTrigger):
    """Fires once the job is no longer running (or the monitor failed)."""

    def __init__(
        self,
        job_path: str,
        allocation_ids: list[str],
        params: dict[str, Any],
        started_at: float,
        poll_s: float = 5.0,
    ) -> None:
        super().__init__()
        self.job_path = job_path
        self.allocation_ids = list(allocation_ids)
        self.params = params
        self.started_at = started_at
        self.poll_s = poll_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return TRIGGER_PATH, {
            "job_path": self.job_path,
            "allocation_ids": self.allocation_ids,
            "params": self.params,
            "started_at": self.started_at,
            "poll_s": self.poll_s,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                result = await asyncio.to_thread(
                    poll_once, self.job_path, self.allocation_ids, self.params, self.started_at
                )
            except Exception as exc:  # the sensor re-raises it in a worker
                yield TriggerEvent({"status": "error", "error": f"{type(exc).__name__}: {exc}"})
                return
            if result["status"] != "running":
                yield TriggerEvent(result)
                return
            await asyncio.sleep(self.poll_s)


class TrainingProgressSensor(BaseSensorOperator):
    """Defers to ``TrainingProgressTrigger``; returns the monitor's final result."""

    template_fields = ("job_path", "allocation_ids", "started_at")

    def __init__(
        self,
        *,
        job_path: Any,
        allocation_ids: Any,
        started_at: Any,
        poll_s: float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_path = job_path
        self.allocation_ids = allocation_ids
        self.started_at = started_at
        self.poll_s = poll_s

    def execute(self, context: Any) -> None:
        self.defer(
            trigger=TrainingProgressTrigger(
                str(self.job_path),
                [str(a) for a in self.allocation_ids],
                dict(context["params"]),
                float(self.started_at),
                self.poll_s,
            ),
            method_name="execute_complete",
        )

    def poke(self, context: Any) -> bool:  # only used if someone runs it without deferring
        result = poll_once(
            str(self.job_path),
            [str(a) for a in self.allocation_ids],
            dict(context["params"]),
            float(self.started_at),
        )
        return bool(result["status"] != "running")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") == "error":
            raise RuntimeError(f"training monitor failed: {event['error']}")
        return event
