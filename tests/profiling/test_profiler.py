from __future__ import annotations

import pytest
import torch

from srifty_core.errors import ConfigError
from srifty_core.profiling.config import ProfilerConfig
from srifty_core.profiling.memory import (
    SEARCH_MARGIN,
    BatchDoesNotFitError,
    find_b_max,
    training_memory_bytes,
)
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.profiler import profile_model
from srifty_core.workloads.zoo import build

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
    # max_step_s=0: the memory alone bounds it (a loaded host's slow steps would stop the
    # search before the cap this test is about)
    config = ProfilerConfig(memory_cap_bytes=cap, max_batch=64, max_step_s=0)
    probe = find_b_max(w, CPU, config, None)
    assert probe.b_max == 5
    assert probe.per_sample_bytes > 0
    # the search tried few sizes, not all of them
    assert len(probe.measured) <= 8
    probe = find_b_max(
        w, CPU, ProfilerConfig(memory_cap_bytes=2**34, max_batch=12, max_step_s=0), None
    )
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
        "resnet18",
        "tiny",
        ProfilerConfig(max_batch=16, repeats=3, warmup=1, threads=1, share_host=1),
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
    # FSDP2's own work per unit, measured on a sharded copy over a process group of one
    assert len(p.fsdp_overhead) == 3 and all(t >= 0 for t in p.fsdp_overhead)
    assert p.fsdp_peak_margin is not None and p.fsdp_peak_margin > -1
    assert ComputeProfile.from_json(p.to_json()) == p


def test_dense_mode_measures_every_power_of_two() -> None:
    p = profile_model(
        "dlrm", "tiny", ProfilerConfig(max_batch=32, probes=None, repeats=2, share_host=1)
    )
    assert p.fw.batch_sizes == (1, 2, 4, 8, 16, 32) and p.probe_mode == "dense"


def test_colocated_profiling_runs_a_load_and_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing as mp

    from srifty_core.profiling import sweep

    # one measurement per batch: a busy host's spread would measure again, each time
    # beside a freshly started load worker (not what this test is about)
    monkeypatch.setattr(sweep, "NOISY_RETRIES", 0)
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
    p = profile_model(  # share_host's default: 2 workers on a CPU
        "dlrm", "tiny", ProfilerConfig(max_batch=8, repeats=2, warmup=1, threads=1, probes=2)
    )
    assert [k for k, _ in p.shared_slowdown] == [2]
    assert p.host_slowdown(2) >= 1.0 and p.host_slowdown(1) == 1.0
    assert [k for k, _ in p.ddp_overhead] == [1, 2]  # alone, and beside a DDP worker
    assert set(mp.active_children()) == before
    # share_host=1: nothing measured (what the profile above records, from this function)
    from srifty_core.profiling.overheads import shared_slowdown

    one = ProfilerConfig(max_batch=8, repeats=2, warmup=1, probes=2, share_host=1)
    assert shared_slowdown("dlrm", "tiny", build("dlrm", "tiny"), 8, one, CPU, lambda: None) == ()
    assert set(mp.active_children()) == before  # and no worker started for it
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

    from srifty_core.profiling.overheads import ddp_overhead
    from srifty_core.workloads.zoo import build

    torch.set_num_threads(1)
    workload = build("dlrm", "small", seed=0)
    config = ProfilerConfig(repeats=5, warmup=1, threads=1, share_host=1)
    cpu = torch.device("cpu")
    pairs = ddp_overhead("dlrm", "small", workload, 16, config, cpu, lambda: None)
    assert [k for k, _ in pairs] == [1]
    assert pairs[0][1] > 5e-4
    assert not dist.is_initialized()  # its process group of one is gone


def test_fsdp_overhead_measures_what_sharding_adds_and_leaves_no_group() -> None:
    """GPT-2 (tiny) under ``fully_shard`` over a process group of one: the hooks, copies
    and DTensor dispatch around each of its units cost something on a CPU core; inside a
    process group (a profile taken in a training job) nothing is measured."""
    import torch
    import torch.distributed as dist

    from srifty_core.profiling.overheads import fsdp_overhead
    from srifty_core.workloads import build

    torch.set_num_threads(1)
    workload = build("hf:gpt2", "tiny", seed=0)
    config = ProfilerConfig(repeats=3, warmup=1, threads=1, share_host=1)
    cpu = torch.device("cpu")
    terms = fsdp_overhead(workload, 4, config, cpu, lambda: None, (2e5, 1e6))
    fw, bw, step = terms.overhead
    assert fw + bw > 0 and step >= 0
    # the sharded step's peak against the memory model, a finite fraction
    assert terms.peak_margin is not None and -1 < terms.peak_margin < 10
    assert not dist.is_initialized()  # its process group of one is gone
    assert not any(type(m).__name__.startswith("FSDP") for m in workload.module.modules())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert fsdp_overhead(workload, 4, config, cpu, lambda: None) == ((), None)
    finally:
        dist.destroy_process_group()


