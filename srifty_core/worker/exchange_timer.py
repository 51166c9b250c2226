"""Timing what a DDP step spends computing and exchanging, for the monitor's online
recalibration: ``ExchangeTimer`` is DDP's all-reduce as a communication hook, timed;
``step_timings`` is rank 0's record of one step from every rank's times."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


def step_timings(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...] | None, float | None]:
    """Rank 0's record of one step from every rank's ``(forward + backward, exchange busy)``
    seconds: the per-rank compute times, and the exchange's busy time as the least over
    the ranks (an early rank's includes waiting for its peers); ``None`` for what some
    rank did not measure (NaN)."""
    fwbw = [float(r[0]) for r in rows]
    busy = [float(r[1]) for r in rows]
    compute = None if not fwbw or any(math.isnan(x) for x in fwbw) else tuple(fwbw)
    exchange = None if not busy or any(math.isnan(x) for x in busy) else min(busy)
    return compute, exchange


class ExchangeTimer:
    """A DDP communication hook that sums the gradient buckets over the ranks (with the
    loss multiplied by ``loss_factor``, the result is DDP's built-in average), timed: per
    step, when the last gradient bucket was ready (the end of this rank's backward
    computation) and how long the exchange kept the links busy (each bucket from when it
    was issued, or the previous one finished, to when it finished; the buckets run one
    after the other).

    On the CPU (gloo) the all-reduce's future completes when the transfer has; on CUDA
    (NCCL) its callbacks run as the work is queued on the GPU's stream, so these times
    would not be the GPU's: ``train`` times only CPU ranks (a CUDA rank's record has no
    timings, and the monitor calibrates from its iteration times alone).

    The division by the world size rides on the loss (``loss_factor``, which the caller
    multiplies its loss by): the backward pass then yields the divided gradients at no
    cost, as DDP's built-in path divides while it copies each gradient into its bucket
    (``Reducer::copy_grad_to_bucket``), while a hook gets a plain copy and dividing each
    bucket would take one more pass over the gradients (DLRM's 34 MB: 3-5 ms per step on
    one CPU core, ``benchmarks/investigations/ddp_division_pass.py``). Registered without
    the factor, the gradients come out ``world`` times DDP's."""

    def __init__(self, world: int) -> None:
        import threading

        self.world = world
        self._lock = threading.Lock()
        self.start(0.0)

    def start(self, t0: float) -> None:
        """A new step whose forward pass starts at ``t0`` (``time.perf_counter``)."""
        with self._lock:
            self.t0 = t0
            self.last_ready: float | None = None
            self.busy_s = 0.0
            self._free_at = t0

    @property
    def loss_factor(self) -> float:
        """What the caller multiplies its loss by: ``1 / world``, DDP's average."""
        return 1.0 / self.world

    def hook(self, state: object, bucket: Any) -> torch.futures.Future[Tensor]:
        ready = time.perf_counter()
        with self._lock:
            self.last_ready = ready
        work = dist.all_reduce(bucket.buffer(), async_op=True)  # divided: loss_factor
        assert work is not None

        def done(fut: torch.futures.Future[Any]) -> Tensor:
            end = time.perf_counter()
            with self._lock:
                self.busy_s += max(end - max(ready, self._free_at), 0.0)
                self._free_at = max(self._free_at, end)
            out: Tensor = fut.value()[0]
            return out

        return work.get_future().then(done)

    def compute_s(self, fallback_end: float) -> float:
        """This step's forward + backward seconds (to ``fallback_end`` when DDP issued no
        bucket)."""
        with self._lock:
            end = self.last_ready if self.last_ready is not None else fallback_end
            return max(end - self.t0, 0.0)
