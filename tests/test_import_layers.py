"""The import contract of ``srifty_core``: no import cycles between its modules, and the
runtime's layers (and the runtime, cloud and profiling packages) import downwards only.

A small AST check, no import-linter: every ``import`` and ``from ... import`` of a module
counts, at module level and inside functions (a function-level import is how a cycle
hides: it only fails, or not, at call time). Imports under ``if TYPE_CHECKING:`` are left
out: they never run, and annotations may name a type of a higher layer.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "srifty_core"

# The runtime's layers, bottom first: a module may import modules of its own layer or
# below (the cycle check keeps a layer acyclic), never above.
_LAYERS = (
    # the run folder's files and their formats; what the ranks run
    ("run folder", "run_store progress train_plan checkpoint rendezvous placement exchange_timer"
     " timeline"),
    ("job model", "job decisions outcome"),
    ("policy", "monitor replanner planning recalibration preflight"),
    # MLflow, the cloud, the workers' processes and wheels
    ("effects", "job_log cloud_watch provisioning artifact launch worker user measure"
     " emulated_job"),
    ("composition", "monitor_step monitor_loop local_run orchestrate job_run child_run"),
)  # fmt: skip
RUNTIME_LAYERS = tuple((name, frozenset(ms.split())) for name, ms in _LAYERS)
RUN_FOLDER = {f"srifty_core.runtime.{m}" for m in RUNTIME_LAYERS[0][1]}
PROFILE_STORE = "srifty_core.profiling.store"
KNOWN_CYCLES: tuple[list[str], ...] = ()
"""Cycles tolerated for now (none: a new one fails the test)."""


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """``{module: {imported module of the package: line}}``: ``from a import b`` counts as
    ``a.b`` when that is a module, else as ``a``."""
    mods = modules(root)
    top = root.name

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_nodes(tree)
        edges: dict[str, int] = {}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]  # fmt: skip
            for t in targets:
                found = known(t) if t == top or t.startswith(top + ".") else None
                if found is not None and found != name:
                    edges.setdefault(found, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _show(graph: Mapping[str, Mapping[str, int]], comp: list[str]) -> str:
    inside = set(comp)
    return "; ".join(
        f"{a} -> {b} (line {line})"
        for a in comp for b, line in sorted(graph[a].items()) if b in inside
    )  # fmt: skip


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = [c for c in cycles(graph) if c not in KNOWN_CYCLES]
    assert not found, "import cycles:\n" + "\n".join(_show(graph, c) for c in found)


def _runtime_layer(module: str) -> int | None:
    prefix = "srifty_core.runtime."
    if not module.startswith(prefix):
        return None
    name = module[len(prefix) :]
    return next((k for k, (_, ms) in enumerate(RUNTIME_LAYERS) if name in ms), None)


def test_every_runtime_module_has_a_layer() -> None:
    runtime = [m for m in modules() if m.startswith("srifty_core.runtime.")]
    assert [m for m in runtime if _runtime_layer(m) is None] == []


def test_runtime_layers_import_downwards() -> None:
    wrong = []
    for a, edges in import_graph().items():
        la = _runtime_layer(a)
        for b, line in edges.items():
            lb = _runtime_layer(b)
            if la is not None and lb is not None and lb > la:
                wrong.append(
                    f"{a} ({RUNTIME_LAYERS[la][0]}) imports {b} ({RUNTIME_LAYERS[lb][0]}), "
                    f"line {line}"
                )
    assert wrong == []


def test_runtime_cloud_and_profiling_import_downwards() -> None:
    """The run-folder layer is below the cloud providers, which are below the rest of the
    runtime; the runtime reads the profile store only, which imports no runtime module."""
    wrong = []
    for a, edges in import_graph().items():
        for b, line in edges.items():
            where = f"{a} imports {b} (line {line})"
            runtime_b = b.startswith("srifty_core.runtime.")
            if a.startswith("srifty_core.cloud") and runtime_b and b not in RUN_FOLDER:
                wrong.append(f"{where}: the cloud may use the run-folder layer only")
            if a in RUN_FOLDER and b.startswith(("srifty_core.cloud", "srifty_core.profiling")):
                wrong.append(f"{where}: the run-folder layer is below the cloud and profiling")
            profiling_b = b.startswith("srifty_core.profiling")
            if a.startswith("srifty_core.runtime.") and profiling_b and b != PROFILE_STORE:
                wrong.append(f"{where}: the runtime reads the profile store only")
            if a == PROFILE_STORE and b.startswith("srifty_core.runtime"):
                wrong.append(f"{where}: the profile store is below the runtime")
    assert wrong == []


def test_the_check_finds_a_function_level_cycle(tmp_path: Path) -> None:
    # Guard against a check that cannot fail: a cycle hidden in a function-level import,
    # and one through a relative import, are found; a TYPE_CHECKING import is not one.
    pkg = tmp_path / "srifty_core"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from srifty_core.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from srifty_core.sub.a import x\n")
    (pkg / "sub" / "c.py").write_text("from . import d\n")
    (pkg / "sub" / "d.py").write_text("def g():\n    from .c import y\n")
    (pkg / "e.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from srifty_core import f\n"
    )
    (pkg / "f.py").write_text("import srifty_core.e\n")
    found = cycles(import_graph(pkg))
    assert found == [
        ["srifty_core.sub.a", "srifty_core.sub.b"],
        ["srifty_core.sub.c", "srifty_core.sub.d"],
    ]


@pytest.mark.parametrize("module", ["srifty_core.runtime.monitor_step", "srifty_core.demo"])
def test_the_graph_sees_function_level_imports(module: str) -> None:
    # monitor_step imports provisioning inside Monitor.__init__; the demo imports the
    # runtime inside its functions only.
    graph = import_graph()
    assert any(b.startswith("srifty_core.runtime.") for b in graph[module])
