"""Nightly allreduce probe sweep: one mapped task group per instance type and allocation.

For each instance type in ``instance_types`` and each of its ``allocations`` (fresh ones,
to capture placement variance; slot 0, 1, ...), one instance of the mapped task group
``on_allocation``: launch an allocation on ``provider`` big enough for the largest world
size (setup), sweep buffer sizes x world sizes x concurrency with ``repeats`` samples and
write that type's partition of the probe store
(``<data dir>/probes/date=<run day>/provider=<p>/instance_type=<t>/``), then release the
allocation (teardown: it runs even when the sweep fails). The local provider's sweeps take
the one slot of the ``srifty_local_host`` pool. A retry of the sweep task measures only
the points its partition still misses. When every sweep succeeded, ``publish`` updates
the Asset ``srifty_probe_store`` so the bandwidth model refresh runs on fresh data.

XCom carries allocation ids and partition paths, never measurements.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task, task_group

# Shared policy (plugins/): the probe-store Asset, start date, task defaults.
from srifty_policy import LOCAL_HOST_POOL, PROBE_STORE, START_DATE, default_args, fails_fast

from srifty_core.probing.config import MIN_ALLOCATIONS

DEFAULT_ARGS = default_args(retry_delay=timedelta(minutes=1), execution_timeout=timedelta(hours=2))
SIZE = r"[0-9]+(\.[0-9]+)?[A-Za-z]*"


@dag(
    dag_id="srifty_probe_sweep",
    schedule="@daily",
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["srifty", "probing"],
    doc_md=__doc__,
    params={
        "provider": Param("local", type="string", enum=["local"], description="Where to run."),
        "instance_types": Param(
            ["local.cpu"],
            type="array",
            minItems=1,
            uniqueItems=True,
            items={"type": "string", "pattern": "^[a-z0-9][a-z0-9.-]*$"},
            description="One mapped sweep per type (local.cpu, or catalog types as labels).",
        ),
        "world_sizes": Param(
            [2],
            type="array",
            minItems=1,
            uniqueItems=True,
            items={"type": "integer", "minimum": 2, "maximum": 64},
            description="World sizes to probe (increasing).",
        ),
        "sizes": Param(
            "4B:64MB",
            type="string",
            pattern=f"^{SIZE}(:{SIZE}|(,{SIZE})*)$",
            description="Buffer sizes: LO:HI geometric range or a comma list, within 4B..512MB.",
        ),
        "points_per_decade": Param(3, type="number", exclusiveMinimum=0, maximum=30),
        "concurrency": Param(
            [1, 2, 4],
            type="array",
            minItems=1,
            uniqueItems=True,
            items={"type": "integer", "minimum": 1, "maximum": 16},
            description="Asynchronous collectives in flight at once.",
        ),
        "collectives": Param(
            ["all_reduce", "all_gather", "reduce_scatter"],
            type="array",
            minItems=1,
            uniqueItems=True,
            items={"type": "string", "enum": ["all_reduce", "all_gather", "reduce_scatter"]},
            description="Collectives timed at every point (each adds an allreduce grid's time).",
        ),
        "repeats": Param(5, type="integer", minimum=1, maximum=1000),
        "warmup": Param(2, type="integer", minimum=0, maximum=100),
        "allocations": Param(
            MIN_ALLOCATIONS,
            type="integer",
            minimum=1,
            maximum=10,
            description=(
                f"Fresh allocations per type (the bandwidth model holds out whole "
                f"allocations: the refresh this sweep triggers needs probes from at least "
                f"{MIN_ALLOCATIONS})."
            ),
        ),
        "sustained_s": Param(
            0.0,
            type="number",
            minimum=0,
            maximum=3900,
            description=(
                "Sustained-transfer probe after each world size's grid: up to this many "
                "seconds of back-to-back allreduces (EC2 types rated 'up to' a bandwidth "
                "burst for 5-60 min: 3900), then samples of what a long job gets. 0: none."
            ),
        ),
    },
)
def srifty_probe_sweep() -> None:
    @task
    @fails_fast
    def plan() -> list[dict[str, Any]]:
        """Check the whole config before anything is launched; one entry per allocation."""
        from srifty_core.cloud import get_provider
        from srifty_core.probing.config import config_from_params

        params = get_current_context()["params"]
        config = config_from_params(params)
        provider = get_provider(params["provider"])
        types = [provider.instance_type(t).name for t in params["instance_types"]]
        return [{"instance_type": t, "slot": k} for t in types for k in range(config.allocations)]

    @task
    @fails_fast
    def allocate(item: dict[str, Any]) -> str:
        from srifty_core.cloud import get_provider
        from srifty_core.measure.sweep import launch_for_sweep
        from srifty_core.probing.config import config_from_params

        params = get_current_context()["params"]
        provider = get_provider(params["provider"])
        return launch_for_sweep(config_from_params(params), provider, item["instance_type"]).id

    # The local provider's workers share this host: one sweep at a time on it (the pool),
    # never beside a profile or a local training job that would skew the timings.
    @task(pool=LOCAL_HOST_POOL)
    @fails_fast
    def sweep(item: dict[str, Any], allocation_id: str) -> str:
        from srifty_core.cloud import get_provider
        from srifty_core.measure.sweep import sweep_on_allocation
        from srifty_core.probing.config import config_from_params

        ctx = get_current_context()
        params = ctx["params"]
        provider = get_provider(params["provider"])
        day = ctx["logical_date"].date() if ctx.get("logical_date") else None
        alloc = provider.get_allocation(allocation_id)
        config = config_from_params(params)
        result = sweep_on_allocation(config, provider, alloc, day=day, slot=int(item["slot"]))
        print(
            f"{result.measured} points measured, {result.skipped} already stored, "
            f"{len(result.failed)} failed; {result.rows} rows in {result.partition}"
        )
        return str(result.raise_for_failures().partition)

    @task
    @fails_fast
    def release(allocation_id: str) -> None:
        from srifty_core.cloud import get_provider

        get_provider(get_current_context()["params"]["provider"]).release(allocation_id)

    @task_group
    def on_allocation(item: dict[str, Any]) -> Any:
        """One allocation: launch it (setup), sweep it, release it (teardown, always)."""
        allocation_id = allocate(item)
        partition = sweep(item, allocation_id)
        partition >> release(allocation_id).as_teardown(setups=allocation_id)
        return partition

    @task(outlets=[PROBE_STORE])
    @fails_fast
    def publish(partitions: str | list[str]) -> list[str]:
        ctx: Any = get_current_context()
        # What a mapped task group's task returned: one value when the group expanded once,
        # else a sequence (indexed by length: iterating a lazy one probes one past its end).
        if isinstance(partitions, str):
            rows = [partitions]
        else:
            rows = [str(partitions[i]) for i in range(len(partitions))]
        ctx["outlet_events"][PROBE_STORE].extra = {"partitions": rows}
        return rows

    publish(on_allocation.expand(item=plan()))


srifty_probe_sweep()
