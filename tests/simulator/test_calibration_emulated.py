"""Recalibration against the emulated EC2: the hidden slowdown only ``train`` applies, the
per-rank breakdown rank 0 would gather, and a window that brings the projection home."""

from __future__ import annotations

import numpy as np
import pytest

from srifty_core import case_studies as cs
from srifty_core.catalog import Catalog
from srifty_core.cloud.base import LaunchRequest
from srifty_core.cloud.emulated.provider import EmulatedProvider
from srifty_core.errors import ConfigError
from srifty_core.profiling.store import load_reference_profile
from srifty_core.simulator import calibration as calib
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload

TYPE = "g4dn.8xlarge"


def _train(slowdown: dict[str, float] | None, iterations: int = 40) -> tuple[object, object]:
    ref, _ = load_reference_profile("resnet50")
    cloud = EmulatedProvider(seed=5, hidden_slowdown=slowdown)
    prof = cloud.profile(TYPE, ref, probes=3, repeats=3, reference_rate=cs.one_core())
    alloc = cloud.launch(LaunchRequest(TYPE, count=3))
    run = cloud.train([alloc], ref, {TYPE: 32}, iterations, reference=cs.one_core())
    return prof, run


def test_hidden_slowdown_reaches_training_but_not_the_profile() -> None:
    p0, r0 = _train(None)
    p1, r1 = _train({TYPE: 1.3})
    assert p0 == p1  # the profile never sees it
    assert r1.pass_s.shape == (40, 3) and r1.vm_types == (TYPE,) * 3  # type: ignore[attr-defined]
    np.testing.assert_allclose(r1.pass_s, 1.3 * r0.pass_s)  # type: ignore[attr-defined]
    np.testing.assert_allclose(r1.exchange_s, r0.exchange_s)  # type: ignore[attr-defined]
    assert r1.mean_s > 1.1 * r0.mean_s  # type: ignore[attr-defined]
    w = r1.window(10, 30)  # type: ignore[attr-defined]
    assert w["pass_s"][TYPE].shape == (20, 3) and w["exchange_s"].shape == (20,)
    assert np.all(w["exchange_s"] > 0) and np.all(w["iteration_s"] >= w["exchange_s"])
    with pytest.raises(ConfigError):
        EmulatedProvider(hidden_slowdown={TYPE: 0.0})


def test_one_window_calibrates_the_projection_of_a_slowed_type() -> None:
    catalog = Catalog.load()
    ref, _ = load_reference_profile("resnet50")
    cloud = EmulatedProvider(seed=3, catalog=catalog)
    prof = cloud.profile(TYPE, ref, probes=4, repeats=5, reference_rate=cs.one_core())
    cloud.hidden_slowdown = {TYPE: 1.3}  # after profiling: a fault the profile never saw
    from srifty_core.predictors.table import ProbeTableBandwidth

    bw = ProbeTableBandwidth().fit(cs.probe_frame({TYPE: 4}, catalog))
    sim = Simulator(bw)
    inst = SimInstance.from_catalog(catalog.get(TYPE, "us-east-1"))
    workload = Workload("resnet50", {prof.device_type: prof})
    config = ClusterConfig((Group(inst, 4, 128),))
    alloc = cloud.launch(LaunchRequest(TYPE, count=4))
    first = cloud.train([alloc], ref, {TYPE: 128}, 200, reference=cs.one_core())
    rest = cloud.train([alloc], ref, {TYPE: 128}, 1000, reference=cs.one_core(),
                       warm_s=float(first.iteration_s.sum()))  # fmt: skip
    g = first.window(0, first.completed)
    window = calib.Window.from_samples(g["iteration_s"], {"T4": g["pass_s"][TYPE]},
                                       g["exchange_s"])  # fmt: skip
    cal = calib.update(calib.prior(workload, [inst], bw), window, sim, workload, config)
    assert cal.compute["T4"].scale == pytest.approx(1.3, rel=0.05)
    actual = float(rest.iteration_s.sum())
    plain = calib.project(sim, workload, config, 1000, 1.0)
    proj = calib.project(calib.calibrated(sim, cal), workload, config, 1000, 1.0)
    assert abs(plain.mean_s / actual - 1) > 0.1
    assert abs(proj.mean_s / actual - 1) <= 0.05
