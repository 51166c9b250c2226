from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pytest

from srifty_core.errors import ConfigError
from srifty_core.predictors.base import BandwidthExtras, BandwidthPredictor
from srifty_core.predictors.table import ProbeTableBandwidth
from srifty_core.profiling.profile import ComputeProfile, PassStats
from srifty_core.simulator.apm import ApmEstimator
from srifty_core.simulator.estimator import Simulator, planner_estimator
from srifty_core.simulator.exchange import bus_bytes, simulate_exchange
from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload
from tests.profiling.test_profile_contract import make_profile


class ConstantBandwidth:
    """busbw and cap fixed; counts its predict calls."""

    def __init__(self, busbw: float, cap: float = math.inf) -> None:
        self.busbw, self.cap, self.calls = busbw, cap, 0

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        self.calls += 1
        return np.full(len(features), self.busbw)

    def bandwidth_cap(self, instance_type: str, world_size: int) -> float:
        return self.cap


def steady(p: ComputeProfile, device: str = "cpu", scale: float = 1.0) -> ComputeProfile:
    """The same profile without variance (and ``scale`` times slower), on ``device``."""

    def s(stats: PassStats) -> PassStats:
        return PassStats(
            stats.batch_sizes, tuple(m * scale for m in stats.mean_s), (0.0,) * len(stats.mean_s), 5
        )

    return dataclasses.replace(
        p,
        device_type=device,
        fw=s(p.fw),
        bw=s(p.bw),
        fw_fit=dataclasses.replace(
            p.fw_fit,
            slopes=tuple(x * scale for x in p.fw_fit.slopes),
            intercepts=tuple(x * scale for x in p.fw_fit.intercepts),
        ),
        bw_fit=dataclasses.replace(
            p.bw_fit,
            slopes=tuple(x * scale for x in p.bw_fit.slopes),
            intercepts=tuple(x * scale for x in p.bw_fit.intercepts),
        ),
    )


def inst(name: str, device: str = "cpu", ranks: int = 1) -> SimInstance:
    return SimInstance(name, device, ranks, {"instance_type": name, "gpu_model": device})


def config(*groups: tuple[SimInstance, int, int]) -> ClusterConfig:
    return ClusterConfig(tuple(Group(i, c, b) for i, c, b in groups))


def test_the_predictor_contract_is_checkable() -> None:
    assert isinstance(ConstantBandwidth(1.0), BandwidthPredictor)
    assert isinstance(ProbeTableBandwidth(), BandwidthPredictor)


def test_one_vm_is_pure_compute() -> None:
    p = steady(make_profile())
    sim = Simulator(ConstantBandwidth(1e9))
    est = sim.estimate(Workload("m", {"cpu": p}), config((inst("a"), 1, 32)))
    assert est.t_pe == 0 and est.exposed_comm == 0 and est.bottleneck == "compute"
    assert est.t_iter == pytest.approx(float(p.t_iter(32)))
    assert est.throughput == pytest.approx(32 / est.t_iter)


def test_iteration_is_fw_plus_max_of_bw_and_exchange() -> None:
    p = steady(make_profile())  # buckets: 1500 B ready at 0.25, 2500 B at 0.99 of backward
    w = Workload("m", {"cpu": p})
    c = config((inst("a"), 4, 32))
    slow_net = ConstantBandwidth(1e3)  # 1 kB/s: communication-bound
    est = Simulator(slow_net, overlap=1.0, schedule="concurrent").estimate(w, c)  # the method
    t_bw = float(p.t_bw(32))
    by_hand = simulate_exchange(
        [0.25 * t_bw, 0.99 * t_bw], [bus_bytes(1500, 4), bus_bytes(2500, 4)], [1e3, 1e3], math.inf
    ).t_pe
    assert est.t_pe == pytest.approx(by_hand)
    # DDP's schedule: the second bucket waits for the first on the one stream
    ddp = Simulator(slow_net, overlap=1.0).estimate(w, c)
    first = 0.25 * t_bw + bus_bytes(1500, 4) / 1e3
    assert ddp.t_pe == pytest.approx(max(first, 0.99 * t_bw) + bus_bytes(2500, 4) / 1e3)
    assert ddp.t_pe > est.t_pe
    assert est.t_iter == pytest.approx(float(p.t_fw(32)) + by_hand)
    assert est.bottleneck == "communication" and est.exposed_comm == pytest.approx(by_hand - t_bw)
    fast = Simulator(ConstantBandwidth(1e12)).estimate(w, c)
    assert fast.t_iter == pytest.approx(float(p.t_iter(32)))  # exchange hidden behind backward


def test_the_slowest_type_sets_the_pace() -> None:
    fast, slow = steady(make_profile(), "T4"), steady(make_profile(), "M60", scale=2.0)
    w = Workload("m", {"T4": fast, "M60": slow})
    est = Simulator(ConstantBandwidth(1e12)).estimate(
        w, config((inst("g4", "T4"), 2, 64), (inst("g3", "M60"), 2, 16))
    )
    assert est.t_fw == pytest.approx(max(float(fast.t_fw(64)), float(slow.t_fw(16))))
    assert est.global_batch == 160 and est.world_size == 4


