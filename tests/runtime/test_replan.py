from __future__ import annotations

import math

import pytest

from srifty_core.errors import ConfigError
from srifty_core.planner.request import Overheads
from srifty_core.runtime.replan import SWITCH_OVERHEADS, remaining_request, replan
from tests.planner.test_plan_contract import request, simulator


def test_the_remaining_request_and_the_original_is_untouched() -> None:
    r = request(objective="cost", time_limit_s=5000.0, budget_usd=20.0)
    rest = remaining_request(
        r, iterations_done=400, elapsed_s=1000.0, spent_usd=5.0, depleted=["fast.x"]
    )
    assert (rest.iterations, rest.time_limit_s, rest.budget_usd) == (600, 4000.0, 15.0)
    assert [o.instance.name for o in rest.offers] == ["slow.x"]
    assert rest.overheads == SWITCH_OVERHEADS and rest.objective == r.objective
    assert r.iterations == 1000 and len(r.offers) == 2 and r.overheads == Overheads(launch_s=100)
    assert math.isinf(
        remaining_request(request(), iterations_done=1, elapsed_s=9, spent_usd=1).budget_usd
    )


def test_replan_uses_what_is_left() -> None:
    r = request(time_limit_s=5000.0, budget_usd=50.0)
    res = replan(
        r, simulator(), iterations_done=500, elapsed_s=100.0, spent_usd=1.0, depleted=["fast.x"]
    )
    assert res.best is not None and res.request.iterations == 500
    assert all(res.request.offers[i].instance.name == "slow.x" for i, _, _ in res.best.choice)
    assert res.best.time_s >= 155.0  # the switch overheads are charged


def test_nothing_left_is_an_error() -> None:
    r = request(time_limit_s=100.0)
    with pytest.raises(ConfigError, match="time limit"):
        remaining_request(r, iterations_done=1, elapsed_s=200.0, spent_usd=0.0)
    with pytest.raises(ConfigError, match="depleted"):
        remaining_request(
            request(), iterations_done=1, elapsed_s=1, spent_usd=0, depleted=["fast.x", "slow.x"]
        )
    with pytest.raises(ConfigError, match="nothing to plan"):
        remaining_request(request(), iterations_done=1000, elapsed_s=1, spent_usd=0)
