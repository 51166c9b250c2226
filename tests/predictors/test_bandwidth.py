"""The bus-bandwidth model: contract, size classes, positivity, unseen categories, caps,
grouped CV, the noise floor, seeded tuning, persistence, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from srifty_core.errors import ConfigError
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.base import FEATURE_COLUMNS, BandwidthPredictor
from srifty_core.predictors.caps import BandwidthCaps, _catalog_rated_bytes
from srifty_core.predictors.features import (
    BUSBW_FLOOR,
    BandwidthDataError,
    check_training_data,
    feature_frame,
    size_masks,
)
from srifty_core.predictors.metrics import group_kfold, mape, noise_floor_predictions
from srifty_core.predictors.prior import hardware_of
from srifty_core.predictors.regressor import BusBandwidthRegressor
from srifty_core.predictors.tuning import DEFAULT_PARAMS, SearchSpace, tune
from tests.predictors.bw_rows import make_probes, true_busbw

FAST = {"n_estimators": 40, "max_depth": 4}


@pytest.fixture(scope="module")
def probes() -> pd.DataFrame:
    return make_probes(allocations=3)


@pytest.fixture(scope="module")
def model(probes: pd.DataFrame) -> BandwidthModel:
    return BandwidthModel(small_params=FAST, large_params=FAST).fit(probes)


def test_it_is_a_bandwidth_predictor(model: BandwidthModel) -> None:
    assert isinstance(model, BandwidthPredictor)


def test_two_regressors_split_at_the_mtu(probes: pd.DataFrame, model: BandwidthModel) -> None:
    assert model.mtu == 9001
    assert isinstance(model.small_, BusBandwidthRegressor)
    assert model.small_ is not model.large_
    rows = probes[probes["buffer_bytes"].isin([8192, 65536])].head(40)
    small = rows["buffer_bytes"] <= 9001
    p = model.predict(rows)
    np.testing.assert_allclose(p[small.to_numpy()], model.small_.predict(rows[small]))
    np.testing.assert_allclose(p[~small.to_numpy()], model.large_.predict(rows[~small]))
    other = BandwidthModel(mtu=100_000, small_params=FAST, large_params=FAST).fit(probes)
    assert size_masks(rows, other.mtu)["small"].all()


def test_sklearn_style(probes: pd.DataFrame) -> None:
    reg = BusBandwidthRegressor(max_depth=3, n_estimators=10)
    assert reg.get_params()["max_depth"] == 3
    assert not hasattr(reg, "booster_")
    assert reg.fit(probes, probes["busbw"]) is reg
    assert reg.n_features_in_ > 0 and hasattr(reg, "encoder_")
    assert reg.set_params(max_depth=4).max_depth == 4
    with pytest.raises(Exception, match="unknown parameter"):
        reg.set_params(depth=4)


def test_fits_the_curve_and_predicts_positive(probes: pd.DataFrame, model: BandwidthModel) -> None:
    p = model.predict(probes)
    assert np.all(p >= BUSBW_FLOOR) and np.all(np.isfinite(p))
    assert mape(p, probes["busbw"]) < 15
    q = probes.iloc[:1].copy()
    q["buffer_bytes"] = 4  # smaller than anything probed
    assert model.predict(q)[0] > 0


def test_unseen_instance_type_falls_back_on_numeric_features(model: BandwidthModel) -> None:
    base = {
        "provider": "ec2",
        "cloud": "aws",
        "region": "us-west-2",
        "zone": "usw2-az9",
        "instance_type": "g5.xlarge",
        "gpu_model": "A10G",
        "gpus_per_vm": 1,
        "vcpus": 4,
        "network_gbps": 10.0,
        "placement_group": True,
        "world_size": 2,
        "buffer_bytes": 64 << 20,
        "concurrent": 1,
        "backend": "nccl",
    }
    slow = {**base, "network_gbps": 5.0, "vcpus": 4, "gpus_per_vm": 1}
    fast = {**base, "network_gbps": 50.0, "vcpus": 48, "gpus_per_vm": 4}
    p = model.predict(feature_frame([slow, fast, {**base, "network_gbps": None}]))
    assert np.all(np.isfinite(p)) and np.all(p > 0)
    assert p[1] > 3 * p[0]  # follows the rated bandwidth it never saw with this name


def test_missing_feature_column_is_named(model: BandwidthModel, probes: pd.DataFrame) -> None:
    with pytest.raises(BandwidthDataError, match="world_size"):
        model.predict(probes.drop(columns=["world_size"]))


def test_caps_rule(probes: pd.DataFrame, model: BandwidthModel) -> None:
    caps = model.caps_
    big = probes[(probes["instance_type"] == "g4dn.xlarge") & (probes["world_size"] == 2)]
    big = big[big["buffer_bytes"] >= 1 << 20]
    per_alloc = (
        (big["concurrent"] * big["busbw"])
        .groupby([big["allocation_id"], big["buffer_bytes"], big["concurrent"]])
        .median()
        .groupby(level=0)
        .max()
    )
    assert model.bandwidth_cap("g4dn.xlarge", 2) == pytest.approx(np.quantile(per_alloc, 0.95))
    # nearest world size; beyond the largest: the largest's
    assert caps.cap("g4dn.xlarge", 3) == caps.cap("g4dn.xlarge", 4)
    assert caps.cap("g4dn.xlarge", 64) == caps.cap("g4dn.xlarge", 4)
    # the cap covers a single transfer at the top of the curve
    assert caps.cap("g4dn.xlarge", 2) >= 0.9 * true_busbw("g4dn.xlarge", 64 << 20, 2, 1)
    # a type never probed on a side of the VM boundary: its rated link there x the median
    # cap/rated ratio of the probed types of that side (across VMs the NIC: g4dn.xlarge;
    # inside one VM its PCIe: g4dn.12xlarge, probed at 2 and 4 of its 4 GPUs); not in the
    # catalog either: the smallest cap probed on that side
    across = {t: max(m.values()) for t, m in caps.by_type.across.items()}
    inside = {t: max(m.values()) for t, m in caps.by_type.one_vm.items()}
    assert set(across) == {"g4dn.xlarge"} and set(inside) == {"g4dn.12xlarge"}
    ratio = float(np.median([across[t] / caps.rated[t] for t in across]))
    rated = _catalog_rated_bytes("g5.xlarge")
    assert rated is not None
    assert caps.cap("g5.xlarge", 2) == pytest.approx(ratio * rated)
    assert caps.cap("g4dn.12xlarge", 8) == pytest.approx(ratio * caps.rated["g4dn.12xlarge"])
    pcie = {t: hardware_of(t).intra_gbs * 1e9 for t in ("g4dn.12xlarge", "g5.12xlarge")}  # type: ignore[union-attr]
    expected = inside["g4dn.12xlarge"] / pcie["g4dn.12xlarge"] * pcie["g5.12xlarge"]
    assert caps.cap("g5.12xlarge", 4) == pytest.approx(expected)
    assert caps.cap("no-such.type", 2) == min(across.values())
    assert BandwidthCaps.from_dict(caps.to_dict()) == caps


def test_caps_and_sustained_factors_keep_one_vm_and_across_vms_apart() -> None:
    """A ring inside one VM (NVLink or PCIe) and one across VMs (the NICs) are different
    links: a one-VM query never takes a cap or a sustained factor measured across VMs,
    even where that world size is the nearer one, nor the other way round; the probe
    table too. A model saved before the two were kept apart splits its caps by the
    catalog (ranks packed one per GPU)."""
    from srifty_core.predictors.table import ProbeTableBandwidth

    # g4dn.12xlarge (4 GPUs): 2 ranks on one VM, 5 ranks on two; inside ten times faster
    grid = make_probes(types=("g4dn.12xlarge",), worlds=(2, 5), allocations=2)
    grid["busbw"] = np.where(grid["world_size"] == 2, 10.0, 1.0) * grid["busbw"]
    top = grid[(grid["buffer_bytes"] == grid["buffer_bytes"].max()) & (grid["world_size"] == 5)]
    held = top[top["concurrent"] == 1].assign(phase="sustained")
    held["busbw"] = held["busbw"] / 4
    data = pd.concat([grid.assign(phase="burst"), held], ignore_index=True)
    m = BandwidthModel(small_params={"n_estimators": 5}, large_params={"n_estimators": 5})
    m.fit(data)
    name = "g4dn.12xlarge"
    # one VM: never the NICs' cap, though 5 ranks are nearer to 4 than 2 are
    assert m.bandwidth_cap(name, 4) > 5 * m.bandwidth_cap(name, 8)
    assert m.sustained_factor(name, 4) == 1.0  # no NIC, no burst credits to spend
    assert m.sustained_factor(name, 8) == pytest.approx(0.25, rel=0.05)
    one_vm = m.caps_.by_type.one_vm[name]
    assert set(one_vm) == {2} and set(m.caps_.by_type.across[name]) == {5}
    assert m.bandwidth_cap(name, 4) == one_vm[2]
    assert m.bandwidth_cap(name, 8) == pytest.approx(float(held["busbw"].median()), rel=0.2)
    table = ProbeTableBandwidth().fit(data)
    assert table.bandwidth_cap(name, 4) > 5 * table.bandwidth_cap(name, 8)
    assert table.sustained_factor(name, 4) == 1.0
    query = feature_frame(
        [{**data.iloc[0].to_dict(), "world_size": n, "buffer_bytes": 64 << 20, "concurrent": 1}
         for n in (4, 8)]
    )  # fmt: skip
    inside, across = table.predict(query)
    assert inside > 5 * across
    old = {"by_type": {name: {"2": 1.0, "4": 2.0, "8": 3.0}}, "quantile": 0.95,
           "min_buffer": 1 << 20}  # fmt: skip
    caps = BandwidthCaps.from_dict(old)
    assert caps.by_type.one_vm == {name: {2: 1.0, 4: 2.0}}
    assert caps.by_type.across == {name: {8: 3.0}}


def test_save_and_load_round_trip(
    tmp_path: Path, probes: pd.DataFrame, model: BandwidthModel
) -> None:
    model.save(tmp_path / "m")
    again = BandwidthModel.load(tmp_path / "m")
    np.testing.assert_allclose(again.predict(probes), model.predict(probes))
    assert again.bandwidth_cap("g4dn.12xlarge", 2) == model.bandwidth_cap("g4dn.12xlarge", 2)
    assert again.mtu == model.mtu


def test_group_kfold_keeps_groups_together() -> None:
    groups = np.array(["a"] * 5 + ["b"] * 3 + ["c"] * 4 + ["d"] * 2)
    folds = group_kfold(groups, 3)
    assert len(folds) == 3
    seen: list[str] = []
    for train, test in folds:
        assert not set(groups[train]) & set(groups[test])
        seen += list(set(groups[test]))
    assert sorted(seen) == ["a", "b", "c", "d"]
    with pytest.raises(BandwidthDataError):
        group_kfold(np.array(["a", "a"]), 2)


def test_noise_floor_uses_other_allocations_only() -> None:
    df = pd.DataFrame(
        {c: ["x"] * 4 for c in FEATURE_COLUMNS}
        | {"busbw": [1.0, 2.0, 4.0, 8.0], "allocation_id": ["a", "b", "c", "c"]}
    )
    df.loc[3, "buffer_bytes"] = "other"  # a configuration measured on one allocation only
    pred = noise_floor_predictions(df)
    assert np.isnan(pred[3])
    assert pred[0] in (2.0, 4.0) and pred[2] in (1.0, 2.0)
    # the model cannot do better than allocation noise: MAPE of the floor is > 0
    probes = make_probes(allocations=3, alloc_sigma=0.2)
    floor = noise_floor_predictions(probes)
    assert 5 < mape(floor, probes["busbw"]) < 40


def test_sample_weights_decay_stale_probes(probes: pd.DataFrame) -> None:
    old = probes.copy()
    new = probes.copy()
    new["busbw"] *= 2  # the network got faster
    both = pd.concat([old, new], ignore_index=True)
    w = np.r_[np.full(len(old), 1 / 64), np.ones(len(new))]  # six half-lives apart
    m = BusBandwidthRegressor(**FAST).fit(both, both["busbw"], w)
    ratio = np.median(m.predict(probes) / probes["busbw"])
    assert 1.7 < ratio < 2.1


SMALL_SPACE = SearchSpace(max_depth=(2, 6), n_estimators=(20, 200))
"""A search space that keeps the tests fast (it holds the default parameters)."""


def test_tuning_twice_with_a_seed_gives_the_same_params_and_error(probes: pd.DataFrame) -> None:
    large = probes[probes["buffer_bytes"] > 9001].reset_index(drop=True)
    a = tune(large, n_trials=4, seed=3, n_splits=3, space=SMALL_SPACE)
    b = tune(large, n_trials=4, seed=3, n_splits=3, space=SMALL_SPACE)
    assert len(a.trials) == 4  # a trial count, not a clock
    assert [t.params for t in a.trials] == [t.params for t in b.trials]
    assert a.best_params == b.best_params and a.best_mape == b.best_mape
    np.testing.assert_array_equal(a.oof, b.oof)
    assert a.trials[0].params == DEFAULT_PARAMS  # the defaults are always tried first
    assert a.best_mape == min(t.mape for t in a.trials if not t.pruned)
    assert a.best_mape == pytest.approx(mape(a.oof, large["busbw"]))
    assert a.n_splits == 3
    other = tune(large, n_trials=4, seed=4, n_splits=3, space=SMALL_SPACE)
    assert [t.params for t in other.trials][1:] != [t.params for t in a.trials][1:]
    with pytest.raises(ConfigError, match="n_trials"):
        tune(large, n_trials=0)
    with pytest.raises(BandwidthDataError, match="group column 'run'"):
        tune(large, n_trials=1, group="run")


def test_pruning_stops_bad_trials_early_and_never_picks_one(probes: pd.DataFrame) -> None:
    """MedianPruner: after PRUNE_STARTUP completed trials, a trial whose score on its first
    folds is worse than the earlier trials' median there stops; the best is a completed
    trial, and the trials before pruning starts are those of an unpruned search."""
    from srifty_core.predictors.tuning import PRUNE_STARTUP

    large = probes[probes["buffer_bytes"] > 9001].reset_index(drop=True)
    pruned = tune(large, n_trials=14, seed=1, n_splits=4, space=SMALL_SPACE)
    full = tune(large, n_trials=14, seed=1, n_splits=4, space=SMALL_SPACE, prune=False)
    assert len(pruned.trials) == len(full.trials) == 14
    assert any(t.pruned for t in pruned.trials) and not any(t.pruned for t in full.trials)
    assert not any(t.pruned for t in pruned.trials[:PRUNE_STARTUP])
    assert [t.mape for t in pruned.trials[:PRUNE_STARTUP]] == [
        t.mape for t in full.trials[:PRUNE_STARTUP]
    ]
    best = [t for t in pruned.trials if t.mape == pruned.best_mape]
    assert best and not best[0].pruned
    assert pruned.best_mape == pytest.approx(mape(pruned.oof, large["busbw"]))
    again = tune(large, n_trials=14, seed=1, n_splits=4, space=SMALL_SPACE)
    assert [(t.params, t.mape, t.pruned) for t in again.trials] == [
        (t.params, t.mape, t.pruned) for t in pruned.trials
    ]


def test_tuning_fits_each_folds_prior_once_and_predicts_as_without_sharing(
    probes: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The physics prior depends on a fold's rows, not on a trial's parameters: 3 trials
    over 3 folds fit it 3 times (not 9), and the out-of-fold predictions are those of
    trials that each fit their own."""
    from srifty_core.predictors import prior as prior_module
    from srifty_core.predictors.tuning import Folds, cross_val_predict

    large = probes[probes["buffer_bytes"] > 9001].reset_index(drop=True)
    fits = []
    real_fit = prior_module.LinkPrior.fit

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        fits.append(1)
        return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(prior_module.LinkPrior, "fit", counted)
    tune(large, n_trials=3, seed=3, n_splits=3, space=SMALL_SPACE)
    assert len(fits) == 3
    groups = large["allocation_id"].astype(str).to_numpy()
    y = large["busbw"].to_numpy(dtype=float)
    folds = Folds(large, y, np.ones(len(large)), groups, 3)
    for params in (DEFAULT_PARAMS, {**DEFAULT_PARAMS, "max_depth": 3, "n_estimators": 40}):
        shared = cross_val_predict(params, large, groups=groups, n_splits=3, folds=folds)
        alone = np.full(len(large), np.nan)  # each fold fitted and predicted from scratch
        for train, test in folds.splits:
            reg = BusBandwidthRegressor(**params).fit(large.iloc[train], y[train])
            alone[test] = reg.predict(large.iloc[test])
        np.testing.assert_array_equal(shared, alone)


