"""A noisy probe point: measured again (the quietest attempt kept), and one still noisy
flagged in the store and named by ``summary.noisy_points`` (the warning lines ``srifty
probe`` prints). Noise is injected into a real local sweep (``SRIFTY_PROBE_NOISE``: the
first sample of a point 10x slower, on every rank), so the rule is what is tested, not
this host's load."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from srifty_core import noise
from srifty_core.measure.probe_worker import NOISE_ENV
from srifty_core.measure.sweep import probe_sweep
from srifty_core.probing.config import SweepConfig
from srifty_core.probing.store import read_partition_table, read_probes
from srifty_core.probing.summary import noisy_points


def test_a_noisy_point_is_measured_again_and_one_still_noisy_is_flagged(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # point 0 (4 B) noisy in its first attempt only, point 1 (1 KB) in all three
    monkeypatch.setenv(NOISE_ENV, f"0:1,1:{1 + noise.NOISY_RETRIES}")
    config = SweepConfig(
        sizes=(4, 1024), world_sizes=(2,), concurrency=(1,), repeats=5, allocations=1
    )
    result = probe_sweep(config, day=date(2026, 3, 2))
    assert result.ok and result.measured == 2
    df = read_probes()
    by_size = {int(s): g for s, g in df.groupby("buffer_bytes")}
    quiet, loud = by_size[4], by_size[1024]
    assert len(quiet) == len(loud) == 5
    # re-measured: the first attempt (one sample 10x: spread 144%) was not the one kept,
    # the quiet second one was (spread 0), and the point is not flagged
    assert set(quiet["spread"]) == {0.0} and not quiet["noisy"].any()
    assert quiet["time_s"].nunique() == 1
    # noisy in every attempt: kept (the quietest of three) and flagged
    assert loud["noisy"].all() and list(loud["spread"]) == [pytest.approx(16.2**0.5 / 2.8)] * 5
    assert loud["time_s"].max() == pytest.approx(10 * loud["time_s"].min())
    warnings = noisy_points(read_partition_table(result.partition).to_pandas())
    assert len(warnings) == 1, warnings
    assert "world size 2, 1KB x 1" in warnings[0] and "spread 144%" in warnings[0]
