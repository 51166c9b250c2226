"""The main job on embedded defaults: SQLite, local files, local processes.

What exists today: the catalog refresh DAG, run for real by Airflow (``airflow dags test``)
against an Airflow home under the data folder, then the report it wrote and the catalog
table. Later stages (probe sweep, model refresh, profiling, plan-and-train) join here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.airflow_env import airflow_environment, migrate, run_airflow
from srifty_core.errors import SriftyError


def _step(n: int, total: int, text: str) -> float:
    print(f"[{n}/{total}] {text} ...", flush=True)
    return time.perf_counter()


def _done(t0: float, extra: str = "") -> None:
    print(f"      done in {time.perf_counter() - t0:.1f}s{(' - ' + extra) if extra else ''}")


def run_dag(dag_id: str, env: dict[str, str], conf: dict[str, object]) -> str:
    """Run one DAG through Airflow's ``dags test`` and return the final run state."""
    run_airflow(["dags", "test", dag_id, "-c", json.dumps(conf)], env, quiet=True)
    out = run_airflow(["dags", "list-runs", dag_id, "-o", "json"], env, quiet=True)
    # Airflow may print warnings on stdout before the JSON document, which is one line.
    runs: list[dict[str, Any]] = next(
        (json.loads(ln) for ln in out.splitlines() if ln.startswith("[")), []
    )
    if not runs:
        raise SriftyError(f"Airflow recorded no run of {dag_id}")
    latest = max(runs, key=lambda r: r.get("run_after") or r.get("start_date") or "")
    return str(latest["state"])


def run_demo(data_dir: Path | None = None) -> int:
    root = paths.data_dir(data_dir)
    home = paths.airflow_home(root)
    env = airflow_environment(home)
    env[paths.ENV_VAR] = str(root)
    total = 3
    print(f"Srifty demo - data folder: {root}")

    t0 = _step(1, total, f"preparing Airflow home {home} (SQLite, airflow db migrate)")
    migrate(env)
    _done(t0)

    t0 = _step(2, total, "running DAG srifty_catalog_refresh through Airflow")
    state = run_dag("srifty_catalog_refresh", env, {"regions": [], "fail_on_error": True})
    _done(t0, f"run state: {state}")
    if state != "success":
        print(f"srifty_catalog_refresh ended {state}; task logs: {home / 'logs'}")
        return 1

    t0 = _step(3, total, "reading the report it wrote")
    # The DAG names the folder by its run's logical date; take the newest one.
    days = sorted((paths.reports_dir(root) / "catalog").glob("*/report.json"))
    if not days:
        raise SriftyError(f"the DAG succeeded but wrote no report under {paths.reports_dir(root)}")
    report_dir = days[-1].parent
    report = json.loads((report_dir / "report.json").read_text())
    s = report["summary"]
    _done(t0)
    print(
        f"\nCatalog: {s['rows']} rows, {s['instance_types']} instance types in "
        f"{', '.join(s['regions'])}; {s['errors']} errors, {s['warnings']} warnings; "
        f"prices observed {s['prices_oldest']} .. {s['prices_newest']}."
    )
    print(f"Report: {report_dir / 'report.md'}\n")

    from srifty_core.catalog import Catalog
    from srifty_core.catalog.report import format_table

    catalog = Catalog.load(overlay_dir=paths.price_overlay_dir(root))
    print(format_table(catalog.select(family="g4dn", region="us-east-1")))
    print("\nMore: `srifty catalog --family p3 --json`, `srifty catalog --validate`.")
    return 0
