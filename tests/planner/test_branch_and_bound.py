"""The exact search (branch and bound) gives the plain exhaustive search's answer: the same
best plan and runners-up, on random requests with limits, spread and mixed rings; its
floors never exceed what the simulator answers."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from srifty_core.planner.bnb import Bound, Keeper
from srifty_core.planner.request import PlanRequest
from srifty_core.planner.result import frontier, rank_key
from srifty_core.planner.search import plan
from srifty_core.planner.space import Space
from tests.planner.scale_fixtures import (
    random_request,
    simulator,
    unlimited_request,
    with_limits,
)

SEEDS = range(24)
SMALL = 3_000
"""Largest (wide) space a random request may have: the reference simulates all of it."""


def small_request(seed: int, *, large_quotas: bool = False) -> PlanRequest:
    """A random request whose space is small; with ``large_quotas``, of 2-3 offers with
    quotas of 14-40 (the bound then takes many counts at once)."""
    rng = np.random.default_rng(seed)
    while True:
        if large_quotas:
            r, limits = unlimited_request(rng, kinds=int(rng.integers(2, 4)), quotas=(14, 41))
        else:
            r, limits = unlimited_request(rng)
        # the limits leave the space as it is: a request over SMALL is rejected before the
        # exhaustive search that sets them (the same requests as ``random_request`` draws)
        if Space.build(r, saturate=False).size(limit=SMALL) <= SMALL:
            return with_limits(r, limits)


def answer(result: object) -> list[tuple[object, float, float]]:
    best = getattr(result, "best", None)
    ranked = ([best] if best else []) + list(getattr(result, "runners_up", ()))
    return [(c.choice, c.time_s, c.cost_usd) for c in ranked]


@pytest.mark.parametrize("large_quotas", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_the_exact_search_answers_what_simulating_everything_answers(
    seed: int, large_quotas: bool
) -> None:
    r = small_request(seed, large_quotas=large_quotas)
    everything = plan(r, simulator(), method="exhaustive", exhaustive_limit=10**6)
    exact = plan(r, simulator(), method="exact", exact_limit=10**6, exact_runners_up=True)
    assert exact.method == "exact"
    assert answer(exact) == answer(everything)  # best plan and runners-up, in order
    quick = plan(r, simulator(), method="exact", exact_limit=10**6)
    assert answer(quick)[:1] == answer(everything)[:1]  # the best plan, proven
    assert quick.evaluated <= exact.evaluated
    for c in quick.runners_up:  # the best of what it simulated: real, feasible, ranked after
        assert c.feasible and quick.best is not None
        assert rank_key(r.objective, c) > rank_key(r.objective, quick.best)
    assert exact.space_size == everything.space_size
    assert exact.searched_below_threshold == everything.searched_below_threshold
    assert exact.evaluated <= everything.evaluated
    if everything.best is None:
        assert exact.best is None and exact.nearest_misses
    # the frontier is of what it simulated: every point is one no other kept one beats
    assert list(exact.frontier) == frontier(list(exact.candidates))
    assert exact.best is None or exact.best in exact.candidates


@pytest.mark.parametrize("seed", range(6))
def test_auto_on_a_small_space_is_the_exact_search(seed: int) -> None:
    r = small_request(100 + seed)
    res = plan(r, simulator())
    assert res.method == "exact"
    assert answer(res)[:1] == answer(plan(r, simulator(), method="exhaustive"))[:1]


def test_nearest_misses_are_those_of_simulating_everything() -> None:
    r = dataclasses.replace(small_request(7), time_limit_s=1.0, budget_usd=1e-6)
    everything = plan(r, simulator(), method="exhaustive")
    exact = plan(r, simulator(), method="exact")
    assert everything.best is None and exact.best is None
    key = [(round(m.time_s, 9), round(m.cost_usd, 12)) for m in everything.nearest_misses]
    assert [(round(m.time_s, 9), round(m.cost_usd, 12)) for m in exact.nearest_misses] == key
    assert any("binding limit" in s for s in exact.explanation())


def test_the_keeper_holds_the_frontier_and_the_best_few_not_everything() -> None:
    r = small_request(3)
    res = plan(r, simulator(), method="exact", runners_up=2)
    assert len(res.runners_up) <= 2
    assert res.evaluated >= len(res.candidates)
    assert [c.choice for c in sorted(res.candidates, key=lambda c: c.choice)] == sorted(
        {c.choice for c in res.candidates}
    )


def test_floors_never_exceed_the_simulator() -> None:
    """Per group, ``pass_floor`` is at most the estimate's passes whatever else is in the
    configuration; the exchange floor at those passes is at most its exchange; and the
    branch and bound's ring ceilings are at least the bandwidth each ring gets."""
    rng = np.random.default_rng(5)
    for _ in range(6):
        r = random_request(rng, kinds=3)
        sim = simulator()
        space = Space.build(r, saturate=False)
        bound = Bound(r, sim, space)
        ceilings = bound.ceilings()
        for choice in itertools.islice(space.enumerate(), 0, None, 7):
            config = space.config(choice)
            est = sim.estimate(r.workload, config)
            floors = [sim.pass_floor(r.workload, g, col) for col, g in enumerate(config.groups)]
            f = max(x for x, _ in floors)
            b = max(x for _, x in floors)
            assert f <= est.t_fw * (1 + 1e-9) and b <= est.t_bw * (1 + 1e-9)
            t_pe = sim.exchange_floor(r.workload, config, b)
            assert t_pe <= est.t_pe * (1 + 1e-9)
            assert f + max(b, t_pe) <= est.t_iter * (1 + 1e-9)
            if config.world_size > 1:
                types = [i for i, _, _ in choice]
                (ring,) = bound.exchange(types, config.vms, config.world_size, len(r.offers), (b,))
                assert ring <= t_pe * (1 + 1e-9)
                assert all(np.all(np.isfinite(c[s])) for c in ceilings for s in c)


def test_a_budget_stops_the_search_and_says_it_is_not_exact() -> None:
    r = small_request(11)
    res = plan(r, simulator(), method="approx", budget=1, exact_limit=0)
    assert res.method == "approx"
    ref = plan(r, simulator(), method="exhaustive")
    if ref.best is not None:
        assert res.best is not None


def test_keeper_frontier_matches_the_result_frontier() -> None:
    r = small_request(2)
    everything = plan(r, simulator(), method="exhaustive")
    keeper = Keeper(r, 4)
    for c in everything.candidates:
        keeper.add(c)
    assert keeper.frontier == list(everything.frontier)
    ranked = ([everything.best] if everything.best else []) + list(everything.runners_up)
    assert [c.choice for c in keeper.top()] == [c.choice for c in ranked]
    if len(ranked) == 4:
        last = ranked[-1]
        assert keeper.threshold() == (last.time_s if r.objective.value == "time" else last.cost_usd)
    else:
        assert keeper.threshold() == math.inf
