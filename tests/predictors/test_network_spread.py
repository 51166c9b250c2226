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
    # two keys that differ by chance on three draws each (2x in sd) share one spread
    chance = pooled_spreads({"a": (0.02, 3), "b": (0.04, 3)})
    assert (
        chance["a"]
        == chance["b"]
        == pytest.approx(np.sqrt((0.02**2 + 0.04**2) / 2) * predictive_spread(3, dof=4))
    )
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


def test_evidence_narrows_a_lone_key_and_is_not_returned() -> None:
    # one device profiled on 3 VMs: alone, a Student t on 2 degrees of freedom
    alone = pooled_spreads({"T4": (0.04, 3)})
    assert alone == {"T4": pytest.approx(0.04 * predictive_spread(3))}
    # 12 other profiles of 3 VMs each, spreading 2.5%: 24 more degrees of freedom
    evidence = {f"m{i}/full/A10G": (0.025, 3) for i in range(12)}
    pooled = pooled_spreads({"T4": (0.04, 3)}, evidence)
    assert set(pooled) == {"T4"}
    var = (2 * 0.04**2 + 24 * 0.025**2) / 26
    assert pooled["T4"] == pytest.approx(np.sqrt(var) * predictive_spread(3, dof=26))
    assert pooled["T4"] < 0.6 * alone["T4"]
    # a key far wider than all the evidence keeps its own, and leaves the pool
    wide = pooled_spreads({"T4": (0.3, 3), "V100": (0.025, 3)}, evidence)
    assert wide["T4"] == pytest.approx(0.3 * predictive_spread(3))
    assert wide["V100"] == pytest.approx(0.025 * predictive_spread(3, dof=26))
