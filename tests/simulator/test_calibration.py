"""Online recalibration (``simulator.calibration``): factors, updates, the simulator hook,
projection, the re-plan rule and the store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from srifty_core.errors import ConfigError
from srifty_core.predictors.network import pooled_spreads
from srifty_core.simulator import calibration as calib
from srifty_core.simulator.calibration import Calibration, Factor, Measured, Projection, Window
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload
from tests.profiling.test_profile_contract import make_profile
from tests.simulator.test_estimator import ConstantBandwidth, steady


class SpreadBandwidth(ConstantBandwidth):
    """A constant bus bandwidth with a per-type allocation spread (``level_sigma``)."""

    def __init__(self, busbw: float, sigmas: dict[str, float]) -> None:
        super().__init__(busbw)
        self.sigmas = sigmas

    def level_sigma(self, instance_type: str) -> float:
        return self.sigmas.get(instance_type, 0.0)


def gpu(name: str, device: str, gbps: float = 10.0) -> SimInstance:
    return SimInstance(name, device, 1, {"instance_type": name, "gpu_model": device,
                                         "network_gbps": gbps})  # fmt: skip


def workload(cv_a: float = 0.02, cv_b: float = 0.04) -> Workload:
    return Workload(
        "m",
        {
            "A": steady(make_profile(vm_cv=cv_a, profiled_vms=3), "A"),
            "B": steady(make_profile(vm_cv=cv_b, profiled_vms=3), "B", scale=2.0),
        },
    )


A, B = gpu("a.big", "A", 10.0), gpu("b.big", "B", 25.0)
NET_A, NET_B = calib.comm_key("a.big", False), calib.comm_key("b.big", False)  # across VMs


def cfg(*groups: tuple[SimInstance, int, int]) -> ClusterConfig:
    return ClusterConfig(tuple(Group(i, c, b) for i, c, b in groups))


# --------------------------------------------------------------------------- factors
def test_conjugate_update_matches_the_closed_form_and_tightens() -> None:
    f = Factor(0.0, 0.1)
    g = f.update(math.log(1.3), 0.05)
    w0, w1 = 1 / 0.1**2, 1 / 0.05**2
    assert g.log_scale == pytest.approx(w1 * math.log(1.3) / (w0 + w1))
    assert g.sd == pytest.approx((w0 + w1) ** -0.5)
    h = g.update(math.log(1.3), 0.05)
    assert h.sd < g.sd < f.sd and h.windows == 2 and h.seen == 2
    assert abs(h.scale - 1.3) < abs(g.scale - 1.3)
    with pytest.raises(ConfigError):
        f.update(0.0, 0.0)


def test_carried_factor_keeps_its_centre_and_widens_by_the_prior_spread() -> None:
    f = Factor(0.2, 0.01, 3, 5).carried(0.05)
    assert f.log_scale == 0.2 and f.windows == 0 and f.seen == 5
    assert f.sd == pytest.approx(math.hypot(0.01, 0.05))


def test_prior_width_is_what_the_simulator_learned_not_a_constant() -> None:
    # B spreads far more than A (beyond chance on three VMs each): each keeps its own
    w = workload(0.01, 0.2)
    bw = SpreadBandwidth(1e9, {"a.big": 0.09, "b.big": 0.07})
    cal = calib.prior(w, [A, B], bw)
    spreads = pooled_spreads({"A": (0.01, 3), "B": (0.2, 3)})
    assert cal.compute["A"].sd == pytest.approx(spreads["A"])
    assert cal.compute["B"].sd == pytest.approx(spreads["B"])
    assert cal.compute["A"].sd != cal.compute["B"].sd
    assert set(cal.comm) == {NET_A, NET_B}  # one GPU a VM: no ring inside one
    assert cal.comm[NET_A].sd == 0.09 and cal.comm[NET_B].sd == 0.07
    assert all(f.scale == 1.0 for f in (*cal.compute.values(), *cal.comm.values()))
    # nothing learned (one VM, no spread model): the floor, so that it can still learn
    bare = calib.prior(Workload("m", {"A": steady(make_profile(), "A")}), [A], ConstantBandwidth(1))
    assert bare.compute["A"].sd == calib.PRIOR_FLOOR == bare.comm[NET_A].sd


def test_measured_noise_is_jitter_over_the_sample_count() -> None:
    m = Measured.of([1.0, 1.1, 0.9, 1.0])
    assert m.n == 4 and m.mean_s == pytest.approx(1.0)
    assert m.log_noise == pytest.approx(np.std([1.0, 1.1, 0.9, 1.0], ddof=1) / 1.0 / 2)
    w = Window.from_samples([1.0, 1.0], {"A": np.ones((2, 3)) * 0.5}, [0.2, 0.2])
    assert w.compute["A"].n == 2 and w.compute["A"].log_noise == calib.NOISE_FLOOR
    assert w.exchange is not None and w.exchange.mean_s == pytest.approx(0.2)
    assert Window.from_samples([1.0], {}, [0.0]).exchange is None  # one rank: no exchange


# --------------------------------------------------------------------------- simulator hook
def test_calibration_scales_compute_per_device_and_bandwidth_per_type() -> None:
    w = workload()
    base = Simulator(ConstantBandwidth(1e6), mean="exact")
    c = cfg((A, 2, 32), (B, 2, 32))
    cal = Calibration("m", {"A": Factor(math.log(1.3), 0.01)}, {NET_A: Factor(math.log(2.0), 0.01)})
    sim = calib.calibrated(base, cal)
    (pc0, busy0), (pc1, busy1) = base.breakdown(w, c), sim.breakdown(w, c)
    assert pc1["A"] == pytest.approx(1.3 * pc0["A"]) and pc1["B"] == pytest.approx(pc0["B"])
    assert busy1 == pytest.approx(2.0 * busy0)  # the ring's slowest link halved
    one = cfg((A, 1, 32))
    assert sim.estimate(w, one).t_iter == pytest.approx(1.3 * base.estimate(w, one).t_iter)
    assert calib.calibrated(base, None).estimate(w, one).t_iter == base.estimate(w, one).t_iter


def test_observed_factors_replace_the_predictive_spreads_in_the_p90() -> None:
    w = workload(0.05, 0.05)
    bw = SpreadBandwidth(1e6, {"a.big": 0.3})
    base = Simulator(bw)
    c = cfg((A, 4, 32))
    prior = calib.prior(w, [A], bw)
    observed = Calibration("m", {"A": Factor(0.0, 0.001, 2, 2)}, {NET_A: Factor(0.0, 0.001, 2, 2)})
    e0 = calib.calibrated(base, prior).estimate(w, c)
    e1 = calib.calibrated(base, observed).estimate(w, c)
    e2 = calib.calibrated(base, observed.unobserved()).estimate(w, c)
    assert e0.t_iter_p90 == pytest.approx(base.estimate(w, c).t_iter_p90)
    assert e1.t_iter == pytest.approx(e0.t_iter)
    assert e1.t_iter_p90 - e1.t_iter < 0.2 * (e0.t_iter_p90 - e0.t_iter)  # type: ignore[operator]
    assert e2.t_iter_p90 == pytest.approx(e0.t_iter_p90)


# --------------------------------------------------------------------------- updates
def test_two_windows_of_a_hidden_slowdown_bring_the_projection_within_5pct() -> None:
    w = workload()
    bw = SpreadBandwidth(1e6, {"a.big": 0.08, "b.big": 0.08})
    base = Simulator(bw, mean="exact")
    c = cfg((A, 2, 32), (B, 2, 32))
    pred, busy = base.breakdown(w, c)
    rng = np.random.default_rng(0)
    cal = calib.prior(w, [A, B], bw)
    truth = Calibration("m", {"B": Factor(math.log(1.3), 0.01)}, {NET_A: Factor(0.0, 0.01)})
    actual = calib.calibrated(base, truth).estimate(w, c).t_iter
    errors = []
    for _ in range(2):
        n = 200
        window = Window.from_samples(
            None,
            {"A": pred["A"] * rng.lognormal(0, 0.03, (n, 2)),
             "B": 1.3 * pred["B"] * rng.lognormal(0, 0.03, (n, 2))},
            busy * rng.lognormal(0, 0.05, n),
        )  # fmt: skip
        cal = calib.update(cal, window, base, w, c)
        proj = calib.project(calib.calibrated(base, cal), w, c, 1000, 1.0)
        errors.append(abs(proj.mean_s / (1000 * actual) - 1))
    assert errors[-1] <= 0.05 < abs(base.estimate(w, c).t_iter / actual - 1)
    assert cal.compute["B"].scale == pytest.approx(1.3, rel=0.02)
    assert cal.compute["A"].scale == pytest.approx(1.0, rel=0.02)
    assert cal.comm[NET_B].windows == 0 and cal.comm[NET_A].windows == 2  # link class
    with pytest.raises(ConfigError, match="uncalibrated"):
        calib.update(cal, window, calib.calibrated(base, cal), w, c)


def test_a_window_of_iteration_times_alone_goes_to_the_bottleneck_side() -> None:
    w = workload()
    base = Simulator(ConstantBandwidth(1e12), mean="exact")  # compute-bound
    c = cfg((A, 2, 32), (B, 2, 32))
    t = base.estimate(w, c).t_iter
    cal = calib.update(calib.prior(w, [A, B], base.bandwidth), Window.from_samples(
        np.full(50, 1.2 * t)), base, w, c)  # fmt: skip
    assert cal.compute["B"].scale > 1.1  # B is the slower device (scale 2 profile)
    assert cal.compute["A"].windows == 0 and all(f.windows == 0 for f in cal.comm.values())


def test_local_workers_sharing_a_host_calibrate_a_factor_of_their_own() -> None:
    """Two CPU ranks on one host measure their contention too: the factor they learn
    applies to two sharing ranks, and one rank alone keeps its profile's prediction."""
    w = Workload("m", {"cpu": steady(make_profile())})
    local = SimInstance.local_cpu(vcpus=2)
    base = Simulator(ConstantBandwidth(1e12), mean="exact")
    two, one = cfg((local, 2, 32)), cfg((local, 1, 32))
    predicted, _ = base.breakdown(w, two)
    window = Window.from_samples(
        np.full(50, 1.0), {"cpu": np.full((50, 2), 1.3 * predicted["cpu"])}, np.zeros(50)
    )
    cal = calib.update(calib.prior(w, [local], base.bandwidth), window, base, w, two)
    key = calib.compute_key("cpu", 2)
    assert key != "cpu" and cal.compute[key].scale > 1.2 and cal.compute[key].windows == 1
    assert cal.compute["cpu"].windows == 0  # one rank alone: not observed
    sim = calib.calibrated(base, cal)
    assert sim.estimate(w, two).t_iter > 1.2 * base.estimate(w, two).t_iter
    assert sim.estimate(w, one).t_iter == pytest.approx(base.estimate(w, one).t_iter)
    # VMs of a cloud type do not share: the device's own factor, as before
    assert calib.compute_key("T4", 1) == "T4"


