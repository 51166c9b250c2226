"""The import contract of ``srifty_core``: no import cycles between its modules, the
control plane's layers (and the jobs, worker, cloud and profiling packages) import
downwards only, the
packages import downwards in the redesign's layer order (no allow-list left) and form no
import cycle between them; there are no provider-name switches above the cloud
package, and only the tracking package imports MLflow.

A small AST check, no import-linter: every ``import`` and ``from ... import`` of a module
counts, at module level and inside functions (a function-level import is how a cycle
hides: it only fails, or not, at call time). Imports under ``if TYPE_CHECKING:`` are left
out: they never run, and annotations may name a type of a higher layer. The imports inside
functions are pinned to the ones that defer a heavy library (and the CLI's), with why.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "srifty_core"

# The control plane's layers (srifty_core.jobs), bottom first: a module may import modules
# of its own layer or below (the cycle check keeps a layer acyclic), never above.
_LAYERS = (
    ("job model", "job decisions outcome cloud_request profile_summary"),
    ("policy", "monitor replanner planning recalibration preflight"),
    # MLflow, the cloud, the workers' processes and wheels
    ("effects", "job_log cloud_watch provisioning artifact emulated_job vm_script"
     " emulation_reference profiler_vm probe_vms"),
    ("composition", "monitor_step monitor_loop local_run orchestrate job_run child_run"
     " profile_vms"),
)  # fmt: skip
JOBS_LAYERS = tuple((name, frozenset(ms.split())) for name, ms in _LAYERS)
WORKER = "srifty_core.worker"
"""What runs on a training VM (torch): below the control plane, above no cloud or profiling."""
PROFILE_STORE = "srifty_core.profiling.store"
_PROFILING = ("profile_vms", "cloud_request", "profiler_vm", "vm_script", "emulation_reference",
              "profile_summary")  # fmt: skip
PROFILING_JOBS = {f"srifty_core.jobs.{m}" for m in _PROFILING}
"""The job that profiles on cloud VMs: it drives the profiler, which training jobs never do
(they read the profile store only)."""
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


def _function_nodes(tree: ast.AST) -> set[int]:
    """The nodes inside a function's body (or a lambda)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
    return inside


@functools.cache
def imports(root: Path = ROOT) -> tuple[tuple[str, str, int, bool], ...]:
    """``(module, imported module of the package, line, inside a function)`` for each
    import: ``from a import b`` counts as ``a.b`` when that is a module, else as ``a``.
    Read once per package and run (the tests below ask for the same tree many times)."""
    return tuple(_scan(root))


def _scan(root: Path) -> Iterator[tuple[str, str, int, bool]]:
    mods = modules(root)
    top = root.name

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_nodes(tree)
        in_function = _function_nodes(tree)
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
                    yield name, found, node.lineno, id(node) in in_function


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """``{module: {imported module of the package: first line}}``."""
    graph: dict[str, dict[str, int]] = {name: {} for name in modules(root)}
    for name, found, line, _ in imports(root):
        graph[name].setdefault(found, line)
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


def _jobs_layer(module: str) -> int | None:
    prefix = "srifty_core.jobs."
    if not module.startswith(prefix):
        return None
    name = module[len(prefix) :]
    return next((k for k, (_, ms) in enumerate(JOBS_LAYERS) if name in ms), None)


def test_every_jobs_module_has_a_layer() -> None:
    jobs = [m for m in modules() if m.startswith("srifty_core.jobs.")]
    assert [m for m in jobs if _jobs_layer(m) is None] == []


def test_jobs_layers_import_downwards() -> None:
    wrong = []
    for a, edges in import_graph().items():
        la = _jobs_layer(a)
        for b, line in edges.items():
            lb = _jobs_layer(b)
            if la is not None and lb is not None and lb > la:
                wrong.append(
                    f"{a} ({JOBS_LAYERS[la][0]}) imports {b} ({JOBS_LAYERS[lb][0]}), line {line}"
                )
    assert wrong == []


