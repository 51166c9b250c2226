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

import math
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

    @property
    def unit(self) -> int:
        """The greatest common divisor of every VM batch and the global batch: every
        count of samples the configurations can reach is a multiple of it (the counting
        tables run in these units)."""
        return math.gcd(self.request.global_batch, *(b for bs in self.vm_batches for b in bs))

    def completions(self, limit: int | None = None) -> list[Any]:
        """Per offer index ``i`` (0 to the number of offers), an array over ``r`` (in
        ``unit``s, 0 to the global batch): the number of ways the offers from ``i`` on
        can hold exactly ``r`` units (an offer unused, or a count up to its quota at one
        of its batches). ``completions()[0][-1]`` is the size of the space; a zero marks
        a remainder nothing after ``i`` can make up (the searches skip such branches).

        Dynamic programming over the offers from the last, one windowed sum per (offer,
        batch): the counts 1..quota of a batch ``b`` add the ways ``b``, ``2b``, ...
        ``quota * b`` units back, a sliding window along each residue modulo ``b``.
        With ``limit``, counts saturate at ``limit + 1``: exact up to ``limit``, and
        ``limit + 1`` means "more than ``limit``", never a partial count."""
        import numpy as np

        unit = self.unit
        n = self.request.global_batch // unit + 1
        cap = None if limit is None else int(limit) + 1
        # int64 holds the window sums of capped counts; beyond that, exact integers
        small = cap is not None and cap * (n + 1) < 2**62
        dtype: type = np.int64 if small else object
        ways: Any = np.zeros(n, dtype=dtype)
        ways[0] = 1
        out = [ways]
        for o, batches in zip(
            reversed(self.request.offers), reversed(self.vm_batches), strict=True
        ):
            nxt = ways.copy()
            if o.quota > 0:
                for b in batches:
                    nxt += _window_sums(ways, b // unit, o.quota)
                if cap is not None:
                    np.minimum(nxt, cap, out=nxt)
            ways = nxt
            out.append(ways)
        out.reverse()
        return out

    def size(self, limit: int | None = None) -> int:
        """Number of configurations (local batches summing exactly to the global batch),
        counted exactly (``completions``). With ``limit``, counts saturate at ``limit +
        1``: the answer is exact up to ``limit`` and ``limit + 1`` means "more than
        ``limit``", never a partial count."""
        return int(self.completions(limit)[0][-1])

    def enumerate(self) -> Iterator[Choice]:
        """Every configuration, depth first over offers (an offer unused first, then its
        batches and counts in increasing order), never entering a branch whose remainder
        the offers after it cannot make up exactly."""
        offers = self.request.offers
        unit = self.unit
        target = self.request.global_batch // unit
        reach = [w > 0 for w in self.completions(limit=1)]

        def dfs(i: int, remaining: int, chosen: list[tuple[int, int, int]]) -> Iterator[Choice]:
            if remaining == 0:
                yield tuple(chosen)
                return
            if i == len(offers):
                return
            if reach[i + 1][remaining]:
                yield from dfs(i + 1, remaining, chosen)
            for b in self.vm_batches[i]:
                u = b // unit
                for c in range(1, offers[i].quota + 1):
                    if c * u > remaining:
                        break
                    if reach[i + 1][remaining - c * u]:
                        chosen.append((i, c, b))
                        yield from dfs(i + 1, remaining - c * u, chosen)
                        chosen.pop()

        if reach[0][target]:
            yield from dfs(0, target, [])

    def config(self, choice: Choice) -> ClusterConfig:
        offers = self.request.offers
        return ClusterConfig(tuple(Group(offers[i].instance, c, b) for i, c, b in choice))


NEAREST_LIMIT = 10**7
"""``nearest_global_batches`` looks no further than this many units (an array of them)."""


def nearest_global_batches(space: Space) -> tuple[int | None, int | None]:
    """The global batches nearest the request's, below and above it (up to twice it), that
    the VM batches of ``space`` can hold exactly within the quotas (``None``: none): what
    to ask for when no configuration holds the request's own."""
    import numpy as np

    g = space.request.global_batch
    batches = [b for bs in space.vm_batches for b in bs]
    if not batches:
        return None, None
    unit = math.gcd(*batches)
    if 2 * g // unit > NEAREST_LIMIT:
        return None, None
    ways: Any = np.zeros(2 * g // unit + 1, dtype=np.int64)
    ways[0] = 1
    for o, bs in zip(space.request.offers, space.vm_batches, strict=True):
        nxt = ways.copy()
        if o.quota > 0:
            for b in bs:
                nxt += _window_sums(ways, b // unit, o.quota)
        ways = np.minimum(nxt, 1)
    held = [int(k) * unit for k in np.flatnonzero(ways) if k > 0]
    below = max((b for b in held if b < g), default=None)
    above = min((b for b in held if b > g), default=None)
    return below, above


def _window_sums(ways: Any, step: int, count: int) -> Any:
    """``out[r] = ways[r - step] + ways[r - 2 step] + ... + ways[r - count * step]`` (terms
    below 0 left out): cumulative sums along each residue modulo ``step``."""
    import numpy as np

    n = len(ways)
    rows = -(-n // step)
    grid = np.zeros(rows * step, dtype=ways.dtype)
    grid[:n] = ways
    grid = grid.reshape(rows, step)
    cum = np.zeros((rows + 1, step), dtype=ways.dtype)
    np.cumsum(grid, axis=0, out=cum[1:])
    lo = np.maximum(np.arange(rows) - count, 0)
    out = cum[np.arange(rows)] - cum[lo]
    return out.reshape(-1)[:n]
