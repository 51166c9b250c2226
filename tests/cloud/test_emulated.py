"""The emulated EC2: contract, clock, limits, network and compute variance, probes, training,
preemptions, and the ground truth's isolation from the learned side."""

from __future__ import annotations

import ast
import dataclasses
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from srifty_core import paths
from srifty_core.catalog.types import Market
from srifty_core.cloud import InstanceState, LaunchRequest, Provider, get_provider
from srifty_core.cloud import emulator_truth as truth
from srifty_core.cloud.emulated.measurements import (
    emulate_training,
    emulated_probe_sweep,
    emulated_profiles,
    write_emulated_probes,
)
from srifty_core.cloud.emulated.provider import EmulatedProvider
from srifty_core.cloud.emulated.world import CapacityError, QuotaError
from srifty_core.errors import ConfigError
from srifty_core.predictors.compute import fit_line
from srifty_core.probing.schema import PROBE_SCHEMA
from srifty_core.probing.store import read_probes
from srifty_core.profiling.profile import ComputeProfile, GradientBucket, PassStats
from tests.cloud.provider_contract import ProviderContract

KB, MB = 1024, 1024**2


class TestEmulatedContract(ProviderContract):
    unpriced_type = "g3.4xlarge"  # the catalog has no spot price for g3
    unpriced_market = "spot"

    @pytest.fixture
    def provider(self) -> EmulatedProvider:
        return EmulatedProvider(seed=1)

    def interrupt(self, provider: Provider, instance_id: str) -> None:
        assert isinstance(provider, EmulatedProvider)
        provider.schedule_interruption(instance_id, 0.0)


def profile(device: str = "T4", buckets_mb: tuple[int, ...] = (1, 25, 18)) -> ComputeProfile:
    bs = (1, 8, 32, 64)
    fw = PassStats(
        bs, tuple(0.004 + 0.0005 * b for b in bs), tuple(2e-4 + 2e-5 * b for b in bs), 10
    )
    bw = PassStats(bs, tuple(0.008 + 0.001 * b for b in bs), tuple(4e-4 + 4e-5 * b for b in bs), 10)
    fractions = np.linspace(0.1, 1.0, len(buckets_mb))
    return ComputeProfile(
        model="resnet18",
        size="s",
        device_type=device,
        device_name=device,
        fw=fw,
        bw=bw,
        fw_fit=fit_line(fw.batch_sizes, fw.mean_s),
        bw_fit=fit_line(bw.batch_sizes, bw.mean_s),
        b_max=64,
        memory_per_sample_bytes=50e6,
        memory_fixed_bytes=1e9,
        memory_cap_bytes=16 * 1024**3,
        n_parameters=11_000_000,
        gradient_bytes=sum(buckets_mb) * MB,
        buckets=tuple(
            GradientBucket(i, m * MB, 1000, float(f))
            for i, (m, f) in enumerate(zip(buckets_mb, fractions, strict=True))
        ),
        bucket_cap_bytes=25 * MB,
        first_bucket_cap_bytes=MB,
        schedule_batch_size=32,
        probe_mode="budget:4",
        threads=1,
        torch_version="2.13.0",
        created_at="2026-01-01T00:00:00+00:00",
    )


def test_get_provider_and_clock() -> None:
    p = get_provider("ec2-emulated")
    assert isinstance(p, EmulatedProvider) and p.name == "ec2-emulated" and p.cloud == "aws"
    t0 = p.now()
    a = p.launch(LaunchRequest("g4dn.xlarge", count=4))
    waited = (p.now() - t0).total_seconds()
    assert 80 < waited < 260  # the slowest of 4 boots, about 150 s each
    p.advance(3600)
    assert (p.now() - t0).total_seconds() == pytest.approx(waited + 3600)
    before = p.now()
    p.release(a)
    assert (p.now() - before).total_seconds() == pytest.approx(5.0)  # volume detach
    with pytest.raises(Exception, match="only moves forward"):
        p.advance(-1)


