"""The physics prior under the bus-bandwidth model: hardware from the catalog, learned link
efficiency and latency, prior-only answers for unprobed types, the domain flag, held-out
error bands, and the error for a type nobody knows."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from srifty_core.errors import UnknownNameError
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.features import feature_frame
from srifty_core.predictors.prior import (
    PCIE_X16_GBS,
    TREE,
    LinkPrior,
    hardware_columns,
    hardware_of,
    one_vm,
    pcie_generation,
)
from srifty_core.predictors.uncertainty import LogErrors
from tests.predictors.bw_rows import make_probes

FAST = {"n_estimators": 40, "max_depth": 4}


def _row(itype: str, world: int, size: int, **extra: object) -> dict[str, object]:
    from srifty_core.catalog import Catalog

    t = Catalog.load().get(itype, "us-east-1")
    return {
        "provider": "ec2-emulated",
        "cloud": "aws",
        "region": "us-east-1",
        "zone": "use1-az1",
        "instance_type": itype,
        "gpu_model": t.gpu_model,
        "gpus_per_vm": t.gpus_per_vm,
        "vcpus": t.vcpus,
        "network_gbps": t.network_gbps,
        "placement_group": False,
        "world_size": world,
        "buffer_bytes": size,
        "concurrent": 1,
        "backend": "nccl",
        **extra,
    }


def test_hardware_comes_from_the_catalog_and_gpu_specs() -> None:
    p4d = hardware_of("p4d.24xlarge")
    assert p4d is not None and p4d.intra_class == "nvlink" and p4d.net_class == "efa"
    assert p4d.intra_gbs == pytest.approx(300.0)  # 600 GB/s both directions, per GPU
    assert p4d.nic_gbs == pytest.approx(400 / 8)
    g4 = hardware_of("g4dn.xlarge")
    assert g4 is not None and g4.intra_class == "pcie"
    assert g4.intra_gbs == PCIE_X16_GBS[3]
    assert g4.nic_gbs is not None and g4.nic_gbs >= 25 / 8  # "up to 25 Gbps": the burst rate
    assert hardware_of("local.cpu") is None
    assert pcie_generation("PCIe 3.0 x16") == 3
    assert pcie_generation("PCIe Gen5 (128 GB/s)") == 5
    assert pcie_generation("") is None


def test_ranks_are_packed_one_per_gpu_unless_the_table_says_how_many_nodes() -> None:
    rows = pd.DataFrame(
        [_row("p3.8xlarge", 4, 1024), _row("p3.8xlarge", 8, 1024), _row("p3.8xlarge", 2, 1024)]
    )
    hw = hardware_columns(rows)
    assert hw["vms"].tolist() == [1, 2, 1]
    assert hw["ranks_per_vm"].tolist() == [4, 4, 2]
    # a public table of 2 nodes x 1 GPU: two VMs of one rank each
    nodes = hardware_columns(
        rows.assign(num_nodes=[pd.NA, pd.NA, 2]).astype({"num_nodes": "Int64"})
    )
    assert nodes["vms"].tolist() == [1, 2, 2]
    assert nodes["ranks_per_vm"].tolist() == [4, 4, 1]
    # a query by type and world size alone: inside one VM while its GPUs hold every rank
    assert [one_vm("p3.8xlarge", n) for n in (2, 4, 8)] == [True, True, False]
    assert not one_vm("g4dn.xlarge", 2) and not one_vm("local.cpu", 2)
    assert hardware_of("p3.8xlarge").gpus_per_vm == 4  # type: ignore[union-attr]


def _ring_rows(eta: float, alpha: float) -> tuple[pd.DataFrame, np.ndarray]:
    """Rows of g4dn.xlarge rings whose bus bandwidth follows the prior's own form."""
    rows = pd.DataFrame(
        [_row("g4dn.xlarge", n, s) for n in (2, 4, 8) for s in (8, 1024, 65536, 1 << 20, 1 << 26)]
    )
    hw = hardware_columns(rows)
    n = hw["world_size"].to_numpy(float)
    s = hw["buffer_bytes"].to_numpy(float)
    s_eff = 2 * s * (n - 1) / n
    bw = eta * hw["nic_gbs"].to_numpy() * 1e9
    t = 2 * (n - 1) / n * n * alpha + s_eff / bw  # one rank per VM: n NIC hops a pass
    return rows, s_eff / t


