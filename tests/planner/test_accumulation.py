"""Gradient accumulation in planning (issue 50 item 1): the simulated iteration with k
micro-batches is k micro-batch passes and one exchange (hand-checked cases); a request
whose global batch the quotas hold only in micro-batches gets a plan with them, one that
fits gets none under ddp, and under fsdp is also searched on fewer VMs in micro-batches;
the plan's micro-batches reach the training plan."""

from __future__ import annotations

import dataclasses

import pytest

from srifty_core.catalog.types import Market
from srifty_core.planner import fit
from srifty_core.planner.request import Offer
from srifty_core.planner.search import plan
from srifty_core.planner.strategies import accumulated
from srifty_core.simulator.accumulation import (
    Accumulated,
    Fastest,
    micro_batches_needed,
    micro_config,
    passes_s,
)
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.sharded import ShardedSimulator, schedule
from srifty_core.simulator.types import ClusterConfig, Group, Workload
from tests.planner.test_strategies import (
    BF16_ADAMW,
    FOUR,
    GIB,
    ONE,
    big_request,
    big_workload,
    ddp_fits_request,
    simulator,
)
from tests.profiling.test_profile_contract import make_profile
from tests.simulator.test_estimator import ConstantBandwidth, config, inst, steady
from tests.simulator.test_sharded import ByCollective, _workload


def ddp_accumulating(sim: Simulator, b_max: int) -> Accumulated:
    return Accumulated(sim, lambda c: micro_batches_needed(c, lambda i, w: b_max), passes_s(sim))


def test_one_rank_runs_k_micro_batch_passes_and_one_step() -> None:
    # steady profile: about 12.3 ms forward and 2.1x that backward at 8 samples (the
    # fit's); 32 samples in micro-batches of 8 (B_max 8): 4 passes of 8, the step once
    p = steady(make_profile())
    w = Workload("m", {"cpu": p})
    sim = Simulator(ConstantBandwidth(1e9))
    est = ddp_accumulating(sim, 8).estimate(w, config((inst("a"), 1, 32)))
    assert est.micro_batches == 4 and est.global_batch == 32
    c = sim.compute_samples(w, config((inst("a"), 1, 8)).groups)
    assert c.t_fw + c.t_bw == pytest.approx(3.1 * 0.0123, rel=0.02)
    assert est.t_iter == pytest.approx(float(p.t_iter(8)) + 3 * (c.t_fw + c.t_bw))
    assert est.t_fw == pytest.approx(4 * c.t_fw)


def test_the_exchange_counts_once_over_the_micro_batches() -> None:
    p = steady(make_profile())
    w = Workload("m", {"cpu": p})
    sim = Simulator(ConstantBandwidth(1e3))  # slow links: the exchange shows
    four = config((inst("a"), 4, 32))
    acc = ddp_accumulating(sim, 8).estimate(w, four)
    micro = sim.estimate(w, micro_config(four, 4))
    assert acc.micro_batches == 4 and micro.exposed_comm > 0
    c = sim.compute_samples(w, micro_config(four, 4).groups)
    passes = c.t_fw + c.t_bw
    # the last micro-batch's iteration (its passes, the exchange, the step) + 3 passes
    assert acc.t_iter == pytest.approx(micro.t_iter + 3 * passes)
    assert acc.t_iter < 4 * micro.t_iter - 2 * micro.exposed_comm  # not exchanged 4 times
    assert ddp_accumulating(sim, 32).estimate(w, four) == sim.estimate(w, four)  # fits: k = 1


def test_a_sharded_micro_batch_before_the_last_gathers_and_does_not_reduce() -> None:
    units = (0, 10_000_000, 10_000_000)
    w = _workload(units)
    sharded = ShardedSimulator(Simulator(ByCollective({None: 1e9})), "fsdp")
    sim = sharded.simulator
    one = config((inst("g", "T4"), 1, 8))
    c1 = sim.compute_samples(w, one.groups)
    assert sharded.accumulating_s(w, one) == pytest.approx(c1.t_fw + c1.t_bw)  # no peers
    four = config((inst("g", "T4"), 4, 8))
    c = sim.compute_samples(w, four.groups)
    per = 0.75 * 40e6 / 1e9  # (n-1)/n of 40 MB at 1 GB/s
    frac = [n / sum(units) for n in units]
    by_hand = schedule([c.t_fw * f for f in frac], [c.t_bw * f for f in frac],
                       [0.0, per, per], [0.0, 0.0, 0.0]).end  # fmt: skip
    assert sharded.accumulating_s(w, four) == pytest.approx(by_hand)
    assert sharded.accumulating_s(w, four) < sharded.estimate(w, four).t_iter
    acc = Accumulated(sharded, lambda cfg: 2, sharded.accumulating_s)
    two = acc.estimate(w, config((inst("g", "T4"), 4, 16)))
    assert two.t_iter == pytest.approx(sharded.estimate(w, four).t_iter + by_hand)