def test_jobs_worker_cloud_and_profiling_import_downwards() -> None:
    """The worker (what runs on a VM) imports no cloud or profiling module, and the cloud
    providers import no worker or jobs module; a training job reads the profile store only,
    which imports no jobs or worker module."""
    wrong = []
    for a, edges in import_graph().items():
        for b, line in edges.items():
            where = f"{a} imports {b} (line {line})"
            jobs_b = b.startswith(("srifty_core.jobs.", WORKER + "."))
            if a.startswith("srifty_core.cloud") and jobs_b:
                wrong.append(f"{where}: the cloud imports no worker or jobs module")
            worker_a = a.startswith(WORKER + ".")
            if worker_a and b.startswith(("srifty_core.cloud", "srifty_core.profiling")):
                wrong.append(f"{where}: the worker imports no cloud or profiling module")
            profiling_b = b.startswith("srifty_core.profiling")
            training_a = a.startswith("srifty_core.jobs.") and a not in PROFILING_JOBS
            if training_a and profiling_b and b != PROFILE_STORE:
                wrong.append(f"{where}: a training job reads the profile store only")
            if a == PROFILE_STORE and b.startswith(("srifty_core.jobs", WORKER)):
                wrong.append(f"{where}: the profile store is below the jobs and the worker")
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


@pytest.mark.parametrize("module", ["srifty_core.jobs.monitor_step", "srifty_core.demo"])
def test_the_graph_sees_function_level_imports(module: str) -> None:
    # monitor_step imports provisioning inside Monitor.__init__; the demo imports the
    # jobs inside its functions only.
    graph = import_graph()
    assert any(b.startswith("srifty_core.jobs.") for b in graph[module])


# ---------------------------------------------------------------- function-level imports
# Imports inside a function only defer a heavy library (REDESIGN.md 4.4, rule 1): an
# internal import goes at the top of its module unless what it loads is heavy. The CLI
# package, every module of it, is the exception (``srifty --help`` stays fast: each
# command imports what it runs). The ones left, with why, can only go.
LAZY_IMPORTERS = frozenset({"srifty_core.cli"})
"""Packages (or modules) whose modules may import anything inside a function."""


def lazy_importer(module: str) -> bool:
    """Is ``module`` one of ``LAZY_IMPORTERS`` or a module inside one of them?"""
    return any(module == p or module.startswith(p + ".") for p in LAZY_IMPORTERS)


