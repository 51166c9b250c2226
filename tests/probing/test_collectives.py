"""The ``collective`` column: schema round-trip with and without it, the sweep config's
``collectives`` field, and a real gloo sweep of all three collectives on two processes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from srifty_core.cloud.local import LocalProvider
from srifty_core.errors import ConfigError
from srifty_core.measure.sweep import probe_sweep
from srifty_core.probing.config import (
    COLLECTIVES,
    SweepConfig,
    busbw,
    config_from_params,
    parse_sizes,
)
from srifty_core.probing.schema import POINT_KEY, PROBE_SCHEMA, ProbeSchemaError
from srifty_core.probing.store import (
    PARTITION_FILE,
    partition_dir,
    read_partition_table,
    read_probes,
    records_to_table,
    write_partition,
)
from srifty_core.probing.summary import format_summary, summarize
from tests.probing.rows import DAY, make_rows


def _as_collective(rows: list[dict[str, Any]], collective: str) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        n, s, t = r["world_size"], r["buffer_bytes"], r["time_s"]
        out.append({**r, "collective": collective, "busbw": busbw(s, n, t, collective)})
    return out


def test_an_old_partition_without_the_column_reads_as_allreduce(tmp_path: Path) -> None:
    table = records_to_table(make_rows(3))
    old = table.drop_columns(["collective"])  # as written before the column existed
    folder = partition_dir(DAY, "local", "local.cpu", tmp_path)
    folder.mkdir(parents=True)
    pq.write_table(old, folder / PARTITION_FILE)
    back = read_partition_table(folder / PARTITION_FILE)
    assert back.schema == PROBE_SCHEMA
    assert back["collective"].to_pylist() == ["all_reduce"] * 3
    assert back["busbw"].to_pylist() == table["busbw"].to_pylist()
    df = read_probes(tmp_path)
    assert set(df["collective"]) == {"all_reduce"}


def test_each_collective_round_trips_with_its_bus_bandwidth(tmp_path: Path) -> None:
    rows = [
        *make_rows(2),
        *_as_collective(make_rows(2), "all_gather"),
        *_as_collective(make_rows(2), "reduce_scatter"),
    ]
    write_partition(
        records_to_table(rows), day=DAY, provider="local", instance_type="local.cpu", root=tmp_path
    )
    df = read_probes(tmp_path)
    assert (
        df["collective"].tolist()
        == ["all_reduce"] * 2 + ["all_gather"] * 2 + ["reduce_scatter"] * 2
    )
    n, s, t = df["world_size"], df["buffer_bytes"], df["time_s"]
    factor = df["collective"].map({"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0})
    assert df["busbw"].tolist() == pytest.approx((factor * s * (n - 1) / (n * t)).tolist())
    assert "collective" in POINT_KEY


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda r: {**r, "collective": "all_to_all"}, "collective not one of"),
        (lambda r: {**r, "collective": "all_gather"}, "busbw != 2"),  # allreduce's busbw
        (lambda r: {**r, "collective": None}, "'collective' has 1 null"),
    ],
)
def test_bad_collective_values_are_rejected_naming_the_column(
    mutate: Callable[[dict[str, Any]], dict[str, Any]], match: str
) -> None:
    with pytest.raises(ProbeSchemaError, match=match):
        records_to_table([mutate(make_rows(1)[0])])


def test_the_sweep_config_names_its_collectives() -> None:
    cfg = SweepConfig(sizes=(4, 1024), collectives=("reduce_scatter", "all_reduce"))
    assert cfg.collectives == ("all_reduce", "reduce_scatter")  # kept in COLLECTIVES order
    assert [p.collective for p in cfg.points()] == ["all_reduce"] * 6 + ["reduce_scatter"] * 6
    assert len({p.key for p in cfg.points()}) == 12
    assert SweepConfig.from_dict(cfg.to_dict()) == cfg
    assert SweepConfig(sizes=(4,)).collectives == ("all_reduce",)
    params = {"sizes": "4B", "collectives": "all_gather,all_reduce"}
    assert config_from_params(params).collectives == ("all_reduce", "all_gather")
    for bad, match in (
        (("all_to_all",), "collectives: must be one of all_reduce, all_gather, reduce_scatter"),
        ((), "collectives: empty"),
        (("all_gather", "all_gather"), "collectives: .* twice"),
        ("all_gather", "collectives: expected a list"),
    ):
        with pytest.raises(ConfigError, match=match):
            SweepConfig(sizes=(4,), collectives=bad)  # type: ignore[arg-type]


def test_a_gloo_sweep_of_every_collective_lands_in_the_store() -> None:
    cfg = SweepConfig(
        sizes=parse_sizes("4B,64KB"),
        world_sizes=(2,),
        concurrency=(1,),
        repeats=2,
        warmup=1,
        collectives=COLLECTIVES,
    )
    day = date(2026, 3, 2)
    result = probe_sweep(cfg, provider=LocalProvider(), day=day)
    assert result.ok and result.measured == 6 and result.rows == 12
    df = read_probes()
    assert df.groupby("collective").size().to_dict() == {c: 4 for c in COLLECTIVES}
    assert (df["time_s"] > 0).all() and set(df["backend"]) == {"gloo"}
    factor = df["collective"].map({"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0})
    n, s, t = df["world_size"], df["buffer_bytes"], df["time_s"]
    assert df["busbw"].tolist() == pytest.approx((factor * s * (n - 1) / (n * t)).tolist())
    summary = summarize(df)  # one line per point and collective, as srifty probe prints it
    assert sorted(summary["collective"]) == sorted(COLLECTIVES * 2)
    assert all(c in format_summary(summary) for c in COLLECTIVES)
    # the collective is part of the point: a rerun finds all six stored, and asking for
    # allreduces only finds them among them
    again = probe_sweep(cfg, provider=LocalProvider(), day=day)
    assert again.measured == 0 and again.skipped == 6
    only = dataclasses.replace(cfg, collectives=("all_reduce",))
    assert probe_sweep(only, provider=LocalProvider(), day=day).skipped == 2


def test_srifty_probe_rejects_an_unknown_collective(capsys: pytest.CaptureFixture[str]) -> None:
    from srifty_core.cli import main

    assert main(["probe", "--sizes", "4B", "--collectives", "all_reduce,gather"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any(
        "collectives: must be one of all_reduce, all_gather, reduce_scatter, got 'gather'" in ln
        for ln in err
    ), err