def test_quota_and_capacity_run_out() -> None:
    p = EmulatedProvider(seed=2, quota={"g4dn.xlarge": 10}, capacity={"p3.2xlarge": 3})
    a = p.launch(LaunchRequest("g4dn.xlarge", count=8))
    with pytest.raises(QuotaError, match="quota of 10"):
        p.launch(LaunchRequest("g4dn.xlarge", count=3))
    p.release(a)
    p.launch(LaunchRequest("g4dn.xlarge", count=10))  # released ones no longer count
    zone = p.zones("p3.2xlarge")[0]
    p.launch(LaunchRequest("p3.2xlarge", count=3, zone=zone))
    with pytest.raises(CapacityError, match="insufficient capacity"):
        p.launch(LaunchRequest("p3.2xlarge", count=1, zone=zone))


def test_scripted_and_rate_preemptions() -> None:
    p = EmulatedProvider(seed=3)
    a = p.launch(LaunchRequest("g4dn.xlarge", count=3, market=Market.SPOT))
    at = p.now() + timedelta(seconds=600)
    p.schedule_interruption(a.instance_ids[0], at)
    p.advance(599)
    assert p.interruptions(a) == ()
    p.advance(2)
    (x,) = p.interruptions(a)
    assert x.instance_id == a.instance_ids[0] and x.at == at
    assert p.describe(a)[0].ended_at == at
    # At 2 interruptions an hour per instance, about 20 of 10 x 1 h are taken back.
    q = EmulatedProvider(seed=4, preemption_rate_per_hour={"g4dn.xlarge": 2.0})
    b = q.launch(LaunchRequest("g4dn.xlarge", count=10, market=Market.SPOT))
    q.advance(3600)
    n = len(q.interruptions(b))
    assert 5 <= n <= 10
    od = q.launch(LaunchRequest("g4dn.xlarge", count=5))
    q.advance(36000)
    assert q.interruptions(od) == ()  # on-demand is never preempted


def test_probe_sweep_records_fit_the_store(tmp_path: Path) -> None:
    table = emulated_probe_sweep(
        ["g4dn.12xlarge", "p3.2xlarge"],
        sizes=[4, 1 * KB, 64 * KB, 1 * MB, 64 * MB, 512 * MB],
        world_sizes=(2, 4, 8, 16),
        concurrency=(1, 2, 4),
        allocations=2,
        repeats=3,
        seed=7,
        day=date(2026, 1, 5),
    )
    assert table.schema == PROBE_SCHEMA
    df = table.to_pandas()
    grid = df[df.phase == "burst"]
    assert len(grid) == 2 * 2 * 6 * 4 * 3 * 3
    # one sustained probe per (type, allocation, world size): 3 repeats at concurrency 1
    sus = df[df.phase == "sustained"]
    assert len(sus) == 2 * 2 * 4 * 3 and set(sus["concurrent"]) == {1}
    assert set(df["provider"]) == {"ec2-emulated"} and set(df["cloud"]) == {"aws"}
    assert set(df["backend"]) == {"nccl"}
    assert df.groupby("instance_type")["allocation_id"].nunique().to_dict() == {
        "g4dn.12xlarge": 2,
        "p3.2xlarge": 2,
    }
    g = df[df.instance_type == "g4dn.12xlarge"].iloc[0]
    assert (g.gpu_model, g.gpus_per_vm, g.vcpus, g.network_gbps) == ("T4", 4, 48, 50.0)
    files = write_emulated_probes(table, root=tmp_path)
    assert len(files) == 2
    back = read_probes(tmp_path, providers=["ec2-emulated"])
    assert len(back) == table.num_rows
    # Reproducible bit for bit with the same seed.
    again = emulated_probe_sweep(
        ["g4dn.12xlarge", "p3.2xlarge"],
        sizes=[4, 1 * KB, 64 * KB, 1 * MB, 64 * MB, 512 * MB],
        world_sizes=(2, 4, 8, 16),
        allocations=2,
        repeats=3,
        seed=7,
        day=date(2026, 1, 5),
    )
    assert again.equals(table)


