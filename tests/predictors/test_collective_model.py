"""The bandwidth model and the probe table per collective, and models saved before the
``collective`` feature existed (a fixture written by the code of that time)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.base import FEATURE_COLUMNS
from srifty_core.predictors.features import CATEGORICAL
from srifty_core.predictors.table import ProbeTableBandwidth
from srifty_core.probing.config import BUSBW_FACTOR
from tests.predictors.bw_rows import make_probes

OLD_MODEL = Path(__file__).parent / "fixtures" / "allreduce_model_v1"
"""A model saved (with ``expected.json``, its predictions of ``query.json``) by the code
before the ``collective`` feature: ``BandwidthModel(small_params=large_params={
"n_estimators": 8, "max_depth": 3}).fit(make_probes(allocations=2, worlds=(2, 4),
concurrency=(1,), repeats=1, seed=3))``."""
SMALL = {"n_estimators": 60, "max_depth": 4}
SLOWER = {"all_reduce": 1.0, "all_gather": 0.6, "reduce_scatter": 0.8}
"""The synthetic truth: each collective's bus bandwidth against the allreduce's."""


def _with_collectives(df: pd.DataFrame) -> pd.DataFrame:
    """Each probe row three times, once per collective, its busbw (and time) scaled by
    ``SLOWER``."""
    parts = []
    for name, k in SLOWER.items():
        part = df.assign(collective=name, busbw=df["busbw"] * k)
        n, s = part["world_size"], part["buffer_bytes"]
        part["time_s"] = BUSBW_FACTOR[name] * s * (n - 1) / (n * part["busbw"])
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def _query(df: pd.DataFrame, collective: str | None) -> pd.DataFrame:
    q = df[df["buffer_bytes"] >= 1 << 20][[c for c in FEATURE_COLUMNS if c != "collective"]]
    q = q.drop_duplicates().reset_index(drop=True)
    return q if collective is None else q.assign(collective=collective)


def test_the_model_learns_each_collective(tmp_path: Path) -> None:
    assert "collective" in FEATURE_COLUMNS and "collective" in CATEGORICAL
    df = _with_collectives(make_probes(allocations=3, concurrency=(1,), seed=1))
    model = BandwidthModel(small_params=SMALL, large_params=SMALL).fit(df)
    ar = model.predict(_query(df, "all_reduce"))
    for name, k in SLOWER.items():
        ratio = model.predict(_query(df, name)) / ar
        assert np.median(ratio) == pytest.approx(k, rel=0.1), name
    # a frame without the column asks about allreduces
    assert model.predict(_query(df, None)).tolist() == ar.tolist()
    # saved and loaded, the same answers
    with_all = pd.concat([_query(df, n) for n in SLOWER], ignore_index=True)
    model.save(tmp_path / "saved")
    assert BandwidthModel.load(tmp_path / "saved").predict(with_all).tolist() == pytest.approx(
        model.predict(with_all).tolist()
    )


def test_caps_come_from_the_allreduce_rows() -> None:
    base = make_probes(allocations=3, concurrency=(1, 2), seed=2)
    alone = BandwidthModel(small_params=SMALL, large_params=SMALL).fit(base)
    both = BandwidthModel(small_params=SMALL, large_params=SMALL).fit(_with_collectives(base))
    for itype in ("g4dn.xlarge", "g4dn.12xlarge"):
        assert both.bandwidth_cap(itype, 4) == alone.bandwidth_cap(itype, 4)


def test_the_probe_table_answers_per_collective() -> None:
    df = _with_collectives(make_probes(allocations=2, concurrency=(1,), seed=4))
    table = ProbeTableBandwidth().fit(df)
    ar = table.predict(_query(df, "all_reduce"))
    assert table.predict(_query(df, None)).tolist() == ar.tolist()
    for name, k in SLOWER.items():
        assert table.predict(_query(df, name)) / ar == pytest.approx(k, rel=1e-9)
    # probed without all-gathers: an all-gather reads the allreduce curve
    only_ar = ProbeTableBandwidth().fit(df[df["collective"] != "all_gather"])
    assert only_ar.predict(_query(df, "all_gather")).tolist() == ar.tolist()


def test_a_model_saved_before_the_feature_loads_and_predicts_as_it_did() -> None:
    old = BandwidthModel.load(OLD_MODEL)
    assert "collective" not in json.loads((OLD_MODEL / "model.json").read_text())["feature_columns"]
    query = pd.read_json(OLD_MODEL / "query.json", orient="records")
    expected = json.loads((OLD_MODEL / "expected.json").read_text())
    assert "collective" not in query.columns
    assert old.predict(query).tolist() == pytest.approx(expected, rel=1e-6)
    # asked with the column, it answers every collective with its allreduce busbw
    for name in SLOWER:
        assert old.predict(query.assign(collective=name)).tolist() == pytest.approx(
            expected, rel=1e-6
        )
    assert old.in_domain(query.assign(collective="all_gather")).all()


def test_a_registered_old_model_is_the_champion_and_predicts(tmp_path: Path) -> None:
    """Through the registry (MLflow) and the champion's local copy, as planning loads it."""
    from srifty_core.predictors.registry import load_champion, log_fit, promote

    folder = tmp_path / "old"
    shutil.copytree(OLD_MODEL, folder)
    _, version = log_fit(
        model_dir=folder,
        params={},
        metrics={},
        tags={"data_version": "dv-old"},
        artifacts={},
        json_artifacts={},
        run_name="old-model",
    )
    promote(version)
    query = pd.read_json(OLD_MODEL / "query.json", orient="records")
    expected = json.loads((OLD_MODEL / "expected.json").read_text())
    for refresh in (True, False):  # from the store, then from the local copy
        champion = load_champion(refresh=refresh)
        assert champion.predict(query).tolist() == pytest.approx(expected, rel=1e-6)
        got = champion.predict(query.assign(collective="reduce_scatter"))
        assert got.tolist() == pytest.approx(expected, rel=1e-6)


def test_a_fit_on_allreduce_probes_is_the_model_the_previous_code_fitted() -> None:
    """The collective feature is constant on allreduce-only probes: the same trees, the same
    predictions as the fixture's, fitted by the code before the feature on the same rows."""
    df = make_probes(allocations=2, worlds=(2, 4), concurrency=(1,), repeats=1, seed=3)
    params = {"n_estimators": 8, "max_depth": 3}
    model = BandwidthModel(small_params=params, large_params=params).fit(df)
    query = pd.read_json(OLD_MODEL / "query.json", orient="records")
    expected = json.loads((OLD_MODEL / "expected.json").read_text())
    # rel 1e-5, not bit for bit: XGBoost's multithreaded histogram sums in whatever order
    # its threads finish, which moved predictions by up to 6e-7 between two runs of the same
    # fit (a fresh-clone run); another tree would move them by percents
    assert model.predict(query).tolist() == pytest.approx(expected, rel=1e-5)
