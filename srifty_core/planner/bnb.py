"""Branch and bound over the pruned space: the exact search, at sizes the plain
exhaustive search could never simulate, and the second half of the approximation.

Contract: ``BranchAndBound(request, sim, space, keeper, budget=...).run()`` searches into
``keeper`` (``Keeper``: the best few, the time/cost frontier, the nearest misses; never
every candidate) and returns True when it finished; then the best plan is that of
simulating every configuration (``tests/planner/test_branch_and_bound.py``). A work
budget stops it early (False). ``simulate`` evaluates configurations not simulated yet
into a keeper.

Imports the planner's request, result and space and the simulator's ``PlannerEstimator``
(its floors: ``pass_floor``, ``ring_ceiling``, ``exchange_floor``).

How and why (enumeration, bound, pruning): docs/design/planner.md#bnb
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from srifty_core.planner.request import Objective, PlanRequest
from srifty_core.planner.result import Candidate, evaluate, miss_ratio, rank_key
from srifty_core.planner.space import Choice, Space
from srifty_core.simulator.estimator import Estimator, PlannerEstimator
from srifty_core.simulator.types import ClusterConfig, Group, SimInstance

SCALAR_COUNTS = 12
"""Up to this many counts of a batch the bound is taken one count at a time, beyond it
for every count at once (numpy)."""
SLACK = 1e-9
"""Relative margin of every cut: a bound is a sum of means the simulator takes in another
order, equal to its own up to rounding."""
MISSES = 3
"""Nearest misses kept (what ``plan`` reports when nothing meets the limits)."""


class _Node(NamedTuple):
    """A partial configuration of the search: what its chosen groups leave and hold."""

    remaining: int
    """Units of the global batch left to place."""
    max_f: float
    """The largest forward floor of the groups chosen (and of what must follow)."""
    max_b: float
    """The largest backward floor, likewise."""
    vms: int
    world: int
    rate: float
    """USD per hour of the groups chosen."""
    types: list[int]
    """The offers chosen, in order."""
    column: int
    """The slot in the simulator's draws of the next group (how many are chosen)."""


class _Child(NamedTuple):
    """A branch from a node: ``vm_count`` VMs of offer ``offer`` at ``batch`` per VM, with
    the bound of every configuration below it (job time, cost) and the node state it
    hands on."""

    time_s: float
    cost: float
    offer: int
    vm_count: int
    batch: int
    max_f: float
    max_b: float
    rate: float


class _Option(NamedTuple):
    """One offer at one VM batch, as the completion tables see it (one VM, its luckiest
    slot)."""

    fw: float
    bw: float
    time_s: float
    """The job time it alone allows."""
    price: float
    """USD per hour per sample."""
    quota: int
    batch: int
    offer: int


class OutOfBudget(Exception):
    """The search used its work budget."""


