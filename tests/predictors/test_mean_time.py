"""The mean-time factor: a job adds up mean transfers, the predictors give typical ones.

Right-skewed probe times (a late wake-up, a retransmission) put the mean above the median;
the factor, learned per type and decade of buffer size from the probes' own repeats, turns
the typical bus bandwidth into the mean transfer's, in both predictors and the simulator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.network import MEAN_TIME_RANGE, mean_time_factors
from srifty_core.predictors.table import ProbeTableBandwidth
from tests.predictors.bw_rows import make_probes

SKEWED = [1.0, 1.0, 1.0, 1.0, 5.0]  # mean 1.8 x the median


def rows(times: dict[tuple[str, int, str], list[float]]) -> pd.DataFrame:
    """Grid rows at concurrency 1: ``{(type, buffer bytes, allocation): times}``."""
    out = []
    for (itype, size, alloc), ts in times.items():
        for r, t in enumerate(ts):
            out.append(
                {
                    "instance_type": itype,
                    "world_size": 2,
                    "buffer_bytes": size,
                    "concurrent": 1,
                    "allocation_id": alloc,
                    "repeat": r,
                    "time_s": t * 1e-3,
                    "status": "ok",
                }
            )
    return pd.DataFrame(out)


def test_a_skewed_point_slows_its_decade_and_a_symmetric_one_does_not() -> None:
    f = mean_time_factors(
        rows(
            {
                ("a", 2_000_000, "x"): SKEWED,
                ("a", 20_000_000, "x"): [0.9, 1.0, 1.1],
                ("b", 2_000_000, "x"): [1.0, 1.0],  # too few samples: says nothing
            }
        )
    )
    assert set(f) == {"a"}
    at = f["a"].at([3_000_000, 30_000_000, 300])
    assert at[0] == pytest.approx(1 / 1.8)
    assert at[1] == pytest.approx(1.0)
    assert at[2] == pytest.approx(1 / 1.8)  # below every probed decade: the nearest one's


def test_each_sample_is_taken_against_its_own_allocations_median() -> None:
    # two allocations at different levels, each steady: no skew, whatever the level gap
    f = mean_time_factors(
        rows({("a", 2_000_000, "x"): [1.0, 1.0, 1.0], ("a", 2_000_000, "y"): [3.0, 3.0, 3.0]})
    )
    assert f["a"].at([2_000_000])[0] == pytest.approx(1.0)


def test_the_factor_is_clipped_and_rows_without_times_give_none() -> None:
    f = mean_time_factors(rows({("a", 2_000_000, "x"): [1.0, 1.0, 1.0, 1.0, 100.0]}))
    assert f["a"].at([2_000_000])[0] == pytest.approx(MEAN_TIME_RANGE[0])
    assert mean_time_factors(rows({("a", 2, "x"): SKEWED}).drop(columns="time_s")) == {}
    failed = rows({("a", 2, "x"): SKEWED}).assign(status="failed")
    assert mean_time_factors(failed) == {}


def skew(probes: pd.DataFrame, itype: str) -> pd.DataFrame:
    """Every fifth repeat of ``itype`` five times slower (its busbw likewise)."""
    out = probes.copy()
    slow = (out["instance_type"] == itype) & (out["repeat"] % 5 == 4)
    out.loc[slow, "time_s"] *= 5.0
    out.loc[slow, "busbw"] /= 5.0
    return out


@pytest.fixture(scope="module")
def probes() -> pd.DataFrame:
    base = make_probes(allocations=2, worlds=(2,), concurrency=(1,), repeats=5, repeat_sigma=0.0)
    return skew(base, str(base["instance_type"].iloc[0]))


def test_both_predictors_learn_it_and_the_model_keeps_it(
    probes: pd.DataFrame, tmp_path: Path
) -> None:
    itype = str(probes["instance_type"].iloc[0])
    other = next(t for t in probes["instance_type"].unique() if t != itype)
    sizes = np.asarray([1 << 20, 64 << 20], dtype=float)
    table = ProbeTableBandwidth().fit(probes)
    # four steady samples and one 5x: each decade's mean is 1.8x its median
    assert table.mean_time_factors(itype, sizes) == pytest.approx([1 / 1.8, 1 / 1.8])
    assert table.mean_time_factors(other, sizes) == pytest.approx([1.0, 1.0])
    assert table.mean_time_factors("never-probed", sizes) == pytest.approx([1.0, 1.0])
    fast = {"n_estimators": 20, "max_depth": 3}
    model = BandwidthModel(small_params=fast, large_params=fast).fit(probes)
    assert model.mean_time_factors(itype, sizes) == pytest.approx([1 / 1.8, 1 / 1.8])
    loaded = BandwidthModel.load(model.save(tmp_path / "m"))
    assert loaded.mean_time_factors(itype, sizes) == pytest.approx([1 / 1.8, 1 / 1.8])
    assert loaded.mean_time_factors(other, sizes) == pytest.approx([1.0, 1.0])