def test_more_vms_more_straggling() -> None:
    w = Workload("m", {"cpu": make_profile()})  # 5% / 10% spread
    sim = Simulator(ConstantBandwidth(1e12), iters=4096)
    t = [sim.estimate(w, config((inst("a"), n, 32))).t_iter for n in (1, 8, 64)]
    assert t[0] < t[1] < t[2]
    one = sim.estimate(w, config((inst("a"), 64, 32)))
    assert one.p50 < one.p95


def test_sampled_and_exact_means_agree() -> None:
    w = Workload("m", {"cpu": make_profile()})
    c = config((inst("a"), 16, 64))
    sampled = Simulator(ConstantBandwidth(1e12), iters=20000).estimate(w, c)
    exact = Simulator(ConstantBandwidth(1e12), mean="exact").estimate(w, c)
    assert sampled.t_fw == pytest.approx(exact.t_fw, rel=3e-3)
    assert sampled.t_bw == pytest.approx(exact.t_bw, rel=3e-3)


def test_reproducible_and_cached() -> None:
    w = Workload("m", {"cpu": make_profile()})
    bw = ConstantBandwidth(1e6, cap=2e6)
    c = config((inst("a"), 8, 32))
    a = Simulator(bw, seed=3).estimate(w, c)
    sim = Simulator(bw, seed=3)
    b = sim.estimate(w, c)
    calls = bw.calls
    sim.estimate(w, config((inst("a"), 8, 64)))  # same world size and buckets: cached
    assert a == b and bw.calls == calls


def test_multi_gpu_vms_split_their_batch() -> None:
    p = steady(make_profile(), "V100")
    w = Workload("m", {"V100": p})
    est = Simulator(ConstantBandwidth(1e12)).estimate(w, config((inst("p3.8x", "V100", 4), 2, 128)))
    assert est.world_size == 8 and est.global_batch == 256
    assert est.t_iter == pytest.approx(float(p.t_iter(32)))
    with pytest.raises(ConfigError, match="does not split"):
        Group(inst("p3.8x", "V100", 4), 1, 30)


def test_bad_requests() -> None:
    w = Workload("m", {"cpu": make_profile()})
    sim = Simulator(ConstantBandwidth(1e9))
    with pytest.raises(ConfigError, match="no compute profile of m for device 'T4'"):
        sim.estimate(w, config((inst("g4", "T4"), 1, 8)))
    with pytest.raises(ConfigError, match="exceeds B_max=256"):
        sim.estimate(w, config((inst("a"), 1, 512)))
    # one type may appear with two batches (unequal local batches on equal VMs)
    assert config((inst("a"), 1, 8), (inst("a"), 2, 16)).global_batch == 40
    with pytest.raises(ConfigError, match="count"):
        config((inst("a"), 0, 8))


def test_apm_ignores_overlap_and_variance() -> None:
    w = Workload("m", {"cpu": make_profile()})
    c = config((inst("a"), 4, 32))
    apm = ApmEstimator(default_gbps=0.000008).estimate(w, c)  # 1 kB/s "rated" link
    assert apm.t_iter == pytest.approx(apm.t_fw + apm.t_bw + apm.t_pe)
    assert apm.t_pe == pytest.approx(
        sum(2 * 3 * 20e-6 + bus_bytes(b.size_bytes, 4) / 1e3 for b in make_profile().buckets)
    )


def test_apm_never_predicts_a_pass_faster_than_the_fastest_measured() -> None:
    # a curve that bends up: the straight line through it is negative at batch 1, and
    # APM predicted a 0 s iteration there (the planner refuses such an estimate)
    sizes = (1, 8, 32, 256)
    fw_mean = (0.001, 0.0011, 0.0012, 0.2)
    fw = PassStats(sizes, fw_mean, tuple(0.01 * m for m in fw_mean), 5)
    p = dataclasses.replace(make_profile(), fw=fw, bw=fw)
    apm = ApmEstimator().estimate(Workload("m", {"cpu": p}), config((inst("a"), 1, 1)))
    assert apm.t_fw == pytest.approx(0.001) and apm.t_bw == pytest.approx(0.001)
    assert apm.t_iter > 0


def test_probe_table_predictor() -> None:
    rows: list[dict[str, Any]] = []
    for alloc, noise in (("a1", 0.9), ("a2", 1.1)):
        for s, b in ((1024, 1e6), (1024**2, 1e8), (64 * 1024**2, 1e9)):
            for c in (1, 4):
                rows.append(
                    {
                        "instance_type": "local.cpu",
                        "world_size": 2,
                        "concurrent": c,
                        "buffer_bytes": s,
                        "busbw": b * noise / c,
                        "status": "ok",
                        "allocation_id": alloc,
                    }
                )
    model = ProbeTableBandwidth().fit(pd.DataFrame(rows))
    q = pd.DataFrame(
        {
            "instance_type": ["local.cpu"] * 3,
            "world_size": [2, 2, 3],
            "concurrent": [1, 1, 1],
            "buffer_bytes": [1024**2, 8 * 1024**2, 10**12],
        }
    )
    pred = model.predict(q)
    assert pred[0] == pytest.approx(1e8)
    assert 1e8 < pred[1] < 1e9
    assert pred[2] == pytest.approx(1e9)  # held constant beyond the probes, nearest world size
    assert model.bandwidth_cap("local.cpu", 2) == pytest.approx(1e9)
    with pytest.raises(ConfigError, match=r"no probes of instance type 'g4dn\.xlarge'"):
        model.bandwidth_cap("g4dn.xlarge", 2)