def _median_busbw(df, size: int, n: int, c: int = 1) -> float:  # type: ignore[no-untyped-def]
    sel = df[(df.buffer_bytes == size) & (df.world_size == n) & (df.concurrent == c)]
    return float(sel["busbw"].median())


def test_network_shape_nvlink_nic_latency_and_sharing() -> None:
    df = emulated_probe_sweep(
        ["p3.8xlarge"],
        sizes=[4, 256 * MB],
        world_sizes=(4, 8),
        concurrency=(1, 4),
        allocations=1,
        repeats=5,
    ).to_pandas()
    inside = _median_busbw(df, 256 * MB, 4)  # 4 V100 on NVLink, one VM
    across = _median_busbw(df, 256 * MB, 8)  # 2 VMs over a 10 Gbps NIC
    assert inside > 20 * across
    assert across < 10e9 / 8
    # Small buffers: a latency floor (tens of microseconds), concurrency almost free.
    t4 = df[(df.buffer_bytes == 4) & (df.world_size == 8)]
    assert 2e-5 < t4[t4.concurrent == 1]["time_s"].median() < 1e-3
    ratio_small = (
        t4[t4.concurrent == 4]["time_s"].median() / t4[t4.concurrent == 1]["time_s"].median()
    )
    assert ratio_small < 2.0
    # Large buffers: four transfers share the NIC, each gets about a quarter.
    shared = _median_busbw(df, 256 * MB, 8, c=4)
    assert 0.2 < shared / across < 0.35


def test_protocol_switch_and_calibration_against_nccl_tests() -> None:
    from srifty_core.catalog import Catalog

    t = Catalog.load().get("p4d.24xlarge", "us-east-1")
    spec = truth.NetSpec.of(t)
    # A kink where LL hands over to LL128 (busbw drops right after 64 KB before rising).
    s = np.array([64 * KB, 64 * KB + 4])
    bb = 2 * s * 15 / 16 / truth.allreduce_time(spec, s, 16)
    assert bb[1] < bb[0]
    # Calibrated: within 1.5x of the published p4d 2x8 times at 1 KB and 1 GB.
    ref = {1024: 195.4e-6, 1073741824: 47392e-6}  # aws-efa-eks README @867b482f
    for size, t_ref in ref.items():
        ratio = t_ref / truth.allreduce_time(spec, float(size), 16)[0]
        assert 1 / 1.5 < ratio < 1.5, (size, ratio)


def test_allocation_levels_vary_within_the_spread() -> None:
    rng = np.random.default_rng(0)
    free = [truth.draw_allocation_level(rng) for _ in range(200)]
    large = [lv.large for lv in free]
    small = [lv.small for lv in free]
    assert 1.4 < max(large) / min(large) <= truth.SPREAD_LARGE + 1e-9
    assert 1.2 < max(small) / min(small) <= truth.SPREAD_SMALL + 1e-9
    pg = [truth.draw_allocation_level(rng, placement_group=True).large for _ in range(200)]
    assert max(pg) / min(pg) <= truth.SPREAD_LARGE**truth.PLACEMENT_NARROWING + 1e-9


def test_compute_scaling_and_variance() -> None:
    t4 = truth.DeviceRate(8.1, 320.0)
    v100 = truth.DeviceRate(15.7, 900.0)
    assert truth.compute_scale(t4, t4) == 1.0
    assert truth.compute_scale(t4, v100) == pytest.approx(np.sqrt(8.1 / 15.7 * 320 / 900))
    rng = np.random.default_rng(1)
    spatial = truth.draw_spatial(rng, 760)
    assert spatial.max() / spatial.min() <= 1.1 + 1e-9 and abs(spatial.mean() - 1) < 0.01
    temporal = truth.draw_temporal(rng, (20000,), 0.02)
    lo, hi = truth.STRAGGLER_SLOWDOWN
    body = temporal[temporal < lo * 0.95]
    # the body is METHOD.md's (within 1.1x, mean 1), skewed right; a few stragglers beyond
    assert body.max() / body.min() <= 1.1 + 1e-9 and abs(body.mean() - 1) < 0.005
    assert np.mean(body - 1 > 0.03) > np.mean(body - 1 < -0.03)
    slow = np.mean(temporal >= lo * 0.95)
    assert 0.5 * truth.STRAGGLER_P < slow < 2 * truth.STRAGGLER_P
    assert temporal.max() <= hi * 1.1


