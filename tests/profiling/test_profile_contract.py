from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from srifty_core.errors import ConfigError
from srifty_core.predictors.compute import fit_piecewise
from srifty_core.profiling.profile import ComputeProfile, GradientBucket, PassStats, mape
from srifty_core.profiling.store import ProfileNotFoundError, ProfileStore


def make_profile(**changes: object) -> ComputeProfile:
    sizes = (1, 8, 32, 256)
    fw_mean = (0.0101, 0.0123, 0.04567, 0.3333333333333333)
    bw_mean = tuple(2.1 * m for m in fw_mean)
    fw = PassStats(sizes, fw_mean, tuple(0.05 * m for m in fw_mean), 5)
    bw = PassStats(sizes, bw_mean, tuple(0.1 * m for m in bw_mean), 5)
    p = ComputeProfile(
        model="resnet18",
        size="small",
        device_type="cpu",
        device_name="x86_64",
        fw=fw,
        bw=bw,
        fw_fit=fit_piecewise(sizes, fw_mean),
        bw_fit=fit_piecewise(sizes, bw_mean),
        b_max=256,
        memory_per_sample_bytes=1234.5,
        memory_fixed_bytes=1e6 / 3,
        memory_cap_bytes=2**32,
        n_parameters=1000,
        gradient_bytes=4000,
        buckets=(GradientBucket(0, 1500, 3, 0.25), GradientBucket(1, 2500, 5, 0.99)),
        bucket_cap_bytes=25 * 2**20,
        first_bucket_cap_bytes=2**20,
        schedule_batch_size=32,
        probe_mode="budget:4",
        threads=1,
        torch_version="2.13.0",
        created_at="2026-11-29T00:00:00+00:00",
    )
    return dataclasses.replace(p, **changes)  # type: ignore[arg-type]


def test_json_round_trips_exactly() -> None:
    p = make_profile()
    q = ComputeProfile.from_json(p.to_json())
    assert q == p
    assert q.to_json() == p.to_json()


def test_profiles_without_a_copy_bandwidth_still_load() -> None:
    d = make_profile().to_dict()
    del d["copy_bytes_per_s"]  # written before the field existed
    old = ComputeProfile.from_dict(d)
    assert old.copy_bytes_per_s == 0.0 and old.ddp_copy_s() == 0.0


def test_profiles_without_an_optimizer_step_still_load() -> None:
    d = make_profile(optimizer_step_s=0.004).to_dict()
    assert ComputeProfile.from_dict(d).optimizer_step_s == 0.004
    del d["optimizer_step_s"]  # written before the field existed
    assert ComputeProfile.from_dict(d).optimizer_step_s == 0.0


def test_predictions() -> None:
    p = make_profile()
    np.testing.assert_allclose(p.t_fw([1, 8, 32, 256]), p.fw.mean_s, rtol=0.05)
    assert float(p.t_iter(100)) == pytest.approx(float(p.t_fw(100) + p.t_bw(100)))
    # spread follows the measured coefficient of variation
    assert float(p.std_fw(8)) == pytest.approx(0.05 * float(p.t_fw(8)))
    assert float(p.std_bw(100)) == pytest.approx(0.1 * float(p.t_bw(100)))
    assert p.t_fw(np.array([2, 4, 16])).shape == (3,)
    with pytest.raises(ConfigError, match="exceeds B_max=256"):
        p.t_fw(257)
    with pytest.raises(ConfigError, match=">= 1"):
        p.t_bw(0)
    assert mape([1.1, 0.9], [1.0, 1.0]) == pytest.approx(10.0)


def test_bad_json_names_the_problem() -> None:
    d = json.loads(make_profile().to_json())
    del d["b_max"]
    with pytest.raises(ConfigError, match="missing field 'b_max'"):
        ComputeProfile.from_dict(d)
    d["schema_version"] = 99
    with pytest.raises(ConfigError, match="schema_version"):
        ComputeProfile.from_dict(d)


def test_store_round_trip_and_not_found(data_dir: Path) -> None:
    store = ProfileStore()
    p = make_profile()
    path = store.save(p)
    assert path == data_dir / "profiles" / "resnet18" / "small" / "cpu.json"
    assert store.load("resnet18", "small", "cpu") == p
    store.save(dataclasses.replace(p, b_max=128))  # rerun replaces, no temp files left
    assert store.load("resnet18", "small", "cpu").b_max == 128
    assert [x.name for x in path.parent.iterdir()] == ["cpu.json"]
    with pytest.raises(ProfileNotFoundError, match=r"have: resnet18/small/cpu"):
        store.load("vgg16", "small", "cpu")