FUNCTION_LEVEL_IMPORTS: dict[tuple[str, str], str] = {
    # (importer, imported): why it stays inside a function. "heavy: X": importing the module
    # loads X (numpy counts where the importer does not load it otherwise).
    ("srifty_core", "srifty_core.planner.search"): "heavy: scipy",
    ("srifty_core.case_studies", "srifty_core.planner.search"): "heavy: scipy",
    ("srifty_core.case_studies", "srifty_core.predictors.table"): "heavy: pyarrow",
    ("srifty_core.case_studies", "srifty_core.simulator.estimator"): "heavy: scipy",
    ("srifty_core.cloud", "srifty_core.cloud.emulated.provider"): "heavy: numpy",
    ("srifty_core.cloud.emulated.measurements", "srifty_core.probing.schema"): "heavy: pyarrow",
    ("srifty_core.cloud.emulated.measurements", "srifty_core.probing.store"): "heavy: pyarrow",
    ("srifty_core.demo", "srifty_core.predictors.registry"): "heavy: pyarrow",
    ("srifty_core.demo", "srifty_core.probing.store"): "heavy: pyarrow",
    ("srifty_core.demo", "srifty_core.probing.summary"): "heavy: pyarrow",
    ("srifty_core.demo", "srifty_core.profiling.ddp_check"): "heavy: torch",
    ("srifty_core.demo", "srifty_core.simulator.estimator"): "heavy: scipy",
    ("srifty_core.jobs.emulation_reference", "srifty_core.profiling.config"): "heavy: torch",
    ("srifty_core.jobs.emulation_reference", "srifty_core.profiling.job"): "heavy: torch",
    ("srifty_core.measure.sharded_memory", "srifty_core.sharding.wrap"): "heavy: torch",
    ("srifty_core.planner.job", "srifty_core.planner.search"): "heavy: scipy",
    ("srifty_core.planner.job", "srifty_core.predictors.public_model"): "heavy: pyarrow",
    ("srifty_core.planner.job", "srifty_core.predictors.nccl_tests"): "heavy: pyarrow",
    ("srifty_core.planner.job", "srifty_core.predictors.registry"): "heavy: pyarrow",
    ("srifty_core.planner.job", "srifty_core.predictors.table"): "heavy: pyarrow",
    ("srifty_core.planner.job", "srifty_core.probing.store"): "heavy: pyarrow",
    ("srifty_core.planner.whatif", "srifty_core.planner.search"): "heavy: scipy",
    ("srifty_core.planner.whatif_report", "srifty_core.simulator.calibration"): "heavy: scipy",
    ("srifty_core.planner.whatif_report", "srifty_core.simulator.estimator"): "heavy: scipy",
    ("srifty_core.predictors.refresh.data", "srifty_core.probing.store"): "heavy: pyarrow",
    ("srifty_core.predictors.refresh.evaluate", "srifty_core.predictors.registry"):
        "heavy: pyarrow",
    ("srifty_core.predictors.refresh.fit", "srifty_core.predictors.tuning"): "heavy: pyarrow",
    ("srifty_core.predictors.refresh.promote", "srifty_core.predictors.registry"): "heavy: pyarrow",
    ("srifty_core.predictors.refresh.register", "srifty_core.predictors.registry"):
        "heavy: pyarrow",
    ("srifty_core.profiling.census_count", "srifty_core.profiling.buckets"): "heavy: torch",
    ("srifty_core.profiling.census_count", "srifty_core.profiling.census_rnn"): "heavy: torch",
    ("srifty_core.profiling.census_count", "srifty_core.profiling.census_attention"): (
        "heavy: torch"
    ),
    ("srifty_core.profiling.census_count", "srifty_core.sharding.units"): "heavy: torch",
    ("srifty_core.jobs.child_run", "srifty_core.worker.checkpoint"): "heavy: torch",
    ("srifty_core.jobs.emulated_job", "srifty_core.worker.checkpoint"): "heavy: torch",
    ("srifty_core.jobs.job_run", "srifty_core.worker.checkpoint"): "heavy: torch",
    ("srifty_core.jobs.job_run", "srifty_core.jobs.local_run"): "heavy: torch",
    ("srifty_core.jobs.orchestrate", "srifty_core.worker.checkpoint"): "heavy: torch",
    ("srifty_core.jobs.planning", "srifty_core.planner.search"): "heavy: scipy",
    ("srifty_core.jobs.planning", "srifty_core.predictors.registry"): "heavy: pyarrow",
    ("srifty_core.jobs.planning", "srifty_core.worker.checkpoint"): "heavy: torch",
    ("srifty_core.jobs.planning", "srifty_core.simulator.calibration"): "heavy: scipy",
    ("srifty_core.jobs.planning", "srifty_core.simulator.estimator"): "heavy: scipy",
    ("srifty_core.jobs.recalibration", "srifty_core.simulator.calibration"): "heavy: scipy",
    ("srifty_core.jobs.recalibration", "srifty_core.simulator.estimator"): "heavy: scipy",
    ("srifty_core.jobs.replanner", "srifty_core.planner.search"): "heavy: scipy",
    ("srifty_core.worker.user", "srifty_core.worker.worker"): "heavy: torch",
    ("srifty_core.simulator.calibration", "srifty_core.simulator.estimator"): "heavy: scipy",
    ("srifty_core.simulator.types", "srifty_core.predictors.network"): "heavy: pyarrow",
    ("srifty_core.workloads.references", "srifty_core.workloads.zoo"): "heavy: torch",
    ("srifty_core.workloads.reference_models", "srifty_core.workloads.vision"): "heavy: torch",
    ("srifty_core.workloads.reference_models", "srifty_core.workloads.gpt_from_scratch"):
        "heavy: torch",
}  # fmt: skip


def function_level_imports(root: Path = ROOT) -> dict[tuple[str, str], int]:
    """``{(importer, imported module of the package): line}`` of the imports inside a
    function, outside ``LAZY_IMPORTERS`` (``lazy_importer``)."""
    out: dict[tuple[str, str], int] = {}
    for a, b, line, in_function in imports(root):
        if in_function and not lazy_importer(a):
            out.setdefault((a, b), line)
    return out


@functools.cache
def _function_level_today() -> dict[tuple[str, str], int]:
    return function_level_imports()


