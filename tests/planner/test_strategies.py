"""Strategy as a plan dimension: fsdp/hsdp where no offered GPU holds a replica, ddp where
replicas fit and are faster, a pinned strategy honoured, bad values named."""

from __future__ import annotations

import dataclasses

import pytest

from srifty_core.catalog.types import Market
from srifty_core.errors import ConfigError
from srifty_core.planner import fit
from srifty_core.planner.request import Offer, Overheads, PlanRequest
from srifty_core.planner.schema.request_spec import RequestSpec
from srifty_core.planner.search import plan
from srifty_core.planner.strategies import FitChecked, sharded_request
from srifty_core.simulator.apm import ApmEstimator
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload
from srifty_core.training_settings import TrainingSettings
from tests.profiling.test_profile_contract import make_profile
from tests.simulator.test_estimator import ConstantBandwidth, steady

GIB = 2**30
BF16_ADAMW = TrainingSettings(precision="bf16", optimizer="adamw")
BLOCKS = 48
UNITS = (80_000_000, *([29_000_000] * BLOCKS))  # a GPT-2 XL-like decoder: 1.47 B
ONE = SimInstance("g5.xlarge", "A10G", 1, {"instance_type": "g5.xlarge"}, gpu_memory_bytes=24 * GIB)
FOUR = SimInstance(
    "g5.12xlarge", "A10G", 4, {"instance_type": "g5.12xlarge"}, gpu_memory_bytes=24 * GIB
)


def big_workload() -> Workload:
    """A model whose AdamW state (16 B per parameter: 23.5 GB) no 24 GiB GPU holds."""
    p = dataclasses.replace(
        steady(make_profile(), "A10G", scale=20.0),
        b_max=0,
        n_parameters=sum(UNITS),
        memory_per_sample_bytes=300e6,
        memory_fixed_bytes=16.0 * sum(UNITS) + 1e9,
        memory_cap_bytes=24 * GIB,
        settings=BF16_ADAMW,
    )
    return Workload("decoder", {"A10G": p}, unit_parameters=UNITS)