def test_link_class_is_the_slowest_rated_network_after_its_factor() -> None:
    c = cfg((A, 1, 32), (B, 1, 32))
    assert calib.link_class(c) == "a.big"
    slow_b = Calibration("m", {}, {NET_B: Factor(math.log(4.0), 0.01)})
    assert calib.link_class(c, slow_b) == "b.big"


def test_a_factor_learned_in_one_vm_never_applies_across_vms() -> None:
    """Issue 47: one p3.8xlarge's exchange (NVLink) measured 70x under a prediction made at
    NIC speed; the factor learned there slowed a 2-VM ring (the NICs) 70x. A ring inside
    one VM and one across VMs keep factors of their own, both ways."""
    w = Workload("m", {"A": steady(make_profile(), "A")})
    quad = SimInstance("q.4gpu", "A", 4, {"instance_type": "q.4gpu", "gpu_model": "A",
                                          "network_gbps": 10.0})  # fmt: skip
    base = Simulator(ConstantBandwidth(1e6), mean="exact")
    one, two = cfg((quad, 1, 128)), cfg((quad, 2, 256))
    prior = calib.prior(w, [quad], base.bandwidth)
    inside, across = calib.comm_key("q.4gpu", True), calib.comm_key("q.4gpu", False)
    assert set(prior.comm) == {inside, across} and inside != across
    for seen, other in ((one, two), (two, one)):
        predicted, busy = base.breakdown(w, seen)
        window = Window.from_samples(
            None, {"A": np.full((50, 4), predicted["A"])}, np.full(50, busy / 70)
        )
        cal = calib.update(prior, window, base, w, seen)
        learned = inside if seen is one else across
        assert cal.comm[learned].scale < 0.05 and cal.comm[learned].windows == 1
        sim = calib.calibrated(base, cal)
        assert sim.breakdown(w, seen)[1] < busy / 20
        assert sim.breakdown(w, other)[1] == pytest.approx(base.breakdown(w, other)[1])
        assert sim.estimate(w, other).t_iter == pytest.approx(base.estimate(w, other).t_iter)


