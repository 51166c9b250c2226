"""The approximation, for spaces too large to search exactly in time: a few hundred
configurations chosen with communication in mind, simulated, then improved by local
search with the simulator.

Contract: ``approximate(request, estimator, space, keeper, simulations=...)`` simulates
into ``keeper`` (1) every single-offer configuration, (2) anchored, network-tiered seeds
and (3) local-search moves, at most ``simulations`` simulations after the single-offer
ones, never one configuration twice. Nothing here proves optimality: ``plan`` follows it
with the branch and bound.

Imports ``planner.bnb`` (``Keeper``, ``simulate``), the planner's request, result and
space, and the simulator's estimators.

How and why: docs/design/planner.md#approx
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from srifty_core.planner.bnb import Keeper, simulate
from srifty_core.planner.request import Objective, PlanRequest
from srifty_core.planner.result import Candidate, miss_ratio, rank_key
from srifty_core.planner.space import Choice, Space
from srifty_core.simulator.estimator import Estimator, PlannerEstimator, planner_estimator
from srifty_core.simulator.types import ClusterConfig, Group

DEFAULT_SIMULATIONS = 300
"""Simulations the approximation may spend after the single-offer ones (about 0.05 s)."""
SEEDS = 96
"""Anchored seeds simulated (the best by score)."""
STARTS = 4
"""Configurations the local search moves from each round."""
PER_ROUND = 48
"""Neighbours simulated per round (the best by score)."""
STALE = 2
"""Rounds without a better best after which the local search stops."""
FILL_NODES = 400
"""Branches one exact fill may try before giving up on its anchor."""


def single_offer_choices(space: Space) -> list[Choice]:
    """Every configuration of one offer alone."""
    batch = space.request.global_batch
    out: list[Choice] = []
    for i, (o, batches) in enumerate(zip(space.request.offers, space.vm_batches, strict=True)):
        for b in batches:
            if batch % b == 0 and 1 <= batch // b <= o.quota:
                out.append(((i, batch // b, b),))
    return out


class _Scorer:
    """The communication-aware score of a configuration without simulating it: every
    group's compute floors (``pass_floor`` where the estimator is a ``PlannerEstimator``,
    else the profile's mean passes) with the exchange of the slowest network used."""

    def __init__(
        self, request: PlanRequest, planner: PlannerEstimator | None, net: Sequence[float]
    ) -> None:
        self.request = request
        self.net = net
        self.floor = planner.pass_floor if planner is not None else None
        self._cache: dict[tuple[int, int, int, int], tuple[float, float]] = {}

    def passes(self, i: int, count: int, batch: int, column: int) -> tuple[float, float]:
        key = (i, count, batch, column)
        hit = self._cache.get(key)
        if hit is None:
            o = self.request.offers[i]
            if self.floor is not None:
                hit = self.floor(self.request.workload, Group(o.instance, count, batch), column)
            else:
                p = self.request.workload.profile(o.instance.device_type)
                per = batch // o.instance.ranks_per_vm
                hit = (float(p.t_fw(per)), float(p.t_bw(per)))
            self._cache[key] = hit
        return hit

    def iteration(self, choice: Choice) -> float:
        ranks = sum(c * self.request.offers[i].instance.ranks_per_vm for i, c, _ in choice)
        comm = max(self.net[i] for i, _, _ in choice) if ranks > 1 else 0.0
        worst = 0.0
        for col, (i, c, b) in enumerate(choice):
            f, bw = self.passes(i, c, b, col)
            worst = max(worst, f + max(bw, comm))
        return worst

    def key(self, choice: Choice) -> tuple[float, ...]:
        """Ranks configurations by score: meeting the limits (by score) first, then the
        objective."""
        r = self.request
        t = r.overheads.total_s + r.iterations * self.iteration(choice)
        rate = sum(r.offers[i].usd_per_hour * c for i, c, _ in choice)
        cost = rate * t / 3600.0
        miss = max(t / r.time_limit_s, cost / r.budget_usd)
        main = (t, cost) if r.objective is Objective.TIME else (cost, t)
        return (max(miss, 1.0), *main)


