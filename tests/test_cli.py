from __future__ import annotations

import json
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from srifty_core import paths
from srifty_core.catalog import Market, Price, PriceObservation, write_overlay
from srifty_core.cli import main


def test_catalog_table_prints_the_real_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--family", "g4dn", "--region", "us-east-1"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("g4dn.")]
    assert len(lines) == 7
    xlarge = next(ln.split() for ln in lines if ln.startswith("g4dn.xlarge "))
    assert xlarge[:6] == ["g4dn.xlarge", "us-east-1", "4", "16", "T4", "1"]
    assert "0.5260" in xlarge
    assert "prices observed 2025-05-31 .. 2026-04-02" in out
    assert "us-west-2" not in out


def test_catalog_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--family", "p4d", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["region"] for r in rows} == {"us-east-1", "us-west-2"}
    assert all(r["name"] == "p4d.24xlarge" and r["gpus_per_vm"] == 8 for r in rows)


def test_unknown_family_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--family", "g4d"]) == 2
    err = capsys.readouterr().err
    assert "unknown instance family 'g4d'" in err and "g4dn" in err


def test_data_dir_option_reaches_the_overlay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "elsewhere"
    obs = PriceObservation(
        "g4dn.xlarge", "us-east-1", Market.ON_DEMAND, None, Price(0.4242, date(2026, 11, 1), "t")
    )
    write_overlay(paths.price_overlay_dir(root) / "t.csv", [obs])
    assert (
        main(["--data-dir", str(root), "catalog", "--family", "g4dn", "--region", "us-east-1"]) == 0
    )
    assert "0.4242" in capsys.readouterr().out
    assert main(["--data-dir", str(root), "catalog", "--family", "g4dn", "--no-overlays"]) == 0
    assert "0.4242" not in capsys.readouterr().out


def test_validate_writes_the_report(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--validate", "--region", "us-east-1"]) == 0
    assert "0 errors" in capsys.readouterr().out
    assert list((data_dir / "reports" / "catalog").glob("*/report.md"))


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "srifty"
    proc = subprocess.run(
        [str(exe), "catalog", "--family", "g4dn", "--region", "us-east-1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "g4dn.metal" in proc.stdout


def test_bad_values_are_one_line_errors_naming_the_option(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from srifty_core.runtime.progress import ProgressLog, ProgressRecord

    with ProgressLog(data_dir / "run" / "progress.jsonl") as log:
        for i in range(1, 5):
            log.append(ProgressRecord(i, float(i), 0.1, 8, "c0"))
    cases = [
        (["probe", "--day", "2026-13-45"], "--day"),
        (["profile", "--model", "resnet18", "--size", "tiny", "--threads", "0"], "threads"),
        (["monitor", str(data_dir / "run"), "--iterations", "10", "--budget", "0"], "--budget"),
        (["monitor", str(data_dir / "run"), "--iterations", "10", "--time-limit", "-5"], "--time"),
    ]
    for argv, name in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("srifty: error:") and name in err and "\n" not in err, err
