"""Slowest-VM compute: sampling and numerical integration agree."""

from __future__ import annotations

import numpy as np
import pytest

from srifty_core.simulator.compute import expected_max, sample_max, sample_max_per_vm


@pytest.mark.parametrize(
    ("mus", "sigmas", "counts"),
    [
        ([0.100], [0.005], [1]),
        ([0.100], [0.005], [64]),
        ([0.100, 0.104], [0.005, 0.002], [16, 8]),
        ([0.050, 0.120, 0.119], [0.001, 0.010, 0.012], [3, 1, 40]),
    ],
)
def test_sampling_and_integration_agree(
    mus: list[float], sigmas: list[float], counts: list[int]
) -> None:
    exact = expected_max(mus, sigmas, counts)
    by_order_stat = sample_max(mus, sigmas, counts, 200_000, np.random.default_rng(1)).mean()
    per_vm = sample_max_per_vm(mus, sigmas, counts, 20_000, np.random.default_rng(2)).mean()
    assert by_order_stat == pytest.approx(exact, rel=2e-4)
    assert per_vm == pytest.approx(exact, rel=1e-3)


def test_known_values() -> None:
    # one normal: its mean; max of two iid standard normals: 1/sqrt(pi)
    assert expected_max([3.0], [0.5], [1]) == pytest.approx(3.0, abs=1e-9)
    assert expected_max([0.0], [1.0], [2]) == pytest.approx(1 / np.sqrt(np.pi), abs=1e-6)
    # more VMs, slower iterations
    assert expected_max([1.0], [0.1], [64]) > expected_max([1.0], [0.1], [8]) > 1.0


def test_sampling_is_seeded() -> None:
    a = sample_max([1.0], [0.1], [4], 100, np.random.default_rng(7))
    b = sample_max([1.0], [0.1], [4], 100, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)


def test_shared_host_factors_follow_processor_sharing() -> None:
    from srifty_core.simulator.compute import shared_host_factors

    def slow(k: int) -> float:
        return {1: 1.0, 2: 1.5, 3: 2.0}[k]

    assert shared_host_factors([1.0, 1.0], slow) == [1.5, 1.5]
    # 1 s and 3 s of work: together 1.5 s, then the big one alone for 2 s more
    assert shared_host_factors([3.0, 1.0], slow) == pytest.approx([3.5 / 3.0, 1.5])
    # three: 1 s at 2x, 1 s more at 1.5x, then 1 s alone
    assert shared_host_factors([1.0, 2.0, 3.0], slow) == pytest.approx([2.0, 3.5 / 2, 4.5 / 3])
