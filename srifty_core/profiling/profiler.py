"""Profile one zoo model on the device this process runs on (CPU here, CUDA where present).

Steps: find B_max (largest batch that fits the device's memory), measure forward and backward
latency at a set of batch sizes (warm-up, device synchronisation, repeats: mean and std),
fit the piecewise-linear t(B) per pass, record the gradient-ready schedule and form DDP's
buckets, and time what a training step adds regardless of the batch (DDP's copy bandwidth,
the optimizer step). The result is a ``ComputeProfile``.

Memory on CPU: there is no allocator peak counter on the CPU, so the training footprint is
*measured* from what training holds: parameters, their gradients and one optimizer state
(SGD momentum), the input batch, and every activation autograd saves for the backward pass
(collected through ``torch.autograd.graph.saved_tensors_hooks``, each storage counted once).
A batch fits when that footprint is within ``memory_cap_bytes``. On CUDA the footprint is the
allocator's peak over a real forward+backward plus the optimizer state, and a batch that
raises out-of-memory does not fit.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import platform
import statistics
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from srifty_core import host_allocator
from srifty_core.console import still_running
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.lifetime import die_with_caller
from srifty_core.noise import NOISY_CV, NOISY_RETRIES, spread
from srifty_core.predictors.compute import (
    DEFAULT_REFINE_TOLERANCE,
    PiecewiseLinear,
    budget_batch_sizes,
    dense_batch_sizes,
    fit_piecewise,
    refine_batch_sizes,
)
from srifty_core.profiling.buckets import (
    DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_BYTES,
    form_buckets,
    gradient_ready_schedule,
    skip_allreduce,
    trainable,
)
from srifty_core.profiling.budget import (
    DEFAULT_CPU_MAX_STEP_S,
    DEFAULT_CPU_MEMORY_CAP,
    ProfilerBudget,
)
from srifty_core.profiling.profile import ComputeProfile, PassStats
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings
from srifty_core.workloads import ModelRefError, build, make_optimizer, parse_model, prepare
from srifty_core.workloads.zoo import Batch, Workload

GPU_MODELS = ("H100", "H200", "A100", "A10G", "L4", "T4", "V100", "M60", "K80")
"""GPU names as the catalog writes them; a CUDA device name is matched against these."""

Progress = Callable[[str, int, int], None]
"""progress(stage, done, total)"""


class BatchDoesNotFitError(SriftyError):
    """Even the smallest batch does not fit the device's memory."""


