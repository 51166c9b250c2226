"""Real sweeps on the local provider: worker processes, gloo on loopback."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from datetime import date
from pathlib import Path

import pandas as pd
import pytest

from srifty_core import paths
from srifty_core.cloud import InstanceState, LaunchRequest
from srifty_core.cloud.local import LOCAL_CPU, LocalProvider, pid_alive
from srifty_core.errors import ConfigError
from srifty_core.measure.probe_worker import FAIL_ENV, FAIL_EXIT_CODE
from srifty_core.measure.runner import labels
from srifty_core.measure.sweep import ProbeFailedError, probe_sweep
from srifty_core.probing.config import SweepConfig, parse_sizes
from srifty_core.probing.store import read_probes

DAY = date(2026, 3, 1)
TINY = SweepConfig(
    sizes=parse_sizes("4B:64KB", steps=3),  # 4B, 512B, 64KB
    world_sizes=(2,),
    concurrency=(1, 2),
    repeats=2,
    warmup=1,
)


class Recorder(LocalProvider):
    """The local provider, remembering every worker PID it started."""

    def __init__(self) -> None:
        super().__init__()
        self.pids: list[int] = []
        self.allocations: list[str] = []

    def run(self, allocation, argv, env=None, **kw):  # type: ignore[no-untyped-def,override]
        super().run(allocation, argv, env, **kw)
        self.allocations.append(allocation.id)
        self.pids += self.worker_pids(allocation)

    def assert_clean(self) -> None:
        assert self.pids
        assert not [p for p in self.pids if pid_alive(p)], "orphan worker processes"
        for a in self.allocations:
            states = {i.state for i in self.describe(self.get_allocation(a))}
            assert states == {InstanceState.TERMINATED}


def _partial_files() -> list[Path]:
    return list((paths.probe_store_dir() / "_partial").rglob("*.jsonl"))


def test_sweep_writes_the_partition_with_every_feature() -> None:
    provider = Recorder()
    progress: list[tuple[int, int]] = []
    result = probe_sweep(
        TINY, provider=provider, day=DAY, on_progress=lambda d, t: progress.append((d, t))
    )
    assert result.ok and result.measured == 6 and result.skipped == 0 and result.rows == 12
    assert progress[0] == (0, 6) and progress[-1] == (6, 6)
    df = read_probes()
    assert len(df) == 12
    assert set(df["provider"]) == {"local"} and set(df["cloud"]) == {"local"}
    assert set(df["instance_type"]) == {LOCAL_CPU} and set(df["gpu_model"]) == {"cpu"}
    assert set(df["vcpus"]) == {os.cpu_count()} and df["network_gbps"].isna().all()
    assert set(df["backend"]) == {"gloo"} and set(df["world_size"]) == {2}
    assert df["allocation_id"].nunique() == 1 and set(df["status"]) == {"ok"}
    assert sorted(set(df["buffer_bytes"])) == [4, 512, 65536]
    assert sorted(set(df["concurrent"])) == [1, 2]
    assert (
        df.groupby(["buffer_bytes", "concurrent"])["repeat"].apply(sorted) == [[0, 1]] * 6
    ).all()
    assert (df["time_s"] > 0).all()
    assert df["busbw"].tolist() == pytest.approx((df["buffer_bytes"] / df["time_s"]).tolist())
    assert (df["date"] == DAY).all()
    assert not _partial_files()
    provider.assert_clean()
    # Everything is there: a rerun measures nothing and starts no process.
    again = probe_sweep(TINY, provider=provider, day=DAY)
    assert again.measured == 0 and again.skipped == 6 and again.allocation_ids == ()
    assert len(read_probes()) == 12


def test_killed_worker_keeps_measured_rows_and_rerun_fills_only_the_gap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider = Recorder()
    monkeypatch.setenv(FAIL_ENV, "1:2")  # rank 1 exits at the third point
    first = probe_sweep(TINY, provider=provider, day=DAY)
    assert not first.ok and first.measured == 2 and len(first.failed) == 4
    reason = first.failed[0].reason
    assert f"rank 1 exited with code {FAIL_EXIT_CODE}" in reason, reason
    with pytest.raises(ProbeFailedError, match="4 probe point"):
        first.raise_for_failures()
    provider.assert_clean()
    df = read_probes(include_failed=True)
    ok, failed = df[df["status"] == "ok"], df[df["status"] == "failed"]
    assert len(ok) == 4 and len(failed) == 1
    row = failed.iloc[0]
    assert (row["world_size"], row["concurrent"]) == (2, 1) and pd.isna(row["busbw"])
    assert f"code {FAIL_EXIT_CODE}" in row["error"]
    kept = ok[["allocation_id", "buffer_bytes", "concurrent", "repeat", "probed_at"]]

    monkeypatch.delenv(FAIL_ENV)
    second = probe_sweep(TINY, provider=provider, day=DAY)
    assert second.ok and second.skipped == 2 and second.measured == 4
    provider.assert_clean()
    df = read_probes(include_failed=True)
    assert len(df) == 12 and set(df["status"]) == {"ok"}
    assert not df.duplicated(["buffer_bytes", "concurrent", "repeat"]).any()
    assert df["allocation_id"].nunique() == 2
    # The rows measured before the kill are the same rows, not re-measured ones.
    pd.testing.assert_frame_equal(
        df.merge(kept, how="inner")[kept.columns].reset_index(drop=True),
        kept.reset_index(drop=True),
    )


def test_hung_worker_times_out_and_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = Recorder()
    monkeypatch.setenv(FAIL_ENV, "1:0:hang")
    cfg = SweepConfig(sizes=(4,), concurrency=(1,), repeats=1, warmup=0, sweep_timeout_s=8)
    result = probe_sweep(cfg, provider=provider, day=DAY)
    assert not result.ok
    assert "timed out after 8s" in result.failed[0].reason or "code" in result.failed[0].reason
    provider.assert_clean()
    assert len(read_probes(include_failed=True)) == 1


def test_bad_input_fails_before_anything_starts(data_dir: Path) -> None:
    provider = Recorder()
    with pytest.raises(ConfigError, match=r"world_sizes: \[4\] exceed the 2 rank"):
        probe_sweep(
            SweepConfig(sizes=(4,), world_sizes=(2, 4)), provider=provider, instances=2, day=DAY
        )
    with pytest.raises(ConfigError, match="backend: nccl needs CUDA"):
        probe_sweep(SweepConfig(sizes=(4,), backend="nccl"), provider=provider, day=DAY)
    with pytest.raises(ConfigError, match=r"count: 17 x local\.cpu"):
        probe_sweep(SweepConfig(sizes=(4,), world_sizes=(17,)), provider=provider, day=DAY)
    with pytest.raises(ConfigError, match="instances: must be at least 1, got 0"):
        probe_sweep(SweepConfig(sizes=(4,)), provider=provider, instances=0, day=DAY)
    assert provider.pids == []
    assert not (data_dir / "cloud").exists() or not list((data_dir / "cloud").rglob("*.json"))
    assert not (data_dir / "probes").exists()


def test_catalog_types_label_the_rows() -> None:
    provider = LocalProvider()
    a = provider.launch(LaunchRequest("g4dn.12xlarge", placement_group=True))
    try:
        lab = labels(a, DAY)
    finally:
        provider.release(a)
    assert lab["instance_type"] == "g4dn.12xlarge" and lab["gpu_model"] == "T4"
    assert (lab["gpus_per_vm"], lab["vcpus"], lab["network_gbps"]) == (4, 48, 50.0)
    assert lab["provider"] == "local" and lab["placement_group"] is True
    assert lab["allocation_id"] == a.id


def test_partials_left_by_a_dead_driver_are_committed_by_the_next_run() -> None:
    from srifty_core.measure.partials import partial_dir
    from tests.probing.rows import make_rows

    # A driver died after its workers flushed two samples of one point, before commit.
    rows = make_rows(2, day=DAY)
    for i, r in enumerate(rows):
        r.update(buffer_bytes=1024, repeat=i, time_s=0.001, busbw=1024 / 0.001)
        r["probed_at"] = r["probed_at"].isoformat()
        r["date"] = DAY.isoformat()
    folder = partial_dir(DAY, "local", LOCAL_CPU)
    folder.mkdir(parents=True)
    lines = [json.dumps(r) for r in rows]
    (folder / "alloc-a.jsonl").write_text("\n".join(lines) + '\n{"torn li')
    provider = Recorder()
    cfg = SweepConfig(sizes=(1024,), concurrency=(1,), repeats=2)
    result = probe_sweep(cfg, provider=provider, day=DAY)
    assert result.ok and result.measured == 0 and result.skipped == 1 and result.rows == 2
    assert provider.pids == []  # nothing was missing, nothing was launched
    assert not _partial_files()
    assert read_probes()["allocation_id"].tolist() == ["alloc-a", "alloc-a"]


def test_sustained_probe_follows_the_largest_world_sizes_grid() -> None:
    """Back-to-back transfers, then samples recorded as phase 'sustained', kept apart from
    the grid even at a grid point's size (a rerun finds the grid complete)."""
    cfg = SweepConfig(
        sizes=(4, 1 << 20),
        concurrency=(1,),
        repeats=2,
        warmup=0,
        sustained_s=0.5,
        sustained_bytes=1 << 20,
    )
    provider = Recorder()
    result = probe_sweep(cfg, provider=provider, day=DAY)
    assert result.ok and result.measured == 2
    df = read_probes()
    sus = df[df["phase"] == "sustained"]
    grid = df[df["phase"] == "burst"]
    assert len(sus) == 2 and set(sus["buffer_bytes"]) == {1 << 20}
    assert set(sus["concurrent"]) == {1} and set(sus["world_size"]) == {2}
    assert len(grid) == 4 and sorted(set(grid["buffer_bytes"])) == [4, 1 << 20]
    assert sus["probed_at"].min() > grid["probed_at"].max()
    provider.assert_clean()
    again = probe_sweep(cfg, provider=provider, day=DAY)
    assert again.measured == 0 and len(read_probes()) == 6


