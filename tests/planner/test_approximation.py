"""The approximation: never "infeasible" where the exact search finds a configuration, its
moves keep the global batch exact, and planning answers for any number of offers."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from srifty_core.catalog.types import Market
from srifty_core.planner.approx import (
    _Scorer,
    anchored_choices,
    neighbours,
    single_offer_choices,
)
from srifty_core.planner.request import Objective, Offer, PlanRequest
from srifty_core.planner.search import plan
from srifty_core.planner.space import Space
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.types import SimInstance
from tests.planner.scale_fixtures import (
    INSTANCES,
    PRICES,
    WORKLOAD,
    WorldBandwidth,
    random_request,
    simulator,
)


def holds(request: PlanRequest, choice: tuple[tuple[int, int, int], ...]) -> bool:
    return sum(c * b for _, c, b in choice) == request.global_batch and all(
        1 <= c <= request.offers[i].quota for i, c, _ in choice
    )


@pytest.mark.parametrize("seed", range(20))
def test_never_infeasible_where_the_exact_search_finds_a_configuration(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    r = random_request(rng)
    while Space.build(r, saturate=False).size(limit=3000) > 3000:
        r = random_request(rng)
    exact = plan(r, simulator(), method="exact")
    approx = plan(r, simulator(), method="approx")
    assert (approx.best is None) == (exact.best is None)
    if approx.best is not None:
        assert approx.best.feasible and holds(r, approx.best.choice)
        assert exact.best is not None
        key = "time_s" if r.objective is Objective.TIME else "cost_usd"
        assert getattr(approx.best, key) >= getattr(exact.best, key) * (1 - 1e-12)
    else:
        assert approx.nearest_misses


@pytest.mark.parametrize("seed", range(8))
def test_every_move_and_seed_holds_the_global_batch(seed: int) -> None:
    rng = np.random.default_rng(2000 + seed)
    r = random_request(rng)
    space = Space.build(r)
    scorer = _Scorer(r, simulator(), [0.01 * (i + 1) for i in range(len(r.offers))])
    seeds = anchored_choices(r, space, scorer) + single_offer_choices(space)
    assert seeds
    for ch in seeds:
        assert holds(r, ch) and ch == tuple(sorted(ch))
        for n in neighbours(r, space, ch):
            assert holds(r, n) and n != ch
            for i, _, b in n:
                assert b in space.vm_batches[i]


def test_the_approximation_knows_communication() -> None:
    """Two types compute alike, one on a network five times slower and a little cheaper:
    the fewest-VMs anchors (the ILP's) take the slow network's larger quota; the
    approximation, without the branch and bound, finds the exact optimum."""
    fast, slow = INSTANCES[0], SimInstance("d.1-like-a", "A", 1, {"instance_type": "d.1"})
    r = PlanRequest(
        workload=WORKLOAD,
        global_batch=512,
        iterations=200,
        offers=(Offer(fast, Market.ON_DEMAND, 8, 3.0), Offer(slow, Market.ON_DEMAND, 8, 2.9)),
    )
    approx = plan(r, simulator(), method="approx", budget=0, exact_limit=0)
    exact = plan(r, simulator(), method="exhaustive")
    ilp = plan(r, simulator(), method="ilp")
    assert approx.method == "approx"
    assert approx.best is not None and exact.best is not None and ilp.best is not None
    assert approx.best.choice == exact.best.choice
    assert ilp.best.time_s > 1.1 * exact.best.time_s


@pytest.mark.parametrize("kinds", [1, 6, 20])
def test_any_number_of_offers_plans(kinds: int) -> None:
    offers = []
    for k in range(kinds):
        inst = INSTANCES[k % len(INSTANCES)]
        named = SimInstance(f"{inst.name}.{k}", inst.device_type, inst.ranks_per_vm,
                            {"instance_type": inst.name})  # fmt: skip
        offers.append(Offer(named, Market.SPOT, 16, 0.5 * PRICES[inst.name] * (1 + k / 10)))
    r = PlanRequest(workload=WORKLOAD, global_batch=2048, iterations=200, offers=tuple(offers))
    for objective in (Objective.TIME, Objective.COST):
        t = time.process_time()
        res = plan(dataclasses.replace(r, objective=objective), Simulator(WorldBandwidth()))
        assert res.best is not None and holds(r, res.best.choice)
        assert res.method in ("exact", "approx")
        assert time.process_time() - t < 5.0  # generous: a loaded 2-core machine