@dataclass(frozen=True, slots=True)
class ProfilerConfig(ProfilerBudget):
    """How to profile: the budget (``ProfilerBudget``, the one home of the defaults that
    ``srifty profile`` and the profile DAG offer), the device, the training settings and
    the profiler's own constants."""

    device: str = "cpu"
    min_batch: int = 1
    refine_tolerance: float = DEFAULT_REFINE_TOLERANCE
    """A check the fit misses by more than this (relative) is probed around further."""
    schedule_repeats: int = 3
    bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES
    first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES
    seed: int = 0
    settings: TrainingSettings = DEFAULT_SETTINGS
    """Precision, optimizer, compile and channels-last as the job trains
    (``training_settings``): the steps are timed that way and the profile records it."""

    def __post_init__(self) -> None:
        ProfilerBudget.__post_init__(self)  # slots: no zero-argument super()
        for name in ("min_batch", "schedule_repeats"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.refine_tolerance < 1:
            raise ConfigError(f"refine_tolerance must be in (0, 1), got {self.refine_tolerance}")


SEARCH_MARGIN = 1.25
"""CPU: a batch whose footprint, extrapolated from the batches measured, exceeds the cap
by more than this factor is counted as not fitting without running it."""
MEMORY_BOUND_BATCH = 1 << 24
"""Where the uncapped B_max search gives up doubling: a batch no memory in sight holds."""


def resolve_device(spec: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``; a device that is not there is an error."""
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {spec!r}: use cpu, cuda or cuda:N") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {spec!r} is not there: this machine has no CUDA device")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {spec!r} is not there: {torch.cuda.device_count()} CUDA device(s)"
            )
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise ConfigError(f"device type {device.type!r} is not supported: use cpu or cuda")
    return device


def device_type_of(device: torch.device) -> tuple[str, str]:
    """(device type as the catalog names GPUs, full device name)."""
    if device.type == "cpu":
        return "cpu", platform.processor() or platform.machine() or "cpu"
    name = torch.cuda.get_device_name(device)
    for model in GPU_MODELS:
        if model in name.upper().replace("TESLA ", ""):
            return model, name
    return name.replace(" ", "_"), name


def _sync_fn(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


# --------------------------------------------------------------------------- memory
def _bytes(tensors: object) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)  # type: ignore[attr-defined]


def training_memory_bytes(workload: Workload, batch: Batch, device: torch.device) -> int:
    """The training footprint of one step at this batch (see the module doc)."""
    params = trainable(workload.module)
    param_bytes = _bytes(params)
    if device.type == "cuda":
        workload.module.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        workload.loss(batch).backward()
        torch.cuda.synchronize(device)
        peak = int(torch.cuda.max_memory_allocated(device))
        workload.module.zero_grad(set_to_none=True)
        return peak + param_bytes  # plus one optimizer state
    own = {p.untyped_storage().data_ptr() for p in params}
    own |= {t.untyped_storage().data_ptr() for t in batch}
    saved: dict[int, int] = {}

    held: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> None:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in own:
            saved[ptr] = st.nbytes()
        # held here, not in the graph: a node that saves its own output through a hook
        # that returns it makes a cycle autograd never frees (about 1 GiB per call for
        # DLRM at batch 100,000, which ran the B_max search out of host memory)
        held.append(t)

    def unpack(_: None) -> torch.Tensor:
        raise SriftyError("training_memory_bytes runs the forward pass only")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = workload.loss(batch)
    del loss
    held.clear()
    return sum(saved.values()) + 3 * param_bytes + _bytes(batch)


def _fits(workload: Workload, b: int, device: torch.device, cap: int) -> tuple[bool, int]:
    try:
        used = training_memory_bytes(workload, workload.make_batch(b, device), device)
    except torch.OutOfMemoryError:
        used = -1
    if used < 0:
        # outside the handler: the traceback that held the failed step's tensors is gone, so
        # their blocks are free and empty_cache can release them
        workload.module.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return False, -1
    return used <= cap, used


MEASURE_PEAK_FROM = 256 * 2**20
"""CPU: from this estimated footprint up, a batch's real step is also run and its peak
resident memory measured (below it, the resident set's page-level noise is too large a
share)."""


def step_peak_bytes(workload: Workload, batch: Batch) -> int | None:
    """CPU, Linux: the training footprint of one real forward and backward at ``batch``,
    measured: the peak resident set during the step (``VmHWM``, reset first through
    ``/proc/self/clear_refs``) over the resident set before it (the heap trimmed), plus
    what the step does not allocate but training holds (the parameters, one optimizer
    state, the batch). It sees what the saved-tensor estimate cannot: the forward's
    temporaries and the backward's (DLRM's step peaks at 2.3-2.6x that estimate). ``None``
    where the kernel does not offer it."""
    try:
        host_allocator.trim()
        before = _status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return None
    workload.module.zero_grad(set_to_none=True)
    workload.loss(batch).backward()
    peak = _status_bytes("VmHWM")
    workload.module.zero_grad(set_to_none=True)
    if before is None or peak is None:
        return None
    return max(0, peak - before) + 2 * _bytes(trainable(workload.module)) + _bytes(batch)


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass(frozen=True, slots=True)
class MemoryProbe:
    b_max: int
    per_sample_bytes: float
    fixed_bytes: float
    cap_bytes: int
    measured: tuple[tuple[int, int], ...]
    """(batch, bytes) at every size the search tried."""
    limit: str = "memory"
    """What bounds B_max: ``memory``, ``step time <s> s`` (``max_step_s``) or the
    search's ceiling ``max_batch``."""


def find_b_max(
    workload: Workload, device: torch.device, config: ProfilerConfig, progress: Progress | None
) -> MemoryProbe:
    """Binary search for the largest batch in [min_batch, max_batch] that fits: double until
    a batch does not fit (or the upper end), then bisect between the last fit and the miss."""
    if device.type == "cuda":
        cap = config.memory_cap_bytes or int(torch.cuda.get_device_properties(device).total_memory)
    else:
        cap = config.memory_cap_bytes or DEFAULT_CPU_MEMORY_CAP
    cpu = device.type == "cpu"
    tried: dict[int, int] = {}
    ratio = 1.0  # CPU: measured step peak over the saved-tensor estimate, latest
    max_step = config.max_step_s
    if max_step is None:
        max_step = DEFAULT_CPU_MAX_STEP_S if cpu else 0.0
    too_slow: set[int] = set()

    def predicted(b: int) -> float | None:
        """The footprint at ``b`` extrapolated (linear in the batch) from the two nearest
        smaller batches tried; None before two are."""
        below = sorted(k for k, v in tried.items() if v >= 0 and k < b)
        if len(below) < 2:
            return None
        (b1, m1), (b2, m2) = ((k, tried[k]) for k in below[-2:])
        return m2 + (m2 - m1) / (b2 - b1) * (b - b2)

    def fits(b: int) -> bool:
        nonlocal ratio
        guess = predicted(b)
        if cpu and guess is not None and guess > cap * SEARCH_MARGIN:
            # not run: a batch predicted well over the cap could exhaust the host's memory
            # (the CPU has no out-of-memory error to catch, the kernel kills the process)
            tried[b] = int(guess)
            ok = False
        else:
            t0 = time.perf_counter()
            ok, used = _fits(workload, b, device, cap)  # a forward pass at b
            if max_step and ok and time.perf_counter() - t0 > max_step / 3:
                too_slow.add(b)  # forward + backward would take longer than max_step
                if progress:
                    progress(f"B_max search: batch {b} steps longer than {max_step:g} s", 0, 0)
                return False
            if cpu and MEASURE_PEAK_FROM <= used * ratio <= cap * SEARCH_MARGIN:
                real = step_peak_bytes(workload, workload.make_batch(b, device))
                if real is not None:
                    ratio = max(1.0, real / used)
            if cpu and used >= 0:
                used = int(used * ratio)
                ok = used <= cap
            tried[b] = used
        if progress:
            progress(f"B_max search: batch {b} {'fits' if ok else 'does not fit'}", len(tried), 0)
        return ok

    lo = config.min_batch
    if progress:
        progress(f"B_max search: from batch {lo}, memory cap {cap / 2**30:.1f} GiB", 0, 0)
    if not fits(lo):
        if lo in too_slow:  # the step-time bound, not the memory: say which
            raise BatchDoesNotFitError(
                f"batch {lo} of {workload.name}/{workload.size} steps longer than "
                f"{max_step:g} s on this host (its forward pass alone took over a third of "
                "it; raise --max-step-s or use a smaller --size)"
            )
        raise BatchDoesNotFitError(
            f"batch {lo} of {workload.name}/{workload.size} does not fit: needs "
            f"{tried[lo] / 2**20:.0f} MiB, cap {cap / 2**20:.0f} MiB (raise --memory-cap or use "
            f"a smaller --size)"
        )
    hi = None
    b = lo
    top = config.max_batch or MEMORY_BOUND_BATCH
    while b < top:
        nxt = min(b * 2, top)
        if fits(nxt):
            b = nxt
        else:
            hi = nxt
            break
    lo = b
    if hi is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
    ok = sorted((k, v) for k, v in tried.items() if 0 <= v <= cap)
    if len(ok) >= 2:
        (b1, m1), (b2, m2) = ok[0], ok[-1]
        per_sample = (m2 - m1) / (b2 - b1)
    else:
        per_sample = 0.0
    fixed = ok[0][1] - per_sample * ok[0][0]
    if hi is not None and hi in too_slow:
        limit = f"step time {max_step:g} s"
    elif hi is None:
        limit = f"max_batch {top}"
    else:
        limit = "memory"
    return MemoryProbe(lo, per_sample, fixed, cap, tuple(sorted(tried.items())), limit)


# --------------------------------------------------------------------------- latency
def measure_latency(
    workload: Workload,
    batch: Batch,
    *,
    repeats: int,
    warmup: int,
    sync: Callable[[], None],
    before_step: Callable[[], None] | None = None,
) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of ``repeats`` steps, after ``warmup`` steps;
    ``before_step`` (if given) runs before each, outside the clock (``_colocated_load``'s
    lockstep)."""
    fw: list[float] = []
    bw: list[float] = []
    for i in range(warmup + repeats):
        workload.module.zero_grad(set_to_none=True)
        sync()
        if before_step is not None:
            before_step()
        t0 = time.perf_counter()
        loss = workload.loss(batch)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        if i >= warmup:
            fw.append(t1 - t0)
            bw.append(t2 - t1)
    return fw, bw


def step_seconds(
    workload: Workload,
    batch: Batch,
    config: ProfilerConfig,
    sync: Callable[[], None],
    before_step: Callable[[], None] | None = None,
) -> list[float]:
    """Forward-plus-backward seconds of ``config.repeats`` steps (``measure_latency``)."""
    fw, bw = measure_latency(
        workload,
        batch,
        repeats=config.repeats,
        warmup=config.warmup,
        sync=sync,
        before_step=before_step,
    )
    return [f + b for f, b in zip(fw, bw, strict=True)]


def _ddp_of_one(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module`` in DDP over a process group of this process alone (an in-memory store;
    gloo on the CPU, NCCL on CUDA), its exchange a no-op hook: DDP's own work, no
    communication. The caller destroys the process group."""
    import torch.distributed as dist

    cuda = device.type == "cuda"
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=1)
    ddp = torch.nn.parallel.DistributedDataParallel(
        module, device_ids=[device.index] if cuda else None
    )
    ddp.register_comm_hook(None, skip_allreduce)
    return ddp


