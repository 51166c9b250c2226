"""The fault harness (``tests/harness/fault_review.py``) cannot rot silently: it imports,
every case and fault carries its metadata, the faults name cases and tests that exist, and
RELIABILITY.md's generated sections are what the harness makes of its recorded run. The
harness itself is not run here (it takes minutes): this only reads it."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "tests" / "harness" / "fault_review.py"


@pytest.fixture(scope="module")
def review() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("fault_review", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fault_review"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("fault_review", None)


def test_every_case_has_a_unique_id_and_says_what_is_right(review: ModuleType) -> None:
    ids = [c.id for c in review.CASES]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    for c in review.CASES:
        assert c.id and c.group and c.what and callable(c.body), c
        if c.field is not None:  # the error due names this, or one of its alternatives
            assert all(f.strip() for f in c.field.split("|")), c.id


def test_every_fault_names_cases_and_tests_that_exist(review: ModuleType) -> None:
    assert review.FAULTS
    for f in review.FAULTS:
        assert f.what and f.before and f.right and f.cases, f
        assert review.case_ids(f.cases)  # LookupError for a case that is not there
        for name in f.tests:
            node = review.test_node(name)  # LookupError for a test that is not there
            path, _, func = node.partition("::")
            assert (ROOT / path).is_file(), node
            assert not func or f"def {func}(" in (ROOT / path).read_text(), node
    for tests in review.PYTEST_CASES.values():
        for name in tests:
            path, _, func = review.test_node(name).partition("::")
            assert (ROOT / path).is_file() and (not func or f"def {func}(" in (
                ROOT / path).read_text()), name  # fmt: skip


def test_every_pytest_case_serves_a_fault(review: ModuleType) -> None:
    used = {i for f in review.FAULTS for i in review.case_ids(f.cases)}
    assert set(review.PYTEST_CASES) <= used, set(review.PYTEST_CASES) - used


def test_reliability_md_is_generated_from_the_recorded_run(review: ModuleType) -> None:
    """Both sections between their markers are exactly what the harness renders from
    ``results/fault_review.json``: no hand-kept row or count, and no metadata change left
    unrendered (``fault_review.py --render`` writes them again)."""
    summary = json.loads(review.RESULT.read_text())
    assert summary["cases"] == len(summary["results"]) == sum(summary["counts"].values())
    assert set(summary["counts"]) <= set(review.OUTCOMES)
    text = review.RELIABILITY.read_text()
    for marker in (review.BEGIN, review.END, review.FAULTS_BEGIN, review.FAULTS_END):
        assert text.count(marker) == 1, marker
    assert review.render(text, summary) == text, "run `tests/harness/fault_review.py --render`"
    table = text.split(review.FAULTS_BEGIN)[1].split(review.FAULTS_END)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert len(rows) == len(review.FAULTS) + 1  # the header
    assert all(len(re.split(r"(?<!\\)\|", ln)) == 7 for ln in rows)  # five cells each