def test_burst_then_sustained() -> None:
    """An "up to" type bursts while its credits last: the grid probes see the burst rate,
    the sustained probe (and a job hours in) the baseline."""
    p = EmulatedProvider(seed=3)
    alloc = p.launch(LaunchRequest("g4dn.xlarge", count=2))
    big = 64 * 1024**2
    burst = p.probe(alloc, [big], [2], [1], repeats=3)
    assert set(burst["phase"]) == {"burst"}
    start = p.now()
    sus = p.probe_sustained(alloc, 2, repeats=3)
    assert set(sus["phase"]) == {"sustained"} and len(sus["busbw"]) == 3
    t = p.catalog_type("g4dn.xlarge")
    ratio = np.median(burst["busbw"]) / np.median(sus["busbw"])
    assert ratio == pytest.approx(t.network_burst_gbps / t.network_gbps, rel=0.2)
    assert (p.now() - start).total_seconds() >= 60 * truth.BURST_MINUTES[0]
    # a type without burst: sustained = burst, no long wait
    q = p.launch(LaunchRequest("g4dn.8xlarge", count=2))
    a = np.median(p.probe(q, [big], [2], [1], repeats=3)["busbw"])
    t0 = p.now()
    b = np.median(p.probe_sustained(q, 2, repeats=3)["busbw"])
    assert a == pytest.approx(b, rel=0.15) and (p.now() - t0).total_seconds() < 60


def test_training_spends_burst_credits() -> None:
    prof = profile()
    fresh = emulate_training({"g4dn.xlarge": 8}, {"g4dn.xlarge": 32}, prof, 20, seed=5)
    later = emulate_training(
        {"g4dn.xlarge": 8}, {"g4dn.xlarge": 32}, prof, 20, seed=5, warm_s=3600.0
    )
    assert later.mean_s > 1.2 * fresh.mean_s


def test_mixed_ring_is_paced_by_its_slowest_link() -> None:
    cat = EmulatedProvider().catalog_type
    fast = truth.NetSpec.of(cat("g4dn.8xlarge"))
    slow = truth.NetSpec.of(cat("g4dn.xlarge"))
    s = np.asarray([256.0 * 1024**2])
    both = truth.cluster_allreduce_time(
        [truth.RingMember(fast, 4, 1), truth.RingMember(slow, 1, 1)], s
    )
    all_fast = truth.cluster_allreduce_time([truth.RingMember(fast, 5, 1)], s)
    all_slow = truth.cluster_allreduce_time([truth.RingMember(slow, 5, 1)], s)
    assert all_fast[0] < both[0] and both[0] == pytest.approx(all_slow[0], rel=0.05)
    # a 4-GPU VM in a ring of 1-GPU VMs: the ring spans 5 VMs, not the 4-GPU type's one
    quad = truth.NetSpec.of(cat("g4dn.12xlarge"))
    mixed = truth.cluster_allreduce_time(
        [truth.RingMember(quad, 1, 4), truth.RingMember(fast, 4, 1)], np.asarray([1024.0])
    )
    alone = truth.allreduce_time(quad, np.asarray([1024.0]), 8)
    assert mixed[0] > alone[0]


