"""The Replanner's change touches only what differs (on the emulated cloud)."""

from __future__ import annotations

from srifty_core.catalog.types import Market
from srifty_core.cloud.base import LaunchRequest
from srifty_core.cloud.emulated.provider import EmulatedProvider
from srifty_core.jobs.replanner import Replanner

SPOT, OD = Market.SPOT, Market.ON_DEMAND


def test_growing_keeps_what_runs_and_launches_the_difference() -> None:
    p = EmulatedProvider(seed=1, launch_delay_s=(150.0, 0.0))
    a = p.launch(LaunchRequest("g4dn.8xlarge", count=4, market=SPOT))
    t0 = p.now()
    allocs, change = Replanner.apply(p, [a], {("g4dn.8xlarge", SPOT): 8, ("g3.8xlarge", OD): 2})
    assert change.keep == (a,) and change.release == ()
    assert sorted((r.instance_type, r.count) for r in change.launch) == [
        ("g3.8xlarge", 2),
        ("g4dn.8xlarge", 4),
    ]
    assert len(allocs) == 3 and sum(x.count for x in allocs) == 10
    assert (p.now() - t0).total_seconds() == 150.0  # launched together


def test_a_preempted_type_is_released_and_replaced() -> None:
    p = EmulatedProvider(seed=2, launch_delay_s=(150.0, 0.0))
    a = p.launch(LaunchRequest("p3.8xlarge", count=2, market=SPOT))
    p.schedule_interruption(a.instance_ids[0], p.now())
    p.advance(1.0)
    change = Replanner.change(p, [a], {("g4dn.8xlarge", SPOT): 8})
    assert change.keep == () and change.release == (a,)
    assert [(r.instance_type, r.count) for r in change.launch] == [("g4dn.8xlarge", 8)]


def test_nothing_changes_when_nothing_differs() -> None:
    p = EmulatedProvider(seed=3)
    a = p.launch(LaunchRequest("g4dn.8xlarge", count=3, market=SPOT))
    change = Replanner.change(p, [a], {("g4dn.8xlarge", SPOT): 3})
    assert change.keep == (a,) and change.release == () and change.launch == ()