def big_request(**changes: object) -> PlanRequest:
    base = PlanRequest(
        workload=big_workload(),
        global_batch=64,
        iterations=100,
        offers=(
            Offer(ONE, Market.ON_DEMAND, quota=8, usd_per_hour=1.0),
            Offer(FOUR, Market.ON_DEMAND, quota=2, usd_per_hour=5.7),
        ),
        overheads=Overheads(launch_s=100),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def simulator() -> Simulator:
    return Simulator(ConstantBandwidth(5e9), iters=32)


def test_the_memory_model_says_no_replica_fits_and_shards_do() -> None:
    w = big_workload()
    assert fit.b_max(w, ONE, "ddp", 8) == 0
    assert fit.b_max(w, ONE, "fsdp", 1) == 0  # one rank holds all the state
    assert fit.b_max(w, ONE, "fsdp", 8) > fit.b_max(w, ONE, "fsdp", 4) > 0
    assert fit.b_max(w, FOUR, "hsdp", 8) == fit.b_max(w, FOUR, "fsdp", 4)
    assert fit.b_max(w, ONE, "hsdp", 8) == 0  # one GPU per VM: nothing to shard over


def test_a_model_no_gpu_holds_is_planned_sharded_and_says_why() -> None:
    with pytest.raises(ConfigError, match="global_batch: 64 cannot be held"):
        big_request(strategy="ddp")
    res = plan(big_request(), simulator())
    assert res.best is not None and res.strategy in ("fsdp", "hsdp")
    assert res.strategy_reason.startswith(f"{res.strategy} over {res.best.estimate.world_size}")
    assert "ddp: no offered GPU holds the model's training state" in res.strategy_reason
    # the plan's ranks hold their batches at its own world size
    for c in (res.best, *res.runners_up):
        world = c.estimate.world_size
        for i, _, b in c.choice:
            inst = res.request.offers[i].instance
            assert b // inst.ranks_per_vm <= fit.b_max(big_workload(), inst, res.strategy, world)
    text = " ".join(res.explanation())
    assert f"Strategy {res.strategy}" in text and "all-gathers" in text
    assert res.to_dict()["strategy"] == res.strategy


def test_a_pinned_strategy_is_honoured() -> None:
    for s in ("fsdp", "hsdp"):
        res = plan(big_request(strategy=s), simulator())
        assert res.strategy == s and res.strategy_reason == f"{s}: pinned by the request"
        assert res.best is not None
        if s == "hsdp":  # shards inside a VM: only the 4-GPU VMs hold a shard
            assert {res.request.offers[i].instance for i, _, _ in res.best.choice} == {FOUR}


def test_configurations_too_small_to_hold_their_batch_break_a_limit() -> None:
    w = big_workload()
    two = ClusterConfig((Group(ONE, 2, 64),))  # 2 ranks: 11.8 GB of state each, ~32 samples
    assert "holds" in fit.short(w, two, "fsdp")
    assert fit.short(w, ClusterConfig((Group(ONE, 8, 1),)), "fsdp") == ""


def ddp_fits_request(**changes: object) -> PlanRequest:
    """Replicas fit (B_max 16 per GPU) but fsdp would hold more per GPU."""
    p = dataclasses.replace(
        steady(make_profile(), "A10G"),
        b_max=16,
        memory_per_sample_bytes=0.1e9,
        memory_fixed_bytes=16.0 * 300e6,
        n_parameters=300_000_000,
        settings=BF16_ADAMW,
    )
    w = Workload("mid", {"A10G": p}, unit_parameters=(0, *([25_000_000] * 12)))
    base = PlanRequest(
        workload=w,
        global_batch=64,
        iterations=100,
        offers=(Offer(ONE, Market.ON_DEMAND, quota=8, usd_per_hour=1.0),),
        overheads=Overheads(launch_s=100),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_ddp_where_replicas_fit_and_are_faster() -> None:
    r = ddp_fits_request()
    assert fit.b_max(r.workload, ONE, "fsdp", 8) > 16  # sharding holds more: searched
    res = plan(r, simulator())
    assert res.strategy == "ddp" and res.best is not None
    assert "faster than the best fsdp plan" in res.strategy_reason
    fsdp = plan(ddp_fits_request(strategy="fsdp"), simulator())
    assert fsdp.best is not None and fsdp.best.time_s > res.best.time_s
    pinned = plan(ddp_fits_request(strategy="ddp"), simulator())
    assert pinned.best == res.best  # auto's ddp plan is ddp's own


def test_the_analytical_estimator_plans_ddp_only() -> None:
    res = plan(ddp_fits_request(), ApmEstimator())
    assert res.strategy == "ddp" and "models ddp only" in res.strategy_reason
    with pytest.raises(ConfigError, match="strategy: fsdp needs the simulator"):
        plan(ddp_fits_request(strategy="fsdp"), ApmEstimator())


@pytest.mark.parametrize("bad", ["zero", "FSDP", 3, None, ""])
def test_bad_strategies_are_one_line_errors_naming_the_field(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        ddp_fits_request(strategy=bad)
    assert str(info.value).startswith("strategy: ") and "\n" not in str(info.value)
    doc = {
        "model": "resnet50",
        "global_batch": 64,
        "iterations": 10,
        "offers": [{"type": "g5.xlarge", "quota": 2}],
        "strategy": bad,
    }
    with pytest.raises(ConfigError) as info:
        RequestSpec.parse(doc)
    assert str(info.value).startswith("strategy: must be one of auto, ddp, fsdp, hsdp, got ")
    assert "\n" not in str(info.value)


def test_the_space_bound_is_checked_at_each_configuration_s_world_size() -> None:
    searched = sharded_request(big_request(), "fsdp")
    bound = searched.workload.profile("A10G").b_max  # at the most ranks the quotas allow
    assert bound > fit.b_max(big_workload(), ONE, "fsdp", 2) > 0
    checked = FitChecked(simulator(), "fsdp", big_workload())
    two = ClusterConfig((Group(ONE, 2, bound),))
    assert "under fsdp over 2 ranks" in checked.estimate(searched.workload, two).unfit
    res = plan(big_request(), simulator(), method="exhaustive")
    unfit = [c for c in res.candidates if c.estimate.unfit]
    assert unfit and all(not c.feasible and c.violations[0].startswith("memory") for c in unfit)


def test_mixed_gpus_share_one_shard_size_and_the_smaller_holds_less() -> None:
    t4 = SimInstance(
        "g4dn.xlarge", "A10G", 1, {"instance_type": "g4dn.xlarge"}, gpu_memory_bytes=16 * GIB
    )
    w = big_workload()
    # every rank holds 1/8 of the state: the 16 GiB GPU has less room left for samples
    assert 0 < fit.b_max(w, t4, "fsdp", 8) < fit.b_max(w, ONE, "fsdp", 8)
    most = fit.b_max(w, t4, "fsdp", 8)
    mixed = ClusterConfig((Group(ONE, 4, most + 1), Group(t4, 4, most + 1)))
    assert fit.short(w, mixed, "fsdp").startswith("g4dn.xlarge holds")
    assert fit.short(w, ClusterConfig((Group(ONE, 4, most), Group(t4, 4, most))), "fsdp") == ""


def test_auto_does_not_search_a_strategy_that_holds_nothing_more() -> None:
    r = ddp_fits_request()
    p = dataclasses.replace(r.workload.profile("A10G"), memory_per_sample_bytes=1e9)
    w = dataclasses.replace(r.workload, profiles={"A10G": p})
    r = dataclasses.replace(r, workload=w)
    assert fit.b_max(w, ONE, "fsdp", 8) < 32  # no power of two beyond ddp's 16
    res = plan(r, simulator())
    assert res.strategy == "ddp"
    assert "replicas hold every local batch fsdp would" in res.strategy_reason
    assert res.best == plan(dataclasses.replace(r, strategy="ddp"), simulator()).best
