"""Probe a mixed-type ring (``probing.mix``): VMs of several instance types as one process
group, stored under the mix's label.

``probe_mix_sweep`` is ``measure.sweep.probe_sweep`` for a mix: for each allocation slot
that still misses points it launches one allocation per member type, starts the probe
worker on every rank of every member as one ring (``measure.runner.run_points``), releases
them all whatever happens, and commits the day's partition of the mix. A mix is probed at
its ring's full world size only (a smaller group would hold only the first members: no
longer that mix). ``launch_ring`` and ``sweep_on_ring`` are the launch and the middle step
alone, for callers that own the allocations (the sweep DAG launches and releases in
separate tasks). Same durability as a single type's sweep: an owner lock per launched
allocation, partial files committed by the next run, a rerun measures only what is
missing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path

from srifty_core.catalog.types import Market
from srifty_core.cloud.base import Allocation, LaunchRequest, Provider
from srifty_core.cloud.local import LocalProvider
from srifty_core.measure.checks import check_backend
from srifty_core.measure.sweep import (
    LaunchThenRun,
    ProgressFn,
    RingRunner,
    SweepResult,
    launch_requests,
    sweep_slot,
    sweep_slots,
)
from srifty_core.probing.config import SweepConfig
from srifty_core.probing.mix import mix_label, parse_mix


def ring_config(
    config: SweepConfig, counts: Mapping[str, int], provider: Provider
) -> tuple[SweepConfig, str]:
    """``config`` at the ring's full world size, and the mix's label, after checking the
    mix (two or more known types, the backend runs here): bad input fails before
    anything is launched."""
    label = mix_label(counts)
    ranks = sum(provider.instance_type(t).ranks_per_instance * n for t, n in counts.items())
    check_backend(config, ranks)
    return dataclasses.replace(config, world_sizes=(ranks,)), label


def launch_ring(
    provider: Provider,
    counts: Mapping[str, int],
    *,
    market: Market = Market.ON_DEMAND,
    placement_group: bool = False,
) -> tuple[Allocation, ...]:
    """One allocation per member type, in name order (the ring's rank order); if one
    launch fails, those already launched are released before the error goes on."""
    return launch_requests(provider, ring_requests(counts, market, placement_group))


def ring_requests(
    counts: Mapping[str, int], market: Market = Market.ON_DEMAND, placement_group: bool = False
) -> tuple[LaunchRequest, ...]:
    """One launch request per member type, in name order (the ring's rank order)."""
    return tuple(
        LaunchRequest(name, count, market=market, placement_group=placement_group)
        for name, count in sorted(counts.items())
    )


def sweep_on_ring(
    config: SweepConfig,
    provider: Provider,
    ring: Sequence[Allocation],
    *,
    day: date | None = None,
    root: Path | None = None,
    slot: int = 0,
    fresh: bool = False,
    on_progress: ProgressFn | None = None,
) -> SweepResult:
    """Measure what the mix's partition still misses of ``slot`` on a ring the caller
    launched (``launch_ring``) and will release, then commit."""
    config, label = ring_config(config, {a.spec.name: a.count for a in ring}, provider)
    return sweep_slot(
        config, provider, ring, label,
        day=day, root=root, slot=slot, fresh=fresh, on_progress=on_progress,
    )  # fmt: skip


def probe_mix_sweep(
    config: SweepConfig,
    mix: Mapping[str, int] | str,
    *,
    provider: Provider | None = None,
    day: date | None = None,
    root: Path | None = None,
    market: Market = Market.ON_DEMAND,
    placement_group: bool = False,
    fresh: bool = False,
    on_progress: ProgressFn | None = None,
    runner: RingRunner | None = None,
) -> SweepResult:
    """The whole sweep of one mix (``{type: VMs}`` or its label) on one day (see the
    module doc). Every allocation is released before this returns, whatever happens.
    Failed points do not raise: look at ``result.failed``."""
    provider = provider or LocalProvider()
    counts = parse_mix(mix, field="mix") if isinstance(mix, str) else dict(mix)
    config, label = ring_config(config, counts, provider)
    return sweep_slots(
        config, provider, label, ring_requests(counts, market, placement_group),
        runner or LaunchThenRun(), day=day, root=root, fresh=fresh, on_progress=on_progress,
    )  # fmt: skip
