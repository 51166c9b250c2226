"""Every DAG in dags/ imports cleanly, is tagged, retries, and parses without heavy imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from srifty_core import paths

pytestmark = pytest.mark.airflow

DAG_FILES = sorted(p for p in paths.DAGS_DIR.glob("*.py") if not p.name.startswith("_"))
HEAVY = (
    "torch",
    "xgboost",
    "mlflow",
    "pulp",
    "sklearn",
    "transformers",
    "srifty_core.workloads.zoo",
)


def test_there_are_dags() -> None:
    assert DAG_FILES


def test_no_import_errors(dagbag: Any) -> None:
    assert dagbag.import_errors == {}
    assert len(dagbag.dags) >= len(DAG_FILES)


def test_every_dag_has_tags_retries_and_docs(dagbag: Any) -> None:
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert "srifty" in dag.tags, f"{dag_id} is not tagged 'srifty'"
        assert dag.doc_md, f"{dag_id} has no doc_md"
        for task in dag.tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"


_IMPORT_EACH = """
import importlib.util, json, os, sys, traceback
from airflow.sdk import Param, dag, task  # what every DAG file imports: once, before the forks
heavy, found = json.loads(sys.argv[1]), {}
for i, path in enumerate(sys.argv[2:]):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a fresh copy of this process per file: nothing one file imports leaks
        os.close(r)
        try:
            spec = importlib.util.spec_from_file_location(f"dagfile{i}", path)
            mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
            said = sorted(m for m in heavy if m in sys.modules)
        except BaseException:
            said = "import failed: " + traceback.format_exc()
        os.write(w, json.dumps(said).encode()); os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        text = fh.read()
    os.waitpid(pid, 0)
    found[path] = json.loads(text) if text else "the child died"
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def heavy_imports(airflow_home: Path) -> dict[str, Any]:
    """``{DAG file: the heavy libraries in sys.modules after importing it}``, each file
    imported in a fork of one interpreter that imported Airflow's SDK once (an interpreter
    per file imported Airflow anew each time: seconds of CPU apiece)."""
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, json.dumps(HEAVY), *map(str, DAG_FILES)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.name)
def test_parsing_imports_no_heavy_library(dag_file: Path, heavy_imports: dict[str, Any]) -> None:
    assert heavy_imports[str(dag_file)] == []
