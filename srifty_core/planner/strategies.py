"""Strategy as a plan dimension: the best of ``ddp``, ``fsdp`` and ``hsdp`` for a request,
and why.

Contract: ``choose(request, estimator, search)`` runs ``search`` (one strategy's search:
``planner.search.plan_one``) once per strategy the request allows (``PlanRequest.strategies``)
and returns the best plan over them for the request's objective, with ``strategy`` and
``strategy_reason`` set. Per strategy: ``ddp`` the request as it is (the profiles' B_max,
the estimator given); ``fsdp``/``hsdp`` the request with each GPU's B_max at the most
ranks the quotas allow (``planner.fit.b_max``; the search space's upper bound) and the
sharded iteration (``simulator.sharded``) over the same ``Simulator``, each configuration
checked against its own world size (``planner.fit.short``: one that does not hold its
batches breaks a limit). Under ``auto`` a sharded strategy is searched only where it lets
some offer hold local batches ddp cannot (otherwise it is the same configurations with
more to exchange); ties go to ddp. A strategy whose quotas cannot hold the global batch
at once is searched with every local batch allowed, each configuration in the fewest
micro-batches that fit (``accumulated``; ``simulator.accumulation``). A sharded strategy
that holds it at once is also searched on fewer VMs of each multi-GPU offer alone than
hold it at once, in micro-batches (``fewer_vms``): one VM in micro-batches exchanges
nothing across VMs, and can be cheaper and faster than two in one pass; the better plan
wins (``merged``). ddp gets micro-batches only where the batch does not fit. An
estimator that is not a ``Simulator`` nor wraps one as ``inner`` (the analytical APM)
plans ddp only, without micro-batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from srifty_core.errors import ConfigError
from srifty_core.planner import fit
from srifty_core.planner.request import Objective, PlanRequest
from srifty_core.planner.result import Candidate, PlanResult, frontier, miss_ratio, rank_key
from srifty_core.planner.space import gpu_batches
from srifty_core.sharding.memory import USABLE, Strategy
from srifty_core.simulator.accumulation import (
    Accumulated,
    Fastest,
    micro_batches_needed,
    passes_s,
)
from srifty_core.simulator.estimator import Estimator, Simulator
from srifty_core.simulator.sharded import ShardedSimulator
from srifty_core.simulator.types import ClusterConfig, IterationEstimate, SimInstance, Workload

Search = Callable[[PlanRequest, Estimator], PlanResult]
SAME = "holds no local batch ddp does not: the same plans with more to exchange"
"""Why ``auto`` did not search a sharded strategy."""


class FitChecked:
    """The sharded iteration of ``strategy``, each estimate marked ``unfit`` where the
    configuration's ranks do not hold their batches at its own world size (by the
    request's own ``memory`` workload: the searched one's B_max is the space's bound)."""

    def __init__(self, simulator: Simulator, strategy: Strategy, memory: Workload) -> None:
        self.simulator = simulator
        self.sharded = ShardedSimulator(simulator, strategy)
        self.strategy = strategy
        self.memory = memory
        self._b_max: dict[tuple[SimInstance, int, bool], int] = {}

    def b_max(self, instance: SimInstance, world: int, accumulating: bool = False) -> int:
        """``fit.b_max`` of the request's memory, memoised (the search asks per estimate)."""
        key = (instance, world, accumulating)
        hit = self._b_max.get(key)
        if hit is None:
            hit = self._b_max[key] = fit.b_max(
                self.memory, instance, self.strategy, world, accumulating=accumulating
            )
        return hit

    def b_max_accumulating(self, instance: SimInstance, world: int) -> int:
        """``b_max`` of a micro-batch while gradients accumulate."""
        return self.b_max(instance, world, True)

    def estimate(self, workload: Workload, config: ClusterConfig) -> IterationEstimate:
        why = fit.short(self.memory, config, self.strategy, self.b_max)
        if why == fit.UNEQUAL_VMS:
            estimate = self.simulator.estimate(workload, config)  # no sharded model of it
        else:
            estimate = self.sharded.estimate(workload, config)
        return dataclasses.replace(estimate, unfit=why) if why else estimate


