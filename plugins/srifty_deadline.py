"""The job's deadline alert: a run of ``srifty_plan_and_train`` should be done by its
queue time plus the conf's ``time_limit_s`` (what is left of it, for a re-plan), plus a
margin (the ``DeadlineAlert``'s interval). Airflow evaluates ``JobTimeLimitDeadline`` when
the run is created (no deadline for a job without a time limit) and, when the run is
still going at that time, the triggerer runs ``job_over_time_limit``: it tags the job's
MLflow runs ``srifty.deadline_missed`` and logs a warning. The run itself is not stopped
here: the monitor's deferral times out at the same limit and the teardown releases the VMs.

The reference class is registered by ``SriftyDeadlinesPlugin`` (Airflow finds custom
deadline references through plugins, in every process that creates runs). Where a
``dag.test()`` runs the DAGs (the demo, the tests), ``job_deadline_alert`` declares none:
see ``srifty_core.airflow_env.DEADLINE_ALERTS_ENV``. Nothing here imports more of
``srifty_core`` at parse time than that light module.
"""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import datetime, timedelta
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk.definitions.deadline import BaseDeadlineReference

log = logging.getLogger(__name__)


def time_limit_s(conf: Any) -> float | None:
    """The conf's ``time_limit_s`` when it is a positive finite number."""
    limit = conf.get("time_limit_s") if isinstance(conf, dict) else None
    if not isinstance(limit, (int, float)) or isinstance(limit, bool):
        return None
    return float(limit) if math.isfinite(limit) and limit > 0 else None


class JobTimeLimitDeadline(BaseDeadlineReference):
    """When the run's job must be done: its queue time (or, before it is queued, the time it
    may run after) plus its conf's ``time_limit_s``; none without a limit."""

    required_kwargs = frozenset({"dag_id", "run_id"})

    def _evaluate_with(self, *, session: Any, **kwargs: Any) -> datetime | None:
        from airflow.models import DagRun
        from sqlalchemy import select

        row = session.execute(
            select(DagRun.conf, DagRun.queued_at, DagRun.run_after).where(
                DagRun.dag_id == kwargs["dag_id"], DagRun.run_id == kwargs["run_id"]
            )
        ).one_or_none()
        if row is None:
            return None
        limit = time_limit_s(row.conf)
        start = row.queued_at or row.run_after
        if limit is None or start is None:
            return None
        return start + timedelta(seconds=limit)  # type: ignore[no-any-return]


def job_deadline_alert(margin: timedelta) -> Any:
    """The DAG's ``DeadlineAlert`` (``margin`` after the job's time limit), or ``None``
    where deadline alerts are off (``srifty_core.airflow_env.DEADLINE_ALERTS_ENV``)."""
    from airflow.sdk.definitions.callback import AsyncCallback
    from airflow.sdk.definitions.deadline import DeadlineAlert

    from srifty_core.airflow_env import deadline_alerts_enabled

    if not deadline_alerts_enabled():
        return None
    return DeadlineAlert(
        reference=JobTimeLimitDeadline(),
        interval=margin,
        callback=AsyncCallback(job_over_time_limit),
        name="time_limit_s",
    )


async def job_over_time_limit(context: dict[str, Any], **kwargs: Any) -> None:
    """The deadline alert's callback (in the triggerer): record the miss in MLflow."""
    dag_run = context.get("dag_run") or {}
    run_id = str(dag_run.get("run_id", ""))
    deadline = (context.get("deadline") or {}).get("deadline_time")
    log.warning("job %s is past its time limit (deadline %s)", run_id, deadline)
    from srifty_core.jobs.orchestrate import deadline_missed

    await asyncio.to_thread(deadline_missed, run_id, dag_run.get("conf") or {}, str(deadline))


class SriftyDeadlinesPlugin(AirflowPlugin):
    name = "srifty_deadlines"
    deadline_references = [JobTimeLimitDeadline]  # noqa: RUF012 (Airflow's plugin attribute)
