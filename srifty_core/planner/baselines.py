"""The method's baselines, behind one interface so that case studies compare like for like.

Contract: ``srifty``, ``apm``, ``cheapest_gpu_first``, ``fastest_gpu_first`` and
``oracle_bo`` each take a ``PlanRequest`` and return a ``MethodChoice``: the configuration
the method would run (a ``Candidate`` evaluated on the same request, in ``plan``'s
``Choice`` notation), or ``None`` when it proposes nothing, with the time it took to
decide. The greedy heuristics ignore the limits (``candidate.violations`` says how).
This module never touches the emulated cloud: the oracle's ground truth comes in as a
function (``measure``).

Imports ``planner.search.plan``, the planner's request, result and space, and the
simulator's ``Estimator`` and ``ApmEstimator``.

How and why (each baseline's rule): docs/design/planner.md#baselines
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from srifty_core.errors import ConfigError
from srifty_core.planner.request import Objective, PlanRequest
from srifty_core.planner.result import Candidate, PlanResult, evaluate, miss_ratio, rank_key
from srifty_core.planner.search import plan
from srifty_core.planner.space import Choice, Space
from srifty_core.simulator.apm import ApmEstimator
from srifty_core.simulator.estimator import Estimator
from srifty_core.simulator.types import ClusterConfig, IterationEstimate

MAGIC_BATCH = 64
"""FGF's per-GPU batch."""
BO_FRACTION = 1 / 3
"""Share of the pruned space the oracle may measure."""

Measure = Callable[[ClusterConfig], float]
"""Ground truth: the mean iteration time (s) of a configuration."""


@dataclass(frozen=True)
class MethodChoice:
    """What one method proposes for a request."""

    method: str
    candidate: Candidate | None
    """The configuration it would run, evaluated on the request (``None``: no proposal)."""
    solve_s: float
    evaluated: int
    """Configurations it evaluated (simulated, or measured for the oracle)."""
    result: PlanResult | None = None
    """The planner's full answer, for planner-based methods."""
    note: str = ""

    @property
    def label(self) -> str:
        return self.candidate.label if self.candidate is not None else "(none)"


def _from_plan(method: str, result: PlanResult) -> MethodChoice:
    note = "" if result.best is not None else "predicts no configuration meets the limits"
    return MethodChoice(method, result.best, result.solve_s, result.evaluated, result, note)


def srifty(request: PlanRequest, estimator: Estimator, *, method: str = "auto") -> MethodChoice:
    """The planner (``plan``) as a method."""
    return _from_plan("srifty", plan(request, estimator, method=method))


def apm(
    request: PlanRequest, estimator: Estimator | None = None, *, method: str = "auto"
) -> MethodChoice:
    """The planner over the APM estimator (``ApmEstimator()`` unless given)."""
    est = estimator if estimator is not None else ApmEstimator()
    return _from_plan("apm", plan(request, est, method=method))


