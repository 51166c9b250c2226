from __future__ import annotations

from pathlib import Path

import pytest

from srifty_core.cli import main
from srifty_core.cli.parser import parse_bytes
from srifty_core.profiling.profile import ComputeProfile


def test_profile_command_writes_the_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    code = main(
        [
            "profile", "--model", "dlrm", "--size", "tiny", "--max-batch", "8",
            "--repeats", "2", "--no-mlflow", "--out", str(out), "--share-host", "1",
        ]
    )  # fmt: skip
    assert code == 0
    p = ComputeProfile.from_json(out.read_text())
    assert p.model == "dlrm" and p.b_max == 8
    printed = capsys.readouterr().out
    assert "B_max 8" in printed and str(out) in printed


def test_profile_into_the_store_and_mlflow(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["profile", "--model", "dlrm", "--size", "tiny", "--max-batch", "4", "--repeats", "2"]
    assert main([*argv, "--share-host", "1"]) == 0
    assert (data_dir / "profiles" / "dlrm" / "tiny" / "cpu.json").is_file()
    assert "MLflow run:" in capsys.readouterr().out


def test_profile_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "resnet", "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'resnet'" in err and "resnet18" in err
    assert (
        main(
            [
                "profile",
                "--model",
                "resnet18",
                "--size",
                "tiny",
                "--memory-cap",
                "1KiB",
                "--no-mlflow",
            ]
        )
        == 2
    )
    assert "does not fit" in capsys.readouterr().err


def test_parse_bytes() -> None:
    assert parse_bytes("4GiB") == 4 * 2**30
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("100") == 100