def test_without_overlap_the_exchange_follows_the_backward_pass() -> None:
    p = steady(make_profile())
    w = Workload("m", {"cpu": p})
    c = config((inst("a"), 2, 32))
    bw = ConstantBandwidth(1e6)
    t_bw = float(p.t_bw(32))
    alone = simulate_exchange(
        [t_bw, t_bw], [bus_bytes(1500, 2), bus_bytes(2500, 2)], [1e6] * 2, math.inf
    )
    serial = Simulator(bw, overlap=0.0, schedule="concurrent").estimate(w, c)
    assert serial.t_pe == pytest.approx(alone.t_pe)
    ddp = Simulator(bw, overlap=0.0).estimate(w, c)  # one after the other from t_bw
    assert ddp.t_pe == pytest.approx(t_bw + (bus_bytes(1500, 2) + bus_bytes(2500, 2)) / 1e6)
    assert serial.t_iter == pytest.approx(float(p.t_fw(32)) + alone.t_pe)
    overlapped = Simulator(bw, overlap=1.0, schedule="concurrent").estimate(w, c)
    assert overlapped.t_pe < serial.t_pe
    with pytest.raises(ConfigError, match="overlap"):
        Simulator(bw, overlap=1.5)


def test_by_default_cpu_workers_exchange_after_the_backward_pass_and_gpus_during_it() -> None:
    bw = ConstantBandwidth(1e6)
    for device, expected in (("cpu", 0.0), ("T4", 1.0)):
        p = steady(make_profile(), device=device)
        w = Workload("m", {device: p})
        c = config((inst("a", device), 2, 32))
        auto = Simulator(bw).estimate(w, c)
        assert auto.t_pe == pytest.approx(Simulator(bw, overlap=expected).estimate(w, c).t_pe)
    # one CPU VM in a mixed configuration is enough: its cores do the reduction
    gpu, cpu = steady(make_profile(), device="T4"), steady(make_profile(), device="cpu")
    w = Workload("m", {"T4": gpu, "cpu": cpu})
    c = config((inst("g", "T4"), 1, 32), (inst("c", "cpu"), 1, 32))
    auto = Simulator(bw).estimate(w, c)
    assert auto.t_pe == pytest.approx(Simulator(bw, overlap=0.0).estimate(w, c).t_pe)


@pytest.mark.parametrize(
    ("vcpus", "workers", "threads", "expected"),
    [(2, 2, 1, 0.0), (16, 2, 1, 1.0), (16, 2, 7, 1.0), (16, 2, 8, 0.0), (16, 8, 1, 1.0)],
)
def test_cpu_workers_overlap_when_their_host_leaves_a_core_per_rank_for_gloo(
    vcpus: int, workers: int, threads: int, expected: float
) -> None:
    bw = ConstantBandwidth(1e6)
    p = dataclasses.replace(steady(make_profile()), threads=threads)
    w = Workload("m", {"cpu": p})
    local = SimInstance.local_cpu(vcpus=vcpus)  # every local worker on this one host
    c = config((local, workers, 32))
    auto = Simulator(bw).estimate(w, c)
    assert auto.t_pe == pytest.approx(Simulator(bw, overlap=expected).estimate(w, c).t_pe)
    assert Simulator(bw, overlap=1.0).estimate(w, c).t_pe < (
        Simulator(bw, overlap=0.0).estimate(w, c).t_pe
    )


def test_ddp_passes_over_the_gradients_add_to_backward_and_after_the_exchange() -> None:
    p = steady(make_profile())  # 4000 B of gradients
    copying = dataclasses.replace(p, copy_bytes_per_s=4000 / 0.01)  # one pass: 10 ms
    assert copying.ddp_copy_s() == pytest.approx(0.01) and p.ddp_copy_s() == 0.0
    bw = ConstantBandwidth(1e12)  # the exchange itself is instant
    for overlap in (0.0, 1.0):
        sim = Simulator(bw, overlap=overlap)
        c = config((inst("a"), 2, 32))
        plain = sim.estimate(Workload("m", {"cpu": p}), c)
        ddp = sim.estimate(Workload("m", {"cpu": copying}), c)
        assert ddp.t_bw == pytest.approx(plain.t_bw + 0.01)  # into the buckets, divided
        assert ddp.t_iter == pytest.approx(plain.t_iter + 0.02)  # ... and back out
    one = Simulator(bw).estimate(Workload("m", {"cpu": copying}), config((inst("a"), 1, 32)))
    assert one.t_iter == pytest.approx(float(p.t_iter(32)))  # no DDP exchange on one worker


