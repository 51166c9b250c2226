"""The refresh pipeline against a real MLflow store: runs, versions, aliases, promotion,
load_champion, and that bad input or a failed run never moves the champion."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from srifty_core.errors import ConfigError
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.base import BandwidthPredictor
from srifty_core.predictors.features import BandwidthDataError
from srifty_core.predictors.refresh.config import RefreshConfig
from srifty_core.predictors.refresh.data import holdout_allocations
from srifty_core.predictors.refresh.evaluate import decide
from srifty_core.predictors.refresh.fit import idle_cores, tuning_sample
from srifty_core.predictors.refresh.pipeline import refresh_bandwidth_model
from srifty_core.predictors.refresh.report import format_report
from srifty_core.probing.schema import ProbeSchemaError
from tests.predictors.bw_rows import T0, make_probes, write_store

CONFIG = RefreshConfig(since=None, n_trials=1, n_splits=3, now=T0 + timedelta(days=1))


def _client() -> Any:
    from mlflow.tracking import MlflowClient

    from srifty_core.predictors.registry import EXPERIMENT
    from srifty_core.tracking.store import setup_experiment

    setup_experiment(EXPERIMENT)
    return MlflowClient()


def _versions() -> list[str]:
    from srifty_core.predictors.registry import MODEL_NAME

    try:
        return [str(v.version) for v in _client().search_model_versions(f"name='{MODEL_NAME}'")]
    except Exception:
        return []


def test_refresh_registers_promotes_and_loads(data_dir: Path) -> None:
    from srifty_core.predictors.registry import (
        CHALLENGER,
        CHAMPION,
        alias_version,
        load_champion,
    )

    write_store(allocations=4)
    first = refresh_bandwidth_model(CONFIG)
    assert first.promotion["promote"] and first.promotion["reason"] == "no champion yet"
    assert alias_version(CHAMPION) == alias_version(CHALLENGER) == "1"
    text = format_report(first)
    assert "<=MTU" in text and ">MTU" in text and "g4dn.xlarge" in text and "promoted" in text

    run = _client().get_run(first.promotion["run_id"])
    m = run.data.metrics
    for key in ("cv_mape_small", "cv_mape_large", "noise_floor_small", "noise_floor_large"):
        assert np.isfinite(m[key]), key
    assert "cv_mape_large/g4dn.xlarge" in m and "holdout_mape_all" in m
    assert run.data.params["data_version"] == first.fit["data_version"]
    assert run.data.tags["srifty.promoted"] == "true"
    names = {a.path for a in _client().list_artifacts(run.info.run_id)}
    assert {"busbw_vs_size.png", "error_table.json", "caps.json"} <= names
    # the training rows are the run's dataset input, named by their data version
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.digest == first.fit["data_version"]
    assert {t.key: t.value for t in inp.tags}.get("mlflow.data.context") == "training"
    assert '"busbw"' in inp.dataset.profile or "busbw" in inp.dataset.schema

    champion = load_champion()
    assert isinstance(champion, BandwidthModel) and isinstance(champion, BandwidthPredictor)
    probes = make_probes(allocations=1)
    assert np.all(champion.predict(probes) > 0)
    assert champion.bandwidth_cap("g4dn.xlarge", 2) > 0
    assert champion.mtu == 9001

    # same data again: the same fit as the champion's, and nothing is registered
    second = refresh_bandwidth_model(CONFIG)
    assert second.evaluation["champion_version"] == "1"
    assert second.evaluation["champion"]["all"] == pytest.approx(
        second.evaluation["challenger"]["all"]
    )
    assert not second.promotion["registered"] and not second.promotion["promote"]
    assert "same data" in second.promotion["reason"] and second.promotion["version"] is None
    assert _versions() == ["1"] and alias_version(CHAMPION) == "1"
    assert "no new version" in format_report(second)


def test_worse_challenger_keeps_the_champion(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srifty_core.predictors.refresh import evaluate
    from srifty_core.predictors.registry import CHALLENGER, CHAMPION, alias_version

    write_store(allocations=4)
    refresh_bandwidth_model(CONFIG)
    write_store(allocations=4, seed=1)  # new data: a new version
    real = evaluate.holdout_metrics

    def worse(model: BandwidthModel, holdout: Any, mtu: int) -> dict[str, float]:
        out = real(model, holdout, mtu)
        return {k: v * (1.5 if model.small_params.get("_tag") else 1.0) for k, v in out.items()}

    # make the challenger (and only it) score worse on the held-out rows
    monkeypatch.setattr(evaluate, "holdout_metrics", worse)
    orig_load = BandwidthModel.load

    def tagged(folder: Path) -> BandwidthModel:
        m = orig_load(folder)
        if "models" in str(folder) and "bandwidth" in str(folder):
            m.small_params["_tag"] = True
        return m

    monkeypatch.setattr(BandwidthModel, "load", classmethod(lambda cls, f: tagged(f)))
    out = refresh_bandwidth_model(CONFIG)
    assert not out.promotion["promote"]
    assert "keep champion" in out.promotion["reason"]
    assert alias_version(CHAMPION) == "1" and alias_version(CHALLENGER) == "2"
    run = _client().get_run(out.promotion["run_id"])
    assert run.data.tags["srifty.promoted"] == "false"
    assert run.data.metrics["champion_holdout_mape"] < run.data.metrics["challenger_holdout_mape"]


@pytest.mark.parametrize(
    ("setup", "error"),
    [
        (lambda d: None, "empty"),
        (lambda d: write_store(allocations=1), "allocations"),
        (lambda d: write_store(allocations=3, types=("g4dn.xlarge",), worlds=(2,)), None),
    ],
)
def test_bad_input_registers_nothing(data_dir: Path, setup: Any, error: str | None) -> None:
    setup(data_dir)
    if error is None:  # three allocations of one type: enough
        refresh_bandwidth_model(CONFIG)
        assert _versions() == ["1"]
        return
    with pytest.raises(BandwidthDataError, match=error):
        refresh_bandwidth_model(CONFIG)
    assert _versions() == []


def test_schema_mismatch_registers_nothing(data_dir: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = make_probes(allocations=3).drop(columns=["backend"])
    folder = data_dir / "probes" / "date=2026-03-01" / "provider=ec2" / "instance_type=x"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), folder / "data.parquet")
    with pytest.raises(ProbeSchemaError, match="expected"):
        refresh_bandwidth_model(CONFIG)
    assert _versions() == []


def test_a_failed_run_never_moves_the_champion(data_dir: Path, tmp_path: Path) -> None:
    import shutil

    from srifty_core.predictors.refresh import pipeline
    from srifty_core.predictors.registry import CHAMPION, alias_version

    write_store(allocations=4)
    refresh_bandwidth_model(CONFIG)
    assert alias_version(CHAMPION) == "1"
    write_store(allocations=4, seed=1)  # new data: register would add a version

    def boom(*a: Any, **k: Any) -> None:
        raise RuntimeError("worker lost")

    # the runs that fail after the fit fit the same staged rows: the first fits them for
    # real and the staging folder it leaves is what the later ones start their steps from
    real_fit, fitted = pipeline.tune_and_fit, tmp_path / "fitted"

    def fit_once(folder: Path) -> None:
        if fitted.exists():
            shutil.copytree(fitted, folder, dirs_exist_ok=True)
            return
        real_fit(folder)
        shutil.copytree(folder, fitted)

    # a failure at any step before promotion: v1 stays champion (v2 may be registered as
    # challenger when the failure comes after registration)
    for step in ("tune_and_fit", "evaluate", "register", "promote_or_not"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(pipeline, "tune_and_fit", fit_once)
            mp.setattr(pipeline, step, boom)
            with pytest.raises(RuntimeError, match="worker lost"):
                pipeline.refresh_bandwidth_model(CONFIG)
        assert alias_version(CHAMPION) == "1", step
    assert fitted.exists()  # the fit did run, for the failure in "evaluate"


def test_holdout_rule_is_stable_and_keeps_training_data() -> None:
    df = make_probes(allocations=5)
    held = holdout_allocations(df, 0.2)
    assert held == holdout_allocations(df.sample(frac=1, random_state=1), 0.2)
    for itype in df["instance_type"].unique():
        ids = set(df.loc[df["instance_type"] == itype, "allocation_id"])
        assert ids & set(held) and ids - set(held)
    assert holdout_allocations(make_probes(allocations=2), 0.0001) == []
    # however many hashes fall below the fraction, two allocations per type stay in training
    three = make_probes(allocations=3)
    for itype in three["instance_type"].unique():
        ids = set(three.loc[three["instance_type"] == itype, "allocation_id"])
        assert len(ids - set(holdout_allocations(three, 0.99))) == 2


def test_tuning_sample_takes_the_same_share_of_every_allocation_in_any_order() -> None:
    df = make_probes(allocations=4)
    assert tuning_sample(df, None).all() and tuning_sample(df, len(df)).all()
    keep = tuning_sample(df, len(df) // 4)
    assert abs(keep.sum() - len(df) / 4) < 0.05 * len(df)
    share = df.assign(keep=keep).groupby("allocation_id")["keep"].mean()
    assert share.between(0.15, 0.35).all(), share  # each allocation keeps about a quarter
    shuffled = df.sample(frac=1, random_state=2)
    again = tuning_sample(shuffled, len(df) // 4)
    assert set(shuffled.index[again]) == set(df.index[keep])  # the rows decide, not the order


def test_refresh_tunes_on_a_sample_and_fits_on_every_row(data_dir: Path) -> None:
    write_store(allocations=4)
    out = refresh_bandwidth_model(dataclasses.replace(CONFIG, tune_rows=100))
    for cls in ("small", "large"):
        t = out.fit["tuning"][cls]
        assert t["rows"] > 100 >= t["tuned_rows"] * 0.7 > 0, t
    table = {(r["instance_type"], r["size_class"]): r for r in out.fit["error_table"]}
    tuned = out.fit["tuning"]["small"]["tuned_rows"] + out.fit["tuning"]["large"]["tuned_rows"]
    assert table["all", "small"]["rows"] + table["all", "large"]["rows"] == tuned
    assert np.isfinite(out.evaluation["challenger"]["all"])
    for bad in ({"tune_rows": 0}, {"n_jobs": 0}, {"tune_rows": 1.5}, {"n_jobs": True}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            dataclasses.replace(CONFIG, **bad)


def test_xgboost_takes_the_idle_cores_and_at_least_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for load, want in ((0.1, 2), (0.6, 1), (1.4, 1), (7.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert idle_cores() == want, load
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.2, 3.0, 3.0))
    assert idle_cores() == 13


def test_decide() -> None:
    assert decide(10.0, None, "no champion yet")["promote"]
    assert decide(10.0, 10.0, "")["promote"]
    assert not decide(10.1, 10.0, "")["promote"]
    assert json.dumps(decide(1.0, 2.0, ""))