def _stats(batch_sizes: list[int], samples: list[list[float]], repeats: int) -> PassStats:
    return PassStats(
        tuple(batch_sizes),
        tuple(statistics.fmean(s) for s in samples),
        tuple(statistics.stdev(s) for s in samples),
        repeats,
    )


def profile_model(
    name: str,
    size: str = "small",
    config: ProfilerConfig | None = None,
    progress: Progress | None = None,
) -> ComputeProfile:
    """Profile model ``name`` (a zoo name or any ``workload`` reference) at ``size`` on
    ``config.device`` with ``config.settings``; see the module doc."""
    config = config or ProfilerConfig()
    device = resolve_device(config.device)
    host_allocator.steady()  # the heap behaviour training runs with (host_allocator)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    with still_running(f"building model {name}"):  # a factory that hangs says so
        workload = build(name, size, seed=config.seed).to(device)
    with user_steps(name):
        return _profile(name, size, config, progress, device, workload)


@contextlib.contextmanager
def user_steps(name: str) -> Iterator[None]:
    """Where the steps of model ``name`` run: an exception the model's own code raises (a
    forward pass that fails, a loss without a gradient) is a ``ModelRefError`` naming the
    model, one line (``step_failure``). A zoo model's failure is Srifty's own bug and keeps
    its traceback; Srifty's errors pass as they are."""
    try:
        yield
    except SriftyError:
        raise
    except Exception as exc:
        if not _user_code(name):
            raise
        raise ModelRefError(step_failure(name, exc)) from exc