def test_the_prior_learns_the_efficiency_and_latency_it_was_shown() -> None:
    rows, busbw = _ring_rows(eta=0.6, alpha=30e-6)
    prior = LinkPrior().fit(rows, busbw)
    params = prior.params()
    assert params["eta"]["ena"] == pytest.approx(0.6, rel=0.05)
    assert params["alpha_s"]["ena"] == pytest.approx(30e-6, rel=0.1)
    np.testing.assert_allclose(prior.predict(rows), busbw, rtol=0.05)
    again = LinkPrior.from_dict(prior.to_dict())
    np.testing.assert_allclose(again.predict(rows), prior.predict(rows))


def test_a_pure_ring_keeps_the_tree_out() -> None:
    rows, busbw = _ring_rows(eta=0.6, alpha=30e-6)
    params = LinkPrior().fit(rows, busbw).params()
    # a tree at any useful speed would beat this ring's latency over 8 VMs: it stays out
    assert params["eta_tree"] < 0.05


def _ring_or_tree_rows(eta_tree: float, alpha: float) -> tuple[pd.DataFrame, np.ndarray]:
    """p4d.24xlarge rows over 2-32 VMs of 8 ranks whose time is the faster of a ring and a
    tree (NCCL's choice), both on the same EFA link; latency on NVLink is negligible."""
    rows = pd.DataFrame(
        [
            _row("p4d.24xlarge", 8 * v, s, num_nodes=v)
            for v in (2, 4, 8, 16, 32)
            for s in (1 << 16, 1 << 20, 1 << 24, 1 << 28, 1 << 32)
        ]
    )
    hw = hardware_columns(rows)
    n = hw["world_size"].to_numpy(float)
    v = hw["vms"].to_numpy(float)
    s = hw["buffer_bytes"].to_numpy(float)
    s_eff = 2 * s * (n - 1) / n
    bw = 0.7 * hw["nic_gbs"].to_numpy() * 1e9
    ring = 2 * (n - 1) / n * v * alpha + s_eff / bw
    tree = 2 * np.ceil(np.log2(v)) * alpha + s_eff / (eta_tree * bw)
    return rows, s_eff / np.minimum(ring, tree)


def test_the_prior_learns_where_the_tree_beats_the_ring() -> None:
    """Over many VMs a ring's latency grows with the VM count and a tree's with its log:
    the prior learns the tree's bandwidth from rows where it wins (small buffers, many
    VMs) while the ring still answers for large buffers."""
    rows, busbw = _ring_or_tree_rows(eta_tree=0.5, alpha=40e-6)
    prior = LinkPrior().fit(rows, busbw)
    params = prior.params()
    assert params["eta_tree"] == pytest.approx(0.5, rel=0.1)
    assert params["alpha_s"]["efa"] == pytest.approx(40e-6, rel=0.15)
    # (the NVLink hops take a little of the latency: within 15% everywhere)
    np.testing.assert_allclose(prior.predict(rows), busbw, rtol=0.15)
    # a ring alone cannot fit these rows: the 32-VM small buffers are far off
    saved = prior.to_dict()  # (as saved before the tree)
    ring_only = LinkPrior.from_dict({**saved, "theta": saved["theta"][:TREE]})
    small = (rows["num_nodes"] == 32).to_numpy() & (rows["buffer_bytes"] == 1 << 20).to_numpy()
    assert ring_only.predict(rows)[small][0] < 0.7 * busbw[small][0]
    # asked for a ring alone (the prior before the tree), the fit never switches it on
    assert LinkPrior(tree=False).fit(rows, busbw).params()["eta_tree"] == 0.0


@pytest.fixture(scope="module")
def model() -> BandwidthModel:
    return BandwidthModel(small_params=FAST, large_params=FAST).fit(make_probes(allocations=3))