# ---------------------------------------------------------------------------- greedy
def _fill(request: PlanRequest, order: Sequence[int], per_gpu: Sequence[int]) -> Choice | None:
    """VMs of the offers in ``order``, each at ``per_gpu[i]`` samples a GPU, one at a time
    until the global batch is held; the last VM takes what is left (a multiple of its GPUs).
    ``None`` when the quotas cannot hold the batch this way."""
    remaining = request.global_batch
    out: list[tuple[int, int, int]] = []
    for i in order:
        o = request.offers[i]
        ranks = o.instance.ranks_per_vm
        full = per_gpu[i] * ranks
        if remaining <= 0 or o.quota == 0 or full < 1:
            continue
        n_full = min(o.quota, remaining // full)
        if n_full:
            out.append((i, n_full, full))
            remaining -= n_full * full
        if 0 < remaining < full and n_full < o.quota and remaining % ranks == 0:
            out.append((i, 1, remaining))
            remaining = 0
    return tuple(out) if remaining == 0 else None


def _gpu_b_max(request: PlanRequest, i: int) -> int:
    return request.workload.profile(request.offers[i].instance.device_type).b_max


def _greedy_choice(
    method: str,
    request: PlanRequest,
    estimator: Estimator,
    choice: Choice | None,
    t0: float,
    note: str = "",
) -> MethodChoice:
    if choice is None:
        return MethodChoice(
            method, None, time.perf_counter() - t0, 0, note="cannot hold the global batch"
        )
    cand = evaluate(request, choice, estimator.estimate(request.workload, _config(request, choice)))
    return MethodChoice(method, cand, time.perf_counter() - t0, 1, note=note)


def _config(request: PlanRequest, choice: Choice) -> ClusterConfig:
    return Space(request, ()).config(choice)


def cheapest_gpu_first(request: PlanRequest, estimator: Estimator) -> MethodChoice:
    """CGF: B_max on every chosen GPU, cheapest GPU (price / GPUs per VM) first."""
    t0 = time.perf_counter()
    offers = request.offers
    order = sorted(
        range(len(offers)),
        key=lambda i: (offers[i].usd_per_hour / offers[i].instance.ranks_per_vm, i),
    )
    per_gpu = [_gpu_b_max(request, i) for i in range(len(offers))]
    return _greedy_choice("cgf", request, estimator, _fill(request, order, per_gpu), t0)


def fastest_gpu_first(
    request: PlanRequest, estimator: Estimator, *, batch: int = MAGIC_BATCH
) -> MethodChoice:
    """FGF: ``batch`` samples a GPU on the fastest GPUs first; all GPUs at B_max when the
    quotas run out."""
    t0 = time.perf_counter()
    offers = request.offers
    per_gpu = [min(batch, _gpu_b_max(request, i)) for i in range(len(offers))]

    def speed(i: int) -> float:
        p = request.workload.profile(offers[i].instance.device_type)
        return per_gpu[i] / float(p.t_iter(per_gpu[i]))

    order = sorted(range(len(offers)), key=lambda i: (-speed(i), i))
    choice = _fill(request, order, per_gpu)
    note = ""
    if choice is None:
        choice = _fill(request, order, [_gpu_b_max(request, i) for i in range(len(offers))])
        note = f"quotas too small at {batch} a GPU: packed at B_max"
    return _greedy_choice("fgf", request, estimator, choice, t0, note)


# ---------------------------------------------------------------------------- oracle BO
def _encode(request: PlanRequest, choice: Choice) -> list[float]:
    """Per offer: VM count / quota and log2 of the per-GPU batch (0 when unused)."""
    x = [0.0] * (2 * len(request.offers))
    for i, c, b in choice:
        o = request.offers[i]
        x[2 * i] = c / max(1, o.quota)
        x[2 * i + 1] = math.log2(b // o.instance.ranks_per_vm) / 10.0
    return x


def _truth_candidate(request: PlanRequest, choice: Choice, t_iter: float) -> Candidate:
    config = _config(request, choice)
    est = IterationEstimate(
        t_iter=t_iter,
        t_fw=math.nan,
        t_bw=math.nan,
        t_pe=math.nan,
        exposed_comm=math.nan,
        p50=t_iter,
        p95=t_iter,
        global_batch=config.global_batch,
        world_size=config.world_size,
        bottleneck="measured",
    )
    return evaluate(request, choice, est)


def _score(request: PlanRequest, c: Candidate) -> float:
    """Lower is better: the objective when the limits hold, else a penalty above every
    feasible value (how far the limits are missed)."""
    value = c.time_s if request.objective is Objective.TIME else c.cost_usd
    if c.feasible:
        return math.log(value)
    return 50.0 + math.log(miss_ratio(request, c))


def _bo_search(
    request: PlanRequest,
    pool: list[Choice],
    budget: int,
    measure: Measure,
    rng: np.random.Generator,
    seen: dict[Choice, Candidate],
    initial: int,
) -> None:
    """Measure up to ``budget`` configurations of ``pool``: ``initial`` at random, then by
    expected improvement of a GP fitted on the scores seen in this pool."""
    import warnings

    from scipy.stats import norm
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    if not pool or budget <= 0:
        return
    xs = np.asarray([_encode(request, ch) for ch in pool])
    tried: list[int] = []

    def run(k: int) -> None:
        ch = pool[k]
        if ch not in seen:
            seen[ch] = _truth_candidate(request, ch, measure(_config(request, ch)))
        tried.append(k)

    for k in rng.permutation(len(pool))[: min(initial, budget)]:
        run(int(k))
    kernel = ConstantKernel(1.0) * Matern(length_scale=0.5, nu=2.5) + WhiteKernel(1e-3)
    while len(tried) < min(budget, len(pool)):
        y = np.asarray([_score(request, seen[pool[k]]) for k in tried])
        gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(xs[tried], y)
        left = np.setdiff1d(np.arange(len(pool)), tried)
        mu, sd = gp.predict(xs[left], return_std=True)
        best = float(y.min())
        sd = np.maximum(sd, 1e-9)
        z = (best - mu) / sd
        ei = (best - mu) * norm.cdf(z) + sd * norm.pdf(z)
        run(int(left[int(np.argmax(ei))]))


def oracle_bo(
    request: PlanRequest,
    measure: Measure,
    *,
    fraction: float = BO_FRACTION,
    homogeneous_only: bool | None = None,
    initial: int = 3,
    seed: int = 0,
) -> MethodChoice:
    """Oracle BO: measure at most ``ceil(fraction x |space|)`` configurations of the pruned
    space with ``measure`` (ground truth), pick the best one observed (the objective among
    those meeting the limits, else the nearest miss). ``homogeneous_only`` (default: when
    the request offers more than one instance type) restricts the search to single-type
    configurations, one search per type with an equal share of the budget. The candidate's
    estimate is the measurement (``bottleneck`` = ``measured``)."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"fraction: must be in (0, 1], got {fraction}")
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    space = Space.build(request)
    every = [tuple(sorted(ch)) for ch in space.enumerate()]
    used = [i for i, o in enumerate(request.offers) if o.quota > 0]
    homog = len(used) > 1 if homogeneous_only is None else homogeneous_only
    seen: dict[Choice, Candidate] = {}
    if homog:
        pools = {i: [ch for ch in every if {j for j, _, _ in ch} == {i}] for i in used}
        searched = sum(len(p) for p in pools.values())
        budget = math.ceil(fraction * searched)
        share = [
            budget // len(used) + (1 if k < budget % len(used) else 0) for k in range(len(used))
        ]
        for k, i in enumerate(used):
            _bo_search(request, pools[i], share[k], measure, rng, seen, initial)
    else:
        budget = math.ceil(fraction * len(every))
        _bo_search(request, every, budget, measure, rng, seen, initial)
    if not seen:
        return MethodChoice(
            "oracle_bo", None, time.perf_counter() - t0, 0, note="no configuration to search"
        )
    feasible = [c for c in seen.values() if c.feasible]
    if feasible:
        best = min(feasible, key=lambda c: rank_key(request.objective, c))
        note = ""
    else:
        best = min(seen.values(), key=lambda c: miss_ratio(request, c))
        note = "no measured configuration met the limits: the nearest miss"
    return MethodChoice("oracle_bo", best, time.perf_counter() - t0, len(seen), note=note)
