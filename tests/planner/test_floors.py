"""The simulator's floors and batched prefetch for the planner: they never change an
estimate, and the batched forms agree with the single ones."""

from __future__ import annotations

import itertools
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest

from srifty_core.planner.space import Space
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.types import Group
from tests.planner.scale_fixtures import WorldBandwidth, random_request, simulator


def test_floors_and_prefetch_leave_estimates_unchanged() -> None:
    rng = np.random.default_rng(21)
    r = random_request(rng, kinds=3)
    space = Space.build(r, saturate=False)
    choices = list(itertools.islice(space.enumerate(), 0, None, 5))[:60]
    configs = [space.config(ch) for ch in choices]
    plain = Simulator(WorldBandwidth(), iters=48)
    busy = Simulator(WorldBandwidth(), iters=48)
    busy.prefetch_configs(r.workload, configs)
    for config in configs:
        for col, g in enumerate(config.groups):
            busy.pass_floor(r.workload, g, col + 9)  # slots beyond the draws so far
            busy.pass_floors(r.workload, g.instance, g.batch, col, 9)
        busy.exchange_floor(r.workload, config, 0.01)
    for o in r.offers:
        busy.ring_ceiling(r.workload, o.instance, range(1, 40))
    for config in configs:
        assert busy.estimate(r.workload, config) == plain.estimate(r.workload, config)


def test_prefetching_configurations_asks_the_model_once() -> None:
    class Counting(WorldBandwidth):
        calls: ClassVar[int] = 0

        def predict(self, features: pd.DataFrame) -> np.ndarray:
            Counting.calls += 1
            return super().predict(features)

    rng = np.random.default_rng(4)
    r = random_request(rng, kinds=3)
    space = Space.build(r)
    configs = [space.config(ch) for ch in itertools.islice(space.enumerate(), 40)]
    sim = Simulator(Counting(), iters=16)
    sim.prefetch_configs(r.workload, configs)
    asked = Counting.calls
    assert asked <= 1
    for config in configs:
        sim.estimate(r.workload, config)
    assert Counting.calls == asked


@pytest.mark.parametrize("column", [0, 2, 9])
def test_batched_pass_floors_agree_with_single_ones(column: int) -> None:
    rng = np.random.default_rng(column)
    r = random_request(rng, kinds=2)
    sim = simulator()
    o = r.offers[0]
    for batch in Space.build(r).vm_batches[0]:
        f, b = sim.pass_floors(r.workload, o.instance, batch, column, 300)
        assert f.shape == b.shape == (300,)
        assert np.all(np.diff(f) >= -1e-12) and np.all(np.diff(b) >= -1e-12)  # more VMs
        for count in (1, 2, 7, 257, 300):
            one = sim.pass_floor(r.workload, Group(o.instance, count, batch), column)
            assert (f[count - 1], b[count - 1]) == pytest.approx(one, rel=1e-12)


def test_exact_mean_floors_are_the_mean_passes() -> None:
    rng = np.random.default_rng(2)
    r = random_request(rng, kinds=2)
    sim = Simulator(WorldBandwidth(), iters=16, mean="exact")
    space = Space.build(r)
    for choice in itertools.islice(space.enumerate(), 30):
        config = space.config(choice)
        est = sim.estimate(r.workload, config)
        for col, g in enumerate(config.groups):
            f, b = sim.pass_floor(r.workload, g, col)
            assert f <= est.t_fw and b <= est.t_bw