def test_function_level_imports_only_defer_heavy_modules() -> None:
    new = [
        f"{a} -> {b} (line {line})"
        for (a, b), line in sorted(_function_level_today().items())
        if (a, b) not in FUNCTION_LEVEL_IMPORTS
    ]
    assert new == [], "import these at the top of the module (or say why not here)"


def test_the_function_level_allow_list_only_shrinks() -> None:
    found = _function_level_today()
    gone = [f"{a} -> {b}" for a, b in FUNCTION_LEVEL_IMPORTS if (a, b) not in found]
    assert gone == [], "no longer imported in a function: remove it from FUNCTION_LEVEL_IMPORTS"


def test_the_check_finds_a_function_level_import(tmp_path: Path) -> None:
    # Guard against a check that cannot fail: a relative import in a method counts, a
    # module-level one, a TYPE_CHECKING one and those of the CLI package's modules do not;
    # a module that only starts with the CLI's name (``clients``) is no CLI module.
    pkg = tmp_path / "srifty_core"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from srifty_core.sub import a\n"
        "class C:\n"
        "    def f(self):\n"
        "        if TYPE_CHECKING:\n"
        "            from srifty_core.errors import E\n"
        "        from .a import x\n"
    )
    (pkg / "cli").mkdir()
    (pkg / "cli" / "__init__.py").write_text("def main():\n    from srifty_core.sub import b\n")
    (pkg / "cli" / "run.py").write_text("def cmd_run():\n    from srifty_core.sub import a\n")
    (pkg / "clients.py").write_text("def f():\n    from srifty_core.sub import a\n")
    assert function_level_imports(pkg) == {
        ("srifty_core.sub.b", "srifty_core.sub.a"): 7,
        ("srifty_core.clients", "srifty_core.sub.a"): 2,
    }


def test_every_cli_module_is_a_lazy_importer() -> None:
    # The exemption covers the files of the CLI package's folder, each of them, and no
    # module outside it.
    cli = sorted(m for m, path in modules().items() if ROOT / "cli" in path.parents)
    assert len(cli) > 1
    assert sorted(m for m in modules() if lazy_importer(m)) == cli


# ---------------------------------------------------------------- package layers
# The redesign's target layers (L0 lowest)
# applied to today's names: each unit is a package of srifty_core or a module at its root,
# placed where most of it goes. A unit may import units of its own layer or below; an
# import of a higher layer must be in ALLOWED_UPWARD. Units of one layer may import each
# other (the module cycle check keeps that acyclic): the target's "|" (siblings
# independent) does not hold for today's names, nor for all of the target's (paths imports
# errors; the demo imports the case studies).
_PACKAGE_LAYERS = (
    ("L0 base", "errors paths training_settings batches atomic outputs lifetime worker_env"
     " host_allocator noise plotting console"),
    # tracking: every MLflow call (store, runs, registry; it imports paths and errors
    # only); the modules that log to MLflow sit above it and call it
    ("L1 data", "catalog probing workload workloads runs tracking"),
    # what a strategy holds per rank and how a module is sharded (no package of Srifty's)
    ("L1 sharding", "sharding"),
    ("L2 schema", "trigger_models"),
    ("L3 compute and bandwidth", "profiling predictors"),
    ("L4 simulator", "simulator"),
    ("L5 planner and cloud", "planner cloud"),
    ("L6 measure", "measure"),
    # what runs on a training VM (torch)
    ("L7 worker", "worker"),
    ("L8 jobs", "jobs"),
    ("L9 apps", "demo case_studies ui airflow_env"),
    # what the root exports lies below it; the CLI reads its version
    ("facade", "srifty_core"),
    ("L10 cli", "cli"),
)  # fmt: skip
PACKAGE_LAYERS = tuple((name, frozenset(units.split())) for name, units in _PACKAGE_LAYERS)

ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
"""Upward imports tolerated, ``(importer, imported) -> why``: none (the 18 of issue 49's
start are gone); a new one fails the check."""


