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


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.name)
def test_parsing_imports_no_heavy_library(dag_file: Path, airflow_home: Path) -> None:
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('dagfile', {str(dag_file)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