def test_stored_factors_of_unknown_links_are_dropped(data_dir: Path) -> None:
    """A version 1 file keyed its communication factors by instance type alone: which
    links they measured is unknown, so they are dropped when read (compute factors kept)."""
    path = calib.store_path("m")
    path.parent.mkdir(parents=True)
    factor = Factor(math.log(0.014), 0.003, 1, 1).to_dict()
    path.write_text(json.dumps({"version": 1, "model": "m", "compute": {"A": factor},
                                "comm": {"p3.8xlarge": factor}}))  # fmt: skip
    stored = calib.load_stored("m")
    assert stored is not None and dict(stored.comm) == {} and set(stored.compute) == {"A"}
    calib.save(Calibration("m", {}, {calib.comm_key("p3.8xlarge", True): Factor(0.1, 0.01, 1, 1)}))
    again = json.loads(path.read_text())
    assert again["version"] == calib.VERSION == 2
    assert list(again["comm"]) == ["p3.8xlarge in one VM"]


# --------------------------------------------------------------------------- re-plan rule
def proj(mean: float, q: float, rate: float = 3.6) -> Projection:
    return Projection(100, mean, q, rate, mean / 100)


def test_replan_when_the_projection_breaks_the_time_limit_at_its_quantile() -> None:
    d = calib.should_replan(proj(900, 1100), elapsed_s=0, spent_usd=0, time_limit_s=1000)
    assert d.replan and "limit" in d.reason
    keep = calib.should_replan(proj(900, 990), elapsed_s=0, spent_usd=0, time_limit_s=1000)
    assert not keep.replan
    late = calib.should_replan(proj(900, 990), elapsed_s=20, spent_usd=0, time_limit_s=1000)
    assert late.replan