def test_the_optimizer_step_follows_the_exchange_on_the_slowest_group() -> None:
    p = steady(make_profile())
    bw = ConstantBandwidth(1e9)
    sim = Simulator(bw)
    for c in (config((inst("a"), 1, 32)), config((inst("a"), 2, 32))):  # one worker too
        plain = sim.estimate(Workload("m", {"cpu": p}), c)
        stepping = sim.estimate(
            Workload("m", {"cpu": dataclasses.replace(p, optimizer_step_s=0.007)}), c
        )
        assert stepping.t_iter == pytest.approx(plain.t_iter + 0.007)
        assert (stepping.t_fw, stepping.t_bw, stepping.t_pe) == (plain.t_fw, plain.t_bw, plain.t_pe)
        assert stepping.p95 == pytest.approx(plain.p95 + 0.007)
    t4 = steady(make_profile(), device="T4")
    mixed = config((inst("a"), 1, 32), (inst("b", "T4"), 1, 32))
    w = Workload("m", {"cpu": p, "T4": t4})
    both = Workload(
        "m",
        {
            "cpu": dataclasses.replace(p, optimizer_step_s=0.002),
            "T4": dataclasses.replace(t4, optimizer_step_s=0.01),
        },
    )
    assert sim.estimate(both, mixed).t_iter == pytest.approx(sim.estimate(w, mixed).t_iter + 0.01)


class SpreadBandwidth(ConstantBandwidth):
    """A bandwidth model that also knows how allocations' network levels spread, and the
    world sizes it was asked."""

    def __init__(self, busbw: float, cap: float = math.inf, sigma: float = 0.0) -> None:
        super().__init__(busbw, cap)
        self.sigma = sigma
        self.worlds: list[tuple[str, int]] = []

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        self.worlds += list(zip(features["instance_type"], features["world_size"], strict=True))
        return super().predict(features)

    def level_sigma(self, instance_type: str) -> float:
        return self.sigma


def test_sustained_cap_paces_every_bucket() -> None:
    """A long job's transfers run at the sustained bandwidth (the cap), however fast the
    burst probes were."""
    p = steady(make_profile())
    w = Workload("m", {"cpu": p})
    c = config((inst("a"), 2, 32))
    burst = Simulator(ConstantBandwidth(1e6), overlap=0.0).estimate(w, c)
    capped = Simulator(ConstantBandwidth(1e6, cap=2.5e5), overlap=0.0).estimate(w, c)
    t_bw = float(p.t_bw(32))
    assert capped.t_pe - t_bw == pytest.approx(4 * (burst.t_pe - t_bw))


class SustainedBandwidth(ConstantBandwidth):
    def sustained_factor(self, instance_type: str, world_size: int) -> float:
        return 0.25


def test_a_long_job_runs_at_the_sustained_factor() -> None:
    """DDP's schedule scales every bucket's burst bandwidth by the sustained factor the
    probes measured; the method's concurrent model (short transfers) does not."""
    p = steady(make_profile())
    w = Workload("m", {"cpu": p})
    c = config((inst("a"), 2, 32))
    t_bw = float(p.t_bw(32))
    burst = Simulator(ConstantBandwidth(1e6), overlap=0.0).estimate(w, c)
    held = Simulator(SustainedBandwidth(1e6), overlap=0.0).estimate(w, c)
    assert held.t_pe - t_bw == pytest.approx(4 * (burst.t_pe - t_bw))
    conc = Simulator(SustainedBandwidth(1e6), overlap=0.0, schedule="concurrent").estimate(w, c)
    assert conc.t_pe == pytest.approx(
        Simulator(ConstantBandwidth(1e6), overlap=0.0, schedule="concurrent").estimate(w, c).t_pe
    )


class SkewedBandwidth(ConstantBandwidth):
    """Probes whose mean transfer is twice the typical one above 2 KB."""

    def mean_time_factors(self, instance_type: str, buffer_bytes: np.ndarray) -> np.ndarray:
        return np.where(np.asarray(buffer_bytes) > 2000, 0.5, 1.0)


def test_each_bucket_runs_at_the_mean_transfers_bandwidth() -> None:
    """The estimate is a mean: a bucket's bus bandwidth is scaled by the predictor's
    mean-time factor at its size, in both schedules; a misshapen factor is an error."""
    p = steady(make_profile())
    w = Workload("m", {"cpu": p})
    c = config((inst("a"), 2, 32))
    t_bw = float(p.t_bw(32))
    sizes = [b.size_bytes for b in p.buckets]  # 1500 and 2500 bytes: the second is slowed
    slowed = sum(bus_bytes(s, 2) / 1e6 * (2.0 if s > 2000 else 1.0) for s in sizes)
    typical = Simulator(ConstantBandwidth(1e6), overlap=0.0)
    mean = Simulator(SkewedBandwidth(1e6), overlap=0.0)
    # DDP's schedule, one bucket after the other: the slowed transfer adds its extra time
    assert typical.estimate(w, c).t_pe - t_bw == pytest.approx(
        sum(bus_bytes(s, 2) / 1e6 for s in sizes)
    )
    assert mean.estimate(w, c).t_pe - t_bw == pytest.approx(slowed)
    # the concurrent schedule, both at once without a cap: the larger one ends last, twice
    # as late
    typical = Simulator(ConstantBandwidth(1e6), overlap=0.0, schedule="concurrent")
    mean = Simulator(SkewedBandwidth(1e6), overlap=0.0, schedule="concurrent")
    late = max(bus_bytes(s, 2) for s in sizes) / 1e6
    assert typical.estimate(w, c).t_pe - t_bw == pytest.approx(late)
    assert mean.estimate(w, c).t_pe - t_bw == pytest.approx(2 * late)

    class Broken(ConstantBandwidth):
        def mean_time_factors(self, instance_type: str, buffer_bytes: np.ndarray) -> np.ndarray:
            return np.zeros(1)

    with pytest.raises(ConfigError, match="mean_time_factors"):
        Simulator(Broken(1e6)).estimate(w, c)