def test_micro_batches_needed_is_the_fewest_that_fit() -> None:
    cfg = config((inst("a"), 2, 32), (inst("b"), 1, 10))
    most = {"a": 8, "b": 4}
    assert micro_batches_needed(cfg, lambda i, w: most[i.name]) == 4  # 32/8, ceil(10/4)=3
    assert micro_config(cfg, 4) == config((inst("a"), 2, 8), (inst("b"), 1, 3))
    assert micro_batches_needed(cfg, lambda i, w: 0) == 0


def test_accumulating_sharded_ranks_use_the_smaller_micro_batch_bound() -> None:
    """A sharded rank that accumulates holds every unsharded gradient, so its micro-batch
    bound is below one pass's: a batch within one pass's B_max needs no micro-batches, one
    above it is split by the accumulating bound."""
    cfg = config(
        (inst("a"), 2, 32),
    )
    plain, accumulating = (lambda i, w: 40), (lambda i, w: 10)
    assert micro_batches_needed(cfg, plain, accumulating) == 1
    big = config(
        (inst("a"), 2, 64),
    )
    assert micro_batches_needed(big, plain, accumulating) == 7  # ceil(64 / 10), not 2
    assert micro_batches_needed(big, plain) == 2
    assert micro_batches_needed(big, plain, lambda i, w: 0) == 0


def test_fit_counts_the_unsharded_gradients_of_accumulation() -> None:
    from srifty_core.sharding.memory import Layout, ModelMemory, rank_memory
    from srifty_core.training_settings import TrainingSettings

    m = ModelMemory((1000, 3000, 3000), 8.0)
    adamw = TrainingSettings(precision="bf16", optimizer="adamw")
    one_pass = rank_memory(m, adamw, Layout("fsdp", 4), 2)
    held = rank_memory(m, adamw, Layout("fsdp", 4), 2, accumulating=True)
    assert one_pass.gradients == 4 * 7000 / 4 and held.gradients == 4 * 7000
    assert rank_memory(m, adamw, Layout("ddp", 4), 2, accumulating=True) == rank_memory(
        m, adamw, Layout("ddp", 4), 2
    )
    w = _workload((10_000, 50_000, 50_000))
    gpu = inst("g", "T4")
    once = fit.b_max(w, gpu, "fsdp", 8)
    assert 0 < fit.b_max(w, gpu, "fsdp", 8, accumulating=True) < once
    assert fit.b_max(w, gpu, "ddp", 8, accumulating=True) == fit.b_max(w, gpu, "ddp", 8)