def test_an_unprobed_catalog_type_gets_the_prior_alone_flagged_out_of_domain(
    model: BandwidthModel,
) -> None:
    probed = feature_frame([_row("g4dn.xlarge", 2, 1 << 20), _row("g4dn.12xlarge", 4, 1 << 20)])
    unprobed = feature_frame([_row("g5.xlarge", 2, 1 << 20), _row("p3.8xlarge", 8, 1 << 20)])
    assert model.in_domain(probed).all()
    assert not model.in_domain(unprobed).any()
    np.testing.assert_allclose(model.predict(unprobed), model.large_.prior_only(unprobed))
    # far beyond the probed VM counts of a probed type: predicted, but flagged
    beyond = feature_frame([_row("g4dn.xlarge", 64, 1 << 20), _row("g4dn.12xlarge", 8, 1 << 20)])
    assert not model.in_domain(beyond).any()
    # an unprobed type's spread is the prior's held-out error: wider than a probed type's
    assert model.level_sigma("g5.xlarge") > model.level_sigma("g4dn.xlarge")


def test_the_error_band_widens_outside_the_domain(model: BandwidthModel) -> None:
    rows = feature_frame([_row("g4dn.xlarge", 2, 1 << 20), _row("g5.xlarge", 2, 1 << 20)])
    pred, lo, hi, inside = model.predict_interval(rows, coverage=0.9)
    assert inside.tolist() == [True, False]
    assert (lo < pred).all() and (pred < hi).all()
    width = np.log(hi / pred)
    assert width[1] >= width[0]
    errors = model.errors_["large"]
    assert errors.rows_inside > 0 and errors.rows_outside > 0
    assert errors.quantile(0.5, in_domain=True) <= errors.quantile(0.95, in_domain=True)


def test_the_band_holds_on_allocations_the_model_never_saw() -> None:
    train = make_probes(allocations=4, seed=1)
    held = make_probes(allocations=4, seed=2)
    model = BandwidthModel(small_params=FAST, large_params=FAST).fit(train)
    _, lo, hi, _ = model.predict_interval(held, coverage=0.9)
    y = held["busbw"].to_numpy()
    covered = float(np.mean((lo <= y) & (y <= hi)))
    assert covered >= 0.75  # a 90% band from 4 allocations: loose, but not empty


def test_no_folds_means_no_band_and_no_extra_fits() -> None:
    model = BandwidthModel(small_params=FAST, large_params=FAST, interval_folds=0).fit(
        make_probes(allocations=2)
    )
    assert model.errors_["large"] == LogErrors()
    rows = feature_frame([_row("g4dn.xlarge", 2, 1 << 20)])
    pred, lo, hi, _ = model.predict_interval(rows)
    np.testing.assert_allclose([lo[0], hi[0]], [pred[0], pred[0]])


def test_a_type_neither_probed_nor_in_the_catalog_is_a_one_line_error(
    model: BandwidthModel,
) -> None:
    row = _row("g4dn.xlarge", 2, 1 << 20)
    row["instance_type"] = "g4dn.xlarg"
    with pytest.raises(UnknownNameError, match=r"g4dn\.xlarg.*did you mean 'g4dn\.xlarge'") as err:
        model.predict(feature_frame([row]))
    assert "\n" not in str(err.value)


def test_the_prior_the_domain_and_the_band_survive_save_and_load(
    model: BandwidthModel, tmp_path: Path
) -> None:
    again = BandwidthModel.load(model.save(tmp_path / "m"))
    rows = feature_frame([_row("g4dn.xlarge", 4, 1 << 16), _row("g5.xlarge", 2, 1 << 24)])
    for a, b in zip(model.predict_interval(rows), again.predict_interval(rows), strict=True):
        np.testing.assert_allclose(a, b)
    assert again.domain_ == model.domain_
    assert math.isclose(again.level_sigma("g5.xlarge"), model.level_sigma("g5.xlarge"))


def test_predictions_stay_within_the_residuals_the_trees_were_shown() -> None:
    """Pseudo-Huber leaves can overshoot wildly where the hessian vanishes; predictions are
    clipped to the range of the training targets (relative to the prior)."""
    from srifty_core.predictors.regressor import BusBandwidthRegressor

    rows = make_probes(allocations=2)
    big = rows[rows["buffer_bytes"] > 9001]
    y = big["busbw"].to_numpy()
    reg = BusBandwidthRegressor(**FAST).fit(big, y)
    ratio = np.log(y / reg.prior_only(big))
    far = big.assign(world_size=4096, concurrent=64)
    got = np.log(reg.predict(far) / reg.prior_only(far))
    assert got.min() >= ratio.min() - 1e-6 and got.max() <= ratio.max() + 1e-6