def unit(module: str) -> str:
    """The package of srifty_core (or the root module) ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_layer(
    module: str, layers: Sequence[tuple[str, frozenset[str]]] = PACKAGE_LAYERS
) -> int | None:
    return next((k for k, (_, units) in enumerate(layers) if unit(module) in units), None)


def upward_imports(
    graph: Mapping[str, Mapping[str, int]],
    layers: Sequence[tuple[str, frozenset[str]]] = PACKAGE_LAYERS,
) -> dict[tuple[str, str], str]:
    """``{(importer, imported): "layer -> layer, line N"}`` of every import of a higher
    layer (a module without a layer counts as the lowest)."""
    out = {}
    for a, edges in graph.items():
        la = package_layer(a, layers) or 0
        for b, line in edges.items():
            lb = package_layer(b, layers) or 0
            if lb > la:
                out[(a, b)] = f"{layers[la][0]} -> {layers[lb][0]}, line {line}"
    return out


def test_every_package_has_a_layer() -> None:
    units = {unit(m) for m in modules()}
    placed = set().union(*(us for _, us in PACKAGE_LAYERS))
    assert sorted(units - placed) == [], "place these in PACKAGE_LAYERS"
    assert sorted(placed - units) == [], "no such package or module any more"


@functools.cache
def _upward_today() -> dict[tuple[str, str], str]:
    return upward_imports(import_graph())


def test_packages_import_downwards_but_for_the_allow_list() -> None:
    found = _upward_today()
    new = {f"{a} -> {b} ({why})" for (a, b), why in found.items() if (a, b) not in ALLOWED_UPWARD}
    assert sorted(new) == [], "new upward imports (import downwards, or move the code)"


def test_the_upward_allow_list_only_shrinks() -> None:
    found = _upward_today()
    gone = [f"{a} -> {b}" for a, b in ALLOWED_UPWARD if (a, b) not in found]
    assert gone == [], "no longer an upward import: remove it from ALLOWED_UPWARD"


def package_graph(graph: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """``{unit: {imported unit: 0}}``: the module graph folded onto packages (and the root's
    modules), an edge where any module of one imports any module of the other."""
    out: dict[str, dict[str, int]] = {unit(a): {} for a in graph}
    for a, edges in graph.items():
        for b in edges:
            if unit(b) != unit(a):
                out[unit(a)][unit(b)] = 0
    return out


def test_no_package_level_import_cycles() -> None:
    """No two packages import each other, through any chain of modules (a module-level
    acyclic graph can still tie its packages into one knot: issue 49 started with 7 of 8
    packages in one)."""
    assert cycles(package_graph(import_graph())) == []


def test_the_package_cycle_check_finds_one(tmp_path: Path) -> None:
    # Guard against a check that cannot fail: a.x imports b.y, b.z imports a.w (no module
    # cycle) is a package cycle.
    pkg = tmp_path / "srifty_core"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from srifty_core.b import y\n")
    (pkg / "b" / "y.py").write_text("")
    (pkg / "b" / "z.py").write_text("from srifty_core.a import w\n")
    (pkg / "a" / "w.py").write_text("")
    graph = import_graph(pkg)
    assert cycles(graph) == []
    assert cycles(package_graph(graph)) == [["a", "b"]]


def test_the_layer_check_finds_an_upward_import(tmp_path: Path) -> None:
    # Guard against a check that cannot fail: errors (L0) importing the catalog (L1) in a
    # function is upward; the catalog importing errors is not.
    pkg = tmp_path / "srifty_core"
    (pkg / "catalog").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "catalog" / "__init__.py").write_text("from srifty_core.errors import E\n")
    (pkg / "errors.py").write_text("def f():\n    from srifty_core.catalog import C\n")
    assert upward_imports(import_graph(pkg)) == {
        ("srifty_core.errors", "srifty_core.catalog"): "L0 base -> L1 data, line 2"
    }


# ---------------------------------------------------------------- provider names, MLflow
PROVIDER_NAMES = frozenset({"local", "ec2", "ec2-emulated"})
PROVIDER_HOMES = ("srifty_core.cloud", "srifty_core.planner.schema")
"""Where provider names may be compared (the cloud package and today's schema package)."""
KNOWN_PROVIDER_SWITCHES: dict[tuple[str, str], int] = {}
"""Comparisons with a provider name and ``isinstance(..., <X>Provider)`` checks outside
``PROVIDER_HOMES``, ``(module, expression) -> count``: none; the providers answer instead
(``Provider.shares_host``, ``billed``, ``simulated``, ``start_workers``...)."""
MLFLOW_HOME = "srifty_core.tracking"
"""The one package that imports MLflow; everything else calls its functions."""


def _strings(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_strings(e) for e in node.elts))
    return set()