def test_merged_rows_train_the_same_squared_error_trees() -> None:
    """Rows of one feature row merge into their weighted mean with their summed weight:
    for squared error XGBoost's gradients and hessians sum to the same, so the trees
    trained on the merged rows predict what those trained on every row do."""
    import xgboost as xgb

    from srifty_core.predictors.prior import distinct_rows
    from srifty_core.predictors.regressor import merge_rows

    rng = np.random.default_rng(0)
    points = rng.integers(0, 4, size=(40, 3)).astype(np.float32)
    points[:5, 2] = np.nan  # a missing value is a value like any other here
    repeats = rng.integers(1, 6, size=len(points))
    features = np.repeat(points, repeats, axis=0)
    label = features[:, 0] - np.nan_to_num(features[:, 1]) + rng.normal(0, 0.3, len(features))
    weight = rng.uniform(0.5, 2.0, len(features))
    merged, mean, total = merge_rows(features, label, weight)
    first_rows, inverse = distinct_rows(features)
    np.testing.assert_array_equal(features[first_rows][inverse], features)
    assert list(first_rows) == sorted(first_rows)
    assert len(merged) == len({tuple(np.nan_to_num(p, nan=-1)) for p in points})
    np.testing.assert_array_equal(merged[0], features[0])  # in order of first appearance
    first = np.all((features == features[0]) | (np.isnan(features) & np.isnan(features[0])), 1)
    assert total[0] == pytest.approx(weight[first].sum())
    assert mean[0] == pytest.approx(np.average(label[first], weights=weight[first]))
    params = {"objective": "reg:squarederror", "max_depth": 3, "nthread": 1, "base_score": 0.0}
    every = xgb.train(params, xgb.DMatrix(features, label=label, weight=weight), 20)
    fewer = xgb.train(params, xgb.DMatrix(merged, label=mean, weight=total), 20)
    query = xgb.DMatrix(points)
    np.testing.assert_allclose(fewer.predict(query), every.predict(query), rtol=1e-5, atol=1e-6)


