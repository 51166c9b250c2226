"""What-if report: how the best plan of a request, its time and its cost change when one
thing changes (a quota, a price, the budget, the global batch, ...), and what one more VM
of each offered type would be worth.

Triggered by hand with a planning request (the fields of a ``srifty plan`` request file)
and scenarios as ``srifty plan --what-if`` takes them (``quota[g4dn.xlarge]=16``,
``budget_usd=20``, ``quota[p3.8xlarge]=4; budget_usd=30``). Every scenario is planned with
one simulator, so what the base search simulated is reused. Writes
``<data dir>/reports/what_if/<run id>/report.{json,md}`` (``planner.whatif_report``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

# Shared policy (plugins/): start date, task defaults, no retry for bad input.
from srifty_policy import START_DATE, default_args, fails_fast


@dag(
    dag_id="srifty_what_if",
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    default_args=default_args(execution_timeout=timedelta(minutes=10)),
    tags=["srifty", "planner"],
    doc_md=__doc__,
    params={
        "request": Param(
            {},
            type="object",
            description="The planning request (model, global_batch, iterations, offers, ...).",
        ),
        "scenarios": Param(
            [],
            type="array",
            items={"type": "string", "minLength": 1},
            description="What-if scenarios, e.g. quota[g4dn.xlarge]=16 or budget_usd=20.",
        ),
        "one_more_vm": Param(
            False, type="boolean", description="Also price one more VM of each offered type."
        ),
        "bandwidth": Param(
            "champion",
            enum=["champion", "probes"],
            description="The registered XGBoost model (champion) or the probe table.",
        ),
    },
)
def srifty_what_if() -> None:
    @task(multiple_outputs=True)
    @fails_fast
    def what_if() -> dict[str, Any]:
        from srifty_core.planner.whatif_report import what_if_report

        ctx = get_current_context()
        p = ctx["params"]
        return what_if_report(
            p["request"],
            p["scenarios"],
            one_more_vm=bool(p["one_more_vm"]),
            bandwidth=p["bandwidth"],
            name=str(ctx["run_id"]),
        )

    what_if()


srifty_what_if()
