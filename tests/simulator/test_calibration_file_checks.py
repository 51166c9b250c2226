"""A stored calibration file is checked on read (issue 48): a damaged one is one line
naming it, never a traceback or a factor that makes every estimate infinite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from srifty_core.errors import ConfigError
from srifty_core.simulator import calibration as calib

GOOD = {"log_scale": 0.1, "sd": 0.05, "windows": 2, "seen": 2}


@pytest.mark.parametrize(
    ("compute", "words"),
    [
        ({"T4": {"sd": 0.05}}, "KeyError: 'log_scale'"),
        ({"T4": "x1.3"}, "not a calibration file"),
        ({"T4": {**GOOD, "sd": float("nan")}}, "finite sd"),
        ({"T4": {**GOOD, "log_scale": 800.0}}, r"compute.T4: log_scale 800 .* x1000"),
        ({"T4": {**GOOD, "windows": -3}}, r"compute.T4: .*counts >= 0"),
        ([1, 2], "not a calibration file"),
    ],
)
def test_a_damaged_calibration_file_is_one_line_naming_it(
    data_dir: Path, compute: Any, words: str
) -> None:
    path = calib.store_path("m")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 2, "model": "m", "compute": compute, "comm": {}}))
    with pytest.raises(ConfigError, match=words) as err:
        calib.load_stored("m")
    assert str(path) in str(err.value) and "delete it to start over" in str(err.value)
    assert "\n" not in str(err.value)
    path.write_text(json.dumps({"version": 2, "model": "m", "compute": {"T4": GOOD}}))
    stored = calib.load_stored("m")  # a good one reads
    assert stored is not None and stored.compute["T4"].windows == 2
