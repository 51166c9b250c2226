"""The scoring of two benchmarks whose figures BENCHMARKS.md quotes: the planning noise
floor of ``benchmarks/prediction_accuracy.py`` and the pooling of recorded local runs in
``benchmarks/reality_runs.py`` (pure functions, on small made-up inputs)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from srifty_core import paths


def load(name: str) -> ModuleType:
    path = paths.REPO_ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def accuracy() -> ModuleType:
    return load("prediction_accuracy")


@pytest.fixture(scope="module")
def reality() -> ModuleType:
    return load("reality_runs")


def runs(times: list[float], cost_per_s: float) -> np.ndarray:
    return np.asarray([[t, t * cost_per_s] for t in times])


def test_the_truths_plan_is_the_best_mean_whose_quantile_meets_the_limits(
    accuracy: ModuleType,
) -> None:
    request = SimpleNamespace(time_limit_s=100.0, budget_usd=1e9)
    fast_but_risky = runs([80.0] * 14 + [150.0] * 2, 1.0)  # mean 88.75, p90 of 16: 150
    steady = runs([95.0] * 16, 1.0)
    slow = runs([99.0] * 16, 0.5)
    table = {"risky": fast_but_risky, "steady": steady, "slow": slow}
    assert accuracy.truth_plan(table, request, 0.9, 0) == "steady"
    assert accuracy.truth_plan(table, request, 0.5, 0) == "risky"  # its median is 80
    assert accuracy.truth_plan(table, request, 0.9, 1) == "slow"  # cheapest that holds
    tight = SimpleNamespace(time_limit_s=50.0, budget_usd=1e9)
    assert accuracy.truth_plan(table, tight, 0.9, 0) is None


def test_a_plan_is_scored_on_its_runs(accuracy: ModuleType) -> None:
    request = SimpleNamespace(time_limit_s=100.0, budget_usd=1e9)
    out = accuracy.score(runs([120.0] + [90.0] * 15, 1.0), request, 0.9, 0, best=81.0)
    assert out["breaks"] == 1 and out["first_breaks"] is True
    assert out["quantile_breaks"] is False  # one run in 16 over: its p90 holds
    assert out["quality"] == pytest.approx(81.0 / np.mean([120.0] + [90.0] * 15))
    over = accuracy.score(runs([101.0] * 4 + [90.0] * 12, 1.0), request, 0.9, 0, best=None)
    assert over["quantile_breaks"] is True and "quality" not in over


def test_the_floor_plans_on_other_allocations_and_is_scored_on_these(
    accuracy: ModuleType,
) -> None:
    offers = [SimpleNamespace(key="a/on-demand"), SimpleNamespace(key="b/on-demand")]
    request = SimpleNamespace(time_limit_s=100.0, budget_usd=1e9, offers=offers)
    a, b = ((0, 1, 64),), ((1, 2, 32),)
    scored = {a: runs([99.0] * 16, 1.0), b: runs([120.0] * 16, 1.0)}
    other = {a: runs([101.0] * 16, 1.0), b: runs([98.0] * 16, 1.0)}  # another draw
    entry = accuracy.floor_entry(other, scored, request, 0.9, 0, best=99.0, top=a)
    assert entry["label"] == "2xb/on-demand@32"
    assert entry["quantile_breaks"] is True and entry["quality"] == pytest.approx(99 / 120)
    assert entry["optimum_seen"]["rejected"] == ["time +1.0%"]


def case(measured: float, again: float, srifty: float, **more: object) -> dict[str, object]:
    return {"measured_s": measured, "measured_again_s": again, "srifty_s": srifty, **more}


def test_recorded_runs_are_split_and_pooled(reality: ModuleType) -> None:
    parts = {"t_fw": 0.02, "t_bw": 0.05, "t_after": 0.01}
    run = {
        "cases": [
            # the mean iteration wins over the median where the run kept it
            case(
                1.0,
                1.0,
                0.090,
                measured_mean_s=0.1,
                measured_again_mean_s=0.11,
                measured_no_comm_s=0.085,
                srifty_parts=parts,
            ),
            case(0.2, 0.19, 0.21),  # an older run's case: no parts
        ]
    }
    e = reality.signed_errors(run)
    assert e["srifty"] == pytest.approx([-10.0, 5.0])
    assert e["floor"] == pytest.approx([10.0, -5.0])
    # compute 0.08 against 0.085; exchange 0.010 predicted against 0.015 exposed
    assert e["compute"] == pytest.approx([-5.0]) and e["exchange"] == pytest.approx([-5.0])
    row = reality.run_row("r", e)
    assert row["srifty_too_fast"] == 1 and "compute_mape" not in row  # not every case split
    rows = [
        {
            "run": "x",
            "cases": 10,
            "srifty_too_fast": 8,
            "srifty_mape": 9.0,
            "srifty_mean_signed": -4.0,
            "floor_too_fast": 5,
            "floor_mape": 5.0,
            "floor_mean_signed": 0.0,
        },
        {
            "run": "y",
            "cases": 10,
            "srifty_too_fast": 4,
            "srifty_mape": 5.0,
            "srifty_mean_signed": 1.0,
            "floor_too_fast": 5,
            "floor_mape": 6.0,
            "floor_mean_signed": 1.0,
        },
    ]
    total = reality.pooled(rows)
    assert total["srifty"]["too_fast_pct"] == 60.0
    lo, hi = total["srifty"]["too_fast_pct_90"]
    assert lo == 40.0 and hi == 80.0  # two runs: the interval spans their own shares
    assert total["srifty"]["runs_over_half"] == 1
    assert total["mape_over_floor"]["mean"] == 1.5
    assert total["mape_over_floor"]["runs_at_or_under_floor"] == 1
    assert "compute" not in total


def test_runs_are_read_in_the_order_they_ran(reality: ModuleType) -> None:
    from pathlib import Path

    names = ["2026-12-01_tenth", "2026-12-01_ninth", "2026-11-30_colocated_2", "2026-12-02_x"]
    ordered = sorted((Path(f"{n}.json") for n in names), key=reality.run_order)
    assert [p.stem for p in ordered] == [
        "2026-11-30_colocated_2",
        "2026-12-01_ninth",
        "2026-12-01_tenth",
        "2026-12-02_x",
    ]
