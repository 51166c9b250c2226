"""Probes of mixed-type rings: every per-type fit ignores them, and both predictors learn
from them the mixed-ring factor (measured over what the member types compose to)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.features import BandwidthDataError, check_training_data
from srifty_core.predictors.refresh.data import check_refresh_data, holdout_allocations
from srifty_core.predictors.table import ProbeTableBandwidth
from tests.predictors.bw_rows import SIZES, make_mix_rows, make_probes

FAST = {"n_estimators": 40, "max_depth": 4}
SMALLER = tuple(s for s in SIZES if s <= 1 << 20)


@pytest.fixture(scope="module")
def probes() -> pd.DataFrame:
    # world 16 and 4: the rings of 4 VMs the mix's member types are asked about
    return make_probes(allocations=3, worlds=(2, 4, 16), concurrency=(1, 2))


def table_busbw(p: ProbeTableBandwidth) -> Callable[[str, int, int], float]:
    def busbw(itype: str, world: int, size: int) -> float:
        q = pd.DataFrame(
            {
                "instance_type": [itype],
                "world_size": [world],
                "concurrent": [1],
                "buffer_bytes": [size],
            }
        )
        return float(p.predict(q)[0])

    return busbw


def model_busbw(m: BandwidthModel, probes: pd.DataFrame) -> Callable[[str, int, int], float]:
    def busbw(itype: str, world: int, size: int) -> float:
        row = probes[probes.instance_type == itype].head(1)
        return float(m.predict(row.assign(world_size=world, buffer_bytes=size, concurrent=1))[0])

    return busbw


def test_table_fits_ignore_mix_rows_and_learn_the_factor(probes: pd.DataFrame) -> None:
    alone = ProbeTableBandwidth().fit(probes)
    mixed = make_mix_rows(table_busbw(alone), 0.5)
    both = ProbeTableBandwidth().fit(pd.concat([probes, mixed], ignore_index=True))
    assert both.curves_.keys() == alone.curves_.keys()
    for k, (xs, ys) in alone.curves_.items():
        np.testing.assert_array_equal(both.curves_[k][0], xs)
        np.testing.assert_array_equal(both.curves_[k][1], ys)
    assert both.caps_ == alone.caps_ and both.sigmas_ == alone.sigmas_
    assert both.sustained_ == alone.sustained_ and both.factors_ == alone.factors_
    for size in SIZES:
        assert both.mixed_factor(size) == pytest.approx(0.5)
    np.testing.assert_allclose(both.mixed_factors(np.asarray(SIZES)), 0.5)
    assert alone.mixed_factor(1 << 20) == 1.0  # no mix probed: the composition as it is
    # a ring measured faster than its members compose to is trusted only up to 1.5x
    fast = ProbeTableBandwidth().fit(
        pd.concat([probes, make_mix_rows(table_busbw(alone), 3.0)], ignore_index=True)
    )
    assert fast.mixed_factor(64 << 20) == 1.5


def test_sustained_mix_rows_are_compared_with_the_sustained_composition(
    probes: pd.DataFrame,
) -> None:
    """A sustained ring row is judged against each member's prediction times its sustained
    factor: measured exactly there, its size class gets 1, while burst rows at half the
    burst composition give 0.5 to theirs."""
    top = probes[(probes.buffer_bytes == max(SIZES)) & (probes.concurrent == 1)]
    held = top.assign(phase="sustained", busbw=top["busbw"] / 4)
    per_type = pd.concat([probes.assign(phase="burst"), held], ignore_index=True)
    alone = ProbeTableBandwidth().fit(per_type)
    assert alone.sustained_factor("g4dn.xlarge", 4) == pytest.approx(0.25, rel=0.05)
    burst = table_busbw(alone)

    def sustained(itype: str, world: int, size: int) -> float:
        return burst(itype, world, size) * alone.sustained_factor(itype, world)

    rows = [
        make_mix_rows(burst, 0.5, sizes=SMALLER),
        make_mix_rows(sustained, 1.0, sizes=(max(SIZES),), phase="sustained"),
    ]
    fit = ProbeTableBandwidth().fit(pd.concat([per_type, *rows], ignore_index=True))
    assert fit.mixed_factor(max(SIZES)) == pytest.approx(1.0)
    assert fit.mixed_factor(1 << 20) == pytest.approx(0.5)


def test_xgboost_fit_ignores_mix_rows_and_keeps_the_factor(
    probes: pd.DataFrame, tmp_path: Path
) -> None:
    alone = BandwidthModel(small_params=FAST, large_params=FAST).fit(probes)
    mixed = make_mix_rows(model_busbw(alone, probes), 0.5)
    both = BandwidthModel(small_params=FAST, large_params=FAST).fit(
        pd.concat([probes, mixed], ignore_index=True)
    )
    np.testing.assert_allclose(both.predict(probes), alone.predict(probes), rtol=1e-6)
    assert both.caps_.by_type == alone.caps_.by_type and both.caps_.rated == alone.caps_.rated
    assert both.caps_.sigmas == alone.caps_.sigmas
    for size in SIZES:
        assert both.mixed_factor(size) == pytest.approx(0.5, rel=1e-6)
    assert alone.mixed_factor(1 << 20) == 1.0
    # saved with the caps; a model saved before mixes existed loads with none (factor 1)
    folder = both.save(tmp_path / "m")
    back = BandwidthModel.load(folder)
    assert back.caps_.mixed == both.caps_.mixed
    assert back.mixed_factor(64 << 20) == pytest.approx(0.5)
    meta = json.loads((folder / "model.json").read_text())
    del meta["caps"]["mixed"]
    (folder / "model.json").write_text(json.dumps(meta))
    assert BandwidthModel.load(folder).mixed_factor(64 << 20) == 1.0


def test_training_checks_and_holdouts_leave_mix_rows_out(probes: pd.DataFrame) -> None:
    alone = ProbeTableBandwidth().fit(probes)
    mixed = make_mix_rows(table_busbw(alone), 0.5, allocations=3)
    with pytest.raises(BandwidthDataError, match="only mixed-type rings"):
        check_training_data(mixed)
    data = pd.concat([probes, mixed], ignore_index=True)
    check_refresh_data(data, 9001)
    held = holdout_allocations(data, 0.5)
    assert held and not any("+" in a for a in held)
    assert held == holdout_allocations(probes, 0.5)
    two = probes[probes.allocation_id.str.endswith("-0")]  # one allocation of each type
    with pytest.raises(BandwidthDataError, match=r"need probes from >= 3 allocations"):
        check_refresh_data(pd.concat([two, mixed], ignore_index=True), 9001)


def test_both_predictors_know_which_mixes_they_probed_and_how_far_mixes_stray(
    probes: pd.DataFrame, tmp_path: Path
) -> None:
    """A mix the probes hold adds no spread; one they never held adds how far a probed mix
    left out of the fit strays from what the others teach (two mixes at 0.5 and 1.0 of
    their composition: each predicted by the other, log 2 off), 0 with one probed mix
    (nothing measured a spread); both predictors agree; a model saved before mixes were
    recorded cannot say."""
    table = ProbeTableBandwidth().fit(probes)
    model = BandwidthModel(small_params=FAST, large_params=FAST).fit(probes)
    members = ("g4dn.12xlarge", "g4dn.xlarge")
    never = ("g4dn.xlarge", "p3.2xlarge")
    one = make_mix_rows(table_busbw(table), 0.5)
    other = make_mix_rows(table_busbw(table), 1.0, mix={"g4dn.12xlarge": 2, "g4dn.xlarge": 2})
    t1 = ProbeTableBandwidth().fit(pd.concat([probes, one], ignore_index=True))
    assert t1.unprobed_mix_sigma(members) is None and t1.unprobed_mix_sigma(members[:1]) is None
    assert t1.unprobed_mix_sigma(never) == 0.0
    t2 = ProbeTableBandwidth().fit(pd.concat([probes, one, other], ignore_index=True))
    spread = float(np.log(2.0))
    assert t2.unprobed_mix_sigma(never) == pytest.approx(spread, rel=1e-6)

    busbw = model_busbw(model, probes)
    both = pd.concat(
        [probes, make_mix_rows(busbw, 0.5),
         make_mix_rows(busbw, 1.0, mix={"g4dn.12xlarge": 2, "g4dn.xlarge": 2})],
        ignore_index=True,
    )  # fmt: skip
    m2 = BandwidthModel(small_params=FAST, large_params=FAST).fit(both)
    assert m2.unprobed_mix_sigma(members) is None
    assert m2.unprobed_mix_sigma(never) == pytest.approx(spread, rel=1e-3)
    assert model.unprobed_mix_sigma(members) == 0.0  # no mix probed at all: named, no spread
    folder = m2.save(tmp_path / "m")
    assert BandwidthModel.load(folder).unprobed_mix_sigma(never) == pytest.approx(spread, rel=1e-3)
    meta = json.loads((folder / "model.json").read_text())
    del meta["caps"]["mixed_probed"]
    (folder / "model.json").write_text(json.dumps(meta))
    assert BandwidthModel.load(folder).unprobed_mix_sigma(never) is None
