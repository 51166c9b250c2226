"""One job per module (issue 49): no module of ``srifty_core`` over ``MAX_LINES`` lines but
the ones listed, each with why it stays whole. The list can only shrink."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "srifty_core"
MAX_LINES = 600
LARGE_MODULES = {
    # the simulator's hot path: one class whose caches (predictor queries, caps, exchange
    # results, common random numbers) are shared by its methods; split, every call of the
    # planner's thousands would cross module state
    "simulator/estimator.py": "one Simulator class and the caches its methods share",
    # the exact search: its bound, node expansion and the keeper are one algorithm whose
    # invariants (the bound is admissible for the keeper's objective) are read together
    "planner/bnb.py": "branch and bound: the bound, the expansion and the keeper",
}


def module_lines(root: Path = ROOT) -> dict[str, int]:
    return {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in root.rglob("*.py")}


def test_no_module_is_over_the_limit_but_the_listed_ones() -> None:
    over = {m: n for m, n in module_lines().items() if n > MAX_LINES}
    assert sorted(set(over) - set(LARGE_MODULES)) == [], f"split these (lines): {over}"


def test_the_list_only_shrinks() -> None:
    lines = module_lines()
    small = [m for m in LARGE_MODULES if lines.get(m, 0) <= MAX_LINES]
    assert small == [], "no longer over the limit: remove from LARGE_MODULES"
    assert len(LARGE_MODULES) <= 2  # issue 49: at most two, each with a reason


def test_the_check_finds_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n")
    assert {m for m, n in module_lines(tmp_path).items() if n > MAX_LINES} == {"long.py"}
