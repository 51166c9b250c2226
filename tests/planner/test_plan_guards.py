"""What the planner says instead of a wrong plan (issue 48): an estimate that is no time
stops the search naming the configuration; a global batch no configuration can hold says
why nothing was evaluated; a damaged profile is one line under `srifty plan`."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml

from srifty_core.cli import main
from srifty_core.planner.result import EstimateError
from srifty_core.planner.search import plan
from srifty_core.predictors.compute import PiecewiseLinear
from srifty_core.simulator.types import Workload
from tests.planner.test_cli_plan import write_planning_data
from tests.planner.test_plan_contract import WORKLOAD, request, simulator


@pytest.mark.parametrize("slope", [math.nan, math.inf, -1.0])
@pytest.mark.parametrize("method", ["exact", "exhaustive", "approx"])
def test_an_estimate_that_is_no_time_stops_the_search(slope: float, method: str) -> None:
    """A profile made in memory (not read from a file, so not checked there) whose
    forward time is NaN, infinite or negative: no plan, an error naming the configuration
    and the profiles to check."""
    bad = WORKLOAD.profiles["M60"]
    fit = PiecewiseLinear((), (slope,), (0.0,), 1.0, float(bad.b_max))
    workload = Workload("m", {**WORKLOAD.profiles, "M60": dataclasses.replace(bad, fw_fit=fit)})
    with pytest.raises(EstimateError, match=r"slow.x/spot@\d+ is not a time.*profiles of m on M60"):
        plan(request(workload=workload), simulator(), method=method)


def test_a_global_batch_no_configuration_holds_says_why_and_what_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """255 is no sum of one power-of-two batch per type: the answer said "among 0
    evaluated" and nothing more."""
    result = plan(request(global_batch=255), simulator())
    assert result.best is None and result.space_size == 0
    (why,) = result.explanation()
    assert "No configuration holds global_batch 255 exactly" in why
    assert "fast.x/on-demand: 1-128 x 1 GPU, up to 4" in why
    assert "nearest global batches these offers hold: 248 and 256" in why
    assert "batch_granularity: any" in why
    assert "among 0 evaluated" not in why


def test_a_nan_profile_under_srifty_plan_is_one_line_naming_the_file(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It planned "nan s and $nan", chose it as the best and exited 0."""
    req = write_planning_data(data_dir)
    path = data_dir / "profiles" / "m" / "full" / "T4.json"
    d = json.loads(path.read_text())
    d["fw_fit"]["slopes"] = [math.nan] * len(d["fw_fit"]["slopes"])
    path.write_text(json.dumps(d))
    assert main(["plan", str(req), "--bandwidth", "probes"]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert str(path) in line and "fw_fit.slopes: must be finite" in line
    assert "nan" not in captured.out.lower()
    yaml.safe_dump  # noqa: B018 - the request file stays as written