def test_a_global_batch_the_quotas_hold_only_in_micro_batches_gets_them() -> None:
    fits = plan(ddp_fits_request(strategy="ddp"), simulator())
    assert fits.best is not None and fits.micro_batches == 1
    assert "micro-batch" not in " ".join(fits.explanation())
    r = ddp_fits_request(strategy="ddp", global_batch=1024)  # 8 GPUs x B_max 16 = 128
    res = plan(r, simulator())
    assert res.best is not None and res.micro_batches >= 8
    for c in (res.best, *res.runners_up):
        k = c.estimate.micro_batches
        for _, _, b in c.choice:
            assert -(-b // k) <= fit.b_max(r.workload, ONE, "ddp", 8) and k <= b
    assert f"{res.micro_batches} micro-batches per step" in res.strategy_reason
    assert "Gradient accumulation" in " ".join(res.explanation())
    assert res.to_dict()["micro_batches"] == res.micro_batches


def test_the_planned_micro_batches_reach_the_training_plan() -> None:
    from srifty_core.jobs.job import Launch
    from srifty_core.jobs.planning import train_plan_for

    kw = {"model": "dlrm", "size": "tiny", "global_batch": 32, "iterations": 5, "run_dir": "r"}
    four = Launch("g5.12xlarge", "on-demand", 2, 4, 4)
    p = train_plan_for([four], strategy="fsdp", micro_batches=4, **kw)  # type: ignore[arg-type]
    assert (p.micro_batches, p.local_batches) == (4, (4,) * 8)
    assert train_plan_for([four], **kw).micro_batches == 1  # type: ignore[arg-type]


def test_a_measured_fsdp_peak_margin_replaces_the_constant() -> None:
    """The profile's own measured transient sets a sharded rank's bound (none measured:
    ``PEAK_MARGIN``'s); a model above the measured peak adds nothing."""
    import dataclasses

    w = _workload((10_000, 50_000, 50_000))
    p = w.profile("T4")
    assert fit.peak_margin(p, "fsdp") == fit.PEAK_MARGIN["fsdp"]
    tight = dataclasses.replace(p, fsdp_peak_margin=-0.15)
    assert fit.peak_margin(tight, "fsdp") == 0.0 and fit.peak_margin(tight, "hsdp") == 0.0
    assert fit.peak_margin(tight, "ddp") == fit.PEAK_MARGIN["ddp"]
    measured = Workload("m", {"T4": tight}, unit_parameters=w.unit_parameters)
    gpu = inst("g", "T4")
    assert fit.b_max(measured, gpu, "fsdp", 8) > fit.b_max(w, gpu, "fsdp", 8)


def test_a_configuration_no_micro_batch_fits_says_which_gpu_and_why() -> None:
    """k = 0: the reason names the GPU and whether accumulation is what leaves it no room
    (a sharded rank then keeps every unsharded gradient), not the whole batch's answer."""
    from srifty_core.planner.strategies import no_micro_batch

    cfg = config((inst("a"), 2, 64))
    at_once, never = (lambda i, w: 2), (lambda i, w: 0)
    said = no_micro_batch(cfg, "fsdp", at_once, never)
    assert "holds 2 samples per GPU under fsdp over 2 ranks at once" in said
    assert "none while gradients accumulate" in said
    assert no_micro_batch(cfg, "fsdp", never, never) == "a holds no sample under fsdp over 2 ranks"
    sim = simulator()
    w = ddp_fits_request(strategy="ddp").workload
    acc = Accumulated(sim, lambda c: 0, passes_s(sim), lambda c: "the reason")
    assert acc.estimate(w, config((ONE, 1, 8))).unfit == "the reason"


def test_a_micro_batch_that_reduce_scatters_adds_its_collectives() -> None:
    """The sync-each mode's micro-batch before the last: every all-gather and every
    reduce-scatter, as the last one's schedule, without the optimizer step."""
    units = (0, 10_000_000, 10_000_000)
    w = _workload(units)
    sharded = ShardedSimulator(Simulator(ByCollective({None: 1e9})), "fsdp")
    four = config((inst("g", "T4"), 4, 8))
    c = sharded.simulator.compute_samples(w, four.groups)
    per = 0.75 * 40e6 / 1e9
    frac = [n / sum(units) for n in units]
    by_hand = schedule([c.t_fw * f for f in frac], [c.t_bw * f for f in frac],
                       [0.0, per, per], [0.0, per, per]).end  # fmt: skip
    assert sharded.syncing_s(w, four) == pytest.approx(by_hand)
    assert sharded.accumulating_s(w, four) < by_hand
    # no step measured in this profile: the last micro-batch is the same schedule
    assert sharded.estimate(w, four).t_iter == pytest.approx(by_hand)
    one = config((inst("g", "T4"), 1, 8))  # no peers: nothing to exchange either way
    assert sharded.syncing_s(w, one) == pytest.approx(sharded.accumulating_s(w, one))


class _Fixed:
    """An estimator of one answer, counting what it was asked."""

    def __init__(self, **fields: object) -> None:
        self.fields, self.asked = fields, 0

    def estimate(self, workload: Workload, cfg: object) -> object:
        import dataclasses

        self.asked += 1
        base = simulator().estimate(ddp_fits_request().workload, config((ONE, 1, 8)))
        return dataclasses.replace(base, **self.fields)  # type: ignore[arg-type]


def test_fastest_takes_the_fastest_answer_that_fits() -> None:
    w, cfg = ddp_fits_request().workload, config((ONE, 1, 8))
    once = _Fixed(t_iter=1.0)
    other = _Fixed(t_iter=0.5)
    assert Fastest(once, other).estimate(w, cfg).t_iter == 1.0  # type: ignore[arg-type]
    assert other.asked == 0  # one pass fits: every mode is that pass
    held, syncing = _Fixed(t_iter=2.0, micro_batches=4), _Fixed(t_iter=3.0, micro_batches=2)
    assert Fastest(held, syncing).estimate(w, cfg).t_iter == 2.0  # type: ignore[arg-type]
    syncing.fields["t_iter"] = 1.5
    assert Fastest(held, syncing).estimate(w, cfg).t_iter == 1.5  # type: ignore[arg-type]
    unfit = _Fixed(t_iter=0.1, micro_batches=0, unfit="held back: no room")
    assert Fastest(unfit, syncing).estimate(w, cfg).t_iter == 1.5  # type: ignore[arg-type]
    # none fits: the last mode's reason (the one that needs the least memory)
    none = _Fixed(t_iter=0.2, unfit="5 micro-batches needed, more than the smallest 4")
    said = Fastest(unfit, none).estimate(w, cfg).unfit  # type: ignore[arg-type]
    assert said == "5 micro-batches needed, more than the smallest 4"


def huge_request() -> object:
    """``big_request``'s decoder at 4x the parameters (5.9 B, bf16 autocast, AdamW): its
    unsharded float32 gradients (23.5 GB) fill a 24 GiB A10G alone, while its state
    sharded over 16 ranks leaves room for samples."""
    import dataclasses

    from tests.planner.test_strategies import UNITS

    units = tuple(4 * n for n in UNITS)
    w = big_workload()
    p = dataclasses.replace(
        w.profiles["A10G"],
        n_parameters=sum(units),
        memory_fixed_bytes=16.0 * sum(units) + 1e9,
        memory_per_sample_bytes=1e9,
        settings=BF16_ADAMW,
    )
    w = Workload("huge", {"A10G": p}, unit_parameters=units)
    return big_request(workload=w, global_batch=256)  # 16 ranks hold 6 each at once


def test_a_model_whose_gradients_fill_a_gpu_accumulates_reduce_scattering_each() -> None:
    """Holding every unsharded gradient between micro-batches leaves no room on any
    offered GPU (the mode before), so the plan's micro-batches each reduce-scatter: the
    configuration runs, its micro-batches within one pass's bound, and the explanation
    and the training plan say so."""
    from srifty_core.jobs.planning import launches_for, train_plan_for

    r = huge_request()
    w = r.workload  # type: ignore[attr-defined]
    assert fit.b_max(w, ONE, "fsdp", 16) >= 1 and fit.b_max(w, FOUR, "fsdp", 16) >= 1
    assert fit.b_max(w, ONE, "fsdp", 16, accumulating=True) == 0
    res = plan(r, simulator())  # type: ignore[arg-type]
    assert res.best is not None and res.strategy in ("fsdp", "hsdp")
    e = res.best.estimate
    assert e.micro_batches > 1 and e.sync_each_micro_batch and res.sync_each_micro_batch
    for i, _, b in res.best.choice:
        inst_ = res.request.offers[i].instance
        per_rank = b // inst_.ranks_per_vm
        assert -(-per_rank // e.micro_batches) <= fit.b_max(w, inst_, res.strategy, e.world_size)
    assert "each reduce-scattering its gradients" in " ".join(res.explanation())
    assert res.to_dict()["sync_each_micro_batch"] is True
    kw = {"model": "dlrm", "size": "tiny", "global_batch": 256, "iterations": 5, "run_dir": "r"}
    train = train_plan_for(
        launches_for(res.request, res.best.choice), strategy=res.strategy,
        micro_batches=e.micro_batches, sync_each_micro_batch=e.sync_each_micro_batch,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    assert train.sync_each_micro_batch and train.micro_batches == e.micro_batches


def test_where_both_modes_fit_each_configuration_takes_the_faster() -> None:
    """``big_request``'s decoder holds its unsharded gradients beside a micro-batch, so on
    the planned configuration both modes fit; the estimate the plan took is the faster."""
    from srifty_core.planner.strategies import accumulated
    from srifty_core.simulator.types import ClusterConfig, Group

    r = big_request(global_batch=2048)  # 16 ranks hold 43 each at once, 25 accumulating
    sim = simulator()
    res = plan(r, sim)
    assert res.best is not None and res.best.estimate.micro_batches > 1
    req, est = accumulated(r, res.strategy, sim)
    assert isinstance(est, Fastest)
    offers = res.request.offers
    cfg = ClusterConfig(tuple(Group(offers[i].instance, c, b) for i, c, b in res.best.choice))
    modes = [m.estimate(req.workload, cfg) for m in (est.first, *est.others)]
    assert [m.sync_each_micro_batch for m in modes] == [False, True]
    assert all(not m.unfit for m in modes)
    assert modes[1].micro_batches <= modes[0].micro_batches
    picked = est.estimate(req.workload, cfg)
    assert picked.t_iter == min(m.t_iter for m in modes)
    assert res.best.estimate.sync_each_micro_batch == picked.sync_each_micro_batch


def test_hsdp_in_micro_batches_skips_vms_of_unequal_gpus_without_failing_the_plan() -> None:
    # hsdp needs one shard group per VM; a mix of 4- and 2-GPU VMs is no hsdp
    # configuration. In micro-batches the estimate once priced the earlier micro-batches'
    # collectives before asking whether the configuration could run, and the sharded
    # simulator's refusal ("every VM needs as many ranks") ended the whole search.
    two = dataclasses.replace(FOUR, name="two-gpu", ranks_per_vm=2, features={
        "instance_type": "two-gpu"})  # fmt: skip
    offers = (
        Offer(FOUR, Market.ON_DEMAND, quota=2, usd_per_hour=5.7),
        Offer(two, Market.ON_DEMAND, quota=1, usd_per_hour=3.0),
    )
    r = big_request(offers=offers, global_batch=512, strategy="hsdp")
    assert two.gpu_memory_bytes == 24 * GIB
    req, estimator = accumulated(r, "hsdp", simulator())
    mixed = ClusterConfig((Group(FOUR, 2, 4 * 64), Group(two, 1, 2 * 64)))
    e = estimator.estimate(req.workload, mixed)
    assert "every VM needs as many GPUs" in e.unfit, e.unfit
    res = plan(r, simulator())
    assert res.best is not None and res.micro_batches > 1
    assert {o for o, _, _ in res.best.choice} == {0}  # the 4-GPU VMs alone


def test_a_sharded_plan_is_also_searched_on_fewer_vms_in_micro_batches() -> None:
    # big_request's decoder under fsdp: 2 g5.12xlarge hold the global batch of 128 at once
    # (38 a GPU), one only in micro-batches (28 a GPU at once); for cost, one VM in 2
    # micro-batches wins (no exchange across VMs), and the plan in one pass is its runner-up
    from srifty_core.planner.request import Objective
    from srifty_core.planner.search import plan_one
    from srifty_core.planner.strategies import FitChecked, fewer_vms, holds, sharded_request

    r = big_request(global_batch=128, offers=big_request().offers[1:], strategy="fsdp")
    r = dataclasses.replace(r, objective=Objective.COST)
    assert holds(r, "fsdp") >= 128 > 4 * fit.b_max(r.workload, FOUR, "fsdp", 4)
    sim = simulator()
    (found,) = fewer_vms(r, "fsdp", sim, plan_one)
    assert found.best is not None and found.best.vms == 1
    res = plan(r, sim)
    assert res.best is not None and res.best.label == found.best.label
    assert res.micro_batches > 1 and res.best.vms == 1
    assert "micro-batches per step on 1 g5.12xlarge, fewer than hold" in res.strategy_reason
    assert [(c.vms, c.estimate.micro_batches) for c in res.runners_up][:1] == [(2, 1)]
    assert res.runners_up[0].cost_usd > res.best.cost_usd
    at_once = plan_one(sharded_request(r, "fsdp"), FitChecked(sim, "fsdp", r.workload))
    assert res.evaluated == at_once.evaluated + found.evaluated
    # offers of one GPU a VM and hsdp beside fsdp are not searched on fewer VMs
    assert fewer_vms(big_request(global_batch=128, strategy="fsdp"), "fsdp", sim, plan_one)
    assert not fewer_vms(
        big_request(global_batch=128, offers=big_request().offers[:1]), "fsdp", sim, plan_one
    )
    assert not fewer_vms(big_request(global_batch=128), "hsdp", sim, plan_one)
