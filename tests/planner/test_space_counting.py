"""The pruned space is counted exactly (never a partial count), capped at ``limit + 1``,
and enumerated without entering a branch that cannot hold the global batch."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from srifty_core.planner.space import Space
from tests.planner.scale_fixtures import random_request


def brute_count(space: Space) -> int:
    """Every (count, batch) per offer, products summed: the definition, slowly."""
    options = []
    for o, batches in zip(space.request.offers, space.vm_batches, strict=True):
        options.append([0] + [c * b for b in batches for c in range(1, o.quota + 1)])
    target = space.request.global_batch
    if np.prod([len(x) for x in options], dtype=float) > 2e5:
        return -1  # too many to list
    return sum(1 for combo in itertools.product(*options) if sum(combo) == target)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("granularity", ["pow2", "any"])
def test_counts_are_exact_and_saturate_at_the_limit(seed: int, granularity: str) -> None:
    rng = np.random.default_rng(seed)
    r = random_request(rng, kinds=int(rng.integers(1, 4)))
    if granularity == "any":
        r = dataclasses.replace(r, batch_granularity="any", global_batch=r.global_batch // 8)
    for saturate in (True, False):
        space = Space.build(r, saturate=saturate)
        n = space.size()
        if n <= 20_000:
            assert n == len(list(space.enumerate()))
        assert brute_count(space) in (n, -1)
        for limit in (0, 1, n - 1, n, n + 1, 10 * n + 3):
            if limit < 0:
                continue
            assert space.size(limit=limit) == min(n, limit + 1)


def test_counts_beyond_int64_stay_exact() -> None:
    """Without a limit the count is a Python integer: no overflow at any size."""
    rng = np.random.default_rng(3)
    r = random_request(rng, kinds=4)
    big = dataclasses.replace(
        r, offers=tuple(dataclasses.replace(o, quota=5000) for o in r.offers), global_batch=4096
    )
    space = Space.build(big)
    n = space.size()
    assert isinstance(n, int) and n > 0
    assert space.size(limit=10**30) == n
    assert space.size(limit=10) == 11


def test_completions_mark_what_the_offers_left_can_hold() -> None:
    rng = np.random.default_rng(8)
    r = random_request(rng, kinds=3)
    space = Space.build(r)
    tables = space.completions()
    unit = space.unit
    assert len(tables) == len(r.offers) + 1
    assert tables[0][-1] == space.size()
    for choice in space.enumerate():
        left = r.global_batch
        for i, c, b in choice:
            assert tables[i][left // unit] > 0
            left -= c * b
        assert left == 0