class Keeper:
    """What a search keeps of the configurations it simulates: the best ``keep`` that
    meet the limits (ranked by ``rank_key``), the time/cost frontier, the nearest misses
    (by ``miss_ratio``) and the ones the caller marks as notable (the approximation's
    seeds); never every candidate. With ``misses_only`` it ranks every configuration by
    how far it misses the limits instead (the search for the nearest misses)."""

    def __init__(
        self,
        request: PlanRequest,
        keep: int,
        *,
        exact: int | None = None,
        misses_only: bool = False,
    ) -> None:
        self.request = request
        self.keep = max(1, keep)
        self.exact = self.keep if exact is None else max(1, min(exact, self.keep))
        """How many of the best the searches must find exactly (they cut what cannot
        beat the ``exact``-th best found so far); the rest of the ``keep`` are the best
        of what was simulated."""
        self.misses_only = misses_only
        self.best: list[tuple[tuple[Any, ...], Candidate]] = []
        self.frontier: list[Candidate] = []
        self.misses: list[tuple[tuple[Any, ...], Candidate]] = []
        self.notable: dict[Choice, Candidate] = {}
        self.seen: set[Choice] = set()
        self.simulated = 0
        self.bounded = 0
        self._threshold = math.inf

    # ------------------------------------------------------------------ thresholds
    def threshold(self) -> float:
        """The measure a configuration must not exceed to matter to the search: the
        ``exact``-th best's time (objective time), cost (objective cost) or miss ratio
        (misses)."""
        return self._threshold

    def _measure(self) -> float:
        if self.misses_only:
            if len(self.misses) < self.exact:
                return math.inf
            return float(self.misses[self.exact - 1][0][0])
        if len(self.best) < self.exact:
            return math.inf
        c = self.best[self.exact - 1][1]
        return c.time_s if self.request.objective is Objective.TIME else c.cost_usd

    def could_enter(self, time_s: float, cost_usd: float) -> bool:
        """Whether a configuration whose time and cost are at least these could be among
        the ``exact`` best (or nearest misses)."""
        thr = self._threshold
        if thr == math.inf:
            return True
        if self.misses_only:
            r = self.request
            lb = max(time_s / r.time_limit_s, cost_usd / r.budget_usd)
        elif self.request.objective is Objective.TIME:
            lb = time_s
        else:
            lb = cost_usd
        return lb * (1.0 - SLACK) <= thr

    # ------------------------------------------------------------------ adding
    def add(self, c: Candidate, *, notable: bool = False) -> None:
        self.seen.add(c.choice)
        self.simulated += 1
        if notable:
            self.notable[c.choice] = c
        self._front(c)
        mkey = (miss_ratio(self.request, c), *rank_key(self.request.objective, c))
        limit = self.keep if self.misses_only else MISSES
        if len(self.misses) < limit or mkey < self.misses[-1][0]:
            bisect.insort(self.misses, (mkey, c), key=lambda x: x[0])
            del self.misses[limit:]
        if c.feasible and not self.misses_only:
            key = rank_key(self.request.objective, c)
            if len(self.best) < self.keep or key < self.best[-1][0]:
                bisect.insort(self.best, (key, c), key=lambda x: x[0])
                del self.best[self.keep :]
        self._threshold = self._measure()

    def _front(self, c: Candidate) -> None:
        """Keep ``frontier`` the configurations no other simulated one beats on both time
        and cost (``result.frontier``), fastest first."""
        f = self.frontier
        i = bisect.bisect_right(f, (c.time_s, c.cost_usd), key=lambda x: (x.time_s, x.cost_usd))
        if i > 0 and f[i - 1].cost_usd <= c.cost_usd:
            return
        j = i
        while j < len(f) and f[j].cost_usd >= c.cost_usd:
            j += 1
        f[i:j] = [c]

    def candidates(self) -> list[Candidate]:
        """Everything kept, each once, best first (``rank_key``)."""
        out: dict[Choice, Candidate] = {}
        for c in (
            *(c for _, c in self.best),
            *self.frontier,
            *(c for _, c in self.misses),
            *self.notable.values(),
        ):
            out.setdefault(c.choice, c)
        return sorted(out.values(), key=lambda c: rank_key(self.request.objective, c))

    def top(self) -> list[Candidate]:
        return [c for _, c in self.best]

    def nearest_misses(self) -> list[Candidate]:
        return [c for _, c in self.misses]


@dataclass(frozen=True, slots=True)
class _Offer:
    index: int
    instance: SimInstance
    quota: int
    price: float
    ranks: int
    batches: tuple[int, ...]
    units: tuple[int, ...]