def test_cross_validation_never_has_an_allocation_on_both_sides(probes: pd.DataFrame) -> None:
    from sklearn.model_selection import GroupKFold

    groups = probes["allocation_id"].to_numpy()  # 6 allocations (2 types x 3)
    assert len(group_kfold(groups, 10)) == 6  # lowered to the number of allocations
    folds = group_kfold(groups, 4)
    assert len(folds) == 4
    for (train, test), (sk_train, sk_test) in zip(
        folds, GroupKFold(n_splits=4).split(probes, groups=groups), strict=True
    ):
        assert not set(groups[train]) & set(groups[test])
        np.testing.assert_array_equal(test, sk_test)
        np.testing.assert_array_equal(train, sk_train)
    assert sorted(np.concatenate([test for _, test in folds])) == list(range(len(probes)))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda df: df.iloc[0:0], "empty"),
        (lambda df: df.drop(columns=["concurrent"]), "concurrent"),
        (lambda df: df[df["buffer_bytes"] > 9001], "<= MTU"),
        (lambda df: df[df["allocation_id"] == df["allocation_id"].iloc[0]], "allocation"),
        (lambda df: df.assign(busbw=-1.0), "positive"),
        (lambda df: df.assign(world_size="two"), "numeric"),
    ],
)
def test_bad_training_data_is_refused(probes: pd.DataFrame, mutate: object, message: str) -> None:
    with pytest.raises(BandwidthDataError, match=message):
        check_training_data(mutate(probes))  # type: ignore[operator]


