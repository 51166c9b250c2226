"""Srifty's plans for the method's case studies on the emulated EC2 (srifty_core.case_studies)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srifty_core import paths
from srifty_core.case_studies import (
    CASES,
    CasePlan,
    format_case_plans,
    plan_case_studies,
)
from srifty_core.errors import ConfigError
from srifty_core.profiling.store import load_reference_profile

BENCHMARK_RESULTS = paths.REPO_ROOT / "benchmarks" / "results" / "case_studies.json"


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> list[CasePlan]:
    """Every case planned once (about 2 s), with an empty data folder (no price overlays)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(paths.ENV_VAR, str(tmp_path_factory.mktemp("case-studies")))
        return plan_case_studies()


def test_every_case_plans(plans: list[CasePlan]) -> None:
    assert [p.case.name for p in plans] == [c.name for c in CASES]
    for p in plans:
        assert p.result.evaluated > 0, p.case.name
        assert p.solve_s < 5, p.case.name


def test_choices_respect_quotas_and_sum_to_the_global_batch(plans: list[CasePlan]) -> None:
    for p in plans:
        if not p.feasible:
            continue
        best = p.result.best
        assert best is not None and p.label == best.label
        request = p.result.request
        assert sum(c * b for _, c, b in best.choice) == p.case.global_batch, p.case.name
        for i, count, batch in best.choice:
            offer = request.offers[i]
            assert 1 <= count <= offer.quota == p.case.quotas[offer.instance.name]
            profile = request.workload.profile(offer.instance.device_type)
            assert batch // offer.instance.ranks_per_vm <= profile.b_max
        assert p.t_iter_s is not None and p.t_iter_s > 0
        assert p.time_s is not None and p.time_s <= p.case.time_limit_s
        assert p.cost_usd is not None and p.cost_usd <= p.case.budget_usd
        assert p.nearest_miss is None


def test_case_6_is_infeasible_and_6x_feasible(plans: list[CasePlan]) -> None:
    by_name = {p.case.name: p for p in plans}
    six, six_x = by_name["6"], by_name["6x"]
    assert not six.feasible
    assert six.label is None and six.time_s is None and six.cost_usd is None
    assert six.nearest_miss is not None and six.nearest_miss.violations
    assert six.nearest_miss.time_s > six.case.time_limit_s  # time binds on the emulated GPUs
    assert six_x.feasible
    assert all(p.feasible for p in plans if p.case.name != "6")


def test_the_plans_are_the_benchmarks_srifty_choices(plans: list[CasePlan]) -> None:
    # benchmarks/case_studies.py plans the same requests (then runs them on the ground truth)
    doc = json.loads(BENCHMARK_RESULTS.read_text())
    if doc["bandwidth"] != "srifty_core.predictors.table:ProbeTableBandwidth":
        pytest.skip("the committed benchmark used another bandwidth model")
    committed = {c["case"]: c["methods"][0] for c in doc["cases"]}
    for p in plans:
        row = committed[p.case.name]
        assert row["method"] == "srifty"
        assert (p.label or "(none)") == row["label"], p.case.name
        if p.feasible:
            assert p.time_s == pytest.approx(row["predicted"]["time_s"], rel=1e-9)
            assert p.cost_usd == pytest.approx(row["predicted"]["cost_usd"], rel=1e-9)


def test_same_seed_same_plans(plans: list[CasePlan]) -> None:
    again = plan_case_studies(["6x", "1"])
    first = {p.case.name: p for p in plans}
    for p in again:
        q = first[p.case.name]
        assert (p.label, p.t_iter_s, p.time_s, p.cost_usd) == (
            q.label,
            q.t_iter_s,
            q.time_s,
            q.cost_usd,
        )
    other = plan_case_studies(["1"], seed=3)[0]
    assert other.feasible
    assert other.result.best is not None
    assert other.result.best.estimate != first["1"].result.best.estimate  # type: ignore[union-attr]


def test_the_table(plans: list[CasePlan]) -> None:
    text = format_case_plans(plans)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["case", "model", "batch"]
    rows = lines[2 : 2 + len(plans)]
    assert [r.split()[0] for r in rows] == [p.case.name for p in plans]
    # the space under the saturation threshold is searched too: 4 samples per GPU win
    assert "32xg4dn.8xlarge@4" in rows[0] and rows[0].endswith("yes")
    six = next(r for r in rows if r.startswith("6 "))
    assert six.endswith("no") and "300 s, $1.40" in six
    assert lines[-1].startswith("case 6: no configuration meets the limits; nearest miss")
    assert "/spot" not in text


def test_unknown_case() -> None:
    with pytest.raises(ConfigError, match="not one of the case studies"):
        plan_case_studies(["8"])


def test_reference_profiles_are_shipped_whatever_the_data_folder(data_dir: Path) -> None:
    assert paths.data_dir() == data_dir  # not the repository's data/
    for model in sorted({c.model for c in CASES}):
        profile, meta = load_reference_profile(model)
        assert profile.model == model == meta["model"]
    with pytest.raises(ConfigError, match="--reprofile"):
        load_reference_profile("resnet50", data_dir)