class Bound:
    """The bound of one request over one space (see the module doc), with the tables it
    reads: which remainders the offers from each index can make up, each offer's group
    floors and the ring ceilings by VM count."""

    def __init__(self, request: PlanRequest, sim: PlannerEstimator, space: Space) -> None:
        self.request = request
        self.sim = sim
        self.space = space
        self.unit = space.unit
        self.target = request.global_batch // self.unit
        self.reach: list[NDArray[np.bool_]] = [w > 0 for w in space.completions(limit=1)]
        self._group: dict[tuple[int, int, int, int], tuple[float, float]] = {}
        self._group_lists: dict[tuple[int, int, int], tuple[list[float], list[float]]] = {}
        self._group_arrays: dict[
            tuple[int, int, int], tuple[NDArray[np.float64], NDArray[np.float64]]
        ] = {}
        self.offers = [
            _Offer(
                i,
                o.instance,
                o.quota,
                o.usd_per_hour,
                o.instance.ranks_per_vm,
                tuple(bs),
                tuple(b // self.unit for b in bs),
            )
            for i, (o, bs) in enumerate(zip(request.offers, space.vm_batches, strict=True))
        ]
        # VMs in all: no more than the quotas, nor than units of the global batch
        self.max_vms = max(1, min(sum(o.quota for o in self.offers), self.target))
        self._ceilings: list[dict[tuple[int, ...], NDArray[np.float64]]] | None = None
        self._joined: list[dict[tuple[int, ...], NDArray[np.float64]]] = []
        self._tails: dict[
            tuple[tuple[int, ...], int, int, int],
            list[tuple[tuple[float, ...], tuple[float, ...]]],
        ] = {}
        devices = {o.instance.device_type for o in self.offers if o.quota > 0}
        self.layouts = sorted(
            {
                (
                    tuple(b.size_bytes for b in request.workload.profile(d).buckets),
                    tuple(b.ready_fraction for b in request.workload.profile(d).buckets),
                )
                for d in devices
            }
        )
        self._completions()
        self._tables_np()

    # ------------------------------------------------------------------ completions
    def _completions(self) -> None:
        """The tables of what the offers from each index can add (``completion_passes``,
        ``completion_cost``), from each (offer, batch): a group's own forward and
        backward floors at one VM in its luckiest slot (more VMs are no faster), and its
        price per sample."""
        request = self.request
        n = len(self.offers)
        overhead, iters = request.overheads.total_s, request.iterations
        # every configuration has two ranks or more when no one GPU holds the batch
        ring = not any(
            o.quota > 0 and o.ranks == 1 and request.global_batch in o.batches for o in self.offers
        )
        options: list[_Option] = []
        for o in self.offers:
            if o.quota == 0:
                continue
            for batch in o.batches:
                floors = [self.group(o.index, 1, batch, col) for col in range(n)]
                f = min(x[0] for x in floors)
                bw = min(x[1] for x in floors)
                t = f + bw
                if ring:  # its type is in the ring: the exchange it alone allows
                    (t_pe,) = self.exchange([o.index], 1, 2, n, (bw,))
                    t = f + max(bw, t_pe)
                t_s = overhead + iters * t
                options.append(_Option(f, bw, t_s, o.price / batch, o.quota, batch, o.index))
        self._anchors: list[tuple[tuple[list[float], list[int]], ...]] = []
        self._prices: list[tuple[list[float], list[float], list[float]]] = []
        self._knapsack: list[tuple[list[int], list[float], list[float]]] = []
        for j in range(n + 1):
            mine = [x for x in options if x.offer >= j]
            # per pass: the most samples the offers from j on hold with every group's
            # floor within an anchor (each offer at its largest batch that fast, its
            # full quota): some group of theirs is at least as slow as the first anchor
            # that holds the samples
            per_pass = []
            for k in (0, 1):  # the option's fw, then its bw
                largest: dict[int, int] = {}
                total = 0
                times: list[float] = []
                holds: list[int] = []
                for x in sorted(mine, key=lambda x: x[k]):
                    old = largest.get(x.offer, 0)
                    if x.batch > old:
                        total += x.quota * (x.batch - old)
                        largest[x.offer] = x.batch
                    times.append(x[k])
                    holds.append(total)
                per_pass.append((times, holds))
            self._anchors.append(tuple(per_pass))
            # cost: per sample, the cheapest price among the options no slower than a job
            # time, and the cheapest price x own job time among the slower ones
            by_time = sorted(mine, key=lambda x: x.time_s)
            below: list[float] = []
            low = math.inf
            for x in by_time:
                low = min(low, x.price)
                below.append(low)
            above = [math.inf] * (len(by_time) + 1)
            for k in range(len(by_time) - 1, -1, -1):
                above[k] = min(above[k + 1], by_time[k].price * by_time[k].time_s)
            self._prices.append(([x.time_s for x in by_time], below, above))
            # and within the quotas: each offer holds at most quota x its largest batch,
            # each sample paying at least the offer's least price x own job time; the
            # cheapest first fill the samples (a fractional knapsack)
            per_offer: dict[int, tuple[float, int]] = {}
            for x in mine:
                least, most = per_offer.get(x.offer, (math.inf, 0))
                per_offer[x.offer] = (min(least, x.price * x.time_s), max(most, x.quota * x.batch))
            filled, paid = [0], [0.0]
            for least, most in sorted(per_offer.values()):
                filled.append(filled[-1] + most)
                paid.append(paid[-1] + least * most)
            self._knapsack.append((filled, paid, sorted(x for x, _ in per_offer.values())))

    def completion_passes(self, start: int, samples: int) -> tuple[float, float]:
        """Floors of the slowest forward and backward passes of any configuration in
        which the offers from ``start`` on hold ``samples`` (> 0) samples."""
        out = []
        for times, holds in self._anchors[start]:
            k = bisect.bisect_left(holds, samples)
            out.append(times[k] if k < len(times) else math.inf)
        return out[0], out[1]

    def completion_cost(self, start: int, samples: int, time_s: float) -> float:
        """A floor of what ``samples`` samples held by the offers from ``start`` on add
        to the cost (USD x 3600) of a configuration whose job time is at least
        ``time_s``: each such sample pays its VM's price per sample for the job's time,
        which is at least its own group's (and the quotas bound how many samples the
        cheapest offers hold)."""
        times, below, above = self._prices[start]
        k = bisect.bisect_right(times, time_s)
        best = above[k]
        if k:
            best = min(best, below[k - 1] * time_s)
        filled, paid, least = self._knapsack[start]
        k = bisect.bisect_left(filled, samples)
        if k >= len(filled):
            return math.inf  # the quotas cannot hold them
        within = paid[k - 1] + (samples - filled[k - 1]) * least[k - 1] if k else 0.0
        return max(samples * best, within)

    def completion_passes_many(
        self, start: int, samples: NDArray[np.int64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``completion_passes`` of each."""
        out = []
        for times, holds in self._anchors_np[start]:
            out.append(times[np.searchsorted(holds, samples, side="left")])
        return out[0], out[1]

    def completion_cost_many(
        self, start: int, samples: NDArray[np.int64], time_s: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """``completion_cost`` of each."""
        times, below, above = self._prices_np[start]
        k = np.searchsorted(times, time_s, side="right")
        best = above[k]
        if len(below):
            under = below[np.maximum(k - 1, 0)] * time_s
            best = np.where(k > 0, np.minimum(best, under), best)
        filled, paid, least = self._knapsack_np[start]
        k = np.searchsorted(filled, samples, side="left")
        over = k >= len(filled)
        k = np.clip(k, 1, len(filled) - 1) - 1
        within = np.where(over, np.inf, paid[k] + (samples - filled[k]) * least[k])
        out: NDArray[np.float64] = np.maximum(samples * best, within)
        return out

    def _tables_np(self) -> None:
        """The completion tables as arrays (an ``inf`` past the last anchor)."""
        inf = np.array([np.inf])
        self._anchors_np = [
            tuple(
                (np.concatenate([np.asarray(t, dtype=np.float64), inf]), np.asarray(h))
                for t, h in per_pass
            )
            for per_pass in self._anchors
        ]
        self._prices_np = [
            (np.asarray(t, dtype=np.float64), np.asarray(b, dtype=np.float64),
             np.asarray(a, dtype=np.float64))
            for t, b, a in self._prices
        ]  # fmt: skip
        self._knapsack_np = [
            (np.asarray(f), np.asarray(p, dtype=np.float64),
             np.concatenate([np.asarray(x, dtype=np.float64), inf]))
            for f, p, x in self._knapsack
        ]  # fmt: skip

    def group_arrays(
        self, i: int, batch: int, column: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``group`` for every count up to the quota (or the global batch), as arrays."""
        key = (i, batch, column)
        hit = self._group_arrays.get(key)
        if hit is None:
            o = self.offers[i]
            counts = max(1, min(o.quota, self.target // (batch // self.unit)))
            hit = self.sim.pass_floors(self.request.workload, o.instance, batch, column, counts)
            self._group_arrays[key] = hit
        return hit

    def group_lists(self, i: int, batch: int, column: int) -> tuple[list[float], list[float]]:
        """``group_arrays`` as lists (for one count at a time)."""
        key = (i, batch, column)
        hit = self._group_lists.get(key)
        if hit is None:
            f, bw = self.group_arrays(i, batch, column)
            hit = (f.tolist(), bw.tolist())
            self._group_lists[key] = hit
        return hit

    def exchange_many(
        self,
        types: Sequence[int],
        vms: NDArray[np.int64],
        world: NDArray[np.int64],
        join: int,
        t_bw: NDArray[np.float64],
    ) -> NDArray[np.float64]:
        """``exchange`` of each (VM counts, world sizes, backward passes)."""
        ceilings = self.ceilings()
        v = np.minimum(vms, self.max_vms)
        scale = 2.0 * (world - 1) / world
        best = np.full(len(v), np.inf)
        for sizes, fractions in self.layouts:
            if not sizes:
                return np.zeros(len(v))
            rows = [ceilings[i][sizes][v] for i in types]
            if join < len(self.offers) and sizes in self._joined[join]:
                rows.append(self._joined[join][sizes][v])
            top = rows[0] if len(rows) == 1 else np.minimum.reduce(rows)
            times = np.asarray(sizes, dtype=np.float64)[None, :] * scale[:, None] / top
            tail = np.cumsum(times[:, ::-1], axis=1)[:, ::-1]
            floor = (np.asarray(fractions)[None, :] * t_bw[:, None] + tail).max(axis=1)
            best = np.minimum(best, floor)
        return best

    # ------------------------------------------------------------------ pieces
    def group(self, i: int, count: int, batch: int, column: int) -> tuple[float, float]:
        key = (i, count, batch, column)
        hit = self._group.get(key)
        if hit is None:
            g = Group(self.offers[i].instance, count, batch)
            hit = self.sim.pass_floor(self.request.workload, g, column)
            self._group[key] = hit
        return hit

    def ceilings(self) -> list[dict[tuple[int, ...], NDArray[np.float64]]]:
        """Per offer and bucket layout: row ``v`` holds, per bucket, the most bus
        bandwidth a ring holding the offer's type among ``v`` or more VMs gives it (a
        suffix maximum of ``ring_ceiling``; row 0 unused)."""
        if self._ceilings is None:
            vms = range(1, self.max_vms + 1)
            out: list[dict[tuple[int, ...], NDArray[np.float64]]] = []
            for o in self.offers:
                if o.quota == 0:
                    out.append({})
                    continue
                tables = self.sim.ring_ceiling(self.request.workload, o.instance, vms)
                per: dict[tuple[int, ...], NDArray[np.float64]] = {}
                for sizes, t in tables.items():
                    suffix = np.maximum.accumulate(t[::-1], axis=0)[::-1]
                    per[sizes] = np.vstack([suffix[:1], suffix])
                out.append(per)
            self._ceilings = out
            # per index: the most any offer from it on gives (one of them joins the ring)
            self._joined = [{} for _ in range(len(out) + 1)]
            for j in range(len(out) - 1, -1, -1):
                here = self._joined[j + 1]
                self._joined[j] = {
                    sizes: (t if sizes not in here else np.maximum(t, here[sizes]))
                    for sizes, t in out[j].items()
                } | {sizes: t for sizes, t in here.items() if sizes not in out[j]}
        return self._ceilings

    def exchange(
        self, types: Sequence[int], vms: int, world: int, join: int, t_bws: Sequence[float]
    ) -> list[float]:
        """Floors of the exchange of any configuration holding the offers ``types`` (and,
        with ``join`` below the number of offers, one from ``join`` on) among ``vms`` or
        more VMs and ``world`` (>= 2) or more ranks, with its mean backward pass at
        least each of ``t_bws``."""
        key = (tuple(types), vms, world, join)
        tails = self._tails.get(key)
        if tails is None:
            tails = self._exchange_tails(types, vms, world, join)
            if len(self._tails) > 200_000:
                self._tails.clear()
            self._tails[key] = tails
        out = []
        for t_bw in t_bws:
            best = math.inf
            for fractions, tail in tails:
                floor = 0.0
                for f, rest in zip(fractions, tail, strict=True):
                    floor = max(floor, f * t_bw + rest)
                best = min(best, floor)
            out.append(best)
        return out

    def _exchange_tails(
        self, types: Sequence[int], vms: int, world: int, join: int
    ) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
        """Per bucket layout: (ready fractions, per bucket the least time the transfers
        from it to the last take, one after the other)."""
        ceilings = self.ceilings()
        v = min(vms, self.max_vms)
        scale = 2.0 * (world - 1) / world
        out = []
        for sizes, fractions in self.layouts:
            rows = [ceilings[i][sizes][v] for i in types]
            if join < len(self.offers) and sizes in self._joined[join]:
                rows.append(self._joined[join][sizes][v])
            top = rows[0] if len(rows) == 1 else np.minimum.reduce(rows)
            times = np.asarray(sizes, dtype=np.float64) * scale / top
            tail = np.cumsum(times[::-1])[::-1]
            out.append((fractions, tuple(float(x) for x in tail)))
        return out

    def config(self, chosen: Sequence[tuple[int, int, int]]) -> ClusterConfig:
        return self.space.config(tuple(chosen))


class BranchAndBound:
    """One run of the search (module doc) into ``keeper``. ``budget``: work units
    (a bound of a branch 1, of a complete configuration 4, a simulation 40) before it
    stops with ``OutOfBudget``; ``None`` for none."""

    def __init__(
        self,
        request: PlanRequest,
        sim: PlannerEstimator,
        space: Space,
        keeper: Keeper,
        *,
        budget: int | None = None,
        limits: bool = True,
        bound: Bound | None = None,
    ) -> None:
        self.request = request
        self.sim = sim
        self.space = space
        self.keeper = keeper
        self.budget = math.inf if budget is None else budget
        self.limits = limits
        self.b = bound if bound is not None else Bound(request, sim, space)
        self.work = 0
        self.overhead = request.overheads.total_s
        self.iters = request.iterations
        self.time_limit = request.time_limit_s
        self.budget_usd = request.budget_usd
        self.by_time = request.objective is Objective.TIME and not keeper.misses_only

    def run(self) -> bool:
        """Search; True when it finished (the keeper holds the exact answer)."""
        if not self.b.reach[0][self.b.target]:
            return True
        try:
            self._expand(0, self.b.target, 0.0, 0.0, 0, 0, 0.0, [], [])
        except OutOfBudget:
            return False
        return True

    def _spend(self, units: int) -> None:
        self.work += units
        if self.work > self.budget:
            raise OutOfBudget

    def _enters(self, time_s: float, cost_usd: float) -> bool:
        """Whether a branch whose job time and cost are at least these can still hold a
        configuration that meets the limits and enters the keeper."""
        lo = 1.0 - SLACK
        if self.limits and (time_s * lo > self.time_limit or cost_usd * lo > self.budget_usd):
            return False
        return self.keeper.could_enter(time_s, cost_usd)

    def _expand(
        self,
        start: int,
        remaining: int,
        max_f: float,
        max_b: float,
        vms: int,
        world: int,
        rate: float,
        types: list[int],
        chosen: list[tuple[int, int, int]],
    ) -> None:
        b = self.b
        unit = b.unit
        column = len(chosen)
        children: list[_Child] = []
        node = _Node(remaining, max_f, max_b, vms, world, rate, types, column)
        for j in range(start, len(b.offers)):
            if not b.reach[j][remaining]:
                break  # nothing from j on makes up the rest
            o = b.offers[j]
            if o.quota == 0:
                continue
            for batch, u in zip(o.batches, o.units, strict=True):
                most = min(o.quota, remaining // u)
                if most == 0:
                    break  # the batches only grow
                full = remaining % u == 0 and remaining // u <= o.quota  # the rest, exactly
                part = most - 1 if full else most  # counts that leave some to the next
                if part:
                    part = self._within(j, batch, column, part, max_f, max_b)
                if not part:
                    pass
                elif part <= SCALAR_COUNTS:  # the counts whose rest the offers after j hold
                    after = b.reach[j + 1]
                    few = [c for c in range(1, part + 1) if after[remaining - c * u]]
                    self._spend(len(few))
                    if few:
                        self._few(children, node, j, batch, u, few)
                else:
                    stop = remaining - u * (part + 1)
                    after = b.reach[j + 1][remaining - u : stop if stop >= 0 else None : -u]
                    counts = np.flatnonzero(after) + 1
                    self._spend(len(counts))
                    if len(counts) > SCALAR_COUNTS:
                        self._many(children, node, j, batch, u, counts)
                    elif len(counts):
                        self._few(children, node, j, batch, u, counts.tolist())
                if full:
                    self._last(children, node, j, batch, most)
        if self.by_time:
            children.sort(key=lambda x: (x.time_s, x.cost, x.offer, -x.vm_count))
        else:
            children.sort(key=lambda x: (x.cost, x.time_s, x.offer, -x.vm_count))
        for t_s, cost, j, c, batch, mf, mb, r in children:
            if not self._enters(t_s, cost):
                continue  # the best found moved on since
            o = b.offers[j]
            left = remaining - c * (batch // unit)
            chosen.append((j, c, batch))
            if left:
                self._expand(
                    j + 1, left, mf, mb, vms + c, world + c * o.ranks, r, [*types, j], chosen
                )
            else:
                self._leaf(chosen, mf, mb, r)
            chosen.pop()

    def _within(
        self, j: int, batch: int, column: int, counts: int, max_f: float, max_b: float
    ) -> int:
        """How many of the counts 1..``counts`` of offer ``j`` at ``batch`` pass the cut
        by compute alone (the time limit, or time as the objective): compute only grows
        with the count, so they are the first ones (a binary search)."""
        thr = self.keeper.threshold() if self.by_time else math.inf
        if self.limits:
            thr = min(thr, self.time_limit)
        if thr == math.inf:
            return counts
        f, bw = self.b.group_lists(j, batch, column)
        lo = 1.0 - SLACK
        overhead, iters = self.overhead, self.iters

        def cut(c: int) -> bool:
            t = max(max_f, f[c - 1]) + max(max_b, bw[c - 1])
            return (overhead + iters * t) * lo > thr

        if not cut(counts):
            return counts
        return bisect.bisect_left(range(1, counts), True, key=cut)

    def _few(
        self,
        children: list[_Child],
        node: _Node,
        j: int,
        batch: int,
        u: int,
        counts: list[int],
    ) -> None:
        """Children of ``node`` with ``counts`` VMs of offer ``j`` at ``batch``, each
        leaving samples the offers after ``j`` can hold (the counts ``_within`` kept):
        one at a time (few counts)."""
        remaining, max_f, max_b, vms, world, rate, types, column = node
        b, o = self.b, self.b.offers[j]
        overhead, iters = self.overhead, self.iters
        fs, bws = b.group_lists(j, batch, column)
        for c in counts:
            left = remaining - c * u
            mf, mb = max(max_f, fs[c - 1]), max(max_b, bws[c - 1])
            samples = left * b.unit
            fc, bc = b.completion_passes(j + 1, samples)
            mf, mb = max(mf, fc), max(mb, bc)
            (t_pe,) = b.exchange([*types, j], vms + c + 1, world + c * o.ranks + 1, j + 1, (mb,))
            t_s = overhead + iters * (mf + max(mb, t_pe))
            r = rate + c * o.price
            cost = (r * t_s + b.completion_cost(j + 1, samples, t_s)) / 3600.0
            if self._enters(t_s, cost):
                children.append(_Child(t_s, cost, j, c, batch, mf, mb, r))

    def _many(
        self,
        children: list[_Child],
        node: _Node,
        j: int,
        batch: int,
        u: int,
        counts: NDArray[np.int64],
    ) -> None:
        """``_few``, for every count at once (numpy)."""
        remaining, max_f, max_b, vms, world, rate, types, column = node
        b, o = self.b, self.b.offers[j]
        overhead, iters = self.overhead, self.iters
        cs = counts
        f, bw = b.group_arrays(j, batch, column)
        mf, mb = np.maximum(max_f, f[cs - 1]), np.maximum(max_b, bw[cs - 1])
        samples = (remaining - cs * u) * b.unit
        fc, bc = b.completion_passes_many(j + 1, samples)
        mf, mb = np.maximum(mf, fc), np.maximum(mb, bc)
        t_pe = b.exchange_many([*types, j], vms + cs + 1, world + cs * o.ranks + 1, j + 1, mb)
        t_s = overhead + iters * (mf + np.maximum(mb, t_pe))
        r = rate + cs * o.price
        cost = (r * t_s + b.completion_cost_many(j + 1, samples, t_s)) / 3600.0
        keep = self._enters_many(t_s, cost)
        for k in np.flatnonzero(keep):
            children.append(
                _Child(float(t_s[k]), float(cost[k]), j, int(cs[k]), batch, float(mf[k]),
                       float(mb[k]), float(r[k]))
            )  # fmt: skip

    def _last(
        self,
        children: list[_Child],
        node: _Node,
        j: int,
        batch: int,
        c: int,
    ) -> None:
        """The child of ``node`` whose ``c`` VMs of offer ``j`` hold all the rest."""
        _, max_f, max_b, vms, world, rate, types, column = node
        b, o = self.b, self.b.offers[j]
        self._spend(1)
        f, bw = b.group(j, c, batch, column)
        mf, mb = max(max_f, f), max(max_b, bw)
        t = mf + mb
        w = world + c * o.ranks
        if w >= 2:
            (t_pe,) = b.exchange([*types, j], vms + c, w, len(b.offers), (mb,))
            t = mf + max(mb, t_pe)
        t_s = self.overhead + self.iters * t
        r = rate + c * o.price
        cost = r * t_s / 3600.0
        if self._enters(t_s, cost):
            children.append(_Child(t_s, cost, j, c, batch, mf, mb, r))

    def _enters_many(
        self, time_s: NDArray[np.float64], cost: NDArray[np.float64]
    ) -> NDArray[np.bool_]:
        """``_enters`` of each."""
        lo = 1.0 - SLACK
        ok = np.ones(len(time_s), dtype=bool)
        if self.limits:
            ok &= (time_s * lo <= self.time_limit) & (cost * lo <= self.budget_usd)
        thr = self.keeper.threshold()
        if thr == math.inf:
            return ok
        if self.keeper.misses_only:
            lb = np.maximum(time_s / self.time_limit, cost / self.budget_usd)
        elif self.request.objective is Objective.TIME:
            lb = time_s
        else:
            lb = cost
        return ok & (lb * lo <= thr)

    def _leaf(
        self, chosen: list[tuple[int, int, int]], max_f: float, max_b: float, r: float
    ) -> None:
        choice = tuple(chosen)
        if choice in self.keeper.seen:
            return
        self._spend(4)
        self.keeper.bounded += 1
        config = self.b.config(choice)
        t = max_f + max(max_b, self.sim.exchange_floor(self.request.workload, config, max_b))
        time_s = self.overhead + self.iters * t
        if not self._enters(time_s, r * time_s / 3600.0):
            return
        self._spend(40)
        est = self.sim.estimate(self.request.workload, config)
        self.keeper.add(evaluate(self.request, choice, est))


def simulate(
    request: PlanRequest,
    estimator: Estimator,
    space: Space,
    keeper: Keeper,
    choices: Iterable[Choice],
    *,
    notable: bool = False,
    prefetch: Callable[[Sequence[ClusterConfig]], None] | None = None,
) -> list[Candidate]:
    """Simulate the configurations not simulated yet into ``keeper`` (its bandwidth curves
    first, in one call, where ``prefetch`` is given); their candidates."""
    todo: list[Choice] = []
    seen = set(keeper.seen)
    for ch in choices:
        key = tuple(sorted(ch))
        if key not in seen:
            seen.add(key)
            todo.append(key)
    configs = [space.config(ch) for ch in todo]
    if prefetch is not None and configs:
        prefetch(configs)
    out = []
    for ch, config in zip(todo, configs, strict=True):
        c = evaluate(request, ch, estimator.estimate(request.workload, config))
        keeper.add(c, notable=notable)
        out.append(c)
    return out
