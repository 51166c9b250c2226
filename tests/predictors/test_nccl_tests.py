"""The public nccl-tests loader: a path, tolerant of missing non-feature columns, clear about
missing feature ones, the table's own cloud; its output fits and tunes as it is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from srifty_core.errors import UnknownNameError
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.base import FEATURE_COLUMNS
from srifty_core.predictors.features import BandwidthDataError
from srifty_core.predictors.nccl_tests import default_path, nccl_tests_frame
from srifty_core.predictors.tuning import SearchSpace, tune

FAST = {"n_estimators": 40, "max_depth": 4}


@pytest.fixture(scope="module")
def raw() -> pd.DataFrame:
    return pd.read_csv(default_path())


@pytest.fixture(scope="module")
def shipped() -> pd.DataFrame:
    return nccl_tests_frame()


def _write(df: pd.DataFrame, tmp_path: Path, name: str = "table.csv") -> Path:
    path = tmp_path / name
    df.to_csv(path, index=False)
    return path


def test_the_shipped_table_loads_as_probe_like_rows(shipped: pd.DataFrame) -> None:
    assert len(shipped) == 474  # the rows of size > 0
    assert set(FEATURE_COLUMNS) <= set(shipped.columns)
    assert (shipped["busbw"] > 0).all()
    # one published table is one allocation: the model's grouping works out of the box
    assert (shipped["allocation_id"] == shipped["table_id"]).all()
    assert shipped["table_id"].nunique() == 26
    assert shipped["num_nodes"].notna().all()


def test_a_path_and_the_tables_own_cloud(
    raw: pd.DataFrame, shipped: pd.DataFrame, tmp_path: Path
) -> None:
    other = raw.copy()
    first = other["table_id"] == other["table_id"].iloc[0]
    other.loc[first, "cloud"] = "aws-govcloud"
    df = nccl_tests_frame(_write(other, tmp_path))
    assert set(df["cloud"]) == {"aws", "aws-govcloud"}
    # without the column: the catalog's cloud
    df = nccl_tests_frame(_write(raw.drop(columns=["cloud"]), tmp_path))
    assert set(df["cloud"]) == {"aws"}
    with pytest.raises(BandwidthDataError, match="not found"):
        nccl_tests_frame(tmp_path / "absent.csv")


def test_a_table_without_num_nodes_loads(
    raw: pd.DataFrame, shipped: pd.DataFrame, tmp_path: Path
) -> None:
    df = nccl_tests_frame(_write(raw.drop(columns=["num_nodes"]), tmp_path))
    # derived from world size / GPUs per node: the same as the table says
    assert df["num_nodes"].tolist() == shipped["num_nodes"].tolist()
    bare = raw.drop(columns=["num_nodes", "gpus_per_node", "table_id", "source"])
    df = nccl_tests_frame(_write(bare, tmp_path, "bare.csv"))
    assert df["num_nodes"].isna().all() and len(df) == len(shipped)
    assert set(df["allocation_id"]) == {"bare.csv"}  # no id at all: the file is one table


@pytest.mark.parametrize("column", ["world_size", "time_us", "instance_type", "size_bytes"])
def test_a_missing_feature_column_is_named(raw: pd.DataFrame, tmp_path: Path, column: str) -> None:
    path = _write(raw.drop(columns=[column]), tmp_path)
    with pytest.raises(BandwidthDataError, match=rf"missing column\(s\) \['{column}'\]"):
        nccl_tests_frame(path)


def test_empty_cells_and_unknown_types_are_clear(raw: pd.DataFrame, tmp_path: Path) -> None:
    holes = raw.copy()
    holes.loc[3, "world_size"] = None
    with pytest.raises(BandwidthDataError, match="'world_size' has 1 empty"):
        nccl_tests_frame(_write(holes, tmp_path))
    typo = raw.copy()
    typo.loc[typo["instance_type"] == "p4d.24xlarge", "instance_type"] = "p4d.24xlarg"
    with pytest.raises(UnknownNameError, match=r"'p4d.24xlarg' in nccl-tests table.*p4d\.24x"):
        nccl_tests_frame(_write(typo, tmp_path))


def test_fit_and_tune_take_the_loaders_output(shipped: pd.DataFrame) -> None:
    model = BandwidthModel(small_params=FAST, large_params=FAST).fit(shipped)
    assert (model.predict(shipped) > 0).all()
    assert model.caps_.by_type.types() == set(shipped["instance_type"])
    # grouped by another column the same way as tune: the same fit here (same groups)
    again = BandwidthModel(small_params=FAST, large_params=FAST).fit(shipped, group="table_id")
    np.testing.assert_allclose(again.predict(shipped), model.predict(shipped))
    with pytest.raises(BandwidthDataError, match="missing group column 'allocation_id'"):
        BandwidthModel().fit(shipped.drop(columns=["allocation_id"]))
    large = shipped[shipped["buffer_bytes"] > 9001].reset_index(drop=True)
    space = SearchSpace(max_depth=(2, 6), n_estimators=(20, 200))
    result = tune(large, n_trials=2, group="table_id", n_splits=3, space=space)
    assert len(result.trials) == 2 and np.isfinite(result.best_mape)


def test_the_public_tables_price_one_vm_on_its_own_links(shipped: pd.DataFrame) -> None:
    """Issue 47: on a fresh install one multi-GPU VM was capped at its NIC's speed (4 V100
    on NVLink at 1.5 GB/s). Inside one VM a ring crosses NVLink or PCIe only: the cap and
    the curve of a type the tables lack on one VM are within 2x of that rated link, a type
    they have on one VM within 2x of its row, and two VMs stay below their NIC."""
    from srifty_core.catalog import Catalog
    from srifty_core.predictors.features import feature_frame
    from srifty_core.predictors.prior import hardware_of
    from srifty_core.simulator.types import SimInstance

    model = BandwidthModel(small_params=FAST, large_params=FAST).fit(shipped)
    catalog = Catalog.load()

    def busbw(name: str, world: int) -> float:
        """What the simulator prices a 256 MiB bucket at: the curve within the cap."""
        inst = SimInstance.from_catalog(catalog.get(name, "us-east-1"))
        row = {**inst.features, "world_size": world, "buffer_bytes": 256 << 20, "concurrent": 1}
        curve = float(model.predict(feature_frame([row]))[0])
        return min(curve, model.bandwidth_cap(name, world))

    for name, world in (("p3.8xlarge", 4), ("p3.16xlarge", 8), ("g4dn.12xlarge", 4)):
        hw = hardware_of(name)
        assert hw is not None and hw.intra_gbs is not None and hw.nic_gbs is not None
        link = hw.intra_gbs * 1e9  # NVLink (V100) or PCIe 3 (T4), per GPU and direction
        assert link / 2 <= busbw(name, world) <= 2 * link, name
        assert busbw(name, 2 * world) <= hw.nic_gbs * 1e9, name  # two VMs: the NICs
    one_vm = shipped[(shipped["num_nodes"] == 1) & (shipped["buffer_bytes"] >= 64 << 20)]
    for name, row in one_vm.groupby("instance_type")["busbw"].max().items():
        world = int(shipped.loc[shipped["instance_type"] == name, "gpus_per_vm"].iloc[0])
        assert row / 2 <= busbw(str(name), world) <= 2 * row, name
