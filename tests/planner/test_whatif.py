"""What-if scenarios: parsing, applying to the request, reuse of the base search's
simulations, the same answer as planning the changed request from scratch, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from srifty_core.catalog import Catalog
from srifty_core.cli import main
from srifty_core.errors import FieldError
from srifty_core.planner import whatif
from srifty_core.planner.request import request_from_dict
from srifty_core.planner.search import plan
from srifty_core.predictors.table import ProbeTableBandwidth
from srifty_core.probing.store import read_probes
from srifty_core.profiling.store import ProfileStore
from srifty_core.simulator.apm import ApmEstimator
from srifty_core.simulator.estimator import Simulator, planner_estimator
from tests.planner.test_cli_plan import planning_data  # noqa: F401  (a fixture)

BASE: dict[str, Any] = {
    "model": "m",
    "global_batch": 512,
    "budget_usd": 20,
    "offers": [
        {"type": "g4dn.xlarge", "market": "spot", "quota": 8},
        {"type": "g3.4xlarge", "market": "on-demand", "quota": 8},
    ],
}


def test_scenarios_parse_and_apply_without_touching_the_base() -> None:
    sc = whatif.parse_scenario("quota[g4dn.xlarge]=16; budget_usd=7.5; overheads.launch_s=60")
    out = whatif.apply_scenario(BASE, sc)
    assert out["offers"][0]["quota"] == 16 and out["budget_usd"] == 7.5
    assert out["overheads"] == {"launch_s": 60}
    assert BASE["offers"][0]["quota"] == 8 and "overheads" not in BASE
    by_index = whatif.apply_scenario(BASE, whatif.parse_scenario("offers[1].market=spot"))
    assert by_index["offers"][1]["market"] == "spot"
    no_limit = whatif.apply_scenario(BASE, whatif.parse_scenario("budget_usd=null"))
    assert "budget_usd" not in no_limit
    both = {**BASE, "offers": [*BASE["offers"], {"type": "g4dn.xlarge", "quota": 2}]}
    pinned = whatif.apply_scenario(both, whatif.parse_scenario("quota[g4dn.xlarge@spot]=3"))
    assert [o["quota"] for o in pinned["offers"]] == [3, 8, 2]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("budget_usd", "write key=value"),
        ("", "empty scenario"),
        ("quota[p3.2xlarge]=4", "no offer of 'p3.2xlarge'; offered: g3.4xlarge, g4dn.xlarge"),
        ("offers[5].quota=1", r"offers\[5\]: the request has 2 offers"),
        ("colour[g4dn.xlarge]=red", "'colour' is not an offer field"),
    ],
)
def test_a_bad_scenario_is_a_field_error_naming_it(text: str, match: str) -> None:
    with pytest.raises(FieldError, match=match):
        whatif.apply_scenario(BASE, whatif.parse_scenario(text))


def _what(data_dir: Path, req: dict[str, Any]) -> whatif.WhatIf:
    catalog = Catalog.load()
    load = whatif.profile_loader(ProfileStore().load)
    sim = Simulator(ProbeTableBandwidth().fit(read_probes()))
    return whatif.WhatIf(
        req, sim, lambda d: request_from_dict(d, catalog=catalog, load_profile=load)
    )


def test_a_scenario_answers_what_planning_it_from_scratch_answers_and_reuses_simulations(
    planning_data: Path,  # noqa: F811
    data_dir: Path,
) -> None:
    req = yaml.safe_load(planning_data.read_text())
    what = _what(data_dir, req)
    assert what.base.feasible
    run_before = what.memo.misses
    answer = what.ask("quota[g4dn.xlarge]=16")
    fresh = plan(
        request_from_dict(
            whatif.apply_scenario(req, whatif.parse_scenario("quota[g4dn.xlarge]=16")),
            catalog=Catalog.load(),
            load_profile=ProfileStore().load,
        ),
        Simulator(ProbeTableBandwidth().fit(read_probes())),
    )
    assert answer.result.best is not None and fresh.best is not None
    assert answer.result.best.choice == fresh.best.choice
    assert answer.result.best.cost_usd == pytest.approx(fresh.best.cost_usd)
    # configurations the base search simulated were not simulated again
    assert what.memo.hits > 0 and what.memo.misses >= run_before
    # a limit that nothing meets: no plan, and the change says so
    none = what.ask("budget_usd=0.001")
    assert none.result.best is None and none.delta(what.base) == (None, None)
    # a bad value in a scenario names the scenario and the field
    with pytest.raises(FieldError, match=r"what-if 'global_batch=-3': global_batch"):
        what.ask("global_batch=-3")


def test_one_more_vm_of_each_type(planning_data: Path, data_dir: Path) -> None:  # noqa: F811
    what = _what(data_dir, yaml.safe_load(planning_data.read_text()))
    marginal = what.marginal_values()
    assert [a.scenario for a in marginal] == ["offers[0].quota=9", "offers[1].quota=9"]
    for a in marginal:  # more quota never makes the best plan worse on its objective
        assert a.result.best is not None and what.base.best is not None
        assert a.result.best.cost_usd <= what.base.best.cost_usd + 1e-9


def test_the_cli_prints_each_scenario_and_its_change(
    planning_data: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", str(planning_data), "--bandwidth", "probes"]
    assert main([*args, "--what-if", "budget_usd=5", "--one-more-vm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("base: ")
    assert "budget_usd=5" in out and "one more VM: offers[0].quota=9" in out
    assert "simulations:" in out and "reused" in out
    assert main([*args, "--what-if", "quota[g3.4xlarge]=2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["what_if"][0]["scenario"] == "quota[g3.4xlarge]=2"
    assert d["simulations"]["reused"] > 0
    assert main([*args, "--what-if", "quota[nope]=2"]) == 2
    assert "what-if 'quota[nope]=2'" in capsys.readouterr().err


def test_the_memo_offers_the_planner_what_its_inner_estimator_does() -> None:
    """``MemoEstimator`` hands every other method on to its inner estimator: over the
    simulator the planner finds its floors and prefetch (the branch and bound runs), over
    APM none (the exhaustive search or the ILP)."""
    sim = Simulator(ProbeTableBandwidth())
    memo = whatif.MemoEstimator(sim)
    assert planner_estimator(memo) is memo
    assert memo.pass_floor == sim.pass_floor
    assert planner_estimator(whatif.MemoEstimator(ApmEstimator())) is None
