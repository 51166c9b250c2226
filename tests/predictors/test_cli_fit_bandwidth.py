"""`srifty fit-bandwidth` end to end on a synthetic store."""

from __future__ import annotations

from pathlib import Path

import pytest

from srifty_core.cli import main
from tests.predictors.bw_rows import write_store


def test_fit_bandwidth_prints_the_table(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_store(allocations=3)
    code = main(["fit-bandwidth", "--since", "all", "--trials", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "noise" in out.lower() or "floor" in out
    assert "g4dn.12xlarge" in out and ">MTU" in out
    assert "promoted to champion" in out


def test_fit_bandwidth_bad_input(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit-bandwidth"]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["fit-bandwidth", "--budget", "soon"]) == 2


def test_fit_bandwidth_says_the_time_budget_became_a_trial_count(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fit-bandwidth", "--budget", "120s"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--budget was removed" in err and "--trials N" in err
    with pytest.raises(SystemExit):
        main(["fit-bandwidth", "--trials", "many"])
