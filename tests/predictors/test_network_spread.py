"""The spread of network levels and VM speeds: pooled over types, made predictive."""

from __future__ import annotations

import numpy as np
import pytest

from srifty_core.predictors.network import pooled_spreads, predictive_spread


def test_predictive_spread_widens_few_draws_and_pooled_dof_narrows_it() -> None:
    assert predictive_spread(1) == 0.0
    assert predictive_spread(3) == pytest.approx(1.70, abs=0.01)
    assert predictive_spread(3, dof=20) < 1.2 < predictive_spread(5) < predictive_spread(3)


def test_pooled_spreads_share_the_variance_and_keep_a_wider_type() -> None:
    same = pooled_spreads({"a": (0.05, 3), "b": (0.05, 3), "c": (0.05, 3), "d": (0.05, 3)})
    alone = 0.05 * predictive_spread(3)
    assert same["a"] == pytest.approx(0.05 * predictive_spread(3, dof=8))
    assert same["a"] < 0.75 * alone  # 8 degrees of freedom, not 2
    # a type that spreads much more than the rest keeps at least its own sample spread
    wide = pooled_spreads({"a": (0.01, 3), "b": (0.01, 3), "c": (0.01, 3), "w": (0.2, 3)})
    assert wide["w"] >= 0.2 * np.sqrt(1 + 1 / 3)
    assert wide["a"] < wide["w"]
    # fewer than two draws: no spread, and no part in the pool
    assert pooled_spreads({"a": (0.0, 1), "b": (0.1, 3)}) == {
        "a": 0.0,
        "b": pytest.approx(0.1 * predictive_spread(3)),
    }
    assert pooled_spreads({"a": (0.0, 1)}) == {"a": 0.0}