def _fill(
    request: PlanRequest, order: Sequence[tuple[int, Sequence[int]]], target: int
) -> Choice | None:
    """The global batch held exactly by the offers in ``order`` (each with its allowed
    batches, largest first), taking as much as possible from the first ones: depth first,
    the largest count first, at most ``FILL_NODES`` branches."""
    offers = request.offers
    reach = [0] * (len(order) + 1)
    for k in range(len(order) - 1, -1, -1):
        i, batches = order[k]
        reach[k] = reach[k + 1] + offers[i].quota * max(batches)
    nodes = 0
    chosen: list[tuple[int, int, int]] = []

    def dfs(k: int, rem: int) -> bool:
        nonlocal nodes
        if rem == 0:
            return True
        if k == len(order) or reach[k] < rem or nodes >= FILL_NODES:
            return False
        nodes += 1
        i, batches = order[k]
        for b in batches:
            most = min(offers[i].quota, rem // b)
            for c in range(most, max(0, most - 2), -1):
                chosen.append((i, c, b))
                if dfs(k + 1, rem - c * b):
                    return True
                chosen.pop()
        return dfs(k + 1, rem)

    if dfs(0, target):
        return tuple(sorted(chosen))
    return None


def anchored_choices(request: PlanRequest, space: Space, scorer: _Scorer) -> list[Choice]:
    """The seeds of step 2 (module doc), each once."""
    offers = request.offers
    floors: dict[tuple[int, int], float] = {}
    for i, (o, batches) in enumerate(zip(offers, space.vm_batches, strict=True)):
        if o.quota == 0:
            continue
        for b in batches:
            floors[(i, b)] = sum(scorer.passes(i, 1, b, 0))
    anchors = sorted(set(floors.values()))
    usable = sorted({i for i, _ in floors}, key=lambda i: (scorer.net[i], i))
    target = request.global_batch
    out: dict[Choice, None] = {}
    for tier in range(1, len(usable) + 1):
        members = usable[:tier]
        if tier < len(usable) and scorer.net[usable[tier]] == scorer.net[members[-1]]:
            continue  # an equally fast network comes next: the tier is not closed yet
        for anchor in anchors:
            allowed = {
                i: sorted(
                    (b for b in space.vm_batches[i] if floors[(i, b)] <= anchor), reverse=True
                )
                for i in members
            }
            allowed = {i: bs for i, bs in allowed.items() if bs}
            if sum(offers[i].quota * bs[0] for i, bs in allowed.items()) < target:
                continue
            fewest = sorted(allowed.items(), key=lambda x: (-x[1][0], scorer.net[x[0]], x[0]))
            cheapest = sorted(
                allowed.items(), key=lambda x: (offers[x[0]].usd_per_hour / x[1][0], x[0])
            )
            for order in (fewest, cheapest):
                choice = _fill(request, order, target)
                if choice is not None:
                    out[choice] = None
    return list(out)


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def neighbours(request: PlanRequest, space: Space, choice: Choice) -> list[Choice]:
    """Configurations one move from ``choice`` (module doc, step 3), global batch exact."""
    offers = request.offers
    groups = {i: (c, b) for i, c, b in choice}
    out: dict[Choice, None] = {}

    def emit(changed: dict[int, tuple[int, int]]) -> None:
        new = {**groups, **changed}
        ch = tuple(sorted((i, c, b) for i, (c, b) in new.items() if c > 0))
        if ch and ch != choice and all(c <= offers[i].quota for i, c, _ in ch):
            out[ch] = None

    def transfer(g: int, cg: int, bg: int, h: int, ch: int, bh: int) -> None:
        """Samples from group g to h (VMs of h's offer at ``bh``; ``ch`` it has): one
        common multiple of the two batches, half of what can move, or all of it."""
        step = _lcm(bg, bh)
        most = min(cg * bg // step, (offers[h].quota - ch) * bh // step)
        for k in {1, most // 2, most}:
            if 1 <= k <= most:
                emit({g: (cg - k * step // bg, bg), h: (ch + k * step // bh, bh)})

    for g, (cg, bg) in groups.items():
        for h, (ch, bh) in groups.items():  # to another group
            if h != g:
                transfer(g, cg, bg, h, ch, bh)
        # to an offer not used yet, at the batch nearest g's (and one either side)
        for j, (o, batches) in enumerate(zip(offers, space.vm_batches, strict=True)):
            if j in groups or o.quota == 0 or not batches:
                continue
            near = min(range(len(batches)), key=lambda k: abs(math.log(batches[k] / bg)))
            for k in (near - 1, near, near + 1):
                if 0 <= k < len(batches):
                    transfer(g, cg, bg, j, 0, batches[k])
        # the same samples at another batch of the same offer
        for b2 in space.vm_batches[g]:
            if b2 != bg and (cg * bg) % b2 == 0:
                emit({g: (cg * bg // b2, b2)})
    return list(out)


def _standing(request: PlanRequest, c: Candidate) -> tuple[Any, ...]:
    """Feasible configurations first, by objective; then the nearest to the limits."""
    if c.feasible:
        return (0.0, *rank_key(request.objective, c))
    return (1.0, miss_ratio(request, c), *rank_key(request.objective, c))


def approximate(
    request: PlanRequest,
    estimator: Estimator,
    space: Space,
    keeper: Keeper,
    *,
    simulations: int = DEFAULT_SIMULATIONS,
) -> None:
    """Steps 1-3 of the module doc into ``keeper`` (at most ``simulations`` simulations
    after the single-offer ones)."""
    planner = planner_estimator(estimator)
    prefetch: Callable[[Sequence[ClusterConfig]], None] | None = None
    if planner is not None:
        batch_prefetch = planner.prefetch_configs

        def prefetch(configs: Sequence[ClusterConfig]) -> None:
            batch_prefetch(request.workload, configs)

    singles = simulate(
        request, estimator, space, keeper, single_offer_choices(space), notable=True,
        prefetch=prefetch,
    )  # fmt: skip
    net = _network_times(request, estimator, planner, space, singles, prefetch)
    scorer = _Scorer(request, planner, net)
    pool: dict[Choice, Candidate] = {c.choice: c for c in singles}

    def run(choices: Iterable[Choice], limit: int, *, notable: bool = False) -> None:
        fresh = [ch for ch in dict.fromkeys(choices) if ch not in keeper.seen]
        fresh.sort(key=scorer.key)
        for c in simulate(
            request, estimator, space, keeper, fresh[:limit], notable=notable, prefetch=prefetch
        ):
            pool[c.choice] = c

    left = simulations
    if left <= 0:
        return
    seeds = anchored_choices(request, space, scorer)
    before = keeper.simulated
    run(seeds, min(SEEDS, left), notable=True)
    left -= keeper.simulated - before
    stale = 0
    while left > 0 and stale < STALE:
        starts = sorted(pool.values(), key=lambda c: _standing(request, c))[:STARTS]
        best = [c.choice for c in starts]
        moves = [n for c in starts for n in neighbours(request, space, c.choice)]
        before = keeper.simulated
        run(moves, min(PER_ROUND, left))
        spent = keeper.simulated - before
        left -= spent
        after = [c.choice for c in sorted(pool.values(), key=lambda c: _standing(request, c))]
        if not spent or after[:STARTS] == best:
            break
        stale = stale + 1 if after[0] == best[0] else 0


def _network_times(
    request: PlanRequest,
    estimator: Estimator,
    planner: PlannerEstimator | None,
    space: Space,
    singles: Sequence[Candidate],
    prefetch: Callable[[Sequence[ClusterConfig]], None] | None,
) -> list[float]:
    """Per offer, what its network costs a ring: the least time its single-offer
    configurations take to move every gradient bucket back to back with nothing to wait
    for (``exchange_floor`` at a backward pass of 0; the exchange time where the
    estimator has no floors: ``planner`` None), or two of its VMs at its smallest batch
    where it has none (a probe for the score, not a plan)."""
    floor = planner.exchange_floor if planner is not None else None

    def moving(config: ClusterConfig, t_pe: float) -> float:
        return float(floor(request.workload, config, 0.0)) if floor is not None else t_pe

    net = [math.inf] * len(request.offers)
    for c in singles:
        if len(c.choice) == 1 and c.estimate.world_size > 1:
            i = c.choice[0][0]
            net[i] = min(net[i], moving(space.config(c.choice), c.estimate.t_pe))
    probes = {}
    for i, (o, batches) in enumerate(zip(request.offers, space.vm_batches, strict=True)):
        if o.quota > 0 and batches and net[i] == math.inf:
            probes[i] = ClusterConfig((Group(o.instance, 2, batches[0]),))
    if probes and prefetch is not None:
        prefetch(list(probes.values()))
    for i, config in probes.items():
        net[i] = moving(config, estimator.estimate(request.workload, config).t_pe)
    return [0.0 if t == math.inf else t for t in net]