def test_replan_when_the_projection_breaks_the_budget() -> None:
    # 3.6 $/h: a dollar per 1000 s
    d = calib.should_replan(proj(900, 1100), elapsed_s=0, spent_usd=0.5, budget_usd=1.5)
    assert d.replan and "budget" in d.reason
    assert not calib.should_replan(proj(900, 990), elapsed_s=0, spent_usd=0.5,
                                   budget_usd=1.5).replan  # fmt: skip


def test_switch_only_when_clearly_better_after_the_switching_cost() -> None:
    current = proj(1000, 1050)

    def rule(alt: Projection, switch_s: float, limit: float = 2000.0) -> bool:
        d = calib.should_replan(current, elapsed_s=0.0, spent_usd=0.0, time_limit_s=limit,
                                alternative=alt, switch_s=switch_s)  # fmt: skip
        assert not d.replan or "another configuration" in d.reason
        return d.replan

    assert rule(proj(600, 700), 200)
    assert not rule(proj(600, 700), 350)  # the switch eats the gain: 700 + 350 > 1000
    assert not rule(proj(600, 1100), 0)  # faster on average, not at its quantile: not clearly
    assert not rule(proj(300, 1000), 100, limit=1060.0)  # breaks the limit at its quantile


def test_cost_objective_weighs_dollars_with_the_switch_billed() -> None:
    current = proj(1000, 1050, rate=3.6)  # $1.00
    cheaper = proj(1000, 1100, rate=1.8)  # $0.55 at its quantile

    def rule(switch_s: float) -> bool:
        return calib.should_replan(current, elapsed_s=0.0, spent_usd=0.0, alternative=cheaper,
                                   switch_s=switch_s, objective="cost").replan  # fmt: skip

    assert rule(100)
    assert not rule(900)  # the switch billed at its rate: (1100 + 900) s x 1.8 $/h = $1.00
    with pytest.raises(ConfigError):
        calib.should_replan(current, elapsed_s=0, spent_usd=0, objective="speed")


