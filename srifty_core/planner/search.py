"""The searches behind ``plan()``: exhaustive over the pruned space, or an integer program
(PuLP) over anchor compute times when the space is too large to simulate every point.

**Exhaustive**: simulate every configuration of the pruned space.

**Anchored ILP** (the method's approximation). Every candidate (offer i, VM batch b) has a
compute time c_ib = t_fw(b) + t_bw(b) from its profile. Sweep an anchor time T over the
distinct c_ib: a configuration whose every VM computes within T is balanced at T. For each
anchor, with integer VM counts n_ib and binaries y_ib (one batch per offer)::

    minimize     sum n_ib              (objective time: fewest VMs, least straggling
                                        and communication at this compute time)
              or sum p_i n_ib          (objective cost: the hourly rate)
    subject to   sum_b n_ib * b  =  B  summed over every (i, b)   (the global batch, exactly)
                 n_ib <= quota_i * y_ib,   sum_b y_ib <= 1        (quota, one batch per type)
                 (N T + overheads) / 3600 * sum p_i n_ib <= budget
                 only (i, b) with c_ib <= T;  skip T if N T + overheads > time limit

Each anchor's optimum is then simulated, and the best simulated configuration wins. CBC
solves it by default (bundled with PuLP), HiGHS when ``highspy`` is installed and asked
for. A status other than Optimal or Infeasible raises: PuLP does not.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator

from srifty_core.errors import SriftyError
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
from srifty_core.simulator.estimator import Estimator

DEFAULT_EXHAUSTIVE_LIMIT = 10_000
"""Configurations the exhaustive search may simulate before the ILP takes over."""


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
    solver: str = "auto",
    runners_up: int = 3,
) -> PlanResult:
    """The best configuration for ``request`` under ``estimator`` (see the module doc).

    ``method``: ``auto`` (exhaustive when the pruned space has at most ``exhaustive_limit``
    configurations, else the ILP), ``exhaustive`` or ``ilp``. Inputs are never modified.
    """
    if method not in ("auto", "exhaustive", "ilp"):
        raise PlannerError(f"method: {method!r} is not one of auto, exhaustive, ilp")
    t0 = time.perf_counter()
    space = Space.build(request)
    size = space.size(limit=exhaustive_limit)
    use = method
    if method == "auto":
        use = "exhaustive" if size <= exhaustive_limit else "ilp"
    below = False
    if use == "exhaustive":
        # the saturation threshold is a preference: search below it too when affordable
        wide = Space.build(request, saturate=False)
        if wide.vm_batches != space.vm_batches:
            wide_size = wide.size(limit=exhaustive_limit)
            if wide_size <= exhaustive_limit:
                space, size, below = wide, wide_size, True
        prefetch = getattr(estimator, "prefetch", None)
        if prefetch is not None:  # every bandwidth curve the search needs, in one call
            offered = [o for o in request.offers if o.quota > 0]
            prefetch(request.workload, [o.instance for o in offered], sum(o.quota for o in offered))
        candidates = exhaustive_search(request, estimator, space)
    else:
        candidates = ilp_search(request, estimator, space, solver)
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
