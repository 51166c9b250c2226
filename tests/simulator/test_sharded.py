"""The sharded iteration: the per-unit event model on cases checked by hand, and the
estimator over a bandwidth predictor (collective column, bus-byte conventions)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from srifty_core.errors import ConfigError
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.sharded import ShardedSimulator, schedule, shard_bus_bytes
from srifty_core.simulator.types import Workload
from tests.profiling.test_profile_contract import make_profile
from tests.simulator.test_estimator import config, inst, steady


class ByCollective:
    """busbw per collective; records the collectives asked (None: no column)."""

    def __init__(self, busbw: dict[str | None, float]) -> None:
        self.busbw = busbw
        self.asked: list[str | None] = []

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        which = features["collective"].iloc[0] if "collective" in features else None
        self.asked.append(which)
        return np.full(len(features), self.busbw.get(which, self.busbw[None]))

    def bandwidth_cap(self, instance_type: str, world_size: int) -> float:
        return math.inf


def test_no_communication_is_the_compute() -> None:
    s = schedule([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0] * 3, [0.0] * 3)
    assert s.forward_end == 6.0 and s.end == 18.0 and s.comm_busy == 0.0


def test_communication_bound_is_every_collective_in_a_row() -> None:
    # no compute: the stream carries the root's gather, two gathers per unit (forward,
    # backward) and every reduce-scatter, one after the other
    gather, reduce = [0.5, 1.0, 1.0], [0.25, 2.0, 2.0]
    s = schedule([0.0] * 3, [0.0] * 3, gather, reduce)
    assert s.comm_busy == 0.5 + 2 * 2.0 + 4.25
    assert s.end == pytest.approx(s.comm_busy)


def test_prefetch_hides_a_gather_behind_the_unit_before() -> None:
    # root gather 1; unit 1 (gather 1) prefetched while the root computes 2 s: the forward
    # ends at 1 + 2 + 2 = 5, not 1 + 2 + 1 + 2
    s = schedule([2.0, 2.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0])
    assert s.forward_end == 5.0
    # backward: unit 1's gather again at 5 (ends 6), its backward 0, the root's 0
    assert s.end == 6.0


def test_a_slow_gather_stalls_the_forward() -> None:
    # unit 1's gather (3 s) outlasts the root's compute (1 s): the unit waits for it
    s = schedule([1.0, 1.0], [1.0, 1.0], [0.0, 3.0], [0.0, 0.0])
    assert s.forward_end == 3.0 + 1.0
    # backward: regather unit 1 from 4 to 7, compute 7-8, root 8-9
    assert s.compute_end == 9.0 and s.end == 9.0


def test_reduce_scatter_follows_the_backward_of_its_unit() -> None:
    # the last reduce-scatter (the root's) starts when the root's backward ends
    s = schedule([1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.5, 0.5])
    assert s.compute_end == 4.0
    assert s.end == 4.5 and s.last_reduce == 4.5


def test_the_schedule_rejects_ragged_units() -> None:
    with pytest.raises(ConfigError, match="one length"):
        schedule([1.0], [1.0, 2.0], [0.0], [0.0])


def test_bus_bytes_of_a_gather_are_half_an_allreduce() -> None:
    assert shard_bus_bytes(8.0, 4) == 6.0


def _workload(units: tuple[int, ...]) -> Workload:
    p = steady(make_profile(), device="T4")
    return Workload("m", {"T4": p}, unit_parameters=units)


def test_fsdp_asks_for_gathers_and_reduce_scatters_and_times_them() -> None:
    bw = ByCollective({None: 1e9})
    sim = Simulator(bw)
    sharded = ShardedSimulator(sim, "fsdp")
    units = (0, 10_000_000, 10_000_000)
    w = _workload(units)
    cfg = config((inst("g", "T4"), 4, 8))
    est = sharded.estimate(w, cfg)
    assert {"all_gather", "reduce_scatter"} <= set(bw.asked)
    # every collective moves (n-1)/n of 40 MB at 1 GB/s: 30 ms; 2 gathers and a reduce per unit
    per = 0.75 * 40e6 / 1e9
    c = sim.compute_samples(w, cfg.groups)
    assert est.t_iter >= 6 * per
    assert est.t_iter >= c.t_fw + c.t_bw
    # on one rank nothing is exchanged: the compute and the step
    one = sharded.estimate(w, config((inst("g", "T4"), 1, 8)))
    c1 = sim.compute_samples(w, config((inst("g", "T4"), 1, 8)).groups)
    assert one.t_iter == pytest.approx(c1.t_fw + c1.t_bw + c1.step)


def test_a_slower_gather_curve_slows_fsdp() -> None:
    units = (0, 10_000_000, 10_000_000)
    cfg = config((inst("g", "T4"), 4, 8))
    fast = ShardedSimulator(Simulator(ByCollective({None: 1e9})), "fsdp")
    slow = ShardedSimulator(Simulator(ByCollective({None: 1e9, "all_gather": 1e8})), "fsdp")
    assert slow.estimate(_workload(units), cfg).t_iter > fast.estimate(_workload(units), cfg).t_iter


def test_hsdp_adds_the_allreduce_across_vms_and_needs_equal_vms() -> None:
    bw = ByCollective({None: 1e9})
    sharded = ShardedSimulator(Simulator(bw), "hsdp")
    w = _workload((0, 10_000_000))
    one_vm = sharded.estimate(w, config((inst("g4", "T4", ranks=4), 1, 32)))
    two_vms = sharded.estimate(w, config((inst("g4", "T4", ranks=4), 2, 32)))
    assert "all_reduce" in bw.asked and two_vms.t_iter > one_vm.t_iter
    with pytest.raises(ConfigError, match="hsdp"):
        sharded.estimate(w, config((inst("g4", "T4", ranks=4), 1, 32), (inst("g2", "T4", 2), 1, 8)))


class Shared:
    """A VM's network of ``rate`` bytes/s shared by the collectives in flight on it
    (each transfer at ``rate / concurrent``), within a cap of ``cap`` in all; the
    gathers and reduce-scatters inside a VM free (their busbw ``inside``)."""

    def __init__(self, rate: float, cap: float = math.inf, inside: float = 1e18) -> None:
        self.rate, self.cap, self.inside = rate, cap, inside
        self.concurrent: list[int] = []

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        if features["collective"].iloc[0] != "all_reduce":
            return np.full(len(features), self.inside)
        self.concurrent += features["concurrent"].tolist()
        return self.rate / features["concurrent"].to_numpy(dtype=float)

    def bandwidth_cap(self, instance_type: str, world_size: int) -> float:
        return self.cap


@pytest.mark.parametrize("ranks", [2, 4])
def test_hsdp_rings_across_vms_share_each_vms_network(ranks: int) -> None:
    # each of a VM's `ranks` ranks all-reduces its shard (1/ranks of the gradients) across
    # the VMs at once, over the one network: together they take as long as one ring
    # carrying the whole gradients would, not 1/ranks of it
    grads = 40_000_000  # bytes of the unit's gradients (10 M float32 parameters)
    w = _workload((0, 10_000_000))
    cfg = config((inst("g", "T4", ranks=ranks), 2, 8 * ranks))
    shared = Shared(rate=1e9)
    sharded = ShardedSimulator(Simulator(shared), "hsdp")
    comm = sharded._comm(w, cfg, sharded.units(w, cfg))
    assert set(shared.concurrent) == {ranks}
    # a ring of 2 VMs moves 2 (2-1)/2 = 1x its buffer: ranks x (grads / ranks) at 1 GB/s
    assert comm.reduce[1] == pytest.approx(grads / 1e9, rel=1e-6)
    # where the cap binds, the rings share it: the same time at a cap of 1 GB/s in all,
    # after the reduce-scatter inside the VM ((ranks - 1) / ranks of the buffer, capped too)
    capped = ShardedSimulator(Simulator(Shared(rate=1e12, cap=1e9)), "hsdp")
    comm = capped._comm(w, cfg, capped.units(w, cfg))
    inside = (ranks - 1) / ranks * grads / 1e9
    assert comm.reduce[1] == pytest.approx(inside + grads / 1e9, rel=1e-6)


def test_hsdp_prefetch_asks_what_its_estimates_read() -> None:
    # the planner prefetches every curve a search can touch: an estimate after it finds
    # its concurrent rings' curves cached (no model call of its own)
    w = _workload((0, 10_000_000))
    shared = Shared(rate=1e9)
    sharded = ShardedSimulator(Simulator(shared), "hsdp")
    four = inst("g", "T4", ranks=4)
    sharded.prefetch(w, [four], 3)
    asked = len(shared.concurrent)
    for vms in (2, 3):
        sharded.estimate(w, config((four, vms, 32)))
    assert asked > 0 and len(shared.concurrent) == asked


def test_ddp_is_not_a_sharded_strategy() -> None:
    with pytest.raises(ConfigError, match="strategy"):
        ShardedSimulator(Simulator(ByCollective({None: 1e9})), "ddp")


class ByType:
    """busbw per instance type."""

    def __init__(self, busbw: dict[str, float]) -> None:
        self.busbw = busbw

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        return np.array([self.busbw[t] for t in features["instance_type"]], dtype=float)

    def bandwidth_cap(self, instance_type: str, world_size: int) -> float:
        return math.inf


def test_a_mixed_ring_gathers_at_its_slowest_type() -> None:
    w = _workload((0, 10_000_000, 10_000_000))
    sharded = ShardedSimulator(Simulator(ByType({"fast": 1e10, "slow": 1e8})), "fsdp")
    mixed = sharded.estimate(w, config((inst("fast", "T4"), 2, 8), (inst("slow", "T4"), 2, 8)))
    slow = sharded.estimate(w, config((inst("slow", "T4"), 4, 8)))
    fast = sharded.estimate(w, config((inst("fast", "T4"), 4, 8)))
    assert mixed.t_iter == pytest.approx(slow.t_iter, rel=1e-6) and fast.t_iter < slow.t_iter


def test_fsdp_own_work_is_added_per_unit_and_on_the_step() -> None:
    """A profile's measured ``fsdp_overhead`` adds its forward and backward seconds to
    every unit (the root one of them) and its step seconds once; a profile without it adds
    nothing and the estimate names the missing term; a mix takes its largest."""
    units = (100, 10_000_000, 10_000_000)
    sim = Simulator(ByCollective({None: 1e9}))
    sharded = ShardedSimulator(sim, "fsdp")
    one = config((inst("g", "T4"), 1, 8))  # one rank: no collective to move
    bare = sharded.estimate(_workload(units), one)
    assert "fsdp_overhead" in bare.missing
    p = steady(make_profile(fsdp_overhead=(0.002, 0.003, 0.004)), device="T4")
    w = Workload("m", {"T4": p}, unit_parameters=units)
    own = sharded.estimate(w, one)
    assert "fsdp_overhead" not in own.missing
    assert own.t_iter - bare.t_iter == pytest.approx(3 * (0.002 + 0.003) + 0.004)
    # the overhead also holds every unit back on a real ring
    ring = config((inst("g", "T4"), 4, 8))
    assert sharded.estimate(w, ring).t_iter > sharded.estimate(_workload(units), ring).t_iter
    q = steady(make_profile(fsdp_overhead=(0.001, 0.001, 0.0)), device="A10G")
    both = Workload("m", {"T4": p, "A10G": q}, unit_parameters=units)
    mix = config((inst("g", "T4"), 1, 8), (inst("a", "A10G"), 1, 8))
    assert ShardedSimulator.overhead(both, mix) == (0.002, 0.003, 0.004)
    unmeasured = Workload("m", {"T4": p, "A10G": steady(make_profile(), device="A10G")})
    assert ShardedSimulator.overhead(unmeasured, mix) is None