def test_training_iterations_in_simulated_time() -> None:
    prof = profile()
    run = emulate_training({"g4dn.xlarge": 4}, {"g4dn.xlarge": 32}, prof, 30, seed=5)
    assert run.completed == 30 and run.iteration_s.shape == (30,)
    assert (run.ended_at - run.started_at).total_seconds() == pytest.approx(run.iteration_s.sum())
    t_compute = float(prof.t_iter(32))  # profiled on a T4: scale 1
    t4 = truth.device_rate(EmulatedProvider().catalog_type("g4dn.xlarge"))
    copy, step = truth.step_costs(prof, t4)  # and every step: 2 DDP copies, the optimizer
    per_step = 2 * copy + step
    assert t_compute + per_step < run.compute_s.mean() < 1.1 * (t_compute + per_step)
    # exactly: the slowest VM's own passes, then DDP's copy into the buckets (divided on
    # the way: no pass of its own), the copy back out and the optimizer step
    slowest = run.pass_s.max(axis=1)
    np.testing.assert_allclose(run.compute_s - slowest, 2 * copy + step, rtol=1e-9)
    assert np.all(run.iteration_s >= run.compute_s)
    # A faster GPU computes faster; a single GPU never communicates.
    fast = emulate_training({"p3.2xlarge": 1}, {"p3.2xlarge": 32}, prof, 10, seed=5)
    assert fast.compute_s.mean() < 0.7 * (t_compute + per_step)
    assert np.allclose(fast.exposed_comm_s, 0.0)
    # Reproducible; heterogeneous jobs run; a batch that does not fit fails with a reason.
    again = emulate_training({"g4dn.xlarge": 4}, {"g4dn.xlarge": 32}, prof, 30, seed=5)
    assert np.array_equal(again.iteration_s, run.iteration_s)
    mixed = emulate_training(
        {"g4dn.xlarge": 2, "g4dn.12xlarge": 1}, {"g4dn.xlarge": 16, "g4dn.12xlarge": 64}, prof, 5
    )
    assert mixed.completed == 5
    with pytest.raises(Exception, match="do not split evenly"):
        emulate_training({"g4dn.12xlarge": 1}, {"g4dn.12xlarge": 6}, prof, 2)
    with pytest.raises(Exception, match="GiB"):
        emulate_training({"g4dn.xlarge": 1}, {"g4dn.xlarge": 512}, prof, 2)


def test_training_stops_at_a_preemption() -> None:
    p = EmulatedProvider(seed=6)
    a = p.launch(LaunchRequest("g4dn.xlarge", count=4, market=Market.SPOT))
    p.schedule_interruption(a.instance_ids[2], 5.0)
    run = p.train([a], profile(), {"g4dn.xlarge": 32}, 1000)
    assert 0 < run.completed < 1000
    assert [x.instance_id for x in run.interrupted] == [a.instance_ids[2]]
    assert run.iteration_s.sum() <= 5.0
    assert p.describe(a)[2].state is InstanceState.INTERRUPTED


def test_run_records_argv_without_executing() -> None:
    p = EmulatedProvider(seed=8)
    a = p.launch(LaunchRequest("g4dn.12xlarge", count=2))
    p.run(a, ["srifty", "probe", "--world-sizes", "8"], {"X": "1"})
    assert p.exit_codes(a) == dict.fromkeys(range(8), 0)
    assert p.runs(a)[0]["argv"] == ["srifty", "probe", "--world-sizes", "8"]
    p.schedule_interruption(a.instance_ids[1], 0.0)
    assert [p.exit_codes(a)[r] for r in (0, 4)] == [0, -9]


LEARNED_SIDE = ("predictors", "simulator", "planner")


def test_learned_side_never_imports_the_ground_truth() -> None:
    root = paths.REPO_ROOT / "srifty_core"
    checked = 0
    for pkg in LEARNED_SIDE:
        for f in sorted((root / pkg).rglob("*.py")) if (root / pkg).is_dir() else []:
            checked += 1
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                bad = [n for n in names if "emulator_truth" in n or ".cloud.emulated." in f"{n}."]
                assert not bad, f"{f} imports the emulator's ground truth: {bad}"
            assert "emulator_truth" not in f.read_text(), f
    assert checked > 0  # the predictors package exists, so the check ran on something