def test_sustained_probes_set_the_cap_and_stay_out_of_the_regressors(
    probes: pd.DataFrame,
) -> None:
    """Sustained rows (after burst credits) become the cap; the grid trains the regressors;
    the spread of allocation levels is learned per type."""
    from srifty_core.predictors.table import ProbeTableBandwidth

    top = probes["buffer_bytes"] == probes["buffer_bytes"].max()
    big = probes[top & (probes["concurrent"] == 1)].copy()
    sustained = big.assign(phase="sustained", busbw=big["busbw"] / 4)
    data = pd.concat([probes.assign(phase="burst"), sustained], ignore_index=True)
    m = BandwidthModel(small_params={"n_estimators": 20}, large_params={"n_estimators": 20})
    m.fit(data)
    itype = str(sustained["instance_type"].iloc[0])
    n = int(sustained["world_size"].iloc[0])
    part = sustained[(sustained.instance_type == itype) & (sustained.world_size == n)]
    expected = float(part.groupby("allocation_id")["busbw"].median().median())
    assert m.bandwidth_cap(itype, n) == pytest.approx(expected)
    grid_only = BandwidthModel(small_params={"n_estimators": 20}, large_params={"n_estimators": 20})
    grid_only.fit(probes)
    row = probes[probes["buffer_bytes"] == probes["buffer_bytes"].max()].head(5)
    np.testing.assert_allclose(m.predict(row), grid_only.predict(row), rtol=1e-6)
    assert m.bandwidth_cap(itype, n) < grid_only.bandwidth_cap(itype, n)
    assert m.level_sigma(itype) == pytest.approx(grid_only.level_sigma(itype))
    assert m.level_sigma(itype) > 0
    # sustained over burst at the sustained probe's size: the grid's curve scaled down
    assert m.sustained_factor(itype, n) == pytest.approx(0.25, rel=0.05)
    assert grid_only.sustained_factor(itype, n) == 1.0
    table = ProbeTableBandwidth().fit(data)
    assert table.bandwidth_cap(itype, n) == pytest.approx(expected)
    assert table.sustained_factor(itype, n) == pytest.approx(m.sustained_factor(itype, n))
    assert table.level_sigma(itype) == pytest.approx(m.level_sigma(itype))


def test_caps_and_spread_survive_save_and_load(probes: pd.DataFrame, tmp_path: Path) -> None:
    big = probes[probes["buffer_bytes"] == probes["buffer_bytes"].max()].copy()
    data = pd.concat([probes, big.assign(phase="sustained")], ignore_index=True)
    data["phase"] = data["phase"].fillna("burst")
    m = BandwidthModel(small_params={"n_estimators": 5}, large_params={"n_estimators": 5})
    m.fit(data)
    back = BandwidthModel.load(m.save(tmp_path / "m"))
    itype = str(big["instance_type"].iloc[0])
    assert back.caps_.sustained == m.caps_.sustained and back.caps_.sigmas == m.caps_.sigmas
    assert back.caps_.factors == m.caps_.factors
    assert back.level_sigma(itype) == m.level_sigma(itype)