def test_vm_spread_raises_the_slowest_vm_and_the_p90() -> None:
    base = steady(make_profile())
    spread = dataclasses.replace(base, vm_cv=0.05, profiled_vms=3)
    c = config((inst("a"), 16, 32))
    one = Simulator(ConstantBandwidth(1e12)).estimate(Workload("m", {"cpu": base}), c)
    many = Simulator(ConstantBandwidth(1e12)).estimate(Workload("m", {"cpu": spread}), c)
    assert many.t_iter > one.t_iter * 1.05  # the slowest of 16 VMs, 5% apart
    assert many.t_iter_p90 is not None and many.t_iter_p90 > many.t_iter
    assert one.t_iter_p90 == pytest.approx(one.t_iter)


def test_other_profiles_vm_spreads_narrow_the_p90_of_a_three_vm_profile() -> None:
    # one profile of 3 VMs that spread 4%: alone, a t on 2 degrees of freedom; beside 20
    # other profiles of the store spreading 2.5% (4% on 3 VMs is within chance of that),
    # the pooled spread is far narrower
    p = dataclasses.replace(steady(make_profile()), vm_cv=0.04, profiled_vms=3)
    c = config((inst("a"), 1, 32))
    sim = Simulator(ConstantBandwidth(1e12))
    alone = sim.estimate(Workload("m", {"cpu": p}), c)
    evidence = {f"m{i}/full/T4": (0.025, 3) for i in range(20)}
    pooled = sim.estimate(Workload("m", {"cpu": p}, evidence), c)
    assert pooled.t_iter == pytest.approx(alone.t_iter)  # the mean is the profile's
    assert alone.t_iter_p90 is not None and pooled.t_iter_p90 is not None
    assert pooled.t_iter < pooled.t_iter_p90 < alone.t_iter_p90
    extra = lambda e: (e.t_iter_p90 - e.t_iter) / e.t_iter  # noqa: E731
    assert extra(pooled) < 0.6 * extra(alone)
    # the store lists this profile too: it is not counted twice
    itself = Workload("m", {"cpu": p}, {**evidence, p.store_key: (0.04, 3)})
    assert itself.vm_spreads() == Workload("m", {"cpu": p}, evidence).vm_spreads()
    with pytest.raises(ConfigError, match=r"vm_evidence\['x'\]"):
        Workload("m", {"cpu": p}, {"x": (-0.1, 3)})


def test_p90_comes_from_the_spread_of_allocations() -> None:
    p = steady(make_profile())
    w = Workload("m", {"cpu": p})
    c = config((inst("a"), 4, 32))
    flat = Simulator(SpreadBandwidth(1e3), overlap=0.0).estimate(w, c)
    assert flat.t_iter_p90 == pytest.approx(flat.t_iter) and flat.net_sigma == 0
    wide = Simulator(SpreadBandwidth(1e3, sigma=0.2), overlap=0.0).estimate(w, c)
    slow = float(np.exp(0.2 * 1.2815515655446004))  # 10th-percentile level: 1/slow as fast
    exchange = wide.t_pe - float(p.t_bw(32))
    assert wide.t_iter == pytest.approx(flat.t_iter)
    assert wide.t_iter_p90 == pytest.approx(wide.t_iter + exchange * (slow - 1), rel=1e-6)
    assert wide.t_iter_quantile(0.5) == wide.t_iter
    assert wide.t_iter_quantile(0.9) == pytest.approx(wide.t_iter_p90)
    assert wide.t_iter < wide.t_iter_quantile(0.8) < wide.t_iter_p90 < wide.t_iter_quantile(0.95)
    assert wide.p50 <= wide.p90 <= wide.p95


def test_mixed_types_are_asked_at_the_ring_they_form() -> None:
    """A ring of 1 four-GPU VM and 3 one-GPU VMs spans 4 VMs: each type is asked about a
    ring of 4 VMs of its own kind (16 ranks and 4 ranks), not about the job's 7 ranks."""
    quad = SimInstance("quad", "T4", 4, {"instance_type": "quad"})
    one = SimInstance("one", "T4", 1, {"instance_type": "one"})
    bw = SpreadBandwidth(1e9)
    prof = steady(make_profile(), device="T4")
    Simulator(bw).estimate(Workload("m", {"T4": prof}), config((quad, 1, 32), (one, 3, 8)))
    assert set(bw.worlds) == {("quad", 16), ("one", 4)}
    homo = SpreadBandwidth(1e9)
    Simulator(homo).estimate(Workload("m", {"T4": prof}), config((quad, 2, 32)))
    assert set(homo.worlds) == {("quad", 8)}