@pytest.mark.parametrize("link", ["nic_gbs", "intra_gbs", "network_gbps"])
def test_a_faster_rated_link_never_lowers_the_prediction(link: str) -> None:
    """Monotone constraints where physics is certain: with every other feature fixed, a
    faster rated link (NIC, NVLink/PCIe, or the catalog's network rating) never predicts
    less bus bandwidth, through the residual or through the prior's feature."""
    from srifty_core.predictors.nccl_tests import nccl_tests_frame
    from srifty_core.predictors.regressor import BusBandwidthRegressor, with_hardware

    rows = with_hardware(nccl_tests_frame())
    y = rows["busbw"].to_numpy(float)
    factors = np.geomspace(0.1, 10.0, 13)

    def worst_drop(reg: BusBandwidthRegressor) -> float:
        preds = np.stack(
            [reg.predict(rows.assign(**{link: rows[link] * f})) for f in factors], axis=1
        )
        return float(np.max(np.log(preds[:, :-1] / preds[:, 1:])))

    assert worst_drop(BusBandwidthRegressor(**FAST).fit(rows, y)) <= 1e-9
    # the same trees unconstrained do lower it somewhere: the check can fail
    assert worst_drop(BusBandwidthRegressor(**FAST, monotone=False).fit(rows, y)) > 1e-3


def test_type_levels_learn_each_types_nic_and_latency_relative_to_its_class() -> None:
    """Two EFA types over 2-8 VMs, one delivering 1.3x and the other 0.7x of the class's
    share of its NIC, with 2x and 0.5x its latency: the levels come back (centred within the
    class), a type the fit never saw takes the class's own, and a saved prior reloads."""
    rows = pd.DataFrame(
        [
            _row(t, 8 * v, s, num_nodes=v)
            for t in ("p4d.24xlarge", "p5.48xlarge")
            for v in (2, 4, 8)
            for s in (1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 28)
        ]
    )
    hw = hardware_columns(rows)
    n, v = hw["world_size"].to_numpy(float), hw["vms"].to_numpy(float)
    s_eff = 2 * rows["buffer_bytes"].to_numpy(float) * (n - 1) / n
    p5 = (rows["instance_type"] == "p5.48xlarge").to_numpy()
    level, lat = np.where(p5, 0.7, 1.3), np.where(p5, 0.5, 2.0)
    t = 2 * (n - 1) / n * v * 20e-6 * lat + s_eff / (0.6 * level * hw["nic_gbs"].to_numpy() * 1e9)
    busbw = s_eff / t
    prior = LinkPrior(tree=False, type_levels=True).fit(rows, busbw)
    params = prior.params()
    got = params["type_levels"]
    assert got["p4d.24xlarge"] / got["p5.48xlarge"] == pytest.approx(1.3 / 0.7, rel=0.05)
    assert got["p4d.24xlarge"] * got["p5.48xlarge"] == pytest.approx(1.0, rel=1e-6)
    lats = params["type_latency"]
    assert lats["p4d.24xlarge"] / lats["p5.48xlarge"] == pytest.approx(4.0, rel=0.1)
    np.testing.assert_allclose(prior.predict(rows), busbw, rtol=0.05)
    without = LinkPrior(tree=False).fit(rows, busbw)
    assert np.abs(np.log(without.predict(rows) / busbw)).max() > 0.2  # the class alone cannot
    # a type the fit never saw (same links as p4d): the class's level and latency, between
    # the two learned types: slower than p4d on large buffers, faster on small ones
    mine = rows[~p5].reset_index(drop=True)
    unseen = prior.predict(mine.assign(instance_type="p4de.24xlarge"))
    known = prior.predict(mine)
    big = (mine["buffer_bytes"] == 1 << 28).to_numpy()
    small = (mine["buffer_bytes"] == 1 << 12).to_numpy()
    assert np.all(unseen[big] < known[big]) and np.all(unseen[small] > known[small])
    again = LinkPrior.from_dict(prior.to_dict())
    np.testing.assert_array_equal(again.predict(rows), prior.predict(rows))
    with pytest.raises(ValueError, match="type levels"):
        LinkPrior.from_dict({**prior.to_dict(), "types": ["p4d.24xlarge"]})