def test_store_lists_the_vm_spreads_of_profiles_taken_on_several_vms(data_dir: Path) -> None:
    store = ProfileStore()
    assert store.vm_spreads() == {}
    store.save(make_profile(vm_cv=0.03, profiled_vms=3))
    store.save(make_profile(model="vgg16", device_type="T4", vm_cv=0.02, profiled_vms=5))
    store.save(make_profile(model="bert", device_type="A10G", vm_cv=0.0, profiled_vms=1))
    assert store.vm_spreads() == {"resnet18/small/cpu": (0.03, 3), "vgg16/small/T4": (0.02, 5)}
    bad = data_dir / "profiles" / "x" / "small" / "cpu.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{}")
    with pytest.raises(ConfigError, match=r"x/small/cpu.json: not a compute profile"):
        store.vm_spreads()


def test_measured_ddp_overhead_replaces_the_copy_model() -> None:
    p = make_profile(copy_bytes_per_s=4000 / 0.002)  # one copy pass: 2 ms
    # modelled: into the buckets (divided on the way: no pass of its own) + back out
    assert p.ddp_passes_s() == pytest.approx((0.002, 0.002))
    measured = dataclasses.replace(p, ddp_overhead=((1, 0.009), (2, 0.0135)))
    # the overhead (9 ms: hooks, copies in and out): the copy out (one pass) after the
    # exchange, the rest on the backward thread; nothing added for the 1/world, which
    # DDP applies in its copy into the buckets (the no-op hook's plain copy costs as much)
    on_backward, after = measured.ddp_passes_s()
    assert (on_backward, after) == pytest.approx((0.009 - 0.002, 0.002))
    assert on_backward + after == pytest.approx(0.009)
    # two workers sharing the device: everything slows by the measured 1.5
    assert measured.pass_slowdown(2) == pytest.approx(1.5)
    assert measured.ddp_passes_s(2) == pytest.approx((1.5 * 0.007, 1.5 * 0.002))
    assert measured.pass_slowdown(1) == 1.0
    assert measured.pass_slowdown(4) == pytest.approx(2.5)  # along the last segment
    # not measured with others: the step's own slowdown stands in
    alone = dataclasses.replace(p, ddp_overhead=((1, 0.009),), shared_slowdown=((2, 1.1),))
    assert alone.pass_slowdown(2) == pytest.approx(1.1)
    # an overhead smaller than one copy pass: all of it after the exchange at most
    tiny = dataclasses.replace(p, ddp_overhead=((1, 0.001),))
    assert tiny.ddp_passes_s() == pytest.approx((0.0, 0.001))


def test_ddp_overhead_round_trips_and_bad_pairs_name_the_field() -> None:
    p = make_profile(ddp_overhead=((1, 0.009), (2, 0.0135)))
    assert ComputeProfile.from_json(p.to_json()) == p
    d = p.to_dict()
    del d["ddp_overhead"]  # written before the field existed
    assert ComputeProfile.from_dict(d).ddp_overhead == ()
    for bad in ([[2, 0.01]], [[1, 0.01], [1, 0.02]], [[1, -0.1]], [[1, "x"]]):
        with pytest.raises(ConfigError, match="ddp_overhead"):
            ComputeProfile.from_dict({**d, "ddp_overhead": bad})


def test_fsdp_overhead_round_trips_and_bad_values_name_the_field() -> None:
    p = make_profile(fsdp_overhead=(0.002, 0.003, 0.001))
    assert ComputeProfile.from_json(p.to_json()) == p
    d = p.to_dict()
    del d["fsdp_overhead"]  # written before the field existed
    assert ComputeProfile.from_dict(d).fsdp_overhead == ()
    for bad in ([0.1, 0.2], [0.1, -0.2, 0.0], [0.1, "x", 0.0], [0.1, float("nan"), 0.0]):
        with pytest.raises(ConfigError, match="fsdp_overhead"):
            ComputeProfile.from_dict({**d, "fsdp_overhead": bad})


def test_fsdp_peak_margin_round_trips_and_bad_values_name_the_field() -> None:
    p = make_profile(fsdp_peak_margin=0.18)
    assert ComputeProfile.from_json(p.to_json()) == p
    d = p.to_dict()
    del d["fsdp_peak_margin"]  # written before the field existed
    assert ComputeProfile.from_dict(d).fsdp_peak_margin is None
    for bad in ("x", -1.0, float("inf")):
        with pytest.raises(ConfigError, match="fsdp_peak_margin"):
            ComputeProfile.from_dict({**d, "fsdp_peak_margin": bad})
