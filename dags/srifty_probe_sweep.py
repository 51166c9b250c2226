"""Nightly allreduce probe sweep: one mapped task group per instance type (or mixed-type
ring) and allocation.

For each instance type in ``instance_types`` and each of its ``allocations`` (fresh ones,
to capture placement variance; slot 0, 1, ...), one instance of the mapped task group
``on_allocation``: launch an allocation on ``provider`` big enough for the largest world
size (setup), sweep buffer sizes x world sizes x concurrency with ``repeats`` samples and
write that type's partition of the probe store
(``<data dir>/probes/date=<run day>/provider=<p>/instance_type=<t>/``), then release the
allocation (teardown: it runs even when the sweep fails). Mixed-type rings
(``probing.mix``) go the same way, one allocation per member type swept as one ring: those
``mixes`` lists, then up to ``mix_budget`` more that ``probing.mix_choice`` picks (mixes
recent plans used, then a small design over the instance types) and the store does not
hold from the last 30 days. The local provider's sweeps take
the one slot of the ``srifty_local_host`` pool. A retry of the sweep task measures only
the points its partition still misses. When every sweep succeeded, ``publish`` updates
the Asset ``srifty_probe_store`` so the bandwidth model refresh runs on fresh data.

XCom carries allocation ids and partition paths, never measurements.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task, task_group

# Shared policy (plugins/): the probe-store Asset, start date, task defaults.
from srifty_policy import LOCAL_HOST_POOL, PROBE_STORE, START_DATE, default_args, fails_fast

from srifty_core.probing.config import MIN_ALLOCATIONS

DEFAULT_ARGS = default_args(retry_delay=timedelta(minutes=1), execution_timeout=timedelta(hours=2))
SIZE = r"[0-9]+(\.[0-9]+)?[A-Za-z]*"
MEMBER = r"[A-Za-z0-9][A-Za-z0-9.-]*:[1-9][0-9]*"


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
        "provider": Param(
            "local",
            type="string",
            enum=["local", "ec2"],
            description=(
                "Where to run. ec2: each slot's VMs start the probe workers from their user "
                "data as one ring and write their rows to the run storage "
                "(SRIFTY_RUN_STORAGE); the ec2 settings below."
            ),
        ),
        "region": Param("us-east-1", type="string", description="ec2: the region."),
        "ec2": Param(
            {},
            type="object",
            description='ec2 launch settings: {"image_id": "ami-...", "subnet_id": ...}.',
        ),
        "instance_types": Param(
            ["local.cpu"],
            type="array",
            minItems=1,
            uniqueItems=True,
            items={"type": "string", "pattern": "^[a-z0-9][a-z0-9.-]*$"},
            description="One mapped sweep per type (local.cpu, or catalog types as labels).",
        ),
        "mixes": Param(
            [],
            type="array",
            uniqueItems=True,
            items={"type": "string", "pattern": f"^{MEMBER}(,{MEMBER})+$"},
            description=(
                "Mixed-type rings to probe, each TYPE:VMS,TYPE:VMS (e.g. "
                "g4dn.12xlarge:1,g4dn.xlarge:3): one allocation per type, one ring, at its "
                "full world size."
            ),
        ),
        "mix_budget": Param(
            2,
            type="integer",
            minimum=0,
            maximum=20,
            description=(
                "Further mixes the sweep chooses (probing.mix_choice): those recent plans "
                "used, then a small design over the instance types' GPUs per VM, rated "
                "links and VM counts; mixes the store holds from the last 30 days are "
                "skipped. 0: only the mixes listed."
            ),
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
    def _provider(params: dict[str, Any], *, launching: bool) -> Any:
        from srifty_core.jobs.probe_vms import probe_provider

        provider, _ = probe_provider(
            params["provider"], ec2=params["ec2"], region=params["region"], launching=launching
        )
        return provider

    def _day(ctx: Any) -> date:
        return ctx["logical_date"].date() if ctx.get("logical_date") else date.today()

    @task
    @fails_fast
    def plan() -> list[dict[str, Any]]:
        """Check the whole config before anything is launched; one entry per allocation."""
        from srifty_core.jobs.job_log import recent_configurations
        from srifty_core.measure.mix_sweep import ring_config
        from srifty_core.probing.config import config_from_params
        from srifty_core.probing.mix import mix_label
        from srifty_core.probing.mix_choice import MIX_DAYS, mixes_to_probe

        ctx = get_current_context()
        params = ctx["params"]
        config = config_from_params(params)
        provider = _provider(params, launching=False)  # the ec2 settings, run storage
        specs = [provider.instance_type(t) for t in params["instance_types"]]
        today = _day(ctx)
        mixes = mixes_to_probe(
            params["mixes"], specs, provider.name, today, params["mix_budget"],
            lambda: recent_configurations(MIX_DAYS),
        )  # fmt: skip
        for m in mixes:
            ring_config(config, m, provider)  # unknown types, a backend not here: fail now
        labels = [s.name for s in specs] + [mix_label(m) for m in mixes]
        keys = ["instance_type"] * len(specs) + ["mix"] * len(mixes)
        return [{key: t, "slot": k} for key, t in zip(keys, labels, strict=True)
                for k in range(config.allocations)]  # fmt: skip

    @task
    @fails_fast
    def allocate(item: dict[str, Any]) -> dict[str, str]:
        """Launch the slot's ring (on EC2, its VMs start the probe workers themselves)."""
        from srifty_core.jobs.probe_vms import allocate_slot, probe_provider
        from srifty_core.measure.runner import ring_id
        from srifty_core.probing.config import config_from_params

        ctx = get_current_context()
        params = ctx["params"]
        provider, runner = probe_provider(
            params["provider"], ec2=params["ec2"], region=params["region"]
        )
        ring, folder, label = allocate_slot(
            config_from_params(params), provider, runner,
            instance_type=item.get("instance_type"), mix=item.get("mix"),
            slot=int(item["slot"]), day=_day(ctx),
        )  # fmt: skip
        return {"ring": ring_id(ring), "folder": folder, "label": label}

    # The local provider's workers share this host: one sweep at a time on it (the pool),
    # never beside a profile or a local training job that would skew the timings.
    @task(pool=LOCAL_HOST_POOL)
    @fails_fast
    def sweep(item: dict[str, Any], allocated: dict[str, str]) -> str:
        from srifty_core.jobs.probe_vms import sweep_launched
        from srifty_core.measure.mix_sweep import sweep_on_ring
        from srifty_core.measure.sweep import sweep_on_allocation
        from srifty_core.probing.config import config_from_params

        ctx = get_current_context()
        params = ctx["params"]
        provider = _provider(params, launching=False)
        day = _day(ctx)
        ids = [a for a in allocated["ring"].split("+") if a]
        ring = [provider.get_allocation(a) for a in ids]
        config, slot = config_from_params(params), int(item["slot"])
        if allocated["folder"] or not ring:  # VMs that started their workers at launch
            result = sweep_launched(
                config, provider, ring, allocated["folder"], allocated["label"],
                slot=slot, day=day,
            )  # fmt: skip
        elif "mix" in item:
            result = sweep_on_ring(config, provider, ring, day=day, slot=slot)
        else:
            result = sweep_on_allocation(config, provider, ring[0], day=day, slot=slot)
        print(
            f"{result.measured} points measured, {result.skipped} already stored, "
            f"{len(result.failed)} failed; {result.rows} rows in {result.partition}"
        )
        return str(result.raise_for_failures().partition)

    @task
    @fails_fast
    def release(allocated: dict[str, str]) -> None:
        from srifty_core.cloud.base import release_all

        provider = _provider(get_current_context()["params"], launching=False)
        release_all(provider, [a for a in allocated["ring"].split("+") if a])

    @task_group
    def on_allocation(item: dict[str, Any]) -> Any:
        """One allocation: launch it (setup), sweep it, release it (teardown, always)."""
        allocated = allocate(item)
        partition = sweep(item, allocated)
        partition >> release(allocated).as_teardown(setups=allocated)
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
