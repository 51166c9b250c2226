"""The searches behind ``plan()``: the best configuration of a ``PlanRequest`` under an
``Estimator``, the search chosen by the exact size of the pruned space (``Space.size``).

Contract: ``plan(request, estimator, method=...)`` returns a ``PlanResult`` whose
``method`` says which search answered: ``exact`` (``planner.bnb``, the best plan proven),
``approx`` (``planner.approx``, then the branch and bound within a work budget),
``exhaustive`` (simulate every configuration) or ``ilp`` (the method's anchored integer
programs). Inputs are never modified; an unknown method raises ``PlannerError``.

Imports the planner's request, result and space, ``planner.bnb``, ``planner.approx`` and
the simulator's estimators; PuLP only inside ``ilp_search``.

How and why: docs/design/planner.md#search
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator

from srifty_core.errors import SriftyError
from srifty_core.planner import strategies
from srifty_core.planner.approx import DEFAULT_SIMULATIONS, approximate
from srifty_core.planner.bnb import BranchAndBound, Keeper
from srifty_core.planner.request import Objective, PlanRequest
from srifty_core.planner.result import (
    Candidate,
    PlanResult,
    evaluate,
    frontier,
    miss_ratio,
    rank_key,
)
from srifty_core.planner.space import Choice, Space, saturation_threshold
from srifty_core.simulator.estimator import Estimator, PlannerEstimator, planner_estimator

DEFAULT_EXHAUSTIVE_LIMIT = 10_000
"""Configurations the plain exhaustive search may simulate before the ILP takes over
(``auto`` with an estimator without floors)."""
DEFAULT_EXACT_LIMIT = 20_000
"""Configurations up to which ``auto`` runs the branch and bound to the end whatever it
costs (spaces this small take a fraction of a second); beyond, the approximation, then
the branch and bound within ``DEFAULT_BUDGET``."""
DEFAULT_BUDGET = 12_000
"""Work units of the branch and bound after the approximation (``bnb.BranchAndBound``;
under 0.1 s on a loaded 2-core machine)."""
TABLE_ROWS = 4_000
"""Bandwidth-model rows (types x VM counts x buckets) the branch and bound may ask for its
ring ceilings after the approximation; beyond, the approximation answers alone."""
FEASIBILITY_BUDGETS = 10
"""Budgets the branch and bound may spend looking for a feasible configuration the
approximation did not find (beyond ``DEFAULT_EXACT_LIMIT``)."""
TINY = 2_000
"""Spaces the exact search enters without the approximation's seeds first."""
METHODS = ("auto", "exact", "approx", "exhaustive", "ilp")
SIZE_LIMIT = 10**12
"""Spaces are counted exactly up to this many configurations (``space_size``; one more
means more than that): the count costs the same at any limit in machine integers."""


class PlannerError(SriftyError):
    """The planner could not finish (a solver failed); the message says what to change."""


def _candidates(
    request: PlanRequest, estimator: Estimator, space: Space, choices: Iterable[Choice]
) -> list[Candidate]:
    out = []
    seen: set[Choice] = set()
    for ch in choices:
        key = tuple(sorted(ch))
        if key in seen:
            continue
        seen.add(key)
        out.append(evaluate(request, key, estimator.estimate(request.workload, space.config(key))))
    return out


def exhaustive_search(request: PlanRequest, estimator: Estimator, space: Space) -> list[Candidate]:
    return _candidates(request, estimator, space, space.enumerate())


