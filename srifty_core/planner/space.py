"""The pruned search space (the method's insights):

1. local batches are powers of two (per GPU), to use the GPU fully;
2. a local batch should saturate the device: at least the type's threshold (the profile's
   first breakpoint, where latency-bound turns throughput-bound) and at most its B_max;
3. every VM of a type gets the same batch (otherwise spreading that type's share evenly
   is no slower).

So a configuration is, per offer, a count (0..quota) and one batch, and the local batches
sum exactly to the global batch. Thresholds are relaxed when they would exclude every
configuration (a global batch smaller than the thresholds).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from srifty_core.planner.request import Offer, PlanRequest
from srifty_core.simulator.types import ClusterConfig, Group

Choice = tuple[tuple[int, int, int], ...]
"""((offer index, VM count, batch per VM), ...) for the offers used (count > 0)."""


def _pow2_upto(n: int) -> list[int]:
    out, b = [], 1
    while b <= n:
        out.append(b)
        b *= 2
    return out


def saturation_threshold(request: PlanRequest, offer: Offer) -> int:
    """The per-GPU batch from which ``offer``'s device is throughput-bound: the offer's
    ``min_batch`` if given, else the profile's first breakpoint (1 when it has none)."""
    if offer.min_batch is not None:
        return int(offer.min_batch)
    p = request.workload.profile(offer.instance.device_type)
    bps = [bp for bp in (*p.fw_fit.breakpoints, *p.bw_fit.breakpoints) if bp > 1]
    return int(min(bps)) if bps else 1


def gpu_batches(request: PlanRequest, offer: Offer, *, saturate: bool = True) -> list[int]:
    """Candidate local batches per GPU for ``offer`` (pruning rules 1-2; rule 2's lower
    bound, the saturation threshold, only with ``saturate``)."""
    p = request.workload.profile(offer.instance.device_type)
    ranks = offer.instance.ranks_per_vm
    b_max = min(p.b_max, request.global_batch // ranks)
    if b_max < 1:
        return []
    if request.batch_granularity == "any":
        return list(range(1, b_max + 1))
    cands = _pow2_upto(b_max)
    if not saturate:
        return cands
    threshold = saturation_threshold(request, offer)
    kept = [b for b in cands if b >= threshold]
    return kept or cands[-1:]


@dataclass(frozen=True, slots=True)
class Space:
    """Per offer: the VM batches allowed (per-GPU batch x GPUs) and the quota."""

    request: PlanRequest
    vm_batches: tuple[tuple[int, ...], ...]

    @classmethod
    def build(cls, request: PlanRequest, *, saturate: bool = True) -> Space:
        """The pruned space; ``saturate=False`` keeps batches below the saturation
        threshold too (the planner searches that larger space when it is affordable)."""
        return cls(
            request,
            tuple(
                tuple(
                    b * o.instance.ranks_per_vm for b in gpu_batches(request, o, saturate=saturate)
                )
                for o in request.offers
            ),
        )

    def size(self, limit: int | None = None) -> int:
        """Number of configurations (local batches summing exactly to the global batch),
        counted exactly by dynamic programming over offers (numpy, one shifted add per
        (batch, count)). With ``limit``, counts saturate at ``limit + 1``: the answer is
        exact up to ``limit`` and ``limit + 1`` means "more than ``limit``", never a
        partial count."""
        import numpy as np

        target = self.request.global_batch
        cap = None if limit is None else int(limit) + 1
        dtype: type = object if cap is None else np.int64
        ways: np.ndarray[Any, Any] = np.zeros(target + 1, dtype=dtype)
        ways[0] = 1
        for o, batches in zip(self.request.offers, self.vm_batches, strict=True):
            nxt = ways.copy()
            for b in batches:
                for c in range(1, o.quota + 1):
                    k = c * b
                    if k > target:
                        break
                    nxt[k:] += ways[: target + 1 - k]
                    if cap is not None:
                        np.minimum(nxt, cap, out=nxt)
            ways = nxt
        return int(ways[target])

    def enumerate(self) -> Iterator[Choice]:
        """Every configuration, depth first over offers."""
        offers = self.request.offers
        target = self.request.global_batch
        # most samples the offers from i on can still take
        reach = [0] * (len(offers) + 1)
        for i in range(len(offers) - 1, -1, -1):
            reach[i] = reach[i + 1] + offers[i].quota * max(self.vm_batches[i], default=0)

        def dfs(i: int, remaining: int, chosen: list[tuple[int, int, int]]) -> Iterator[Choice]:
            if remaining == 0:
                yield tuple(chosen)
                return
            if i == len(offers) or reach[i] < remaining:
                return
            yield from dfs(i + 1, remaining, chosen)
            for b in self.vm_batches[i]:
                for c in range(1, offers[i].quota + 1):
                    if c * b > remaining:
                        break
                    chosen.append((i, c, b))
                    yield from dfs(i + 1, remaining - c * b, chosen)
                    chosen.pop()

        yield from dfs(0, target, [])

    def config(self, choice: Choice) -> ClusterConfig:
        offers = self.request.offers
        return ClusterConfig(tuple(Group(offers[i].instance, c, b) for i, c, b in choice))
