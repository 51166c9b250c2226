"""The Parquet probe store: one schema, atomic idempotent partitions, filters, age weights."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from srifty_core import paths
from srifty_core.errors import ConfigError
from srifty_core.probing import store
from srifty_core.probing.schema import COLUMNS, PROBE_SCHEMA, ProbeSchemaError
from srifty_core.probing.store import (
    CHECKSUM_FILE,
    PARTITION_FILE,
    ProbeStoreError,
    partition_dir,
    read_probes,
    records_to_table,
    write_partition,
)
from tests.probing.rows import DAY, T0, make_rows


def _write(rows: list[dict[str, Any]], **kw: Any) -> Path:
    key = {"day": DAY, "provider": "local", "instance_type": "local.cpu", **kw}
    return write_partition(pd.DataFrame(rows), **key)


def test_round_trip_keeps_schema_and_values(data_dir: Path) -> None:
    path = _write(make_rows(4))
    assert path == partition_dir(DAY, "local", "local.cpu") / PARTITION_FILE
    assert path.is_relative_to(paths.probe_store_dir())
    assert "date=2026-03-01/provider=local/instance_type=local.cpu" in str(path)
    assert pq.read_schema(path).remove_metadata().equals(PROBE_SCHEMA.remove_metadata())
    df = read_probes()
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 4
    assert df["busbw"].tolist() == pytest.approx([r["busbw"] for r in make_rows(4)])
    assert df["network_gbps"].isna().all()
    assert str(df["probed_at"].dt.tz) == "UTC"


def test_rewrite_replaces_the_partition_without_duplicates(data_dir: Path) -> None:
    _write(make_rows(4))
    _write(make_rows(4))
    assert len(read_probes()) == 4
    _write(make_rows(2))  # a rerun that measured less replaces, not appends
    assert len(read_probes()) == 2
    _write(make_rows(3, instance_type="g4dn.xlarge"), instance_type="g4dn.xlarge")
    assert len(read_probes()) == 5  # other partitions untouched


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda df: df.drop(columns=["busbw"]), r"missing column\(s\) \['busbw'\]"),
        (lambda df: df.assign(busbw=df["busbw"].astype(str)), "column 'busbw' has type"),
        (lambda df: df.assign(world_size=df["world_size"] * 1.0), "column 'world_size' has type"),
        (lambda df: df.assign(probed_at=df["probed_at"].dt.tz_localize(None)), "'probed_at'"),
        (lambda df: df.assign(colour="red"), r"unexpected column\(s\) \['colour'\]"),
        (lambda df: df.assign(zone=None), "column 'zone' has type null|'zone' has 4 null"),
        (lambda df: df.assign(busbw=df["busbw"] * 2), "busbw != 2"),
        (lambda df: df.assign(status="meh"), "status not ok/failed"),
        (lambda df: df.assign(world_size=1), "world_size < 2"),
    ],
)
def test_write_rejects_bad_frames_naming_the_column(mutate: Any, match: str) -> None:
    df = mutate(pd.DataFrame(make_rows(4)))
    with pytest.raises(ProbeSchemaError, match=match):
        write_partition(df, day=DAY, provider="local", instance_type="local.cpu")
    assert not partition_dir(DAY, "local", "local.cpu").exists() or not list(
        partition_dir(DAY, "local", "local.cpu").iterdir()
    )


def test_failed_rows_need_a_reason() -> None:
    rows = make_rows(1)
    rows[0].update(status="failed", time_s=None, busbw=None, error="rank 1 died")
    assert records_to_table(rows).num_rows == 1
    rows[0]["error"] = None
    with pytest.raises(ProbeSchemaError, match="status failed and no error"):
        records_to_table(rows)


def test_rows_must_belong_to_the_partition() -> None:
    with pytest.raises(ConfigError, match="instance_type: rows hold"):
        _write(make_rows(2), instance_type="g4dn.xlarge")


def test_read_rejects_a_file_with_another_schema(data_dir: Path) -> None:
    path = _write(make_rows(2))
    (path.parent / CHECKSUM_FILE).unlink()  # a file written elsewhere, without a checksum
    table = pq.read_table(path).drop_columns(["vcpus"])
    pq.write_table(table, path)
    with pytest.raises(ProbeSchemaError, match="missing column 'vcpus'"):
        read_probes()
    table = pq.read_table(path).append_column("vcpus", pa.array(["2", "2"]))
    pq.write_table(table, path)
    with pytest.raises(ProbeSchemaError, match="column 'vcpus' is string"):
        read_probes()


def test_a_failed_write_leaves_the_old_partition_and_no_temp_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = _write(make_rows(4))
    before = path.read_bytes()

    def crash(table: pa.Table, where: Any, **kw: Any) -> None:
        Path(where).write_bytes(b"PAR1 half a file")  # the writer dies mid-way
        raise OSError("disk full")

    monkeypatch.setattr(store.pq, "write_table", crash)
    with pytest.raises(OSError, match="disk full"):
        _write(make_rows(2))
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [PARTITION_FILE, CHECKSUM_FILE]
    assert len(read_probes()) == 4


def test_stale_temp_files_are_ignored_then_cleaned(data_dir: Path) -> None:
    path = _write(make_rows(4))
    stale = path.parent / f".{PARTITION_FILE}.dead.tmp"
    stale.write_bytes(b"garbage from a killed writer")
    assert len(read_probes()) == 4
    _write(make_rows(3))
    assert not stale.exists() and len(read_probes()) == 3


def test_filters() -> None:
    _write(make_rows(4, start=T0, step=timedelta(days=1)))
    _write(make_rows(2, instance_type="g4dn.xlarge"), instance_type="g4dn.xlarge")
    failed = make_rows(1, provider="ec2")
    failed[0].update(status="failed", time_s=None, busbw=None, error="boom")
    _write(failed, provider="ec2")
    assert len(read_probes()) == 6
    assert len(read_probes(include_failed=True)) == 7
    assert len(read_probes(instance_types=["g4dn.xlarge"])) == 2
    assert len(read_probes(providers=["ec2"], include_failed=True)) == 1
    window = read_probes(
        instance_types=["local.cpu"], since=T0 + timedelta(days=1), until=T0 + timedelta(days=3)
    )
    assert window["probed_at"].tolist() == [
        pd.Timestamp(T0 + timedelta(days=1)),
        pd.Timestamp(T0 + timedelta(days=2)),
    ]
    naive = read_probes(
        instance_types=["local.cpu"], since=(T0 + timedelta(days=3)).replace(tzinfo=None)
    )
    assert len(naive) == 1
    assert read_probes(instance_types=["p3.2xlarge"]).empty


def test_age_weights_halve_every_half_life() -> None:
    _write(make_rows(4, start=T0, step=timedelta(days=1)))
    now = T0 + timedelta(days=2)
    df = read_probes(half_life=timedelta(days=1), now=now)
    # ages 2, 1, 0 days and one sample 1 day in the future (weight capped at 1)
    assert df["weight"].tolist() == pytest.approx([0.25, 0.5, 1.0, 1.0])
    df = read_probes(half_life=timedelta(hours=12), now=now)
    assert df["weight"].tolist() == pytest.approx([1 / 16, 0.25, 1.0, 1.0])
    assert "weight" not in read_probes().columns
    with pytest.raises(ConfigError, match="half_life"):
        read_probes(half_life=timedelta(0))


def test_partition_names_are_checked() -> None:
    with pytest.raises(ConfigError, match="instance_type"):
        partition_dir(DAY, "local", "../escape")


def test_partitions_written_before_the_phase_column_read_as_burst(data_dir: Path) -> None:
    path = _write(make_rows())
    old = pq.read_table(path).drop(["phase"])
    pq.write_table(old, path)  # a partition of the schema before ``phase`` (and checksums)
    (path.parent / CHECKSUM_FILE).unlink()
    df = store.read_probes()
    assert len(df) == len(make_rows()) and set(df["phase"]) == {"burst"}
    bad = make_rows()
    bad[0]["phase"] = "warm"
    with pytest.raises(ProbeSchemaError, match="phase"):
        store.records_to_table(bad)


def test_every_flipped_bit_is_caught_or_harmless(data_dir: Path) -> None:
    """A review flipped single bits in partitions: 10 of 132 went unnoticed. Now the
    sidecar's SHA-256 (and Parquet's page CRCs) catch every one."""
    import random

    path = _write(make_rows(50))
    good = path.read_bytes()
    want = read_probes()
    rng = random.Random(0)
    caught = 0
    for _ in range(200):
        damaged = bytearray(good)
        i = rng.randrange(len(damaged))
        damaged[i] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        try:
            got = read_probes()
        except (ProbeStoreError, ProbeSchemaError):
            caught += 1
            continue
        pd.testing.assert_frame_equal(got, want)  # never silently different numbers
    assert caught == 200
    path.write_bytes(good)
    pd.testing.assert_frame_equal(read_probes(), want)


def test_the_error_names_the_damaged_partition(data_dir: Path) -> None:
    path = _write(make_rows(4))
    path.write_bytes(path.read_bytes()[:-9] + b"x" * 9)
    with pytest.raises(ProbeStoreError, match=r"instance_type=local\.cpu.*does not match"):
        read_probes()


def test_a_crash_between_the_renames_leaves_a_readable_partition(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(make_rows(4))
    real_replace = store.os.replace

    def die_before_the_data_file(src: Any, dst: Any) -> None:
        if Path(dst).name == PARTITION_FILE:
            raise OSError("killed")  # the sidecar is already replaced
        real_replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(store.os, "replace", die_before_the_data_file)
        with pytest.raises(OSError, match="killed"):
            _write(make_rows(2))
    assert len(read_probes()) == 4  # the old file, vouched for as "previous"
    _write(make_rows(3))
    assert len(read_probes()) == 3


def test_partitions_without_a_checksum_are_read(data_dir: Path) -> None:
    path = _write(make_rows(4))
    (path.parent / CHECKSUM_FILE).unlink()
    assert len(read_probes()) == 4


def test_partitions_written_before_the_noise_columns_read_as_null(data_dir: Path) -> None:
    path = _write(make_rows())
    old = pq.read_table(path).drop(["spread", "noisy"])
    pq.write_table(old, path)  # a partition of the schema before ``spread`` and ``noisy``
    (path.parent / CHECKSUM_FILE).unlink()
    df = store.read_probes()
    assert len(df) == len(make_rows())
    assert df["spread"].isna().all() and df["noisy"].isna().all()