def test_an_estimate_names_the_terms_its_profiles_lack() -> None:
    base = steady(make_profile())
    w = Workload("m", {"cpu": base})
    c = config((inst("a"), 2, 32))
    est = Simulator(ConstantBandwidth(1e9)).estimate(w, c)
    assert est.missing == ("optimizer_step", "ddp_copy")
    full = dataclasses.replace(base, optimizer_step_s=0.01, copy_bytes_per_s=1e9)
    est = Simulator(ConstantBandwidth(1e9)).estimate(Workload("m", {"cpu": full}), c)
    assert est.missing == ()
    one = Simulator(ConstantBandwidth(1e9)).estimate(w, config((inst("a"), 1, 32)))
    assert one.missing == ("optimizer_step",)  # one worker: DDP copies nothing


def local(name: str = "local.cpu") -> SimInstance:
    return SimInstance(name, "cpu", 1, {"instance_type": name, "provider": "local"}, True)


def test_local_workers_share_the_host_by_processor_sharing() -> None:
    base = steady(make_profile())
    shared = dataclasses.replace(base, shared_slowdown=((2, 1.3),))
    sim = Simulator(ConstantBandwidth(1e12), overlap=0.0)
    plain = sim.estimate(Workload("m", {"cpu": base}), config((local(), 2, 32)))
    assert "shared_slowdown" in plain.missing  # two local workers, nothing measured
    w = Workload("m", {"cpu": shared})
    even = sim.estimate(w, config((local(), 2, 32)))
    assert "shared_slowdown" not in even.missing
    assert even.t_fw == pytest.approx(1.3 * plain.t_fw)
    assert even.t_bw == pytest.approx(1.3 * plain.t_bw)
    # unequal batches: the small worker finishes first, the big one then runs alone
    small, big = float(base.t_iter(8)), float(base.t_iter(56))
    est = sim.estimate(w, config((local("a"), 1, 8), (local("b"), 1, 56)))
    want = (small * 1.3 + (big - small)) / big
    assert est.t_fw + est.t_bw == pytest.approx(want * big, rel=1e-6)
    assert 1.0 < want < 1.3
    # one worker, or cloud VMs (each its own host): no sharing
    one = sim.estimate(w, config((local(), 1, 32)))
    assert one.t_fw == pytest.approx(float(base.t_fw(32)))
    vms = sim.estimate(w, config((inst("a"), 2, 32)))
    assert vms.t_fw == pytest.approx(plain.t_fw) and "shared_slowdown" not in vms.missing


def test_host_slowdown_interpolates_and_extends() -> None:
    p = dataclasses.replace(make_profile(), shared_slowdown=((2, 1.2), (4, 2.0)))
    assert p.host_slowdown(1) == 1.0
    assert p.host_slowdown(2) == pytest.approx(1.2)
    assert p.host_slowdown(3) == pytest.approx(1.6)
    assert p.host_slowdown(6) == pytest.approx(2.8)  # along the last segment
    assert dataclasses.replace(p, shared_slowdown=()).host_slowdown(4) == 1.0
    back = ComputeProfile.from_json(p.to_json())
    assert back.shared_slowdown == ((2, 1.2), (4, 2.0))
    d = p.to_dict()
    d["shared_slowdown"] = [[1, 1.5]]
    with pytest.raises(ConfigError, match="shared_slowdown"):
        ComputeProfile.from_dict(d)
    d["shared_slowdown"] = [[2, float("nan")]]
    with pytest.raises(ConfigError, match="shared_slowdown"):
        ComputeProfile.from_dict(d)


class MixedBandwidth(SpreadBandwidth):
    """Probes of mixed rings measured them at half what their types compose to."""

    def mixed_factors(self, buffer_bytes: np.ndarray, features: object = None) -> np.ndarray:
        return np.full(np.shape(buffer_bytes), 0.5)

    def mixed_bound(self, buffer_bytes: np.ndarray) -> np.ndarray:
        return self.mixed_factors(buffer_bytes)


def test_a_mixed_ring_is_scaled_by_its_mixed_factor() -> None:
    """The mixed-ring factor scales a ring of several types (its exchange takes twice as
    long at half the bandwidth) and leaves a ring of one type alone."""
    quad = SimInstance("quad", "T4", 4, {"instance_type": "quad"})
    one = SimInstance("one", "T4", 1, {"instance_type": "one"})
    w = Workload("m", {"T4": steady(make_profile(), device="T4")})
    mixed, homo = config((quad, 1, 32), (one, 3, 8)), config((quad, 2, 32))
    plain = Simulator(SpreadBandwidth(1e6), overlap=0.0)
    halved = Simulator(MixedBandwidth(1e6), overlap=0.0)
    a, b = plain.estimate(w, mixed), halved.estimate(w, mixed)
    assert b.t_pe - b.t_bw == pytest.approx(2 * (a.t_pe - a.t_bw))
    assert halved.estimate(w, homo) == plain.estimate(w, homo)


