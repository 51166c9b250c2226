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
    plan_path: str, allocation_id: str, params: dict[str, Any], started_at: float
) -> dict[str, Any]:
    """One monitor step as a JSON-able dict (``status``: running, finished or replan)."""
    from srifty_core.runtime.orchestrate import JobSpec, poll

    return poll(plan_path, allocation_id, JobSpec.from_params(params), started_at).to_dict()


class TrainingProgressTrigger(BaseTrigger):
    """Fires once the job is no longer running (or the monitor failed)."""

    def __init__(
        self,
        plan_path: str,
        allocation_id: str,
        params: dict[str, Any],
        started_at: float,
        poll_s: float = 5.0,
    ) -> None:
        super().__init__()
        self.plan_path = plan_path
        self.allocation_id = allocation_id
        self.params = params
        self.started_at = started_at
        self.poll_s = poll_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return TRIGGER_PATH, {
            "plan_path": self.plan_path,
            "allocation_id": self.allocation_id,
            "params": self.params,
            "started_at": self.started_at,
            "poll_s": self.poll_s,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                result = await asyncio.to_thread(
                    poll_once, self.plan_path, self.allocation_id, self.params, self.started_at
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

    template_fields = ("plan_path", "allocation_id", "started_at")

    def __init__(
        self,
        *,
        plan_path: Any,
        allocation_id: Any,
        started_at: Any,
        poll_s: float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.plan_path = plan_path
        self.allocation_id = allocation_id
        self.started_at = started_at
        self.poll_s = poll_s

    def execute(self, context: Any) -> None:
        self.defer(
            trigger=TrainingProgressTrigger(
                str(self.plan_path),
                str(self.allocation_id),
                dict(context["params"]),
                float(self.started_at),
                self.poll_s,
            ),
            method_name="execute_complete",
        )

    def poke(self, context: Any) -> bool:  # only used if someone runs it without deferring
        result = poll_once(
            str(self.plan_path),
            str(self.allocation_id),
            dict(context["params"]),
            float(self.started_at),
        )
        return bool(result["status"] != "running")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") == "error":
            raise RuntimeError(f"training monitor failed: {event['error']}")
        return event
