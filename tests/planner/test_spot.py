"""Spot interruptions priced into the plan: the hazard from the catalog's bands, the
expected and quantile cost of interruptions against a simulation of the runtime's rule,
and the planner's choice with the risk priced or ignored."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import yaml

from srifty_core.catalog import Catalog
from srifty_core.planner import spot
from srifty_core.planner.job import render
from srifty_core.planner.request import request_from_dict
from srifty_core.planner.result import probe_mix_command
from srifty_core.planner.search import plan
from srifty_core.predictors.table import ProbeTableBandwidth
from srifty_core.probing.store import read_probes
from srifty_core.profiling.store import ProfileStore
from srifty_core.simulator.estimator import Simulator
from tests.planner.test_cli_plan import planning_data  # noqa: F401  (a fixture)


def test_bands_become_a_hazard_per_vm_hour() -> None:
    assert spot.monthly_share(">20%") == 0.25 and spot.monthly_share("5-10%") == 0.075
    assert spot.monthly_share("") is None and spot.monthly_share("often") is None
    lam = spot.hazard_per_hour(0.25)
    assert 1 - math.exp(-lam * spot.HOURS_PER_MONTH) == pytest.approx(0.25)
    assert spot.hazard_per_hour(0.0) == 0.0
    with pytest.raises(ValueError, match="share per month"):
        spot.hazard_per_hour(1.0)


@pytest.mark.parametrize(
    ("q", "mean"), [(0.9, 0.0), (0.9, 0.3), (0.5, 2.0), (0.9, 7.5), (0.99, 40)]
)
def test_poisson_quantile(q: float, mean: float) -> None:
    from scipy.stats import poisson

    assert spot.poisson_quantile(q, mean) == int(poisson.ppf(q, mean))


def _simulate(
    rng: random.Random, rate_h: float, work_s: float, ckpt_s: float, restart_s: float
) -> float:
    """One job under the runtime's rule: interruptions at rate ``rate_h`` (per hour of
    wall time, downtime included); each loses the work since the last checkpoint and the
    restart; the job ends when ``work_s`` of work is done."""
    t = done = since_ckpt = 0.0
    while True:
        nxt = rng.expovariate(rate_h / 3600.0)
        # progress until the interruption or the end, whichever first
        step = min(nxt, work_s - done)
        done_after = done + step
        if done_after >= work_s - 1e-9:
            return t + step
        # checkpoints every ckpt_s of work: the work since the last one is lost
        since_ckpt = (since_ckpt + step) % ckpt_s
        t += nxt + restart_s
        done = done_after - since_ckpt
        since_ckpt = 0.0
        # the restart is downtime: interruptions can land in it too (a Poisson process
        # over wall time); modelled by drawing the next gap from the restart's end


def test_expected_time_and_quantile_match_a_simulation_of_the_runtime_rule() -> None:
    rate, work, ckpt, restart = 0.8, 4 * 3600.0, 600.0, 150.0
    risk = spot.interruption_risk(
        rate, time_s=work, time_q_s=work, checkpoint_s=ckpt, restart_s=restart, quantile=0.9
    )
    rng = random.Random(0)
    runs = sorted(_simulate(rng, rate, work, ckpt, restart) for _ in range(4000))
    mean = sum(runs) / len(runs)
    assert work + risk.extra_s == pytest.approx(mean, rel=0.03)
    p90 = runs[int(0.9 * len(runs))]
    assert work + risk.extra_q_s >= p90  # conservative: each loss a whole interval
    assert work + risk.extra_q_s <= p90 * 1.15
    assert risk.expected == pytest.approx(rate * (work + risk.extra_s) / 3600)


def test_no_spot_no_risk_and_a_hopeless_rate_is_infinite() -> None:
    assert (
        spot.interruption_risk(
            0.0, time_s=10, time_q_s=12, checkpoint_s=1, restart_s=1, quantile=0.9
        )
        == spot.NONE
    )
    hopeless = spot.interruption_risk(
        100.0, time_s=10, time_q_s=12, checkpoint_s=60, restart_s=60, quantile=0.9
    )
    assert not hopeless.finite


def _plan(path: Path, **changes: object) -> object:
    req = yaml.safe_load(path.read_text()) | changes
    request = request_from_dict(req, catalog=Catalog.load(), load_profile=ProfileStore().load)
    return plan(request, Simulator(ProbeTableBandwidth().fit(read_probes())))


def test_the_planner_prices_interruptions_and_says_so(planning_data: Path) -> None:  # noqa: F811
    req = yaml.safe_load(planning_data.read_text())
    offers = [
        {**req["offers"][0], "interruptions_per_month": 0.99},  # spot, very risky
        req["offers"][1],
    ]
    common = {"offers": offers, "budget_usd": None, "time_limit_s": None, "iterations": 400_000}
    priced = _plan(planning_data, **common)
    ignored = _plan(planning_data, **common, spot_interruptions="ignored")
    by_label = {c.label: c for c in ignored.candidates}  # type: ignore[attr-defined]
    spot_used = 0
    for c in priced.candidates:  # type: ignore[attr-defined]
        twin = by_label[c.label]
        assert twin.spot == spot.NONE
        if "/spot" in c.label:
            spot_used += 1
            assert c.spot.expected > 0 and c.spot.at_quantile >= 1
            assert c.time_s > twin.time_s and c.cost_usd > twin.cost_usd
            assert c.time_at_risk_s - twin.time_at_risk_s >= c.time_s - twin.time_s
        else:
            assert c.time_s == twin.time_s and c.spot == spot.NONE
    assert spot_used > 0
    best = priced.best  # type: ignore[attr-defined]
    text = render(priced)  # type: ignore[arg-type]
    assert ("Spot interruptions (in the figures above)" in text) == ("/spot" in best.label)
    d = best.to_dict(priced.request)  # type: ignore[attr-defined]
    assert set(d["spot_interruptions"]) == {
        "expected",
        "at_risk_quantile",
        "expected_extra_s",
        "extra_at_risk_quantile_s",
    }


def test_a_bad_override_names_the_field(planning_data: Path) -> None:  # noqa: F811
    from srifty_core.errors import FieldError

    req = yaml.safe_load(planning_data.read_text())
    req["offers"][0]["interruptions_per_month"] = 1.5
    with pytest.raises(FieldError, match=r"offers\[0\]\.interruptions_per_month"):
        request_from_dict(req, catalog=Catalog.load(), load_profile=ProfileStore().load)
    req["offers"][0]["interruptions_per_month"] = 0.1
    req["spot_interruptions"] = "sometimes"
    with pytest.raises(FieldError, match="spot_interruptions"):
        request_from_dict(req, catalog=Catalog.load(), load_profile=ProfileStore().load)


def test_the_explanation_says_which_types_bandwidth_was_extrapolated(
    planning_data: Path,  # noqa: F811
) -> None:
    """A plan whose ring crosses a type the bandwidth model never probed at that shape
    says so (the p90 then carries the prior's wider held-out error)."""
    import numpy as np
    import pandas as pd

    class NoRingProbed(ProbeTableBandwidth):
        def in_domain(self, features: pd.DataFrame) -> np.ndarray:
            return (features["world_size"] < 2).to_numpy()  # every ring is outside

    req = yaml.safe_load(planning_data.read_text())
    request = request_from_dict(req, catalog=Catalog.load(), load_profile=ProfileStore().load)
    result = plan(request, Simulator(NoRingProbed().fit(read_probes())))
    best = result.best
    assert best is not None
    text = render(result)
    assert best.vms > 1  # a ring: its bandwidth is outside the domain
    assert best.estimate.extrapolated
    assert "Bandwidth extrapolated for " + best.estimate.extrapolated[0] in text
    assert best.to_dict(request)["bandwidth_extrapolated"] == list(best.estimate.extrapolated)
    for c in result.candidates:  # one VM of one GPU: no ring, nothing extrapolated
        assert bool(c.estimate.extrapolated) == (c.estimate.world_size > 1)


def test_a_mixed_ring_never_probed_names_the_command_that_probes_it(
    planning_data: Path,  # noqa: F811
) -> None:
    """Each type probed alone, their mix never: a plan that rings them together says so
    and gives the ``srifty probe --mix`` that would measure that ring."""
    req = yaml.safe_load(planning_data.read_text())
    for o in req["offers"]:
        o["quota"] = 1  # one VM of each: a job needs both, so the ring is mixed
    req.update(strategy="ddp", objective="time")
    request = request_from_dict(req, catalog=Catalog.load(), load_profile=ProfileStore().load)
    result = plan(request, Simulator(ProbeTableBandwidth().fit(read_probes())))
    best = result.best
    assert best is not None and best.vms == 2, render(result)
    assert "the mix g3.4xlarge+g4dn.xlarge" in best.estimate.extrapolated
    text = render(result)
    assert "Mixed ring g3.4xlarge+g4dn.xlarge never probed as one ring" in text
    # where the offers run: EC2 types, so on EC2 (jobs.probe_vms), over NCCL
    probe = (
        "`srifty probe --mix g3.4xlarge:1,g4dn.xlarge:1 --provider ec2 --region us-east-1 "
        """--ec2 '{"image_id": "ami-..."}' --backend nccl`"""
    )
    assert probe in text, text
    local = {"provider": "local", "backend": "gloo"}
    assert probe_mix_command("a:1,b:2", local) == "srifty probe --mix a:1,b:2"
    emulated = {"provider": "ec2-emulated", "backend": "nccl"}
    assert probe_mix_command("a:1,b:2", emulated).endswith("--mix a:1,b:2 --provider ec2-emulated")
