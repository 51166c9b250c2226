"""How much memory one training step holds (``training_memory_bytes``, ``step_peak_bytes``)
and the largest batch that fits the device (``find_b_max``, the B_max search).

Memory on CPU: there is no allocator peak counter on the CPU, so the training footprint is
*measured* from what training holds: parameters, their gradients and one optimizer state
(SGD momentum), the input batch, and every activation autograd saves for the backward pass
(collected through ``torch.autograd.graph.saved_tensors_hooks``, each storage counted once).
A batch fits when that footprint is within ``memory_cap_bytes``. On CUDA the footprint is the
allocator's peak over a real forward+backward plus the optimizer state, and a batch that
raises out-of-memory does not fit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from srifty_core import host_allocator
from srifty_core.errors import SriftyError
from srifty_core.profiling.buckets import trainable
from srifty_core.profiling.budget import DEFAULT_CPU_MAX_STEP_S, DEFAULT_CPU_MEMORY_CAP
from srifty_core.profiling.config import ProfilerConfig, Progress
from srifty_core.workloads.zoo import Batch, Workload


class BatchDoesNotFitError(SriftyError):
    """Even the smallest batch does not fit the device's memory."""


SEARCH_MARGIN = 1.25
"""CPU: a batch whose footprint, extrapolated from the batches measured, exceeds the cap
by more than this factor is counted as not fitting without running it."""
MEMORY_BOUND_BATCH = 1 << 24
"""Where the uncapped B_max search gives up doubling: a batch no memory in sight holds."""


def tensor_bytes(tensors: object) -> int:
    """Bytes of these tensors' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)  # type: ignore[attr-defined]


def training_memory_bytes(workload: Workload, batch: Batch, device: torch.device) -> int:
    """The training footprint of one step at this batch (see the module doc)."""
    params = trainable(workload.module)
    param_bytes = tensor_bytes(params)
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
    return sum(saved.values()) + 3 * param_bytes + tensor_bytes(batch)


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
    host_allocator.trim()
    before = host_allocator.resident_bytes("VmRSS")
    if not host_allocator.reset_peak_resident():
        return None
    workload.module.zero_grad(set_to_none=True)
    workload.loss(batch).backward()
    peak = host_allocator.resident_bytes("VmHWM")
    workload.module.zero_grad(set_to_none=True)
    if before is None or peak is None:
        return None
    return (
        max(0, peak - before) + 2 * tensor_bytes(trainable(workload.module)) + tensor_bytes(batch)
    )


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
