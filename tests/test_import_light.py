"""`import srifty_core` (and its light modules) must not load any heavy library."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "torch",
    "xgboost",
    "mlflow",
    "pulp",
    "airflow",
    "sklearn",
    "optuna",
    "pandas",
    "pyarrow",
    "transformers",
)
LIGHT_MODULES = (
    "srifty_core",
    "srifty_core.paths",
    "srifty_core.errors",
    "srifty_core.catalog",
    "srifty_core.airflow_env",
    "srifty_core.cli",
    "srifty_core.profiling",
    "srifty_core.workloads",
    "srifty_core.profiling.profile",
    "srifty_core.profiling.store",
    "srifty_core.predictors.compute",
    "srifty_core.predictors.champion_cache",
    "srifty_core.tracking",
    "srifty_core.tracking.store",
    "srifty_core.tracking.runs",
    "srifty_core.tracking.registry",
    "srifty_core.cloud",
    "srifty_core.cloud.ec2",
    "srifty_core.cloud.ec2.prices",
    "srifty_core.cloud.emulated.provider",
    "srifty_core.cloud.emulated.measurements",
    "srifty_core.case_studies",
    "srifty_core.plotting",
)


def _loaded_after_import(module: str) -> list[str]:
    code = (
        f"import json, sys; import {module}; "
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return list(json.loads(out.strip().splitlines()[-1]))


def test_light_modules_load_no_heavy_library() -> None:
    for module in LIGHT_MODULES:
        assert _loaded_after_import(module) == [], module


def test_the_check_detects_a_heavy_import() -> None:
    # Guard against a check that cannot fail: a module that does import a heavy library.
    assert "pandas" in _loaded_after_import("srifty_core.catalog, pandas")