def test_mixed_ring_probes_slow_the_simulated_mixed_job() -> None:
    """End to end: a probe table fitted with rings measured at half their composition
    predicts the mixed job's exchange twice as long, the homogeneous job's unchanged."""
    from tests.predictors.bw_rows import make_mix_rows, make_probes

    probes = make_probes(allocations=2, worlds=(2, 4, 16), concurrency=(1,))
    alone = ProbeTableBandwidth().fit(probes)

    def busbw(itype: str, world: int, size: int) -> float:
        q = {"instance_type": [itype], "world_size": [world], "concurrent": [1]}
        return float(alone.predict(pd.DataFrame({**q, "buffer_bytes": [size]}))[0])

    both = ProbeTableBandwidth().fit(pd.concat([probes, make_mix_rows(busbw, 0.5)]))
    big = SimInstance("g4dn.12xlarge", "T4", 4, {"instance_type": "g4dn.12xlarge"})
    small = SimInstance("g4dn.xlarge", "T4", 1, {"instance_type": "g4dn.xlarge"})
    w = Workload("m", {"T4": steady(make_profile(), device="T4")})
    mixed, homo = config((big, 1, 32), (small, 3, 8)), config((big, 2, 32))
    before = Simulator(alone, overlap=0.0).estimate(w, mixed)
    after = Simulator(both, overlap=0.0).estimate(w, mixed)
    assert after.t_pe - after.t_bw == pytest.approx(2 * (before.t_pe - before.t_bw))
    assert after.t_iter > before.t_iter
    same = Simulator(both, overlap=0.0).estimate(w, homo)
    assert same == Simulator(alone, overlap=0.0).estimate(w, homo)


def test_any_number_of_types_and_the_first_slots_keep_their_draws() -> None:
    w = Workload("m", {"cpu": make_profile()})
    ten = config(*((inst(f"t{i}"), 1, 8) for i in range(10)))
    small = config((inst("a"), 2, 8), (inst("b"), 1, 16))
    sim = Simulator(ConstantBandwidth(1e9), max_types=2)
    before = sim.estimate(w, small)
    est = sim.estimate(w, ten)  # beyond max_types: more slots are drawn, no error
    assert est.t_iter > 0 and est.world_size == 10
    assert sim.estimate(w, small) == before
    again = Simulator(ConstantBandwidth(1e9), max_types=2)
    assert again.estimate(w, ten) == est  # seeded per slot: reproducible


def test_prefetch_asks_the_model_once_and_changes_no_estimate() -> None:
    w = Workload("m", {"T4": steady(make_profile(), "T4")})
    a, b = inst("a", "T4"), inst("b", "T4", ranks=4)
    configs = [config((a, n, 8)) for n in (2, 3, 4)] + [config((a, 2, 8), (b, 1, 32))]
    plain_bw = ConstantBandwidth(1e9)
    plain = [Simulator(plain_bw).estimate(w, c) for c in configs]
    bw = ConstantBandwidth(1e9)
    sim = Simulator(bw)
    sim.prefetch(w, [a, b], max_vms=4)
    assert bw.calls == 1
    assert [sim.estimate(w, c) for c in configs] == plain
    assert bw.calls == 1  # every curve was there
    assert plain_bw.calls > 1


class DomainBandwidth(ConstantBandwidth):
    """Constant busbw; only ``known`` types at up to ``max_world`` ranks are in domain."""

    def __init__(self, known: set[str], max_world: int) -> None:
        super().__init__(1e8)
        self.known, self.max_world = known, max_world

    def in_domain(self, features: pd.DataFrame) -> np.ndarray:
        ok = features["instance_type"].isin(self.known) & (features["world_size"] <= self.max_world)
        return ok.to_numpy()


def test_an_estimate_names_the_types_whose_bandwidth_was_extrapolated() -> None:
    w = Workload("m", {"cpu": steady(make_profile())})
    bw = DomainBandwidth({"a"}, max_world=4)
    sim = Simulator(bw)
    assert sim.estimate(w, config((inst("a"), 4, 32))).extrapolated == ()
    assert sim.estimate(w, config((inst("a"), 8, 32))).extrapolated == ("a",)
    assert sim.estimate(w, config((inst("a"), 2, 32), (inst("b"), 2, 32))).extrapolated == ("b",)
    # a predictor without a domain is taken at its word
    assert (
        Simulator(ConstantBandwidth(1e8)).estimate(w, config((inst("a"), 8, 32))).extrapolated == ()
    )


def test_a_measured_ddp_overhead_is_what_the_estimate_adds() -> None:
    p = steady(make_profile())
    measured = dataclasses.replace(
        p, copy_bytes_per_s=4000 / 0.002, ddp_overhead=((1, 0.009),)
    )  # 9 ms measured, one copy pass 2 ms
    bw = ConstantBandwidth(1e12)
    sim = Simulator(bw, overlap=0.0)
    c = config((inst("a"), 2, 32))
    plain = sim.estimate(Workload("m", {"cpu": p}), c)
    ddp = sim.estimate(Workload("m", {"cpu": measured}), c)
    assert ddp.t_bw == pytest.approx(plain.t_bw + 0.007)  # hooks, copy in (divided)
    assert ddp.t_iter == pytest.approx(plain.t_iter + 0.009)  # ... and the copy out
    assert "ddp_copy" not in ddp.missing
    # an overhead of at most one copy pass is all copy out: added after the exchange,
    # and a measured 0 is a measurement, not a missing term
    for measured_s in (0.001, 0.002, 0.0):
        small = dataclasses.replace(measured, ddp_overhead=((1, measured_s),))
        est = sim.estimate(Workload("m", {"cpu": small}), c)
        assert est.t_bw == pytest.approx(plain.t_bw)
        assert est.t_iter == pytest.approx(plain.t_iter + measured_s)
        assert "ddp_copy" not in est.missing
    assert "ddp_copy" in plain.missing  # neither measured nor a copy bandwidth


