from __future__ import annotations

import math

import pytest

from srifty_core.errors import ConfigError
from srifty_core.jobs.replanner import SWITCH_OVERHEADS, Progress, Replanner
from srifty_core.planner.request import Overheads
from tests.planner.test_plan_contract import request, simulator


def test_the_remaining_request_and_the_original_is_untouched() -> None:
    r = request(objective="cost", time_limit_s=5000.0, budget_usd=20.0)
    rest = Replanner().rest(r, Progress(400, 1000.0, 5.0, depleted=("fast.x",)))
    assert (rest.iterations, rest.time_limit_s, rest.budget_usd) == (600, 4000.0, 15.0)
    assert [o.instance.name for o in rest.offers] == ["slow.x"]
    assert rest.overheads == SWITCH_OVERHEADS and rest.objective == r.objective
    assert r.iterations == 1000 and len(r.offers) == 2 and r.overheads == Overheads(launch_s=100)
    assert math.isinf(Replanner().rest(request(), Progress(1, 9, 1)).budget_usd)


def test_replan_uses_what_is_left() -> None:
    r = request(time_limit_s=5000.0, budget_usd=50.0)
    res = Replanner(simulator()).plan(r, Progress(500, 100.0, 1.0, depleted=("fast.x",)))
    assert res.best is not None and res.request.iterations == 500
    assert all(res.request.offers[i].instance.name == "slow.x" for i, _, _ in res.best.choice)
    assert res.best.time_s >= 155.0  # the switch overheads are charged
    chosen, note = Replanner.choose(res)
    assert chosen is res.best and note is None


def test_nothing_left_is_an_error() -> None:
    r = request(time_limit_s=100.0)
    with pytest.raises(ConfigError, match="time limit"):
        Replanner().rest(r, Progress(1, 200.0, 0.0))
    with pytest.raises(ConfigError, match="depleted"):
        Replanner().rest(request(), Progress(1, 1, 0, depleted=("fast.x", "slow.x")))
    with pytest.raises(ConfigError, match="nothing to plan"):
        Replanner().rest(request(), Progress(1000, 1, 0))
    with pytest.raises(ConfigError, match="estimator"):
        Replanner().plan(request(), Progress(1))


def test_survivors_split_the_batch_evenly() -> None:
    assert Replanner.survivors(10, 3) == (4, 3, 3)
    with pytest.raises(ConfigError, match="cannot split"):
        Replanner.survivors(2, 3)
