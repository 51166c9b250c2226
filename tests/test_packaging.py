"""The wheel carries the data the code reads at run time, and its extras split the roles:
a worker installs torch without Airflow, MLflow, Celery or Postgres."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from srifty_core import paths
from tests.planner.test_cli_plan import write_planning_data

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGE = REPO / "srifty_core"


def shipped_files() -> set[str]:
    """Every file under srifty_core/shipped/, relative to srifty_core/."""
    return {
        p.relative_to(PACKAGE).as_posix()
        for p in paths.SHIPPED_DATA_DIR.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_the_shipped_data_is_package_data() -> None:
    assert paths.SHIPPED_DATA_DIR == PACKAGE / "shipped"
    for d in (paths.CATALOG_DIR, paths.REFERENCE_DIR, paths.REFERENCE_PROFILES_DIR):
        assert d.is_relative_to(paths.SHIPPED_DATA_DIR) and d.is_dir()


def test_package_data_globs_cover_every_shipped_file() -> None:
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]["srifty_core"]
    covered = {
        p.relative_to(PACKAGE).as_posix() for g in globs for p in PACKAGE.glob(g) if p.is_file()
    }
    missing = shipped_files() - covered
    assert not missing, f"add package-data globs in pyproject.toml for {sorted(missing)}"


def test_the_files_the_code_reads_are_shipped() -> None:
    from srifty_core.case_studies import CASES
    from srifty_core.predictors.nccl_tests import default_path
    from srifty_core.profiling.store import reference_profile_paths

    shipped = shipped_files()
    wanted = [
        default_path(),
        *(paths.CATALOG_DIR / f for f in ("ec2_gpu_catalog.csv", "ec2_spot_prices.csv")),
        *(paths.CATALOG_DIR / f for f in ("gpu_specs.csv", "price_sources.csv")),
        *(p for case in CASES for p in reference_profile_paths(case.model)),
    ]
    for p in wanted:
        assert p.relative_to(PACKAGE).as_posix() in shipped, p


def _requires(metadata: str) -> dict[str, set[str]]:
    """Requires-Dist names per extra ("" for the base install)."""
    out: dict[str, set[str]] = {}
    for req in Parser().parsestr(metadata).get_all("Requires-Dist") or []:
        name = re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower()
        m = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
        out.setdefault(m.group(1) if m else "", set()).add(name)
    return out


HEAVY = ("apache-airflow", "mlflow", "celery", "psycopg", "postgres", "xgboost", "torch")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this checkout, built once for the module."""
    # Offline: the venv's own setuptools builds (the project needs >= 68).
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 68:
        pytest.skip(f"setuptools {setuptools.__version__} < 68 in this venv")
    # Build from a copy of the sources (no build/ or egg-info left in the checkout).
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(PACKAGE, src / "srifty_core", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run([*cmd, "-q", str(src), "-w", str(out)], check=True, timeout=300)
    (built,) = out.glob("srifty-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_carries_the_shipped_data_and_splits_the_extras(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (meta,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        requires = _requires(zf.read(meta).decode())
    missing = {f"srifty_core/{f}" for f in shipped_files()} - names
    assert not missing, f"the wheel lacks {sorted(missing)}"
    assert "srifty_core/py.typed" in names

    def heavy(extra: str) -> set[str]:
        return {n for n in requires.get(extra, set()) if any(h in n for h in HEAVY)}

    assert heavy("") == set(), "the base install stays light"
    assert heavy("worker") == {"torch"}
    assert {"transformers", "fsspec"} <= requires["worker"]
    assert {"pulp", "xgboost-cpu", "scipy"} <= requires["planner"]
    assert requires["tracking"] == {"mlflow"}
    assert "apache-airflow" in requires["airflow"]
    assert requires["all"] == {"srifty"}


def test_an_installed_wheel_keeps_its_data_outside_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(paths.ENV_VAR, raising=False)
    assert paths.in_source_tree() and paths.default_data_dir() == REPO / "data"
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path / "site-packages")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert not paths.in_source_tree()
    assert paths.data_dir() == tmp_path / "xdg" / "srifty"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.data_dir() == tmp_path / "home" / ".local" / "share" / "srifty"


@pytest.mark.slow
def test_srifty_plan_runs_from_the_installed_wheel(
    wheel: Path, data_dir: Path, tmp_path: Path
) -> None:
    """A non-editable install (the wheel's files, not this checkout) plans a request: the
    catalog, GPU specs and reference data come from package data. The dependencies are
    this venv's (the test runs offline); the wheel's own files shadow the checkout."""
    request = write_planning_data(data_dir)
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
    subprocess.run([*pip, "--target", str(target), str(wheel)], check=True, timeout=300)
    code = (
        "import sys, srifty_core; from srifty_core.cli import main; "
        "print('FROM', srifty_core.__file__, file=sys.stderr); "
        f"sys.exit(main(['plan', {str(request)!r}, '--bandwidth', 'probes', '--json']))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    origin = run.stderr.split("FROM ", 1)[1].split()[0]
    assert Path(origin).is_relative_to(target), origin
    assert json.loads(run.stdout)["best"] is not None
