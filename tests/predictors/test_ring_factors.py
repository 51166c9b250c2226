"""The mixed-ring factor as a function of the ring (issue 52 item 2): a level per buffer
decade and slopes on the ring's features, learned from probed mixes, chosen by leaving
whole mixes out, so that a mix never probed is predicted by what its structure says."""

from __future__ import annotations

import numpy as np

from srifty_core.predictors.mixed_rings import (
    MIXED_FACTOR_MAX,
    RING_FEATURES,
    fit_ring_factors,
    ring_features,
)

SIZES = np.array([1e3, 1e5, 1e6, 1e8])


def test_ring_features_describe_what_differs_between_members() -> None:
    np.testing.assert_allclose(ring_features([1, 4], [25.0, 50.0], 8), [2.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(ring_features([1, 1, 8], [None, 100.0, 12.5], 16), [3, 3, 1, 1])
    np.testing.assert_allclose(ring_features([2, 2], [None, None], 2), [0, 0, 0, -2])
    # clipped to the ranges the pruning bound covers
    assert ring_features([1, 64], [1.0, 3200.0], 1 << 20).tolist() == [3.0, 7.0, 0.0, 7.0]


def _mixes(
    rings: list[tuple[list[float], float]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    labels, sizes, y, x = [], [], [], []
    for k, (features, ratio) in enumerate(rings):
        for s in SIZES:
            labels.append(f"mix{k}")
            sizes.append(s)
            y.append(np.log(ratio))
            x.append(features)
    return np.array(labels), np.array(sizes), np.array(y), np.array(x, dtype=float)


# rings whose members differ in GPUs per VM ran at half their composition, the others at
# all of it, whatever their links and sizes
TRAIN = [
    ([2, 1, 0, 0], 0.5), ([0, 1, 0, 0], 1.0), ([2, 0, 0, 1], 0.5),
    ([0, 0, 0, 1], 1.0), ([3, 2, 0, -1], 0.5), ([0, 2, 0, -1], 1.0),
]  # fmt: skip


def test_a_never_probed_mix_gets_the_factor_its_structure_says() -> None:
    rings = fit_ring_factors(*_mixes(TRAIN), probed=("a+b",))
    assert rings.slopes and rings.slopes["gpu_spread"] < 0
    spread = rings.at(SIZES, np.array([2.0, 1.5, 0.0, 0.5]))
    alike = rings.at(SIZES, np.array([0.0, 1.5, 0.0, 0.5]))
    np.testing.assert_allclose(spread, 0.5, rtol=0.15)
    np.testing.assert_allclose(alike, 1.0, rtol=0.15)
    one_level = fit_ring_factors(*_mixes(TRAIN[:2]), probed=())  # 2 mixes: no slopes
    assert not one_level.slopes
    np.testing.assert_allclose(one_level.at(SIZES, np.array([2.0, 1, 0, 0])), np.sqrt(0.5))
    # held out, a mix strays little from what the others teach (one level for all: log
    # sqrt 2 at best)
    assert rings.sigma is not None and rings.sigma < 0.5 * np.log(np.sqrt(2.0))


def test_the_bound_holds_for_any_ring() -> None:
    rings = fit_ring_factors(*_mixes(TRAIN), probed=())
    rng = np.random.default_rng(0)
    lo, hi = np.array(list(RING_FEATURES.values())).T
    bound = rings.bound(SIZES)
    for _ in range(200):
        x = rng.uniform(lo - 1, hi + 1)
        gpus = [1.0, 2.0 ** min(x[0], 6)]
        f = ring_features(gpus, [10.0, 10.0 * 2.0 ** max(x[1], 0)], int(8 * 2.0 ** x[3]))
        assert np.all(rings.at(SIZES, f) <= bound * (1 + 1e-12))
    assert np.all(bound <= MIXED_FACTOR_MAX)