def sharded_request(request: PlanRequest, strategy: Strategy) -> PlanRequest:
    """``request`` pinned to ``strategy``, each device's profile with the largest B_max any
    offer of it has under ``strategy`` at the most ranks the quotas allow."""
    if strategy == "ddp":
        return dataclasses.replace(request, strategy="ddp")
    w = request.workload
    world = request.max_world
    bound: dict[str, int] = {}
    for o in request.offers:
        d = o.instance.device_type
        bound[d] = max(bound.get(d, 0), fit.b_max(w, o.instance, strategy, world))
    profiles = {d: dataclasses.replace(p, b_max=bound.get(d, 0)) for d, p in w.profiles.items()}
    workload = Workload(w.model, profiles, w.vm_evidence, w.unit_parameters)
    return dataclasses.replace(request, workload=workload, strategy=strategy)


def holds(request: PlanRequest, strategy: Strategy) -> int:
    """The samples the quotas hold under ``strategy``, every GPU at its B_max at the most
    ranks the quotas allow (beyond it: micro-batches)."""
    w, world = request.workload, request.max_world
    return sum(
        o.quota * o.instance.ranks_per_vm * fit.b_max(w, o.instance, strategy, world)
        for o in request.offers
    )


def accumulated(
    request: PlanRequest, strategy: Strategy, sim: Simulator
) -> tuple[PlanRequest, Estimator]:
    """``request`` pinned to ``strategy`` with every local batch allowed (each profile's
    B_max the global batch) and its estimator: each configuration in the fewest
    micro-batches its GPUs hold under ``strategy`` at its own world size
    (``simulator.accumulation``; a micro configuration checked as any other); under
    fsdp/hsdp the faster of the two modes that fits: the exchange held back to the last
    micro-batch (each rank keeps every unsharded gradient), or every micro-batch
    reduce-scattering its gradients (``sync_each_micro_batch``)."""
    w = request.workload
    profiles = {
        d: dataclasses.replace(p, b_max=request.global_batch) for d, p in w.profiles.items()
    }
    free = Workload(w.model, profiles, w.vm_evidence, w.unit_parameters)
    req = dataclasses.replace(request, workload=free, strategy=strategy)
    if strategy == "ddp":

        def ddp_b_max(instance: SimInstance, world: int) -> int:
            return fit.b_max(w, instance, "ddp", world)

        return req, Accumulated(
            sim,
            lambda c: micro_batches_needed(c, ddp_b_max),
            passes_s(sim),
            lambda c: no_micro_batch(c, strategy, ddp_b_max, None),
        )
    checked = FitChecked(sim, strategy, w)
    held_back = Accumulated(
        checked,
        lambda c: micro_batches_needed(c, checked.b_max, checked.b_max_accumulating),
        checked.sharded.accumulating_s,
        lambda c: no_micro_batch(c, strategy, checked.b_max, checked.b_max_accumulating),
    )
    syncing = Accumulated(  # FSDP's other mode: no unsharded gradient kept
        checked,
        lambda c: micro_batches_needed(c, checked.b_max),
        checked.sharded.syncing_s,
        lambda c: no_micro_batch(c, strategy, checked.b_max, None),
        sync_each=True,
    )
    return req, Fastest(held_back, syncing)


