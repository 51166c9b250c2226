"""Shared fixtures: an isolated data folder for every test, and one Airflow home per session."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from srifty_core import paths
from srifty_core.airflow_env import airflow_environment, migrate
from tests import file_order

pytest_plugins = [
    "tests.cloud.moto_aws",  # the moto fixtures (moto_url, aws)
    "tests.netns",  # network namespaces as VMs (net)
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On parallel workers (scripts/test runs pytest-xdist), the costliest test files start
    first (``tests.file_order``). Every worker sorts the same way, as xdist needs; a serial
    run keeps the collection order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        file_order.order(items)


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test writes into its own data folder, never into the repository's data/."""
    root = tmp_path / "srifty-data"
    root.mkdir()
    monkeypatch.setenv(paths.ENV_VAR, str(root))
    # MLflow exports the URI it was last given; start each test from the default store.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    return root


@pytest.fixture(autouse=True)
def _mlflow_store_from_template(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """In this process, a data folder's default MLflow store is a copy of one made once per
    run (by ``tracking.store._create_once`` itself, under a file lock, in the run's shared
    temporary folder) instead of being made again: MLflow's table migrations cost about a
    second of CPU per store, and about 85 tests each open a fresh one (12% of the parallel
    workers' CPU, sampled at a60fca8). Child processes (the CLI, workers) still create
    their stores for real, as ``tests/profiling/test_tracking.py`` checks."""
    from srifty_core.tracking import store

    create = store._create_once

    def from_template(folder: Path, uri: str) -> None:
        if not (folder / "mlflow.db").exists():
            template = _mlflow_template(tmp_path_factory, create)
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(template / "mlflow.db", folder / "mlflow.db")
            (folder / "mlflow.db.ready").touch()
        create(folder, uri)

    monkeypatch.setattr(store, "_create_once", from_template)


def _mlflow_template(tmp_path_factory: pytest.TempPathFactory, create: Any) -> Path:
    """The run's template store's folder, made by the first process to need it."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's, shared by the workers
    folder = shared / "mlflow-store-template"
    with FileLock(f"{folder}.lock"):
        if not (folder / "mlflow.db.ready").exists():
            folder.mkdir(exist_ok=True)
            create(folder, f"sqlite:///{folder / 'mlflow.db'}")
    return folder


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private AIRFLOW_HOME (SQLite, examples off, small parallelism, the repo's dags/ and
    plugins/), migrated once per test session.

    The variables go into this process's environment before anything imports Airflow, so
    ``dag.test()`` in a test runs against this home.
    """
    home = tmp_path_factory.mktemp("airflow-home")
    env = airflow_environment(home)
    template = _migrated_template(tmp_path_factory)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        if template is None:
            migrate(env)
        else:
            shutil.copyfile(template, home / "airflow.db")
        yield home


def _migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """On parallel workers (pytest-xdist): a metadata DB (SQLite) migrated once per run, in
    the run's shared temporary folder, under a file lock, by the first worker to need one,
    for each worker to copy into its own home (``migrate`` starts an Airflow CLI and builds
    every table: seconds of CPU per worker). No DAG runs in it. ``None`` in a serial run."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent / "airflow-db-template"  # the run's, shared
    with FileLock(f"{root}.lock"):
        if not (root / ".done").exists():
            if root.exists():  # a worker that died half-way
                shutil.rmtree(root)
            migrate(airflow_environment(root))
            (root / ".done").touch()
    return root / "airflow.db"


@pytest.fixture(scope="session")
def dagbag(airflow_home: Path) -> object:
    """Every DAG in dags/, parsed once by Airflow's own DagBag."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(paths.DAGS_DIR))


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``extra``, for child interpreters."""
    return {**os.environ, **(extra or {})}


@pytest.fixture(scope="session")
def planning_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the planner needs, made once per session in its own data folder: a CPU
    profile of DLRM (tiny), its emulated T4 profile, and a champion bus-bandwidth model
    fitted (for real, tiny budget) on synthetic probes of ``local.cpu`` and two g4dn types.

    The CPU profile is measured for real (buckets, B_max, memory), then its latencies are
    replaced by a throughput-bound line of 1 ms per sample and pass: the tiny model's steps
    take the same fraction of a millisecond at any batch, which makes one worker the
    planner's choice, and the plan-and-train tests need a plan that splits the batch over
    two workers (as a real-size model's would). The workers still train the tiny model.

    On parallel workers (pytest-xdist) the first worker to need them makes them in the
    run's shared temporary folder, under a file lock, and the others read them (tests copy
    them, ``ready_to_plan``; none writes here): about 25 s of profiling and fitting once
    per run instead of once per worker.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.mktemp("planning-assets")
        _make_planning_assets(root)
        return root
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent / "planning-assets"  # the run's, shared
    with FileLock(f"{root}.lock"):
        if not (root / ".done").exists():
            if root.exists():  # a worker that died half-way
                shutil.rmtree(root)
            root.mkdir()
            _make_planning_assets(root)
            (root / ".done").touch()
    return root


def _make_planning_assets(root: Path) -> None:
    from srifty_core.cloud.emulated.measurements import emulated_profiles
    from srifty_core.predictors.refresh.config import RefreshConfig
    from srifty_core.predictors.refresh.pipeline import refresh_bandwidth_model
    from srifty_core.profiling.config import ProfilerConfig
    from srifty_core.profiling.profiler import profile_model
    from srifty_core.profiling.store import ProfileStore
    from tests.predictors.bw_rows import write_store

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(paths.ENV_VAR, str(root))
        mp.setenv("MLFLOW_TRACKING_URI", "")
        store = ProfileStore()
        cpu = profile_model(
            "dlrm",
            "tiny",
            ProfilerConfig(max_batch=32, repeats=3, warmup=1, threads=1, share_host=1),
        )
        linear = _throughput_bound(cpu, 1e-3)  # deterministic, unlike a loaded CPU's curve
        store.save(linear)
        for p in emulated_profiles(["g4dn.xlarge"], linear, max_batch=256).values():
            store.save(p)
        write_store(types=("g4dn.xlarge", "g4dn.12xlarge", "local.cpu"), allocations=3)
        refresh_bandwidth_model(RefreshConfig(since=None, half_life=None, n_trials=1))


def _throughput_bound(profile: Any, per_sample_s: float) -> Any:
    """``profile`` with linear latencies, ``per_sample_s`` per sample and pass (5% spread)."""
    from dataclasses import replace

    def stats(s: Any) -> Any:
        means = tuple(per_sample_s * b + 1e-4 for b in s.batch_sizes)
        return replace(s, mean_s=means, std_s=tuple(0.05 * m for m in means))

    def fit(f: Any) -> Any:
        return replace(f, breakpoints=(), slopes=(per_sample_s,), intercepts=(1e-4,))

    return replace(profile, fw=stats(profile.fw), bw=stats(profile.bw),
                   fw_fit=fit(profile.fw_fit), bw_fit=fit(profile.bw_fit))  # fmt: skip


@pytest.fixture
def ready_to_plan(planning_assets: Path, data_dir: Path) -> Path:
    """This test's data folder with the session's profiles, probes and champion model."""
    for sub in ("profiles", "probes", "mlflow"):
        src = planning_assets / sub
        if src.exists():
            shutil.copytree(src, data_dir / sub, dirs_exist_ok=True)
    return data_dir
