from __future__ import annotations

import numpy as np
import pytest

from srifty_core.errors import ConfigError
from srifty_core.predictors.pooling import partial_pool


def test_keys_that_agree_within_their_errors_all_take_the_pooled_mean() -> None:
    estimates = [(1.0, 0.1), (1.1, 0.1), (1.05, 0.2)]
    mean = partial_pool(estimates)
    w = np.array([100.0, 100.0, 25.0])
    assert mean == pytest.approx(float(np.dot(w, [1.0, 1.1, 1.05]) / w.sum()))
    assert partial_pool(estimates, own=0) == pytest.approx(mean)  # tau^2 = 0


def test_a_precise_key_keeps_its_own_and_a_noisy_one_is_pulled_in() -> None:
    estimates = [(0.9, 0.01), (1.3, 0.01), (1.1, 0.01), (3.0, 1.0)]
    mean = partial_pool(estimates)
    assert 0.9 < mean < 1.3  # the three precise keys truly differ; the noisy one counts little
    assert partial_pool(estimates, own=0) == pytest.approx(0.9, abs=0.001)
    noisy = partial_pool(estimates, own=3)
    assert abs(noisy - mean) < 0.2 * abs(3.0 - mean)


def test_one_estimate_is_itself_and_bad_input_is_named() -> None:
    assert partial_pool([(1.7, 0.5)]) == 1.7
    assert partial_pool([(1.7, 0.5)], own=0) == 1.7
    for bad in ([], [(1.0, 0.0)], [(float("nan"), 0.1)]):
        with pytest.raises(ConfigError, match="partial_pool"):
            partial_pool(bad)
    with pytest.raises(ConfigError, match="own index"):
        partial_pool([(1.0, 0.1)], own=2)