def test_what_an_estimator_and_a_bandwidth_model_offer_is_asked_by_protocol() -> None:
    """The planner's optional methods (``PlannerEstimator``): the simulator has them all,
    APM none. A bandwidth model's optional methods, each on its own: the probe table has
    all but ``in_domain``; a predictor with none has none; a subclass that adds one has
    it, bound to itself."""
    sim = Simulator(ConstantBandwidth(1e9))
    assert planner_estimator(sim) is sim
    assert planner_estimator(ApmEstimator()) is None
    table = BandwidthExtras.of(ProbeTableBandwidth())
    assert table.in_domain is None
    assert None not in (
        table.sustained_factor,
        table.level_sigma,
        table.mean_time_factors,
        table.mixed_factors,
        table.mixed_bound,
        table.unprobed_mix_sigma,
    )
    assert BandwidthExtras.of(ConstantBandwidth(1e9)) == BandwidthExtras(
        None, None, None, None, None, None, None
    )
    sustained = SustainedBandwidth(1e9)
    extras = BandwidthExtras.of(sustained)
    assert extras.sustained_factor is not None and extras.sustained_factor("a", 2) == 0.25
    assert extras.level_sigma is None and extras.mixed_factors is None


class UnprobedMixes(ConstantBandwidth):
    """A bandwidth model whose probes held no mixed ring: each adds ``sigma``."""

    def __init__(self, busbw: float, sigma: float) -> None:
        super().__init__(busbw)
        self.sigma = sigma

    def unprobed_mix_sigma(self, instance_types: Sequence[str]) -> float | None:
        return self.sigma if len(set(instance_types)) > 1 else None


def test_a_mix_never_probed_is_named_and_widens_the_p90() -> None:
    """A ring of two types the bandwidth model never held as one ring: the estimate names
    the mix among what it extrapolated and the network spread grows in quadrature (a
    one-type ring, and a model that cannot say, are as before)."""
    w = Workload("m", {"T4": steady(make_profile(), "T4")})
    a, b = inst("a", "T4"), inst("b", "T4", ranks=4)
    mixed, homo = config((a, 2, 8), (b, 1, 32)), config((a, 3, 8))
    plain = Simulator(ConstantBandwidth(1e7)).estimate(w, mixed)  # the exchange binds
    flagged = Simulator(UnprobedMixes(1e7, 0.3)).estimate(w, mixed)
    assert "the mix a+b" in flagged.extrapolated and "the mix a+b" not in plain.extrapolated
    assert flagged.net_sigma == pytest.approx(float(np.hypot(plain.net_sigma, 0.3)))
    assert flagged.t_iter == plain.t_iter
    assert flagged.t_iter_p90 is not None and plain.t_iter_p90 is not None
    assert flagged.t_iter_p90 > plain.t_iter_p90
    same = Simulator(UnprobedMixes(1e7, 0.3)).estimate(w, homo)
    assert same == Simulator(ConstantBandwidth(1e7)).estimate(w, homo)


class StructuredBandwidth(SpreadBandwidth):
    """Probes of mixed rings taught that a ring whose members differ in GPUs per VM runs at
    half its composition, one of alike members at all of it."""

    def __init__(self, busbw: float) -> None:
        super().__init__(busbw)
        self.asked: list[np.ndarray] = []

    def mixed_factors(self, buffer_bytes: np.ndarray, features: object = None) -> np.ndarray:
        assert isinstance(features, np.ndarray)
        self.asked.append(features)
        return np.full(np.shape(buffer_bytes), 0.5 if features[0] > 0 else 1.0)

    def mixed_bound(self, buffer_bytes: np.ndarray) -> np.ndarray:
        return np.ones(np.shape(buffer_bytes))


def test_a_mixed_ring_is_asked_with_its_own_features() -> None:
    """The simulator gives the bandwidth model the ring's features (GPUs per VM and rated
    links of its members, its world size): a ring of a 4-GPU VM and 1-GPU VMs gets the
    factor of such rings, one of two 1-GPU types that of alike members."""
    from srifty_core.predictors.mixed_rings import ring_features

    feats = {"gpu_model": "T4", "network_gbps": 50.0}
    quad = SimInstance("quad", "T4", 4, {"instance_type": "quad", "gpus_per_vm": 4, **feats})
    one = SimInstance("one", "T4", 1, {"instance_type": "one", "gpus_per_vm": 1, **feats})
    other = SimInstance("other", "T4", 1, {"instance_type": "other", "gpus_per_vm": 1, **feats})
    w = Workload("m", {"T4": steady(make_profile(), device="T4")})
    plain = Simulator(SpreadBandwidth(1e6), overlap=0.0)
    model = StructuredBandwidth(1e6)
    aware = Simulator(model, overlap=0.0)
    spread, alike = config((quad, 1, 32), (one, 3, 8)), config((one, 2, 8), (other, 2, 8))
    a, b = plain.estimate(w, spread), aware.estimate(w, spread)
    assert b.t_pe - b.t_bw == pytest.approx(2 * (a.t_pe - a.t_bw))
    assert aware.estimate(w, alike).t_iter == pytest.approx(plain.estimate(w, alike).t_iter)
    np.testing.assert_allclose(model.asked[0], ring_features([4, 1], [50.0, 50.0], 7))
