"""`srifty plan` starts calibrated from the factors earlier runs of the model stored, says so,
and ignores them with ``--no-calibration``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from srifty_core.cli import main
from srifty_core.simulator import calibration as calib
from tests.planner.test_cli_plan import planning_data  # noqa: F401  (the fixture)


def _plan(request: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    main(["plan", str(request), "--bandwidth", "probes", "--json", *extra])
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_plan_uses_stored_factors_and_says_so(
    planning_data: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    plain = _plan(planning_data, capsys)
    assert plain["calibration"] is None
    calib.save(calib.Calibration("m", {"T4": calib.Factor(math.log(3.0), 0.01, 4, 4)}, {}))
    slowed = _plan(planning_data, capsys)
    cal = slowed["calibration"]
    assert isinstance(cal, dict) and cal["compute"]["T4"]["scale"] == pytest.approx(3.0)
    best, best0 = slowed["best"], plain["best"]
    assert isinstance(best, dict) and isinstance(best0, dict)
    assert best["t_iter_s"] != best0["t_iter_s"]  # the T4 is three times slower now
    ignored = _plan(planning_data, capsys, "--no-calibration")
    assert ignored["calibration"] is None and ignored["best"] == best0
    main(["plan", str(planning_data), "--bandwidth", "probes"])
    text = capsys.readouterr().out
    assert "Calibrated by earlier runs of m (--no-calibration to ignore): T4 compute x3.000" in text
