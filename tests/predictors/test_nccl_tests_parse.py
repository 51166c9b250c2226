"""The nccl-tests output parser: it reproduces the shipped rows of a public table from the
table's own text, reads all_gather/reduce_scatter layouts, and infers the rank count."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from srifty_core.errors import ConfigError
from srifty_core.predictors.nccl_tests import default_path
from srifty_core.predictors.nccl_tests_parse import parse_tables, world_size_from_ratio

README = Path(__file__).parent / "fixtures" / "awsome_nccl_tests_readme_p4de.txt"
"""Two all_reduce_perf tables as aws-samples/awsome-distributed-training's
micro-benchmarks/nccl-tests/README.md prints them at 7217859f (MIT-0 licence), with the
srun prefix ``0:``: the shipped table's ``...README.md@7217859f#0`` and ``#1``."""
TABLE_ID = "aws-samples/awsome-distributed-training:micro-benchmarks/nccl-tests/README.md@7217859f#"


def test_the_parser_reproduces_the_shipped_rows_of_a_public_table() -> None:
    tables = parse_tables(README.read_text(), collective="all_reduce")
    shipped = pd.read_csv(default_path())
    assert len(tables) == 2
    for k, table in enumerate(tables):
        want = shipped[shipped["table_id"] == f"{TABLE_ID}{k}"].reset_index(drop=True)
        got = pd.DataFrame([r.__dict__ for r in table.rows])
        assert len(got) == len(want) > 20 and table.collective == "all_reduce"
        for c in (
            "size_bytes",
            "count_elements",
            "time_us",
            "algbw_GBps",
            "busbw_GBps",
            "inplace_time_us",
            "inplace_algbw_GBps",
            "inplace_busbw_GBps",
        ):
            assert got[c].tolist() == pytest.approx(want[c].tolist()), c
        assert world_size_from_ratio(table) == int(want["world_size"].iloc[0]) == 16


LAYOUT = (Path(__file__).parent / "fixtures" / "nccl_tests_layouts.txt").read_text()
"""The layouts of nccl-tests' all_gather_perf (with a root column and an mpirun prefix),
an older reduce_scatter_perf (no root column, an error column) and an alltoall_perf: a
format sample written for this test, its numbers made up (not evidence)."""


def test_all_gather_and_reduce_scatter_layouts_are_read() -> None:
    ag, rs = parse_tables(LAYOUT)  # alltoall is not one of ours: skipped
    assert ag.collective == "all_gather" and rs.collective == "reduce_scatter"
    assert [r.size_bytes for r in ag.rows] == [1048576, 2097152]
    assert ag.rows[1].time_us == 300.0 and ag.rows[1].inplace_busbw_GBps == 6.78
    assert rs.rows[0].redop == "sum" and rs.rows[0].inplace_time_us == 401.0  # no root column
    assert world_size_from_ratio(ag) == 16  # 6.55 / 6.99 = 15/16
    assert world_size_from_ratio(rs) == 2  # 5.24 / 10.49 = 1/2
    with pytest.raises(ConfigError, match="without a '# Collective test starting'"):
        parse_tables(LAYOUT.split("# Collective test starting: reduce")[0].split("\n", 1)[1])
    with pytest.raises(ConfigError, match="collective: must be one of"):
        parse_tables(LAYOUT, collective="alltoall")


def test_the_shipped_all_gather_tables_are_consistent_and_load() -> None:
    """Each row of the shipped all_gather tables: busbw / algbw = (n-1)/n as printed (both
    runs), time = size / algbw (derived, as SOURCES.md says), and the frame's label is
    nccl-tests' all-gather busbw."""
    from srifty_core.predictors.nccl_tests import collectives_path, nccl_tests_frame

    raw = pd.read_csv(collectives_path())
    n = raw["world_size"]
    for alg, bus in (("algbw_GBps", "busbw_GBps"), ("inplace_algbw_GBps", "inplace_busbw_GBps")):
        ratio = raw[bus] / raw[alg]
        assert (abs(ratio - (n - 1) / n) < 0.01 / raw[alg] + 1e-3).all()
    derived = raw["size_bytes"] / (raw["algbw_GBps"] * 1e9) * 1e6
    assert raw["time_us"].tolist() == pytest.approx(derived.tolist(), abs=0.006)
    frame = nccl_tests_frame(collectives_path())
    assert set(frame["collective"]) == {"all_gather"} and frame["table_id"].nunique() == 5
    got = frame["busbw"] / 1e9
    assert got.tolist() == pytest.approx(raw["busbw_GBps"].tolist(), rel=2e-3, abs=0.01)
