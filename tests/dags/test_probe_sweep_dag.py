"""Run srifty_probe_sweep for real with dag.test() on the local provider (a tiny sweep)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from srifty_core.cloud.local import pid_alive
from srifty_core.probing import PROBE_STORE_ASSET_NAME, PROBE_STORE_ASSET_URI, parse_sizes
from srifty_core.probing.store import read_probes

pytestmark = pytest.mark.airflow

TINY = {
    "provider": "local",
    "instance_types": ["local.cpu"],
    "world_sizes": [2],
    "sizes": "4B:64KB",
    "points_per_decade": 1,
    "concurrency": [1],
    "repeats": 2,
    "warmup": 1,
    "allocations": 1,
    "collectives": ["all_reduce"],
}


def test_the_default_sweep_feeds_a_refresh_that_succeeds(dagbag: Any) -> None:
    """The refresh the sweep's probe-store update triggers holds out whole allocations and
    refuses fewer than ``MIN_ALLOCATIONS``: a sweep on its defaults measures that many."""
    from srifty_core.predictors.refresh import data as refresh_data
    from srifty_core.probing.config import MIN_ALLOCATIONS

    dag = dagbag.get_dag("srifty_probe_sweep")
    assert dag.params["allocations"] == MIN_ALLOCATIONS == refresh_data.MIN_ALLOCATIONS


def test_probe_sweep_writes_the_partition_and_releases(dagbag: Any, data_dir: Path) -> None:
    dag = dagbag.get_dag("srifty_probe_sweep")
    run = dag.test(run_conf=TINY)
    assert run.state == "success"
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["publish"] == "success" and states["on_allocation.release"] == "success"
    parts = sorted((data_dir / "probes").glob("date=*/provider=local/instance_type=local.cpu"))
    assert len(parts) == 1 and (parts[0] / "data.parquet").exists()
    df = read_probes()
    sizes = parse_sizes("4B:64KB", points_per_decade=1)
    assert sorted(set(df["buffer_bytes"])) == list(sizes) and len(sizes) == 6
    assert len(df) == len(sizes) * 2 and set(df["world_size"]) == {2}
    # publish updated the probe-store Asset, naming the partition it wrote.
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(
            select(AssetEvent).where(AssetEvent.source_run_id == run.run_id)
        ).all()
        assert [e.asset.uri for e in events] == [PROBE_STORE_ASSET_URI]
        assert events[0].extra["partitions"] == [str(parts[0] / "data.parquet")]
    # The teardown released the allocation and its workers.
    state_files = list((data_dir / "cloud" / "local").glob("*.json"))
    assert len(state_files) == 1
    state = json.loads(state_files[0].read_text())
    assert set(state["instances"].values()) == {"terminated"}
    assert not [p["pid"] for p in state["processes"] if pid_alive(p["pid"])]


def test_each_allocation_fills_its_own_slot(dagbag: Any, data_dir: Path) -> None:
    """Two allocations (two worker processes each) show what three would: a slot, an
    allocation and a mapped group each (the one-allocation case is the test above)."""
    dag = dagbag.get_dag("srifty_probe_sweep")
    run = dag.test(run_conf={**TINY, "sizes": "4B:400B", "allocations": 2})
    assert run.state == "success"
    df = read_probes()
    assert sorted(set(df["allocation_slot"])) == [0, 1]
    assert df["allocation_id"].nunique() == 2 and len(df) == 2 * 3 * 2
    states = [json.loads(p.read_text()) for p in (data_dir / "cloud" / "local").glob("*.json")]
    assert len(states) == 2
    assert all(set(s["instances"].values()) == {"terminated"} for s in states)
    # One mapped task group instance per allocation: launch, sweep and release each.
    tis = run.get_task_instances()
    for task_id in ("on_allocation.allocate", "on_allocation.sweep", "on_allocation.release"):
        assert sorted(ti.map_index for ti in tis if ti.task_id == task_id) == [0, 1]
    (publish,) = [ti for ti in tis if ti.task_id == "publish"]
    assert len(publish.xcom_pull(task_ids="publish")) == 2  # every allocation's partition


def test_asset_matches_the_library_constant(dagbag: Any) -> None:
    dag = dagbag.get_dag("srifty_probe_sweep")
    outlets = dag.get_task("publish").outlets
    assert [(a.name, a.uri) for a in outlets] == [(PROBE_STORE_ASSET_NAME, PROBE_STORE_ASSET_URI)]
    assert dag.get_task("on_allocation.release").is_teardown
    assert dag.get_task("on_allocation.allocate").is_setup


def test_bad_conf_names_the_field(dagbag: Any) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.get_dag("srifty_probe_sweep")
    with pytest.raises(ParamValidationError, match="world_sizes"):
        dag.test(run_conf={**TINY, "world_sizes": [1]})


def test_the_sweep_probes_the_mixes_it_is_given_and_chooses_more(
    dagbag: Any, data_dir: Path
) -> None:
    """Two types as labels on local processes, one mix listed and one chosen by the design
    (``mix_budget``): three mapped groups, the mixes swept as one ring each, every member
    released by the teardown."""
    dag = dagbag.get_dag("srifty_probe_sweep")
    conf = {**TINY, "instance_types": ["g4dn.xlarge", "g5.xlarge"], "sizes": "4B:4KB"}
    conf.update(mixes=["g4dn.xlarge:1,g5.xlarge:2"], mix_budget=1)
    run = dag.test(run_conf=conf)
    assert run.state == "success"
    releases = [ti for ti in run.get_task_instances() if ti.task_id == "on_allocation.release"]
    assert len(releases) == 4 and all(ti.state == "success" for ti in releases)
    df = read_probes()
    ranks = df.groupby("instance_type")["world_size"].unique().map(list).to_dict()
    assert ranks == {
        "g4dn.xlarge": [2],
        "g5.xlarge": [2],
        "mix_1xg4dn.xlarge_2xg5.xlarge": [3],
        "mix_1xg4dn.xlarge_1xg5.xlarge": [2],
    }
    for f in (data_dir / "cloud" / "local").glob("local-*.json"):
        assert set(json.loads(f.read_text())["instances"].values()) == {"terminated"}