def fewer_vms(
    request: PlanRequest, strategy: Strategy, sim: Simulator, search: Search
) -> list[PlanResult]:
    """``strategy``'s plans on fewer VMs of one offer than hold the global batch at once,
    in micro-batches: ``accumulated``'s search of each offer of more than one GPU a VM alone,
    its quota cut to one VM fewer than the fewest that hold the batch at once (its whole
    quota where even that does not; skipped where one VM does). On such VMs a shard group
    has peers inside the VM, and fewer VMs exchange less across them. Not searched: offers of
    one GPU a VM (fewer of them in micro-batches is ddp's trade of hours for VMs, which the
    method's search does not make), mixes of offers, and hsdp where fsdp is searched too
    (hsdp on one VM is fsdp on it)."""
    if strategy == "hsdp" and "fsdp" in request.strategies:
        return []
    w, out = request.workload, []
    for i, o in enumerate(request.offers):
        per_vm = o.instance.ranks_per_vm
        if per_vm < 2:
            continue
        fewest = next(
            (n for n in range(1, o.quota + 1)
             if n * per_vm * fit.b_max(w, o.instance, strategy, n * per_vm)
             >= request.global_batch),
            o.quota + 1,
        )  # fmt: skip
        most = min(o.quota, fewest - 1)
        if most < 1 or fit.b_max(w, o.instance, strategy, most * per_vm) < 1:
            continue
        quotas = [dataclasses.replace(x, quota=most if j == i else 0)
                  for j, x in enumerate(request.offers)]  # fmt: skip
        try:
            req, estimator = accumulated(
                dataclasses.replace(request, offers=tuple(quotas)), strategy, sim
            )
        except ConfigError:  # no configuration of this offer alone
            continue
        out.append(search(req, estimator))
    return out


def merged(request: PlanRequest, results: Sequence[PlanResult], runners_up: int = 3) -> PlanResult:
    """One result of several searches of one strategy: the best of their plans, the next
    ones as runners-up, the frontier of every configuration evaluated, the nearest misses
    where none has a plan, and what they did in all (configurations, space, seconds)."""
    won = min(results, key=lambda r: _rank(request, r))
    seen: dict[tuple[Any, ...], Candidate] = {}
    for r in results:  # a configuration two searches met: the answer where it can run
        ran = (*r.candidates, *r.frontier, *r.runners_up, *r.nearest_misses)
        for c in (*ran, *((r.best,) if r.best is not None else ())):
            if c.choice not in seen or (seen[c.choice].estimate.unfit and not c.estimate.unfit):
                seen[c.choice] = c
    everything = list(seen.values())
    plans = sorted(
        {c.choice: c for r in results for c in (r.best, *r.runners_up) if c is not None}.values(),
        key=lambda c: rank_key(request.objective, c),
    )
    misses = sorted(
        (m for r in results for m in r.nearest_misses), key=lambda c: miss_ratio(request, c)
    )
    return dataclasses.replace(
        won,
        evaluated=sum(r.evaluated for r in results),
        space_size=sum(r.space_size for r in results),
        solve_s=sum(r.solve_s for r in results),
        frontier=tuple(frontier(everything)),
        runners_up=tuple(plans[1 : 1 + runners_up]) if won.best is not None else (),
        nearest_misses=tuple(misses[:3]) if won.best is None else won.nearest_misses,
        candidates=tuple(everything),
    )


def no_micro_batch(
    config: ClusterConfig,
    strategy: Strategy,
    b_max_of: Callable[[SimInstance, int], int],
    accumulating: Callable[[SimInstance, int], int] | None,
) -> str:
    """Why no micro-batch of ``config`` fits: the first GPU that holds no sample, and
    whether it holds some at once, without accumulating."""
    world = config.world_size
    for g in config.groups:
        at_once = b_max_of(g.instance, world)
        if accumulating is not None and accumulating(g.instance, world) < 1 <= at_once:
            return (
                f"{g.instance.name} holds {at_once} samples per GPU under {strategy} over "
                f"{world} ranks at once, and none while gradients accumulate (each rank "
                "keeps every unsharded gradient between micro-batches)"
            )
        if at_once < 1:
            return f"{g.instance.name} holds no sample under {strategy} over {world} ranks"
    return "a GPU holds no sample"


