"""Validate the instance catalog (shipped files plus price overlays) and write a report.

Weekly, or on demand. Writes ``<data dir>/reports/catalog/<run date>/report.{json,md}``;
fails the run if the catalog has errors a planner would trip on (``fail_on_error``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

# Shared policy (plugins/): the probe-store Asset, start date, task defaults.
from srifty_policy import START_DATE, default_args, fails_fast

DEFAULT_ARGS = default_args(retry_delay=timedelta(minutes=1))


@dag(
    dag_id="srifty_catalog_refresh",
    schedule="@weekly",
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["srifty", "catalog"],
    doc_md=__doc__,
    params={
        "regions": Param(
            [],
            type="array",
            items={"type": "string", "pattern": "^[a-z]{2}-[a-z]+-[0-9]$"},
            description="Regions to report on; empty means every region in the catalog.",
        ),
        "fail_on_error": Param(
            True, type="boolean", description="Fail the run when the catalog has errors."
        ),
    },
)
def srifty_catalog_refresh() -> None:
    @task(multiple_outputs=True)
    @fails_fast
    def validate_catalog() -> dict[str, Any]:
        from srifty_core.catalog.refresh import refresh_catalog_report

        ctx = get_current_context()
        run_day = ctx["logical_date"].date() if ctx.get("logical_date") else None
        return refresh_catalog_report(regions=ctx["params"]["regions"], run_day=run_day)

    @task
    @fails_fast
    def gate(summary: dict[str, Any]) -> None:
        from srifty_core.catalog.refresh import check_summary

        check_summary(summary, fail_on_error=get_current_context()["params"]["fail_on_error"])

    gate(validate_catalog())


srifty_catalog_refresh()