def test_the_footprint_estimate_frees_what_the_forward_saved() -> None:
    """A ReLU saves its own output: a saved-tensor hook that hands it back to autograd
    makes a cycle nothing frees (the B_max search of DLRM grew by 1 GiB per try)."""
    import weakref

    from torch import nn

    from srifty_core.workloads.zoo import Workload

    module = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    outputs: list[weakref.ref[torch.Tensor]] = []
    module.register_forward_hook(lambda m, i, o: outputs.append(weakref.ref(o)))
    w = Workload(
        "relu",
        "tiny",
        module,
        {},
        lambda b, device, gen: (torch.randn(b, 4, generator=gen),),
        lambda m, batch: m(batch[0]).sum(),
    )
    assert training_memory_bytes(w, w.make_batch(8, CPU), CPU) > 0
    assert outputs and outputs[0]() is None


def test_b_max_search_does_not_run_a_batch_predicted_far_over_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the CPU a batch over the host's memory is not an error to catch but a killed
    process: the search extrapolates from what it measured and skips such batches."""
    from srifty_core.profiling import memory

    w = build("resnet18", "tiny")
    at = {b: training_memory_bytes(w, w.make_batch(b, CPU), CPU) for b in (4, 5, 8)}
    cap = (at[4] + at[5]) // 2
    assert at[8] > SEARCH_MARGIN * cap  # what the doubling from 4 would reach
    ran: list[int] = []
    real = memory._fits

    def counting(workload, b, device, cap):  # type: ignore[no-untyped-def]
        ran.append(b)
        return real(workload, b, device, cap)

    monkeypatch.setattr(memory, "_fits", counting)
    probe = find_b_max(w, CPU, ProfilerConfig(memory_cap_bytes=cap), None)
    assert probe.b_max == 4
    assert 8 in dict(probe.measured) and 8 not in ran  # predicted over the cap: not run
    assert max(ran) < 8


def test_step_peak_sees_the_temporaries_the_estimate_does_not() -> None:
    from srifty_core.profiling.memory import step_peak_bytes

    w = build("dlrm", "small", seed=0)
    batch = w.make_batch(32768, CPU)
    peak = step_peak_bytes(w, batch)
    if peak is None:
        pytest.skip("this kernel does not report a resettable peak resident set")
    assert peak > 1.3 * training_memory_bytes(w, batch, CPU)


def test_lockstep_load_workers_start_each_step_with_the_profiler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In lockstep a load worker starts a step only when the profiler starts one (a job's
    ranks step together): while the profiler sleeps between steps the worker waits, so its
    steps overlap the profiler's; a worker that dies makes the next step fail, not hang;
    and none is left when the block ends."""
    import multiprocessing as mp
    import time

    from srifty_core.errors import SriftyError
    from srifty_core.profiling import colocated

    before = set(mp.active_children())
    config = ProfilerConfig(threads=1)
    with colocated.colocated_load(
        "dlrm", "tiny", 4, config, CPU, others=1, lockstep=True
    ) as together:
        assert together is not None
        for _ in range(3):  # each call releases one step of the worker
            together()
            time.sleep(0.05)
    assert set(mp.active_children()) == before
    with colocated.colocated_load("dlrm", "tiny", 4, config, CPU, others=1) as free:
        assert free is None  # not in lockstep: nothing to call

    monkeypatch.setattr(colocated, "LOCKSTEP_TIMEOUT_S", 3.0)
    with colocated.colocated_load(
        "dlrm", "tiny", 4, config, CPU, others=1, lockstep=True
    ) as together:
        assert together is not None
        together()
        time.sleep(0.5)  # the worker ends its step and says it is ready for the next one
        for child in set(mp.active_children()) - before:
            child.kill()
            child.join()
        with pytest.raises(SriftyError, match="stopped stepping"):
            together()
    assert set(mp.active_children()) == before


def test_a_load_worker_ends_with_a_killed_profiler() -> None:
    """A profiler killed mid-measurement cannot set ``stop``: its background worker must
    not keep stepping (and slowing every later measurement on the host)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import multiprocessing as mp, time, torch\n"
        "from srifty_core.profiling.colocated import colocated_load\n"
        "from srifty_core.profiling.config import ProfilerConfig\n"
        "config = ProfilerConfig(threads=1)\n"
        "with colocated_load('dlrm', 'tiny', 4, config, torch.device('cpu'), others=1):\n"
        "    print(*(p.pid for p in mp.active_children()), flush=True)\n"
        "    time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline().split()[0])
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the load worker outlived the profiler")
