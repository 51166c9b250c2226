"""The main job on embedded defaults: SQLite, local files, local processes.

Runs, for real, what exists of the loop on this machine:

1. the catalog refresh DAG (validate the shipped catalog, write a report);
2. the probe sweep DAG on the local provider (gloo allreduce, world size 2) into the
   Parquet probe store;
3. the profiling DAG for a small ResNet-18 on the CPU (profile store + MLflow run);
4. the simulator's prediction for 2-worker DDP from that profile and those probes, then
   the same DDP job run for real, side by side;
5. a training run on two local workers with reweighted gradients, checkpoints and a
   progress log, where one worker is preempted mid-run: the monitor notices, the job
   re-plans onto the surviving worker, resumes from the checkpoint and finishes exactly
   the iterations asked for.

Each DAG runs through Airflow (``airflow dags test``) against an Airflow home under the data
folder. Later stages (model refresh, plan-and-train with re-planning) join here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.airflow_env import airflow_environment, migrate, run_airflow
from srifty_core.errors import SriftyError

DEMO_MODEL = "resnet18"
DEMO_SIZE = "small"
DEMO_BATCHES = (16, 48)


class _Steps:
    def __init__(self, total: int) -> None:
        self.n, self.total, self.t0 = 0, total, 0.0

    def start(self, text: str) -> None:
        self.n += 1
        print(f"[{self.n}/{self.total}] {text} ...", flush=True)
        self.t0 = time.perf_counter()

    def done(self, extra: str = "") -> None:
        tail = f" - {extra}" if extra else ""
        print(f"      done in {time.perf_counter() - self.t0:.1f}s{tail}", flush=True)


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


def _require(state: str, dag_id: str, home: Path) -> None:
    if state != "success":
        raise SriftyError(f"{dag_id} ended {state}; task logs: {home / 'logs'}")


def _preempted_training(root: Path) -> Any:
    """Train DLRM (tiny) for 40 iterations on 2 local workers; a watcher reclaims the
    second worker (as a spot interruption would) once 10 iterations are logged."""
    import threading

    from srifty_core.cloud.base import Allocation
    from srifty_core.cloud.local import LocalProvider
    from srifty_core.runtime.local_run import train_local
    from srifty_core.runtime.progress import read_progress
    from srifty_core.runtime.worker import TrainPlan

    run_dir = paths.data_dir(root) / "runs" / f"demo-{int(time.time())}"
    plan = TrainPlan(
        model="dlrm",
        size="tiny",
        global_batch=12,
        iterations=40,
        local_batches=(4, 8),
        run_dir=str(run_dir),
        checkpoint_every=5,
        step_sleep_s=0.05,
    )
    provider = LocalProvider(paths.data_dir(root) / "cloud")
    first: list[Allocation] = []

    def remember(alloc: Allocation) -> None:
        if not first:
            first.append(alloc)

    def reclaim() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            recs = read_progress(plan.progress_path)
            if recs and recs[-1].iteration >= 10 and first:
                provider.interrupt(first[0].instance_ids[1])
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=reclaim, daemon=True)
    watcher.start()
    report = train_local(plan, provider, on_poll=remember, timeout_s=300)
    watcher.join(timeout=5)
    print(f"  run folder: {run_dir} (progress.jsonl, checkpoint)")
    return report


def run_demo(data_dir: Path | None = None) -> int:
    root = paths.data_dir(data_dir)
    home = paths.airflow_home(root)
    env = airflow_environment(home)
    env[paths.ENV_VAR] = str(root)
    steps = _Steps(6)
    print(f"Srifty demo - data folder: {root}")

    steps.start(f"preparing Airflow home {home} (SQLite, airflow db migrate)")
    migrate(env)
    steps.done()

    steps.start("DAG srifty_catalog_refresh: validate the instance catalog")
    state = run_dag("srifty_catalog_refresh", env, {"regions": [], "fail_on_error": True})
    _require(state, "srifty_catalog_refresh", home)
    reports = sorted((paths.reports_dir(root) / "catalog").glob("*/report.json"))
    s = json.loads(reports[-1].read_text())["summary"]
    steps.done(
        f"{s['rows']} rows, {s['errors']} errors, {s['warnings']} warnings; "
        f"report {reports[-1].parent / 'report.md'}"
    )

    steps.start("DAG srifty_probe_sweep: gloo allreduce on 2 local workers, 4 B..64 MB")
    state = run_dag(
        "srifty_probe_sweep",
        env,
        {"world_sizes": [2], "sizes": "4B:64MB", "points_per_decade": 2, "repeats": 3},
    )
    _require(state, "srifty_probe_sweep", home)
    from srifty_core.probing.store import read_probes
    from srifty_core.probing.summary import format_summary, summarize

    probes = read_probes(root=paths.probe_store_dir(root))
    steps.done(f"{len(probes)} rows in {paths.probe_store_dir(root)}")
    print(format_summary(summarize(probes)))

    steps.start(f"DAG srifty_profile_model: {DEMO_MODEL}/{DEMO_SIZE} on the CPU (4 probes)")
    state = run_dag(
        "srifty_profile_model",
        env,
        # one thread: each DDP rank below runs one, on this 2-core machine
        {
            "model": DEMO_MODEL,
            "size": DEMO_SIZE,
            "probes": 4,
            "max_batch": 64,
            "repeats": 4,
            "threads": 1,
        },
    )
    _require(state, "srifty_profile_model", home)
    from srifty_core.profiling.report import summary_text
    from srifty_core.profiling.store import ProfileStore

    profile = ProfileStore(paths.profiles_dir(root)).load(DEMO_MODEL, DEMO_SIZE, "cpu")
    steps.done(f"profile in {paths.profiles_dir(root)}, run logged to MLflow")
    print(summary_text(profile))

    a, b = DEMO_BATCHES
    steps.start(f"simulate, then run, DDP on 2 local workers with local batches {a} and {b}")
    from srifty_core.predictors.table import ProbeTableBandwidth
    from srifty_core.runtime.measure import measure_ddp
    from srifty_core.simulator.apm import ApmEstimator
    from srifty_core.simulator.estimator import Simulator
    from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload

    inst = SimInstance.local_cpu()
    config = ClusterConfig((Group(inst, 1, a), Group(inst, 1, b)))
    workload = Workload(DEMO_MODEL, {"cpu": profile})
    est = Simulator(ProbeTableBandwidth().fit(probes)).estimate(workload, config)
    apm = ApmEstimator().estimate(workload, config)
    real = measure_ddp(DEMO_MODEL, DEMO_SIZE, (a, b), iterations=8, warmup=2)
    steps.done()
    err, apm_err = (100 * (x / real.mean_s - 1) for x in (est.t_iter, apm.t_iter))
    print(
        f"predicted {est.t_iter * 1e3:.1f} ms/iteration (forward {est.t_fw * 1e3:.1f}, "
        f"backward {est.t_bw * 1e3:.1f}, exchange {est.t_pe * 1e3:.1f}; {est.bottleneck} "
        f"binds); APM baseline {apm.t_iter * 1e3:.1f} ms; measured {real.mean_s * 1e3:.1f} ms "
        f"(Srifty {err:+.0f}%, APM {apm_err:+.0f}%)."
    )
    steps.start("train on 2 local workers, preempt one at iteration 10, recover")
    report = _preempted_training(root)
    steps.done(f"{report.iterations} iterations in {len(report.segments)} configurations")
    for seg in report.segments:
        detect = f", noticed in {seg.detect_s * 1e3:.0f} ms" if seg.detect_s is not None else ""
        print(
            f"  {seg.config_id}: local batches {list(seg.local_batches)}, iterations "
            f"{seg.start_iteration + 1}..{seg.end_iteration}, {seg.outcome}{detect}"
        )
    print(
        f"\nEverything is under {root}: probes/, profiles/, mlflow/ (open it with "
        f"`.venv/bin/mlflow ui --backend-store-uri sqlite:///{paths.mlflow_dir(root)}/mlflow.db`), "
        f"airflow/, reports/."
    )
    return 0