def _names_a_provider_class(node: ast.expr) -> bool:
    if isinstance(node, ast.Tuple):
        return any(_names_a_provider_class(e) for e in node.elts)
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name.endswith("Provider")


def _is_provider_switch(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        return bool(PROVIDER_NAMES & set().union(*map(_strings, [node.left, *node.comparators])))
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "isinstance" and len(node.args) == 2
        and _names_a_provider_class(node.args[1])
    )  # fmt: skip


def provider_switches(root: Path = ROOT) -> dict[tuple[str, str], int]:
    """``{(module, expression): count}`` of the comparisons with a provider name and the
    ``isinstance(..., <X>Provider)`` checks outside ``PROVIDER_HOMES``."""
    out: dict[tuple[str, str], int] = {}
    for name, path in sorted(modules(root).items()):
        if any(name == h or name.startswith(h + ".") for h in PROVIDER_HOMES):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _is_provider_switch(node):
                key = (name, ast.unparse(node))
                out[key] = out.get(key, 0) + 1
    return out


def mlflow_importers(root: Path = ROOT) -> set[str]:
    """The modules that import ``mlflow`` or one of its modules, anywhere in the file, or
    reach it through ``sys.modules`` (a lookup by the name ``"mlflow"``)."""
    out = set()
    for name, path in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )  # fmt: skip
            if any(t == "mlflow" or t.startswith("mlflow.") for t in targets):
                out.add(name)
            text = ast.unparse(node) if isinstance(node, ast.Subscript | ast.Call) else ""
            if "sys.modules" in text and "'mlflow'" in text:
                out.add(name)
    return out


def test_no_provider_names_above_cloud() -> None:
    assert provider_switches() == KNOWN_PROVIDER_SWITCHES == {}, "ask the Provider instead"


def outside_mlflow_home(importers: set[str]) -> list[str]:
    """The modules of ``importers`` outside ``MLFLOW_HOME``."""
    return sorted(m for m in importers if m != MLFLOW_HOME and not m.startswith(MLFLOW_HOME + "."))


def test_mlflow_is_imported_only_in_the_tracking_package() -> None:
    found = mlflow_importers()
    assert outside_mlflow_home(found) == [], "MLflow belongs in srifty_core.tracking"
    assert found, "nothing imports MLflow: the check looks in the wrong place"


def test_the_provider_and_mlflow_checks_find_what_they_look_for(tmp_path: Path) -> None:
    # Guard against checks that cannot fail.
    pkg = tmp_path / "srifty_core"
    (pkg / "cloud").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cloud" / "__init__.py").write_text("def f(p):\n    return p == 'ec2'\n")
    (pkg / "jobs.py").write_text(
        "import mlflow.tracking\n"
        "def f(p, q):\n"
        "    if p.provider in ('local', 'ec2-emulated') or isinstance(q, cloud.LocalProvider):\n"
        "        return p.name == 'localhost'\n"
        "    return p.provider == 'local'\n"
    )
    (pkg / "log.py").write_text("def f():\n    from mlflow import log_metric\n")
    (pkg / "tracking").mkdir()
    (pkg / "tracking" / "__init__.py").write_text("")
    (pkg / "tracking" / "runs.py").write_text("def f():\n    import mlflow\n")
    (pkg / "trackingx.py").write_text("import mlflow\n")
    (pkg / "calib.py").write_text("import sys\ndef f():\n    m = sys.modules.get('mlflow')\n")
    assert provider_switches(pkg) == {
        ("srifty_core.jobs", "p.provider in ('local', 'ec2-emulated')"): 1,
        ("srifty_core.jobs", "isinstance(q, cloud.LocalProvider)"): 1,
        ("srifty_core.jobs", "p.provider == 'local'"): 1,
    }
    found = mlflow_importers(pkg)
    assert found == {
        "srifty_core.calib", "srifty_core.jobs", "srifty_core.log", "srifty_core.tracking.runs",
        "srifty_core.trackingx",
    }  # fmt: skip
    assert outside_mlflow_home(found) == [
        "srifty_core.calib", "srifty_core.jobs", "srifty_core.log", "srifty_core.trackingx"
    ]  # fmt: skip
