"""One-call measurements on a fresh emulated EC2: a probe dataset (``emulated_probe_sweep``,
a ``PROBE_SCHEMA`` table; ``write_emulated_probes`` stores it), profiles per GPU model
(``emulated_profiles``) and one training run (``emulate_training``). Same arguments and
seed, same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import date
from typing import TYPE_CHECKING, Any

from srifty_core.catalog import Catalog
from srifty_core.catalog.types import Market
from srifty_core.cloud import emulator_truth as truth
from srifty_core.cloud.base import LaunchRequest
from srifty_core.cloud.emulated.probes import DEFAULT_CONCURRENCY, DEFAULT_WORLD_SIZES
from srifty_core.cloud.emulated.provider import EmulatedProvider
from srifty_core.cloud.emulated.training import TrainingRun
from srifty_core.cloud.emulated.world import PROVIDER_NAME
from srifty_core.errors import ConfigError
from srifty_core.probing.config import (
    ALL_REDUCE,
    MAX_BUFFER_BYTES,
    MIN_BUFFER_BYTES,
    check_collectives,
    geometric_sizes,
)
from srifty_core.probing.mix import mix_label

if TYPE_CHECKING:
    import pyarrow as pa

    from srifty_core.profiling.profile import ComputeProfile


def emulated_profiles(
    instance_types: Sequence[str],
    reference: ComputeProfile,
    *,
    probes: int = 4,
    repeats: int = 5,
    max_batch: int | None = None,
    region: str = "us-east-1",
    seed: int = 0,
    catalog: Catalog | None = None,
    reference_rate: truth.DeviceRate | None = None,
    vms: int = 3,
) -> dict[str, ComputeProfile]:
    """``EmulatedProvider.profile`` on each type's GPU, once per device type (profiles are
    per device type: ``A100-40GB`` and ``A100-80GB`` are two), in the order given on one
    provider, each on ``vms`` VMs: ``{device_type: profile}``. Same
    arguments and seed, same profiles. ``reference_rate``: as for ``profile``."""
    p = EmulatedProvider(seed=seed, region=region, catalog=catalog)
    out: dict[str, ComputeProfile] = {}
    for name in instance_types:
        gpu = p.catalog_type(name).device_type
        if gpu not in out:
            out[gpu] = p.profile(
                name,
                reference,
                probes=probes,
                repeats=repeats,
                max_batch=max_batch,
                reference_rate=reference_rate,
                vms=vms,
            )
    return out


def columns_to_table(cols: Mapping[str, Sequence[Any]]) -> pa.Table:
    """Probe columns (from ``EmulatedProvider.probe``) as a table checked against
    ``PROBE_SCHEMA``."""
    import pyarrow as pa

    from srifty_core.probing.schema import PROBE_SCHEMA, conform

    n = len(cols["time_s"])
    given = {"collective": [ALL_REDUCE] * n, **cols}  # a probe naming none: allreduces
    arrays = [
        pa.array(given[f.name], type=f.type) if f.name in given else pa.nulls(n, type=f.type)
        for f in PROBE_SCHEMA
    ]  # spread and noisy: not computed by the emulator (null)
    return conform(pa.Table.from_arrays(arrays, schema=PROBE_SCHEMA))


def emulated_probe_sweep(
    instance_types: Sequence[str],
    *,
    sizes: Sequence[int] | None = None,
    world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    allocations: int = 3,
    repeats: int = 5,
    placement_group: bool = False,
    regions: Sequence[str] = ("us-east-1",),
    seed: int = 0,
    day: date | None = None,
    provider: EmulatedProvider | None = None,
    sustained: bool = True,
    mixes: Sequence[Mapping[str, int]] = (),
    collectives: Sequence[str] = (ALL_REDUCE,),
) -> pa.Table:
    """An emulated probe dataset: for each region and type, ``allocations`` fresh
    allocations of ``ceil(max world size / GPUs per VM)`` VMs, each swept over ``sizes``
    (default 4 B..512 MB, 3 points a decade) x ``world_sizes`` x ``concurrency`` with
    ``repeats`` samples, then (``sustained``) the sustained-transfer probe at each world
    size (phase ``sustained``: what training sees once "up to" NICs spent their burst).

    Then each mix of ``mixes`` (``{instance type: VMs}``, e.g. ``{"g4dn.12xlarge": 1,
    "g4dn.xlarge": 3}``) on ``allocations`` fresh groups of allocations (one per type,
    launched together): ``probe_mix`` over ``sizes`` at the ring's full world size, then
    (``sustained``) ``probe_mix_sustained``; rows under the mix's label (``probing.mix``).
    The mixes come after every type's own sweep, so adding them changes no other row.

    ``collectives`` beyond all_reduce (all_gather, reduce_scatter) come last: for each, every
    type on ``allocations`` fresh allocations, ``probe`` with that collective over the same
    grid (no sustained probe); so adding them changes no other row either.

    Returns one table (``PROBE_SCHEMA``, provider ``ec2-emulated``);
    ``write_emulated_probes`` stores it. Same arguments and seed, same rows."""
    import pyarrow as pa

    size_list = list(sizes or geometric_sizes(MIN_BUFFER_BYTES, MAX_BUFFER_BYTES))
    extra = [c for c in check_collectives(collectives) if c != ALL_REDUCE]
    if ALL_REDUCE not in collectives:
        raise ConfigError("collectives: the emulated sweep always probes all_reduce; list it")
    mix_list = [dict(m) for m in mixes]
    for i, m in enumerate(mix_list):
        mix_label(m, field=f"mixes[{i}]")  # bad input fails before anything is launched
    tables = []
    for r, region in enumerate(regions):
        p = provider if provider is not None and provider.region == region else None
        p = p or EmulatedProvider(seed=seed * 1000 + r, region=region)
        for name in instance_types:
            spec = p.instance_type(name)
            top = max(world_sizes)
            count = max(2, math.ceil(top / spec.ranks_per_instance))
            for slot in range(allocations):
                alloc = p.launch(LaunchRequest(name, count=count, placement_group=placement_group))
                try:
                    cols = p.probe(
                        alloc,
                        size_list,
                        world_sizes,
                        concurrency,
                        repeats=repeats,
                        allocation_slot=slot,
                        day=day,
                    )
                    tables.append(columns_to_table(cols))
                    if sustained:
                        for n in sorted(w for w in set(world_sizes) if 2 <= w <= alloc.ranks):
                            tables.append(
                                columns_to_table(
                                    p.probe_sustained(
                                        alloc, n, repeats=repeats, allocation_slot=slot, day=day
                                    )
                                )
                            )
                finally:
                    p.release(alloc)
        for m in mix_list:
            for slot in range(allocations):
                group = p.launch_many(
                    [
                        LaunchRequest(name, count=count, placement_group=placement_group)
                        for name, count in sorted(m.items())
                    ]
                )
                try:
                    tables.append(
                        columns_to_table(
                            p.probe_mix(
                                group, size_list, repeats=repeats, allocation_slot=slot, day=day
                            )
                        )
                    )
                    if sustained:
                        tables.append(
                            columns_to_table(
                                p.probe_mix_sustained(
                                    group, repeats=repeats, allocation_slot=slot, day=day
                                )
                            )
                        )
                finally:
                    for alloc in group:
                        p.release(alloc)
        for collective in extra:
            for name in instance_types:
                spec = p.instance_type(name)
                count = max(2, math.ceil(max(world_sizes) / spec.ranks_per_instance))
                for slot in range(allocations):
                    alloc = p.launch(
                        LaunchRequest(name, count=count, placement_group=placement_group)
                    )
                    try:
                        cols = p.probe(
                            alloc,
                            size_list,
                            world_sizes,
                            concurrency,
                            repeats=repeats,
                            allocation_slot=slot,
                            day=day,
                            collective=collective,
                        )
                        tables.append(columns_to_table(cols))
                    finally:
                        p.release(alloc)
    from srifty_core.probing.schema import PROBE_SCHEMA

    return pa.concat_tables(tables) if tables else PROBE_SCHEMA.empty_table()


def write_emulated_probes(table: pa.Table, root: Any = None) -> list[Any]:
    """Write an emulated sweep into the probe store, one partition per (day, type)."""
    import pyarrow.compute as pc

    from srifty_core.probing.store import write_partition

    out = []
    days = pc.unique(table["date"]).to_pylist()
    for day in days:
        on_day = table.filter(pc.equal(table["date"], pa_scalar_date(day)))
        for name in sorted(pc.unique(on_day["instance_type"]).to_pylist()):
            part = on_day.filter(pc.equal(on_day["instance_type"], name))
            out.append(
                write_partition(
                    part, day=day, provider=PROVIDER_NAME, instance_type=name, root=root
                )
            )
    return out


def pa_scalar_date(d: date) -> Any:
    import pyarrow as pa

    return pa.scalar(d, type=pa.date32())


def emulate_training(
    counts: Mapping[str, int],
    batches: Mapping[str, int],
    profile: ComputeProfile,
    iterations: int,
    *,
    market: Market | str = Market.ON_DEMAND,
    region: str = "us-east-1",
    placement_group: bool = False,
    seed: int = 0,
    reference: truth.DeviceRate | None = None,
    warm_s: float = 0.0,
) -> TrainingRun:
    """Launch ``counts[type]`` VMs of each type on a fresh emulator, run ``iterations``
    iterations (``batches[type]`` samples per VM; ``warm_s`` as ``train``), release, and
    return what was measured. One allocation per type; same inputs and seed, same numbers."""
    p = EmulatedProvider(seed=seed, region=region)
    launched = []
    try:
        for name, count in counts.items():
            if count > 0:
                launched.append(
                    p.launch(
                        LaunchRequest(
                            name,
                            count=count,
                            market=Market.parse(market),
                            placement_group=placement_group,
                        )
                    )
                )
        return p.train(launched, profile, batches, iterations, reference=reference, warm_s=warm_s)
    finally:
        for a in launched:
            p.release(a)