def enlarges(request: PlanRequest, sharded: PlanRequest) -> bool:
    """Whether ``sharded`` lets some offer hold local batches ``request`` (ddp) does not."""
    return any(
        o.quota > 0 and set(gpu_batches(sharded, s)) - set(gpu_batches(request, o))
        for o, s in zip(request.offers, sharded.offers, strict=True)
    )


def no_replica_fits(request: PlanRequest) -> str:
    """Why ddp has nothing to search where no offered GPU holds a replica ("" otherwise)."""
    w = request.workload
    offered = [o for o in request.offers if o.quota > 0]
    if any(w.profile(o.instance.device_type).b_max > 0 for o in offered):
        return ""
    need = max(fit.state_gib(w, o.instance.device_type) for o in offered)
    largest = max(offered, key=lambda o: fit.capacity_bytes(w, o.instance))
    cap = fit.capacity_bytes(w, largest.instance) / fit.GIB
    return (
        f"no offered GPU holds the model's training state (needs {need:.1f} GiB, largest "
        f"{cap:.1f} GiB x {USABLE:g} usable)"
    )


def _compare(objective: Objective, winner: PlanResult, other: PlanResult) -> str:
    """What ``winner``'s best plan gains over ``other``'s, on the objective first."""
    a, b = winner.best, other.best
    assert a is not None and b is not None
    faster = f"{b.time_s / a.time_s:.2f}x faster"
    cheaper = f"{100 * (1 - a.cost_usd / b.cost_usd):.0f}% cheaper"
    name = f"the best {other.strategy} plan"
    if abs(b.time_s / a.time_s - 1) < 0.005 and abs(b.cost_usd / a.cost_usd - 1) < 0.005:
        return f"as fast and as cheap as {name}"
    if objective is Objective.TIME:
        if b.time_s > a.time_s * 1.005:
            return f"{faster} than {name}"
        return f"as fast as {name} and {cheaper}"
    if b.cost_usd > a.cost_usd * 1.005:
        return f"{cheaper} than {name}"
    return f"as cheap as {name} and {faster}"


def _tag(result: PlanResult, strategy: Strategy, reason: str) -> PlanResult:
    return dataclasses.replace(result, strategy=strategy, strategy_reason=reason)


def _simulator_of(estimator: Estimator) -> Simulator | None:
    """The ``Simulator`` behind ``estimator``: itself, or the one a wrapper holds as
    ``inner`` (``planner.whatif.MemoEstimator``); ``None`` for any other estimator."""
    for e in (estimator, getattr(estimator, "inner", None)):
        if isinstance(e, Simulator):
            return e
    return None


