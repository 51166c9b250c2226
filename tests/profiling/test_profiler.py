from __future__ import annotations

import pytest
import torch

from srifty_core.errors import ConfigError
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.profiler import (
    BatchDoesNotFitError,
    ProfilerConfig,
    find_b_max,
    profile_model,
    training_memory_bytes,
)
from srifty_core.profiling.zoo import build

CPU = torch.device("cpu")


def test_cpu_footprint_grows_with_the_batch() -> None:
    w = build("resnet18", "tiny")
    m = [training_memory_bytes(w, w.make_batch(b, CPU), CPU) for b in (1, 2, 4, 8)]
    params = sum(p.numel() * 4 for p in w.module.parameters())
    assert m[0] > 3 * params  # parameters, gradients, optimizer state, activations
    assert m == sorted(m) and m[3] - m[2] > m[1] - m[0] > 0


def test_b_max_is_the_largest_batch_under_the_cap() -> None:
    w = build("resnet18", "tiny")
    at = {b: training_memory_bytes(w, w.make_batch(b, CPU), CPU) for b in (5, 6)}
    cap = (at[5] + at[6]) // 2
    probe = find_b_max(w, CPU, ProfilerConfig(memory_cap_bytes=cap, max_batch=64), None)
    assert probe.b_max == 5
    assert probe.per_sample_bytes > 0
    # the search tried few sizes, not all of them
    assert len(probe.measured) <= 8
    probe = find_b_max(w, CPU, ProfilerConfig(memory_cap_bytes=2**34, max_batch=12), None)
    assert probe.b_max == 12


def test_a_batch_that_does_not_fit() -> None:
    with pytest.raises(BatchDoesNotFitError, match="batch 1 of resnet18/tiny does not fit"):
        profile_model("resnet18", "tiny", ProfilerConfig(memory_cap_bytes=1024))
    with pytest.raises(BatchDoesNotFitError, match=r"\[64\] do not fit"):
        profile_model("dlrm", "tiny", ProfilerConfig(max_batch=16, batch_sizes=(2, 64)))


def test_a_device_that_is_not_there() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="'cuda' is not there"):
        profile_model("resnet18", "tiny", ProfilerConfig(device="cuda"))
    with pytest.raises(ConfigError, match="unknown device"):
        profile_model("resnet18", "tiny", ProfilerConfig(device="abacus"))


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ConfigError, match="repeats"):
        ProfilerConfig(repeats=1)
    with pytest.raises(ConfigError, match="probes"):
        ProfilerConfig(probes=1)


def test_profile_a_tiny_model_end_to_end() -> None:
    p = profile_model(
        "resnet18", "tiny", ProfilerConfig(max_batch=16, repeats=3, warmup=1, threads=1)
    )
    checks = len(p.probe_checks)
    assert p.b_max == 16 and p.probe_mode == "budget:4" + (f"+{checks}" if checks else "")
    assert p.fw.batch_sizes[0] == 1 and p.fw.batch_sizes[-1] == 16
    # the 4 budgeted probes, then up to 3 checks between them, each a held-out error
    assert len(p.fw.batch_sizes) == 4 + checks and 1 <= checks <= 3
    assert all(b in p.fw.batch_sizes and e >= 0 for b, e in p.probe_checks)
    assert all(m > 0 for m in p.fw.mean_s + p.bw.mean_s)
    assert all(s >= 0 for s in p.fw.std_s + p.bw.std_s)
    assert p.t_iter(16) > p.t_iter(1) > 0
    assert sum(b.size_bytes for b in p.buckets) == p.gradient_bytes
    assert all(0 <= b.ready_fraction <= 1 for b in p.buckets)
    # DDP's passes over the gradients: a memory copy, faster than 100 MB/s on any CPU
    assert p.copy_bytes_per_s > 1e8 and 0 < p.ddp_copy_s() < p.gradient_bytes / 1e8
    # SGD with momentum reads and writes a few copies of the parameters: memory speed
    assert 0 < p.optimizer_step_s < 10 * p.gradient_bytes / 1e8
    assert ComputeProfile.from_json(p.to_json()) == p


def test_dense_mode_measures_every_power_of_two() -> None:
    p = profile_model("dlrm", "tiny", ProfilerConfig(max_batch=32, probes=None, repeats=2))
    assert p.fw.batch_sizes == (1, 2, 4, 8, 16, 32) and p.probe_mode == "dense"


def test_colocated_profiling_runs_a_load_and_cleans_up() -> None:
    import multiprocessing as mp

    before = set(mp.active_children())
    p = profile_model(
        "dlrm",
        "tiny",
        ProfilerConfig(
            max_batch=8, repeats=2, warmup=1, threads=1, colocated=2, probes=2, refine=0
        ),
    )
    assert p.fw.batch_sizes == (1, 8)
    assert set(mp.active_children()) == before
    with pytest.raises(ConfigError, match="colocated"):
        ProfilerConfig(colocated=0)


def test_share_host_measures_the_slowdown_of_workers_beside_each_other() -> None:
    import multiprocessing as mp

    before = set(mp.active_children())
    p = profile_model(
        "dlrm",
        "tiny",
        ProfilerConfig(max_batch=8, repeats=2, warmup=1, threads=1, share_host=2, probes=2),
    )
    assert [k for k, _ in p.shared_slowdown] == [2]
    assert p.host_slowdown(2) >= 1.0 and p.host_slowdown(1) == 1.0
    assert [k for k, _ in p.ddp_overhead] == [1, 2]  # alone, and beside a DDP worker
    assert set(mp.active_children()) == before
    assert (
        profile_model(
            "dlrm", "tiny", ProfilerConfig(max_batch=8, repeats=2, warmup=1, probes=2)
        ).shared_slowdown
        == ()
    )
    with pytest.raises(ConfigError, match="share_host"):
        ProfilerConfig(share_host=0)
    with pytest.raises(ConfigError, match="colocated and share_host"):
        ProfilerConfig(share_host=2, colocated=2)


def test_a_zero_memory_cap_or_batch_is_refused_not_read_as_the_default() -> None:
    """``--memory-cap 0`` used to mean the default cap (``0 or 4 GiB``) and ran a B_max
    search that took 16 GB of this host's memory."""
    with pytest.raises(ConfigError, match="memory_cap must be at least 1 byte, got 0"):
        ProfilerConfig(memory_cap_bytes=0)
    with pytest.raises(ConfigError, match=r"batch_sizes must be >= 1 each, got \[0, 8\]"):
        ProfilerConfig(batch_sizes=(0, 8))
    with pytest.raises(ConfigError, match="batch_sizes"):
        ProfilerConfig(batch_sizes=())


def test_ddp_overhead_measures_what_wrapping_in_ddp_adds() -> None:
    """DLRM's 26 embedding tables: DDP copies 32 MiB of gradients into its buckets and back
    every step, several milliseconds on a CPU core where the step itself takes a few."""
    import torch
    import torch.distributed as dist

    from srifty_core.profiling.profiler import ddp_overhead
    from srifty_core.profiling.zoo import build

    torch.set_num_threads(1)
    workload = build("dlrm", "small", seed=0)
    config = ProfilerConfig(repeats=5, warmup=1, threads=1)
    cpu = torch.device("cpu")
    pairs = ddp_overhead("dlrm", "small", workload, 16, config, cpu, lambda: None)
    assert [k for k, _ in pairs] == [1]
    assert pairs[0][1] > 5e-4
    assert not dist.is_initialized()  # its process group of one is gone