def test_profiling_on_an_emulated_gpu() -> None:
    from srifty_core.catalog import Catalog

    ref = profile("T4")  # measured on a T4: 50 MB a sample, 1 GB fixed
    p = EmulatedProvider(seed=3)
    t0 = p.now()
    v100 = p.profile("p3.8xlarge", ref, probes=4, repeats=5, seed=1, refine=0)
    assert v100.device_type == "V100-16GB" and v100.probe_mode == "budget:4"
    assert p.now() > t0  # profiling takes simulated time
    # B_max from the GPU's 16 GiB and the network's footprint (the same on any device)
    cat = Catalog.load()
    cap = cat.get("p3.8xlarge", "us-east-1").gpu_memory_gib * 1024**3
    assert v100.b_max == int((cap - 1e9) // 50e6)
    assert float(v100.memory_bytes(v100.b_max)) <= cap < float(v100.memory_bytes(v100.b_max + 1))
    assert v100.memory_cap_bytes == int(cap)
    m60 = p.profile("g3.8xlarge", ref, seed=1)  # 8 GiB
    assert m60.device_type == "M60" and m60.b_max < v100.b_max
    # latency at the budgeted sizes, near the ground truth's scaled reference
    assert v100.fw.batch_sizes[0] == 1 and v100.fw.batch_sizes[-1] == v100.b_max
    assert len(v100.fw.batch_sizes) == 4 and all(s > 0 for s in v100.fw.std_s)
    scale = truth.compute_scale(truth.DeviceRate(8.1, 320.0), truth.DeviceRate(15.7, 900.0))
    expect = np.asarray(ref.fw_fit(np.asarray(v100.fw.batch_sizes, dtype=float))) * scale
    np.testing.assert_allclose(v100.fw.mean_s, expect, rtol=0.08)
    np.testing.assert_allclose(v100.t_bw(64), float(ref.bw_fit(64)) * scale, rtol=0.08)
    assert float(m60.t_iter(32)) > float(v100.t_iter(32))  # the slower GPU
    # buckets are the model's, not the device's; training accepts B_max but not B_max + 1
    assert v100.buckets == ref.buckets and v100.gradient_bytes == ref.gradient_bytes
    per_vm = 4 * v100.b_max
    run = emulate_training({"p3.8xlarge": 1}, {"p3.8xlarge": per_vm}, ref, 2)
    assert run.completed == 2
    with pytest.raises(Exception, match="GiB"):
        emulate_training({"p3.8xlarge": 1}, {"p3.8xlarge": per_vm + 4}, ref, 2)
    # reproducible; a network that does not fit at all says so
    again = EmulatedProvider(seed=3).profile("p3.8xlarge", ref, seed=1, refine=0)
    assert again.fw == v100.fw and again.bw_fit == v100.bw_fit
    with pytest.raises(ConfigError, match="does not fit"):
        p.profile("g3.8xlarge", dataclasses.replace(ref, memory_fixed_bytes=9 * 1024**3))
    both = emulated_profiles(["g4dn.xlarge", "g4dn.8xlarge", "p3.2xlarge"], ref, seed=2)
    assert sorted(both) == ["T4", "V100-16GB"]


def test_launching_a_configuration_waits_for_the_slowest_not_the_sum() -> None:
    from srifty_core.cloud.base import LaunchRequest as Req
    from srifty_core.cloud.emulated.provider import EmulatedProvider as Emu

    p = Emu(seed=5, launch_delay_s=(150.0, 0.0))
    t0 = p.now()
    allocs = p.launch_many([Req("g4dn.xlarge", count=2), Req("g3.4xlarge", count=3)])
    assert (p.now() - t0).total_seconds() == pytest.approx(150.0)
    assert all(i.state.value == "running" for a in allocs for i in p.describe(a))


MIX = {"g4dn.12xlarge": 1, "g4dn.xlarge": 3}
MIX_LABEL = "mix_1xg4dn.12xlarge_3xg4dn.xlarge"


def test_probe_sweep_over_a_mixed_ring_is_stored_under_its_label(tmp_path: Path) -> None:
    """A mix is probed as one ring on fresh allocation groups (burst grid at the ring's full
    world size, then the sustained probe), stored under the mix's label and read back; the
    types' own rows are those of a sweep without the mix."""
    kw: dict[str, Any] = {
        "sizes": [4, 64 * KB, 1 * MB, 64 * MB],
        "world_sizes": (2, 4),
        "concurrency": (1,),
        "allocations": 2,
        "repeats": 3,
        "seed": 7,
        "day": date(2026, 1, 5),
    }
    table = emulated_probe_sweep(["g4dn.12xlarge", "g4dn.xlarge"], mixes=[MIX], **kw)
    df = table.to_pandas()
    mixed = df[df.instance_type == MIX_LABEL]
    grid, sus = mixed[mixed.phase == "burst"], mixed[mixed.phase == "sustained"]
    assert len(grid) == 2 * 4 * 3 and len(sus) == 2 * 3
    assert set(mixed["world_size"]) == {4 + 3} and set(mixed["concurrent"]) == {1}
    row = mixed.iloc[0]
    assert (row.gpu_model, row.gpus_per_vm, row.vcpus, row.network_gbps) == ("mixed", 1, 4, 5.0)
    ids = sorted(mixed["allocation_id"].unique())
    assert len(ids) == 2 and all(len(i.split("+")) == 2 for i in ids)
    assert sorted(mixed["allocation_slot"].unique()) == [0, 1]
    # an "up to" member: the ring falls to its baseline once every member's credits are spent
    big = grid[grid.buffer_bytes == 64 * MB]["busbw"].median()
    assert sus["busbw"].median() < 0.5 * big
    alone = emulated_probe_sweep(["g4dn.12xlarge", "g4dn.xlarge"], **kw)
    assert df[df.instance_type != MIX_LABEL].reset_index(drop=True).equals(alone.to_pandas())
    files = write_emulated_probes(table, root=tmp_path)
    assert any(f"instance_type={MIX_LABEL}" in str(f) for f in files)
    back = read_probes(tmp_path, instance_types=[MIX_LABEL])
    assert len(back) == len(mixed) and set(back["phase"]) == {"burst", "sustained"}


def test_a_mixed_ring_runs_at_its_slowest_member() -> None:
    """The probe is the truth's ring: a fast type joined by a slow one gets the slow one's
    large-buffer bandwidth, not its own."""
    p = EmulatedProvider(seed=4, spread_small=1.0, spread_large=1.0)
    quad = p.launch(LaunchRequest("g4dn.12xlarge", count=2))
    one = p.launch(LaunchRequest("g4dn.xlarge", count=2))
    fast = np.median(p.probe(quad, [256 * MB], [8], [1], repeats=3)["busbw"])
    slow = np.median(p.probe(one, [256 * MB], [2], [1], repeats=3)["busbw"])
    ring = np.median(p.probe_mix([quad, one], [256 * MB], repeats=3)["busbw"])
    assert ring < 0.7 * fast and ring == pytest.approx(slow, rel=0.25)
    with pytest.raises(ConfigError, match="one per instance type"):
        p.probe_mix([quad, quad], [1024])
    with pytest.raises(ConfigError, match=r"mixes\[0\]: .*at least two"):
        emulated_probe_sweep(["g4dn.xlarge"], mixes=[{"g4dn.xlarge": 2}])


def test_emulated_profiles_check_between_their_probes() -> None:
    ref = profile("T4")
    p = EmulatedProvider(seed=3)
    checked = p.profile("p3.8xlarge", ref, probes=4, repeats=5, seed=1)
    plain = p.profile("p3.8xlarge", ref, probes=4, repeats=5, seed=1, refine=0)
    n = len(checked.probe_checks)
    assert 1 <= n <= 3 and checked.probe_mode == f"budget:4+{n}"
    assert len(checked.fw.batch_sizes) == 4 + n and len(plain.fw.batch_sizes) == 4
    assert set(plain.fw.batch_sizes) < set(checked.fw.batch_sizes)
    assert all(b in checked.fw.batch_sizes and e >= 0 for b, e in checked.probe_checks)