def choose(request: PlanRequest, estimator: Estimator, search: Search) -> PlanResult:
    """The best plan over the strategies ``request`` allows (module doc)."""
    allowed = request.strategies
    pinned = request.strategy != "auto"
    sim = _simulator_of(estimator)
    if sim is None:
        if pinned and allowed != ("ddp",):
            raise ConfigError(
                f"strategy: {request.strategy} needs the simulator; the "
                f"{type(estimator).__name__} estimator models ddp only"
            )
        r = search(sharded_request(request, "ddp"), estimator)
        why = "ddp: pinned by the request" if pinned else "ddp: the estimator models ddp only"
        return _tag(r, "ddp", why)
    results: dict[Strategy, PlanResult] = {}
    notes: dict[Strategy, str] = {}
    notes_micro: dict[Strategy, str] = {}  # a plan on fewer VMs in micro-batches: why
    ddp_request: PlanRequest | None = None
    for s in allowed:
        if s == "hsdp" and all(o.instance.ranks_per_vm == 1 for o in request.offers):
            notes[s] = "shards inside a VM, and no offered VM has more than one GPU"
            continue
        if holds(request, s) < request.global_batch:  # only in micro-batches
            if holds(request, s) < 1:
                ddp_why = no_replica_fits(request) if s == "ddp" else ""
                notes[s] = ddp_why or "no offered GPU holds a sample"
                continue
            req, accumulating = accumulated(request, s, sim)
            results[s] = _tag(search(req, accumulating), s, "")
            continue
        try:
            req = sharded_request(request, s)
        except ConfigError as exc:  # the quotas cannot hold the global batch under s
            notes[s] = no_replica_fits(request) if s == "ddp" else str(exc)
            notes[s] = notes[s] or str(exc)
            continue
        if s == "ddp":
            ddp_request = req
            results[s] = _tag(search(req, estimator), s, "")
            continue
        if not pinned and ddp_request is not None and not enlarges(ddp_request, req):
            notes[s] = SAME
            continue
        checked = FitChecked(sim, s, request.workload)
        offered = [o for o in req.offers if o.quota > 0]
        most_vms = min(sum(o.quota for o in offered), req.global_batch)
        checked.sharded.prefetch(req.workload, [o.instance for o in offered], most_vms)
        at_once = search(req, checked)
        fewer = fewer_vms(request, s, sim, search)
        won = merged(request, [at_once, *fewer])
        if won.micro_batches > 1 and won.best is not None:
            n = won.best.choice[0][1]
            offer = request.offers[won.best.choice[0][0]].instance.name
            notes_micro[s] = (
                f"; {won.micro_batches} micro-batches per step on {n} {offer}, fewer than "
                f"hold the global batch of {request.global_batch} at once: "
                + ("it beat the best plan in one pass" if at_once.best is not None
                   else "no plan in one pass meets the limits")
            )  # fmt: skip
        results[s] = _tag(won, s, "")
    if not results:
        raise ConfigError(
            "strategy: no strategy can hold the global batch: "
            + "; ".join(f"{s}: {n}" for s, n in notes.items())
        )
    order = {s: i for i, s in enumerate(allowed)}

    def key(item: tuple[Strategy, PlanResult]) -> tuple[Any, ...]:
        s, r = item
        return (*_rank(request, r), order[s])

    ranked = sorted(results.items(), key=key)
    s, best = ranked[0]
    if pinned:
        why = notes_micro.get(s) or _micro(request, best, s)
        return _tag(best, s, f"{s}: pinned by the request" + why)
    if best.best is None:
        reason = f"{s}: nothing meets the limits under any strategy"
    else:
        world = best.best.estimate.world_size
        where = s if s == "ddp" else f"{s} over {world} ranks"
        others = [r for t, r in ranked[1:] if r.best is not None]
        parts = [_compare(request.objective, best, r) for r in others]
        parts += [f"{t}: no plan meets the limits" for t, r in ranked[1:] if r.best is None]
        same = [t for t, n in notes.items() if n == SAME]
        if same:
            parts.append(
                f"replicas hold every local batch {' and '.join(same)} would (the same "
                "configurations with more to exchange)"
            )
        parts += [f"{t}: {n}" for t, n in notes.items() if n != SAME]
        reason = f"{where}: " + ("; ".join(parts) if parts else "the only strategy searched")
    return _tag(best, s, reason + (notes_micro.get(s) or _micro(request, best, s)))


def _rank(request: PlanRequest, result: PlanResult) -> tuple[Any, ...]:
    """A result's place: one with a plan first, then its best plan's ``rank_key``."""
    best = result.best
    return (best is None, () if best is None else rank_key(request.objective, best))


def _micro(request: PlanRequest, result: PlanResult, strategy: Strategy) -> str:
    """Why ``result``'s best plan accumulates gradients ("" when it does not)."""
    k = 1 if result.best is None else result.best.estimate.micro_batches
    if k <= 1:
        return ""
    return (
        f"; {k} micro-batches per step: the quotas hold at most "
        f"{holds(request, strategy)} samples at once under {strategy}, the global batch is "
        f"{request.global_batch}"
    )
