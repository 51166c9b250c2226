"""The baselines (APM, CGF, FGF, oracle BO) on the contract suite's small problems."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from srifty_core.catalog.types import Market
from srifty_core.planner.baselines import (
    MethodChoice,
    apm,
    cheapest_gpu_first,
    fastest_gpu_first,
    oracle_bo,
    srifty,
)
from srifty_core.planner.request import Offer, PlanRequest
from srifty_core.planner.search import plan
from srifty_core.planner.space import Space
from srifty_core.simulator.types import ClusterConfig
from tests.planner.test_plan_contract import FAST, SLOW, WORKLOAD, request, simulator


def truth() -> Callable[[ClusterConfig], float]:
    """A stand-in ground truth that counts its calls."""
    sim = simulator()
    calls: list[ClusterConfig] = []

    def measure(config: ClusterConfig) -> float:
        calls.append(config)
        return sim.estimate(WORKLOAD, config).t_iter

    measure.calls = calls  # type: ignore[attr-defined]
    return measure


METHODS: dict[str, Callable[[PlanRequest], MethodChoice]] = {
    "srifty": lambda r: srifty(r, simulator()),
    "apm": lambda r: apm(r),
    "cgf": lambda r: cheapest_gpu_first(r, simulator()),
    "fgf": lambda r: fastest_gpu_first(r, simulator()),
    "oracle_bo": lambda r: oracle_bo(r, truth(), homogeneous_only=False),
}


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("global_batch", [256, 2560])
def test_each_method_holds_the_global_batch_within_quotas(name: str, global_batch: int) -> None:
    r = request(global_batch=global_batch)
    got = METHODS[name](r)
    assert got.method == name and got.solve_s >= 0
    assert got.candidate is not None, got.note
    assert sum(c * b for _, c, b in got.candidate.choice) == global_batch
    used: dict[int, int] = {}
    # the planner may step in micro-batches where the quotas cannot hold the global batch
    # at once (gradient accumulation): each micro-batch must fit
    k = got.result.micro_batches if got.result is not None else 1
    assert k == 1 or global_batch == 2560, "micro-batches only where the batch does not fit"
    for i, c, b in got.candidate.choice:
        used[i] = used.get(i, 0) + c
        o = r.offers[i]
        assert b % o.instance.ranks_per_vm == 0
        per_rank = b // o.instance.ranks_per_vm
        assert -(-per_rank // k) <= WORKLOAD.profile(o.instance.device_type).b_max
    assert all(used[i] <= r.offers[i].quota for i in used)


def test_cgf_packs_b_max_on_the_cheapest_gpus() -> None:
    got = cheapest_gpu_first(request(global_batch=512), simulator()).candidate
    assert got is not None
    # SLOW is cheaper per GPU (0.5 vs 3.0 $/h); B_max 256: two VMs hold 512
    assert got.choice == ((1, 2, 256),)
    # the last VM takes the rest
    rest = cheapest_gpu_first(request(global_batch=640), simulator()).candidate
    assert rest is not None and rest.choice == ((1, 2, 256), (1, 1, 128))


def test_fgf_uses_64_a_gpu_on_the_fastest_then_packs() -> None:
    got = fastest_gpu_first(request(global_batch=256), simulator()).candidate
    assert got is not None and got.choice == ((0, 4, 64),)  # FAST: 4 x 64
    spill = fastest_gpu_first(request(global_batch=512), simulator()).candidate
    assert spill is not None and spill.choice == ((0, 4, 64), (1, 4, 64))
    packed = fastest_gpu_first(request(global_batch=2560), simulator())
    assert packed.candidate is not None and "packed at B_max" in packed.note
    assert packed.candidate.choice == ((0, 4, 256), (1, 6, 256))


def test_apm_is_the_planner_over_apm() -> None:
    r = request(objective="cost", budget_usd=50.0)
    got = apm(r)
    assert got.result is not None and got.candidate == got.result.best
    assert got.candidate is not None  # APM's own estimate: no spread
    assert got.candidate.estimate.p95 == got.candidate.estimate.t_iter


def test_greedy_ignores_limits_and_says_so() -> None:
    r = request(time_limit_s=101.0)  # nothing finishes in 1 s after a 100 s launch
    got = cheapest_gpu_first(r, simulator())
    assert got.candidate is not None and not got.candidate.feasible
    assert srifty(r, simulator()).candidate is None


def test_oracle_bo_measures_a_third_and_picks_the_best_it_saw() -> None:
    r = request(objective="time", budget_usd=50.0)
    n = Space.build(r).size()
    measure = truth()
    got = oracle_bo(r, measure, homogeneous_only=False, seed=1)
    assert got.evaluated == len(measure.calls) <= math.ceil(n / 3)  # type: ignore[attr-defined]
    assert got.candidate is not None and got.candidate.estimate.bottleneck == "measured"
    exact = plan(r, simulator(), method="exhaustive").best
    assert exact is not None
    assert got.candidate.time_s >= exact.time_s - 1e-9  # never better than the optimum
    assert got.candidate.time_s <= 1.25 * exact.time_s  # and the GP finds a good one
    again = oracle_bo(r, truth(), homogeneous_only=False, seed=1)
    assert again.candidate == got.candidate


def test_oracle_bo_homogeneous_only_in_heterogeneous_requests() -> None:
    r = request(global_batch=512)
    got = oracle_bo(r, truth())  # two offers: one search per type
    assert got.candidate is not None and len({i for i, _, _ in got.candidate.choice}) == 1
    # no single type holds 2560 (4 x 256 and 8 x 256): nothing to propose
    none = oracle_bo(request(global_batch=2560), truth())
    assert none.candidate is None and none.evaluated == 0


def test_greedy_reports_when_the_batch_cannot_be_split() -> None:
    # one 4-GPU type cannot hold an odd batch
    quad = Offer(type(FAST)("quad.x", "V100", 4, {}), Market.ON_DEMAND, quota=2, usd_per_hour=1.0)
    r = request(global_batch=6, offers=(quad, Offer(SLOW, Market.SPOT, quota=0, usd_per_hour=1.0)))
    got = cheapest_gpu_first(r, simulator())
    assert got.candidate is None and "cannot hold" in got.note