# --------------------------------------------------------------------------- the store
def test_store_keeps_observed_factors_per_model_and_type(data_dir: Path) -> None:
    cal = Calibration(
        "resnet/50",
        {"T4": Factor(math.log(1.3), 0.01, 2, 2), "V100": Factor(0.0, 0.02)},
        {"g4dn.xlarge": Factor(0.05, 0.03, 2, 2)},
    )
    path = calib.save(cal)
    assert path.parent == data_dir / "calibration" and path.name == "resnet_50.json"
    stored = calib.load_stored("resnet/50")
    assert stored is not None and set(stored.compute) == {"T4"}  # V100: never observed
    assert stored.compute["T4"].scale == pytest.approx(1.3)
    calib.save(Calibration("resnet/50", {"V100": Factor(0.1, 0.01, 1, 1)}, {}))
    merged = calib.load_stored("resnet/50")
    assert merged is not None and set(merged.compute) == {"T4", "V100"}
    assert calib.load_stored("other") is None
    path.write_text(json.dumps({"model": "someone else"}))
    with pytest.raises(ConfigError, match="not the calibration"):
        calib.load_stored("resnet/50")


def test_for_request_starts_the_next_plan_calibrated() -> None:
    from srifty_core.catalog.types import Market
    from srifty_core.planner.request import Offer, PlanRequest

    w = workload()
    req = PlanRequest(
        workload=w, global_batch=64, iterations=10,
        offers=(Offer(A, Market.ON_DEMAND, 4, 1.0), Offer(B, Market.ON_DEMAND, 4, 1.0)),
    )  # fmt: skip
    bw = SpreadBandwidth(1e9, {"a.big": 0.09})
    assert calib.for_request(req, bw) is None
    calib.save(Calibration("m", {"A": Factor(math.log(1.3), 0.01, 3, 3)}, {}))
    cal = calib.for_request(req, bw)
    assert cal is not None and cal.carried_from_store()
    assert cal.compute_scale("A") == pytest.approx(1.3) and cal.compute_scale("B") == 1.0
    assert cal.compute["A"].sd > 0.01 and cal.compute["A"].windows == 0
    assert any(line.startswith("A compute x1.300") for line in cal.describe())


def test_mlflow_gets_the_factors_only_when_a_run_is_active(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cal = Calibration("m", {"A": Factor(math.log(1.3), 0.01, 1, 1)}, {})
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)  # a database store puts artifacts under ./mlruns
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert calib.log_mlflow(cal) is False
    with mlflow.start_run() as run:
        assert calib.log_mlflow(cal) is True
    got = mlflow.get_run(run.info.run_id).data.metrics
    assert got["calibration.compute.A"] == pytest.approx(1.3)