def _user_code(name: str) -> bool:
    """Whether ``name`` is a model Srifty did not write (a factory, an ``hf:`` config)."""
    try:
        return parse_model(name).kind != "zoo"
    except ModelRefError:
        return False


def step_failure(name: str, exc: BaseException) -> str:
    """``<model>: a training step raised <type>: <first line> (<file>:<line>, in <fn>)``:
    the innermost frame outside torch and Srifty (the model's code) where there is one,
    and what a loss without a gradient means."""
    lines = str(exc).strip().splitlines()
    text = f"{name}: a training step raised {type(exc).__name__}: "
    text += lines[0] if lines else "(no message)"
    ours = (Path(torch.__file__).parent, Path(__file__).parent.parent)
    theirs = [
        f
        for f, _ in traceback.walk_tb(exc.__traceback__)
        if not any(Path(f.f_code.co_filename).is_relative_to(d) for d in ours)
    ]
    if theirs:
        f = theirs[-1]
        text += f" ({Path(f.f_code.co_filename).name}:{f.f_lineno}, in {f.f_code.co_name})"
    if "does not require grad" in str(exc):
        text += (
            "; the loss must be computed from the module's output with gradients on (not "
            "detached, not under torch.no_grad)"
        )
    return text


def _profile(
    name: str,
    size: str,
    config: ProfilerConfig,
    progress: Progress | None,
    device: torch.device,
    workload: Workload,
) -> ComputeProfile:
    """``profile_model`` once the model is built."""
    workload.module.train()
    precision = prepare(workload, config.settings, autocast=True)
    sync = _sync_fn(device)
    if _user_code(name):  # a step that fails is one line before any progress line
        workload.module.zero_grad(set_to_none=True)
        workload.loss(workload.make_batch(1, device, seed=config.seed)).backward()
        workload.module.zero_grad(set_to_none=True)

    memory = find_b_max(workload, device, config, progress)
    if config.batch_sizes:
        sizes = sorted(set(config.batch_sizes))
        too_big = [b for b in sizes if b > memory.b_max or b < 1]
        if too_big:
            raise BatchDoesNotFitError(
                f"batch size(s) {too_big} do not fit {workload.name}/{size} on {config.device}: "
                f"B_max is {memory.b_max}"
            )
        mode = "explicit"
    elif config.probes is None:
        sizes = dense_batch_sizes(memory.b_max, config.min_batch)
        mode = "dense"
    else:
        sizes = budget_batch_sizes(memory.b_max, config.probes, config.min_batch)
        mode = f"budget:{config.probes}"
    if len(sizes) < 2:
        raise ConfigError(f"need at least 2 distinct batch sizes to fit, got {sizes}")

    samples: dict[int, tuple[list[float], list[float]]] = {}
    noisy: dict[int, str] = {}

    def run(b: int) -> None:
        batch = workload.make_batch(b, device, seed=config.seed)
        best: tuple[float, tuple[list[float], list[float]]] | None = None
        for _ in range(1 + NOISY_RETRIES):
            with _colocated_load(name, size, b, config, device):
                got = measure_latency(
                    workload, batch, repeats=config.repeats, warmup=config.warmup, sync=sync
                )
            cv = step_spread(got)
            if best is None or cv < best[0]:
                best = (cv, got)
            if best[0] <= NOISY_CV:
                break
            if progress:
                progress(f"latency sweep: batch {b} spread {cv:.0%}, measuring again", 0, 0)
        assert best is not None
        samples[b] = best[1]
        if best[0] > NOISY_CV:
            noisy[b] = (
                f"batch {b}: steps spread {best[0]:.0%} (std/mean over {config.repeats} "
                f"repeats) after {NOISY_RETRIES} re-measurements; the host was busy"
            )
        else:
            noisy.pop(b, None)

    def fits() -> tuple[PassStats, PassStats, PiecewiseLinear, PiecewiseLinear]:
        bs = sorted(samples)
        fw_stats = _stats(bs, [samples[b][0] for b in bs], config.repeats)
        bw_stats = _stats(bs, [samples[b][1] for b in bs], config.repeats)
        return (
            fw_stats,
            bw_stats,
            fit_piecewise(bs, fw_stats.mean_s, cv=fw_stats.cv, repeats=config.repeats),
            fit_piecewise(bs, bw_stats.mean_s, cv=bw_stats.cv, repeats=config.repeats),
        )

    for i, b in enumerate(sizes):
        if progress:
            progress(f"latency sweep: batch {b}", i, len(sizes))
        run(b)
        if progress:
            progress(f"latency sweep: batch {b}", i + 1, len(sizes))
    current = fits()
    checks: list[tuple[int, float]] = []
    if mode.startswith("budget") and config.refine > 0:

        def predict(b: int) -> float:
            return current[2].at(b) + current[3].at(b)

        def measure(b: int) -> tuple[float, float]:
            nonlocal current
            run(b)
            current = fits()
            steps = [f + w for f, w in zip(*samples[b], strict=True)]
            mean = statistics.fmean(steps)
            if progress:
                progress("checks between probes", len(checks) + 1, config.refine)
            return mean, statistics.stdev(steps) / mean / len(steps) ** 0.5

        checks = refine_batch_sizes(
            sizes, predict, measure, budget=config.refine, tolerance=config.refine_tolerance
        )
        if checks:
            mode += f"+{len(checks)}"
    fw_stats, bw_stats, fw_fit, bw_fit = current
    sizes = sorted(samples)

    sched_b = sizes[len(sizes) // 2]
    if progress:
        progress(f"gradient schedule: batch {sched_b}", 0, 0)
    schedule = gradient_ready_schedule(
        workload,
        workload.make_batch(sched_b, device, seed=config.seed),
        repeats=config.schedule_repeats,
        sync=sync,
    )
    params = trainable(workload.module)
    buckets = form_buckets(
        params,
        schedule,
        bucket_cap_bytes=config.bucket_cap_bytes,
        first_bucket_bytes=config.first_bucket_bytes,
    )
    if progress:
        progress("DDP overhead: measuring (and host sharing, if asked)", 0, 0)
    shared = shared_slowdown(name, size, workload, sched_b, config, device, sync)
    overhead = ddp_overhead(name, size, workload, sched_b, config, device, sync)
    if progress:
        progress("DDP overhead", 1, 1)
    with _colocated_load(name, size, sched_b, config, device):
        copy_bw = copy_bandwidth(_bytes(params), device, sync)
        # last: the steps move the weights, and nothing is measured after them
        step_s = optimizer_step_seconds(
            workload,
            workload.make_batch(sched_b, device, seed=config.seed),
            sync,
            settings=config.settings,
        )
    device_type, device_name = device_type_of(device)
    return ComputeProfile(
        model=name,
        size=size,
        device_type=device_type,
        device_name=device_name,
        fw=fw_stats,
        bw=bw_stats,
        fw_fit=fw_fit,
        bw_fit=bw_fit,
        b_max=memory.b_max,
        memory_per_sample_bytes=memory.per_sample_bytes,
        memory_fixed_bytes=memory.fixed_bytes,
        memory_cap_bytes=memory.cap_bytes,
        n_parameters=sum(p.numel() for p in params),
        gradient_bytes=_bytes(params),
        buckets=buckets,
        bucket_cap_bytes=config.bucket_cap_bytes,
        first_bucket_cap_bytes=config.first_bucket_bytes,
        schedule_batch_size=sched_b,
        probe_mode=mode,
        threads=torch.get_num_threads() if device.type == "cpu" else 0,
        torch_version=str(torch.__version__),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        copy_bytes_per_s=copy_bw,
        optimizer_step_s=step_s,
        probe_checks=tuple(checks),
        shared_slowdown=shared,
        ddp_overhead=overhead,
        settings=config.settings,
        effective_precision=precision,
        b_max_limit=memory.limit,
        noisy=tuple(noisy[b] for b in sorted(noisy)),
    )


def step_spread(samples: tuple[list[float], list[float]]) -> float:
    """std/mean of the forward-plus-backward step times of one batch's repeats (a batch
    above ``noise.NOISY_CV`` is measured again, up to ``noise.NOISY_RETRIES`` times)."""
    return spread([f + b for f, b in zip(*samples, strict=True)])


def shared_slowdown(
    name: str,
    size: str,
    workload: Workload,
    batch: int,
    config: ProfilerConfig,
    device: torch.device,
    sync: Callable[[], None],
) -> tuple[tuple[int, float], ...]:
    """``(k, factor)`` for k = 2..``config.shared_workers`` (none on CUDA): the median
    forward-plus-backward time at ``batch`` with ``k - 1`` background workers doing the
    same steps in step with it (``_colocated_load``'s lockstep: a job's ranks start each
    step together), over the median alone. The workers start once and are paused and
    resumed for ``SHARE_ROUNDS`` alternating rounds (alone, shared, alone, ...), so that
    drift and one-off disturbances of the host (another process starting, a page-fault
    storm) fall on both sides; at least 1."""
    workers = config.shared_workers(device.type == "cpu")
    if workers <= 1:
        return ()
    import multiprocessing as mp

    data = workload.make_batch(batch, device, seed=config.seed)
    out = []
    for k in range(2, workers + 1):
        go = mp.get_context("spawn").Event()
        alone: list[float] = []
        shared: list[float] = []
        with _colocated_load(
            name, size, batch, config, device, others=k - 1, go=go, lockstep=True
        ) as together:
            for _ in range(SHARE_ROUNDS):
                go.clear()
                alone += step_seconds(workload, data, config, sync)
                go.set()
                shared += step_seconds(workload, data, config, sync, together)
        out.append((k, max(1.0, statistics.median(shared) / statistics.median(alone))))
    return tuple(out)


SHARE_ROUNDS = 3
"""Alternating alone/shared rounds of ``shared_slowdown``."""
LOCKSTEP_TIMEOUT_S = 120.0
"""How long a lockstep step waits for the load workers before the profile fails."""


def ddp_overhead(
    name: str,
    size: str,
    workload: Workload,
    batch: int,
    config: ProfilerConfig,
    device: torch.device,
    sync: Callable[[], None],
) -> tuple[tuple[int, float], ...]:
    """``(k, seconds)`` for k = 1..``config.shared_workers`` (1 on a GPU): what wrapping the
    model in DDP adds to a forward-plus-backward step at ``batch``, with ``k - 1``
    background workers doing DDP steps of their own in step with it (and ``colocated - 1``
    as always): DDP's passes over the gradients are memory-bound and come at the same
    moment of every rank's step, so workers that step together slow them more than
    workers at random moments of theirs (``benchmarks/investigations/ddp_lockstep.py``:
    ResNet-18 at batch 8 beside one worker, +3.9 ms in step against +1.8 at random moments,
    medians of four alternated rounds; docs/benchmarks/local-ddp.md has the rest and the
    noise).

    A copy of the model is wrapped in ``DistributedDataParallel`` over a process group of
    this process alone (an in-memory store, gloo on the CPU, NCCL on CUDA) with a no-op
    communication hook: what remains is DDP's own work (autograd hooks, gradients copied
    into the buckets and back, buffer broadcasts), which the copy bandwidth alone does not
    predict (ShuffleNet's 170 small tensors cost 1.9 ms where its two copy passes take 0.2;
    DLRM's 38 large ones 7 ms where they take 7, and 17 ms on a busier host). Median DDP
    step minus median plain step over ``SHARE_ROUNDS`` alternating rounds, at least 0.
    Empty where a process group already exists in this process (a profile taken inside a
    training job)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return ()
    cuda = device.type == "cuda"
    try:
        module = _ddp_of_one(copy.deepcopy(workload.module), device)
        wrapped = dataclasses.replace(workload, module=module)
        data = workload.make_batch(batch, device, seed=config.seed)
        out = []
        base = config.colocated - 1
        for k in range(1, config.shared_workers(not cuda) + 1):
            plain: list[float] = []
            ddp: list[float] = []
            with _colocated_load(
                name, size, batch, config, device, others=base + k - 1, ddp=True, lockstep=True
            ) as together:
                for _ in range(SHARE_ROUNDS):
                    plain += step_seconds(workload, data, config, sync, together)
                    ddp += step_seconds(wrapped, data, config, sync, together)
            out.append((k, max(0.0, statistics.median(ddp) - statistics.median(plain))))
        del module, wrapped
        return tuple(out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def copy_bandwidth(
    n_bytes: int, device: torch.device, sync: Callable[[], None], repeats: int = 7
) -> float:
    """Bytes/s of copying ``n_bytes`` of float32 from one buffer into another on ``device``
    (median of ``repeats`` after a warm-up), with this process's thread setting: what DDP's
    passes over the gradients (into the buckets, divided on the way, and back out) run at."""
    n = max(1, n_bytes // 4)
    src = torch.ones(n, device=device)
    dst = torch.empty(n, device=device)
    return 4 * n / _median_seconds(lambda: dst.copy_(src), sync, repeats)


def optimizer_step_seconds(
    workload: Workload,
    batch: Batch,
    sync: Callable[[], None],
    repeats: int = 7,
    settings: TrainingSettings = DEFAULT_SETTINGS,
) -> float:
    """Median seconds of ``optimizer.step()`` for the optimizer of ``settings`` (SGD with
    momentum, or AdamW: ``workload.make_optimizer``, as the worker trains) over the
    model's parameters, gradients in place, after a warm-up step that creates its state.
    Memory-bound and independent of the batch size."""
    params = trainable(workload.module)
    opt = make_optimizer(settings, params, lr=1e-6, momentum=0.9)
    workload.module.zero_grad(set_to_none=True)
    workload.loss(batch).backward()
    seconds = _median_seconds(opt.step, sync, repeats)
    workload.module.zero_grad(set_to_none=True)
    return seconds


def _median_seconds(fn: Callable[[], object], sync: Callable[[], None], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after one warm-up call, each
    between device synchronisations."""
    times = []
    for i in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _load_worker(
    name: str,
    size: str,
    batch: int,
    threads: int,
    device: str,
    ready: Any,
    stop: Any,
    go: Any = None,
    ddp: bool = False,
    caller: int | None = None,
    together: Any = None,
    settings: dict[str, Any] | None = None,
) -> None:
    """Background training steps until ``stop`` is set (a co-located worker); while
    ``go`` (if given) is clear it idles between steps. ``ddp``: the model wrapped in DDP
    over a process group of this worker alone, the exchange a no-op (DDP's own passes).
    ``together`` (this worker's end of a pipe, if given): each step after the first
    starts when the profiler's does (``_step_when_told``). It ends with ``caller`` (the
    profiler) if that is killed before it can set ``stop``: an orphan would keep stepping
    and slow every measurement after it."""
    die_with_caller(caller)
    host_allocator.steady()
    if threads:
        torch.set_num_threads(threads)
    workload = build(name, size).to(torch.device(device))
    prepare(workload, TrainingSettings.from_dict(settings), autocast=True)
    if ddp:
        workload.module = _ddp_of_one(workload.module, torch.device(device))
    data = workload.make_batch(batch, torch.device(device), seed=1)
    workload.module.train()
    first = True
    while not stop.is_set():
        if go is not None and not first and not go.wait(0.05):
            continue
        workload.module.zero_grad(set_to_none=True)
        if together is not None and not first and not _step_when_told(together, stop):
            break  # the profiler is done with us
        workload.loss(data).backward()
        if first:
            ready.set()
            first = False


def _step_when_told(conn: Any, stop: Any) -> bool:
    """A load worker in lockstep: say it is ready for a step, then wait for the profiler's
    go. False when the profiler is done (``stop``, or its end of the pipe closed)."""
    try:
        conn.send(b"ready")
        while not conn.poll(0.05):
            if stop.is_set():
                return False
        conn.recv()
    except (EOFError, OSError):
        return False
    return not stop.is_set()


@contextlib.contextmanager
def _colocated_load(
    name: str,
    size: str,
    batch: int,
    config: ProfilerConfig,
    device: torch.device,
    others: int | None = None,
    go: Any = None,
    ddp: bool = False,
    lockstep: bool = False,
) -> Iterator[Callable[[], None] | None]:
    """Run ``others`` (default ``config.colocated - 1``) background workers for the
    duration of the block (stepping only while ``go``, an event of the spawn context, is
    set, if given). With ``lockstep`` the block gets a function to call before each
    step it times (``measure_latency``'s ``before_step``): every worker then starts a
    step with it, as a job's ranks do (it raises ``SriftyError`` if a worker stops
    stepping for ``LOCKSTEP_TIMEOUT_S``); else ``None``."""
    n = config.colocated - 1 if others is None else others
    if n <= 0:
        yield None
        return
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    # Lockstep through one pipe per worker, not a shared barrier: a worker killed inside a
    # barrier's wait can die holding its lock, and the profiler's next wait then blocks
    # forever, its timeout never reached; a dead worker's pipe just reads as closed.
    pipes = [ctx.Pipe() for _ in range(n)] if lockstep else []

    def step_together() -> None:
        stopped = SriftyError(
            f"a co-located load worker stopped stepping (no step in {LOCKSTEP_TIMEOUT_S:g} s)"
        )
        deadline = time.monotonic() + LOCKSTEP_TIMEOUT_S
        for (mine, _), p in zip(pipes, procs, strict=True):
            # a worker that died after saying it was ready left that message in the pipe:
            # check it is alive first, or the step would go ahead without it
            if not p.is_alive():
                raise stopped
            try:
                while not mine.poll(0.05):
                    if not p.is_alive() or time.monotonic() > deadline:
                        raise stopped
                mine.recv()  # the worker is ready for a step
            except (EOFError, OSError):
                raise stopped from None
        for mine, _ in pipes:
            try:
                mine.send(b"go")
            except OSError:
                raise stopped from None

    procs: list[Any] = []
    readies = []
    for i in range(n):
        ready = ctx.Event()
        p = ctx.Process(
            target=_load_worker,
            args=(
                name,
                size,
                batch,
                config.threads or 0,
                str(device),
                ready,
                stop,
                go,
                ddp,
                os.getpid(),
                pipes[i][1] if lockstep else None,
                config.settings.to_dict(),
            ),
            daemon=True,
        )
        p.start()
        procs.append(p)
        readies.append(ready)
    try:
        for ready, p in zip(readies, procs, strict=True):
            while not ready.wait(0.5):
                if not p.is_alive():
                    raise SriftyError(f"a co-located load worker died (exit {p.exitcode})")
        yield step_together if lockstep else None
    finally:
        stop.set()  # a worker waiting for its next step sees it and leaves
        for mine, _ in pipes:
            mine.close()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()


def host_summary() -> str:
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs"