def test_sustained_probe_settings_are_checked() -> None:
    from srifty_core.probing.config import SWEEP_TIMEOUT_S, config_from_params

    with pytest.raises(ConfigError, match="sustained_s"):
        SweepConfig(sizes=(4,), sustained_s=SWEEP_TIMEOUT_S)
    for bad in (-1.0, math.nan, math.inf):  # named, also when the timeout derives from it
        with pytest.raises(ConfigError, match=r"^sustained_s: must be a number >= 0"):
            SweepConfig(sizes=(4,), sustained_s=bad, sweep_timeout_s=SWEEP_TIMEOUT_S + bad)
    with pytest.raises(ConfigError, match="sustained_bytes"):
        SweepConfig(sizes=(4,), sustained_s=1.0, sustained_bytes=0)
    cfg = config_from_params({"sizes": "4B", "sustained_s": 3900})
    assert cfg.sustained_s == 3900 and cfg.sweep_timeout_s == SWEEP_TIMEOUT_S + 3900


def test_a_missing_sustained_probe_is_measured_alone_on_a_rerun() -> None:
    """A run killed during the sustained probe (here: a partition made without one) has
    every grid point stored: the rerun measures the sustained probe only, and a third run
    nothing; no row is doubled."""
    grid_only = SweepConfig(sizes=(4, 1024), concurrency=(1,), repeats=2, warmup=0)
    provider = Recorder()
    assert probe_sweep(grid_only, provider=provider, day=DAY).measured == 2
    with_sustained = dataclasses.replace(grid_only, sustained_s=0.3, sustained_bytes=1 << 16)
    again = probe_sweep(with_sustained, provider=provider, day=DAY)
    assert again.ok and again.measured == 0 and len(again.allocation_ids) == 1
    df = read_probes()
    assert (df["phase"] == "burst").sum() == 4 and (df["phase"] == "sustained").sum() == 2
    third = probe_sweep(with_sustained, provider=provider, day=DAY)
    assert third.allocation_ids == () and len(read_probes()) == 6
    provider.assert_clean()