@contextlib.contextmanager
def _solver_output_silenced() -> Iterator[None]:
    """Standard output (file descriptor 1) to /dev/null for the block: HiGHS prints its
    banner from native code whatever ``msg`` says, which would land before the JSON of
    ``srifty plan --json``."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _solver(name: str) -> object:
    """``highs`` (needs highspy), ``cbc`` (bundled with PuLP) or ``auto`` (HiGHS if installed)."""
    import warnings

    import pulp

    if name in ("auto", "highs"):
        highs = pulp.HiGHS(msg=False)
        if highs.available():
            return highs
        if name == "highs":
            raise PlannerError("solver: HiGHS is not installed (pip install highspy); use cbc")
    if name not in ("auto", "cbc"):
        raise PlannerError(f"solver: {name!r} is not one of auto, highs, cbc")
    with warnings.catch_warnings():  # PuLP 3 deprecates its bundled CBC in favour of 4.0's
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False)


def ilp_search(
    request: PlanRequest, estimator: Estimator, space: Space, solver: str = "auto"
) -> list[Candidate]:
    import pulp

    offers = request.offers
    items: list[tuple[int, int, float]] = []
    for i, (o, batches) in enumerate(zip(offers, space.vm_batches, strict=True)):
        if o.quota == 0:
            continue
        p = request.workload.profile(o.instance.device_type)
        for b in batches:
            items.append((i, b, float(p.t_iter(b // o.instance.ranks_per_vm))))
    anchors = sorted({t for _, _, t in items})
    n_iter, overhead = request.iterations, request.overheads.total_s
    with _solver_output_silenced():
        backend = _solver(solver)
    choices: list[Choice] = []
    for anchor in anchors:
        if n_iter * anchor + overhead > request.time_limit_s:
            break  # anchors only grow from here
        allowed = [(i, b) for i, b, t in items if t <= anchor * (1 + 1e-12)]
        prob = pulp.LpProblem("srifty_anchor", pulp.LpMinimize)
        n = {
            (i, b): prob.add_variable(f"n_{i}_{b}", 0, offers[i].quota, cat="Integer")
            for i, b in allowed
        }
        y = {(i, b): prob.add_variable(f"y_{i}_{b}", 0, 1, cat="Binary") for i, b in allowed}
        rate = pulp.lpSum(offers[i].usd_per_hour * v for (i, _), v in n.items())
        vms = pulp.lpSum(n.values())
        if request.objective is Objective.TIME:
            prob += vms + 1e-6 * rate
        else:
            prob += rate + 1e-6 * vms
        prob += pulp.lpSum(b * v for (_, b), v in n.items()) == request.global_batch
        for (i, b), v in n.items():
            prob += v <= offers[i].quota * y[(i, b)]
        for i in {i for i, _ in allowed}:
            prob += pulp.lpSum(y[(j, b)] for j, b in allowed if j == i) <= 1
        if request.budget_usd != float("inf"):
            prob += (n_iter * anchor + overhead) / 3600.0 * rate <= request.budget_usd
        with _solver_output_silenced():
            status = prob.solve(backend)
        if status == pulp.LpStatusInfeasible:
            continue
        if status != pulp.LpStatusOptimal:
            raise PlannerError(
                f"the ILP solver ({solver}) ended {pulp.LpStatus[status]!r} at anchor "
                f"{anchor * 1e3:.2f} ms; try another solver or the exhaustive search"
            )
        choice = tuple(
            (i, round(v.value()), b) for (i, b), v in n.items() if v.value() and v.value() > 0.5
        )
        if choice:
            choices.append(choice)
    return _candidates(request, estimator, space, choices)


def plan(
    request: PlanRequest,
    estimator: Estimator,
    *,
    method: str = "auto",
    exhaustive_limit: int = DEFAULT_EXHAUSTIVE_LIMIT,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
    budget: int = DEFAULT_BUDGET,
    solver: str = "auto",
    runners_up: int = 3,
    exact_runners_up: bool = False,
) -> PlanResult:
    """The best configuration for ``request`` under ``estimator`` over the strategies the
    request allows (``planner.strategies.choose``: ``ddp``, ``fsdp``, ``hsdp``; the result
    says which and why), each searched by ``plan_one`` with these arguments."""
    if method not in METHODS:
        raise PlannerError(f"method: {method!r} is not one of {', '.join(METHODS)}")

    def one(req: PlanRequest, est: Estimator) -> PlanResult:
        return plan_one(
            req,
            est,
            method=method,
            exhaustive_limit=exhaustive_limit,
            exact_limit=exact_limit,
            budget=budget,
            solver=solver,
            runners_up=runners_up,
            exact_runners_up=exact_runners_up,
        )

    return strategies.choose(request, estimator, one)


def plan_one(
    request: PlanRequest,
    estimator: Estimator,
    *,
    method: str = "auto",
    exhaustive_limit: int = DEFAULT_EXHAUSTIVE_LIMIT,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
    budget: int = DEFAULT_BUDGET,
    solver: str = "auto",
    runners_up: int = 3,
    exact_runners_up: bool = False,
) -> PlanResult:
    """The best configuration for ``request`` under ``estimator`` (see the module doc), the
    strategy the request pins (``plan`` chooses among strategies).

    ``method``:

    - ``auto``: the exact search (branch and bound) when the pruned space has at most
      ``exact_limit`` configurations, else the approximation followed by the branch and
      bound within ``budget`` work units where its bandwidth tables are cheap enough
      (``exact`` when that finishes, ``approx`` otherwise). With an estimator that has
      no floors (not a ``PlannerEstimator``, e.g. APM): the plain exhaustive search up to
      ``exhaustive_limit`` configurations, else the ILP, as before;
    - ``exact``: the branch and bound, whatever the size;
    - ``approx``: the approximation, then the branch and bound within ``budget`` (none
      with ``budget=0``). Where the approximation found nothing feasible, the branch and
      bound looks for a feasible configuration: to the end within ``exact_limit``, so
      the approximation never says "infeasible" where the exact search finds a plan;
    - ``exhaustive``: simulate every configuration (the reference);
    - ``ilp``: the anchored integer programs (the method's original approximation).

    ``result.method`` says which search answered: ``exact`` only when the best plan is
    proven. The runners-up are the best of what the search simulated; with
    ``exact_runners_up`` the branch and bound proves them too (it then cuts only what
    cannot beat the last of them: up to a hundred times the work). Inputs are never
    modified.
    """
    if method not in METHODS:
        raise PlannerError(f"method: {method!r} is not one of {', '.join(METHODS)}")
    t0 = time.perf_counter()
    space = Space.build(request)
    planner = planner_estimator(estimator)
    size = space.size(limit=max(SIZE_LIMIT, exact_limit, exhaustive_limit))
    use = method
    if method == "auto":
        if planner is not None:
            use = "exact" if size <= exact_limit else "approx"
        else:
            use = "exhaustive" if size <= exhaustive_limit else "ilp"
    elif method == "exact" and planner is None:
        use = "exhaustive"
    below = False
    if use in ("exhaustive", "exact"):
        # the saturation threshold is a preference: search below it too when affordable
        limit = exhaustive_limit if use == "exhaustive" else exact_limit
        wide = Space.build(request, saturate=False)
        if wide.vm_batches != space.vm_batches:
            wide_size = wide.size(limit=limit)
            if wide_size <= limit:
                space, size, below = wide, wide_size, True
    if use in ("exhaustive", "ilp"):
        if use == "exhaustive":
            if planner is not None:
                _prefetch_all(request, planner, space)
            candidates = exhaustive_search(request, estimator, space)
        else:
            candidates = ilp_search(request, estimator, space, solver)
        return _result(request, use, candidates, size, t0, runners_up, below)
    keeper = Keeper(request, 1 + runners_up, exact=None if exact_runners_up else 1)
    if use == "exact":
        assert planner is not None  # "exact" without floors became "exhaustive" above
        exact = _exact(request, planner, space, keeper, size, budget=None)
    else:
        exact = _approximate(request, estimator, planner, space, keeper, size, exact_limit, budget)
    top = keeper.top()
    misses: tuple[Candidate, ...] = ()
    if not top:
        misses = _nearest_misses(request, planner, space, keeper, budget)
    best = top[0] if top else None
    candidates = keeper.candidates()
    return PlanResult(
        request=request,
        method="exact" if exact else "approx",
        best=best,
        evaluated=keeper.simulated,
        space_size=size,
        solve_s=time.perf_counter() - t0,
        frontier=tuple(frontier(candidates)),
        runners_up=tuple(top[1 : 1 + runners_up]),
        nearest_misses=misses,
        candidates=tuple(candidates),
        below_threshold=_below_threshold(request, best) if below else (),
        searched_below_threshold=below,
    )


def _result(
    request: PlanRequest,
    use: str,
    candidates: list[Candidate],
    size: int,
    t0: float,
    runners_up: int,
    below: bool,
) -> PlanResult:
    """The answer of a search that simulated every candidate it returns."""
    feasible = sorted(
        (c for c in candidates if c.feasible), key=lambda c: rank_key(request.objective, c)
    )
    best = feasible[0] if feasible else None
    misses: tuple[Candidate, ...] = ()
    if best is None:
        misses = tuple(sorted(candidates, key=lambda c: miss_ratio(request, c))[:3])
    return PlanResult(
        request=request,
        method=use,
        best=best,
        evaluated=len(candidates),
        space_size=size,
        solve_s=time.perf_counter() - t0,
        frontier=tuple(frontier(candidates)),
        runners_up=tuple(feasible[1 : 1 + runners_up]),
        nearest_misses=misses,
        candidates=tuple(candidates),
        below_threshold=_below_threshold(request, best) if below else (),
        searched_below_threshold=below,
    )


def _prefetch_all(request: PlanRequest, planner: PlannerEstimator, space: Space) -> None:
    """Every bandwidth curve a search over the whole space can touch, in one call."""
    offered = [o for o in request.offers if o.quota > 0]
    planner.prefetch(request.workload, [o.instance for o in offered], _max_vms(request, space))


def _max_vms(request: PlanRequest, space: Space) -> int:
    """The most VMs a configuration of ``space`` can have (each holds a unit at least)."""
    return max(1, min(sum(o.quota for o in request.offers), request.global_batch // space.unit))


def _exact(
    request: PlanRequest,
    estimator: PlannerEstimator,
    space: Space,
    keeper: Keeper,
    size: int,
    *,
    budget: int | None,
) -> bool:
    """The branch and bound (within ``budget`` work units, ``None`` for none), after the
    approximation's seeds where the space is not tiny (a good first answer cuts more);
    True when it finished."""
    _prefetch_all(request, estimator, space)
    sims = 0 if size <= TINY else min(DEFAULT_SIMULATIONS, size // 8)
    if not keeper.seen:
        approximate(request, estimator, space, keeper, simulations=sims)
    return BranchAndBound(request, estimator, space, keeper, budget=budget).run()


def _approximate(
    request: PlanRequest,
    estimator: Estimator,
    planner: PlannerEstimator | None,
    space: Space,
    keeper: Keeper,
    size: int,
    exact_limit: int,
    budget: int,
) -> bool:
    """The approximation, then the branch and bound within ``budget`` where its
    bandwidth tables are cheap enough to build; True when that finished. With nothing
    feasible found, the branch and bound looks for a feasible configuration whatever its
    tables cost: to the end on a space within ``exact_limit``, else within ten budgets
    (the limits cut most of such a space); none without floors (``planner`` None)."""
    approximate(request, estimator, space, keeper)
    if planner is None:
        return False
    if not keeper.top():
        rescue = None if size <= exact_limit else FEASIBILITY_BUDGETS * budget
        return _exact(request, planner, space, keeper, size, budget=rescue)
    if budget > 0 and _table_rows(request, space) <= TABLE_ROWS:
        return _exact(request, planner, space, keeper, size, budget=budget)
    return False


def _table_rows(request: PlanRequest, space: Space) -> int:
    """Bandwidth-model rows the branch and bound's ring ceilings need (every offered
    type at every VM count, every bucket)."""
    offered = [o for o in request.offers if o.quota > 0]
    vms = _max_vms(request, space)
    buckets = {len(request.workload.profile(o.instance.device_type).buckets) for o in offered}
    return len(offered) * vms * max(buckets, default=0)


def _nearest_misses(
    request: PlanRequest,
    planner: PlannerEstimator | None,
    space: Space,
    keeper: Keeper,
    budget: int,
) -> tuple[Candidate, ...]:
    """Nothing meets the limits: the configurations nearest to meeting them (``miss_ratio``),
    by the branch and bound on that measure (within ``budget``; where the estimator has
    floors) from the nearest simulated so far."""
    near = Keeper(request, 3, misses_only=True)
    for c in keeper.nearest_misses():
        near.add(c)
    near.seen |= keeper.seen
    if planner is not None and _table_rows(request, space) <= TABLE_ROWS:
        _prefetch_all(request, planner, space)
        BranchAndBound(request, planner, space, near, budget=budget, limits=False).run()
    keeper.seen |= near.seen
    keeper.simulated += near.simulated - len(keeper.nearest_misses())
    for c in near.nearest_misses():
        keeper.notable.setdefault(c.choice, c)
    return tuple(near.nearest_misses())


def _below_threshold(request: PlanRequest, best: Candidate | None) -> tuple[str, ...]:
    """Offers whose batch in ``best`` is under their saturation threshold."""
    if best is None:
        return ()
    out = []
    for i, _, b in best.choice:
        o = request.offers[i]
        if b // o.instance.ranks_per_vm < saturation_threshold(request, o):
            out.append(o.key)
    return tuple(out)
