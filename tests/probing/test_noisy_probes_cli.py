"""``srifty probe`` names a noisy point in its output, and the profiler and the probe sweep
share one noise rule (``srifty_core.noise``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from srifty_core import noise
from srifty_core.cli import main
from srifty_core.measure.probe_worker import NOISE_ENV


def test_the_rule_is_std_over_mean_and_one_constant() -> None:
    from srifty_core.profiling import sweep, timing

    assert sweep.NOISY_CV is noise.NOISY_CV and sweep.NOISY_RETRIES == 2
    assert noise.spread([1.0, 1.0, 1.0]) == 0.0
    assert noise.spread([10.0, 1.0, 1.0, 1.0, 1.0]) == pytest.approx(16.2**0.5 / 2.8)
    assert noise.is_noisy(0.26) and not noise.is_noisy(0.25)
    assert timing.step_spread(([1.0, 3.0], [1.0, 3.0])) == noise.spread([2.0, 6.0])


def test_srifty_probe_warns_of_a_noisy_point(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(NOISE_ENV, f"1:{1 + noise.NOISY_RETRIES}")  # 1 KB: noisy throughout
    argv = [
        "probe",
        "--allocations",
        "1",
        "--world-sizes",
        "2",
        "--sizes",
        "4B:1KB",
        "--steps",
        "2",
        "--repeats",
        "5",
    ]
    assert main([*argv, "--concurrency", "1", "--day", "2026-03-02", "--no-progress"]) == 0
    out = capsys.readouterr().out
    warnings = [ln for ln in out.splitlines() if ln.startswith("warning: noisy probe")]
    assert any("world size 2, 1KB x 1" in ln and "spread 144%" in ln for ln in warnings), out
