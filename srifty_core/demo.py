"""The main job on embedded defaults: SQLite, local files, local processes.

Runs, for real and through Airflow (``airflow dags test`` against an Airflow home under the
data folder, every DAG in one Airflow interpreter: ``airflow_env.AirflowSession``), the
whole loop on this machine:

1. the catalog refresh DAG (validate the shipped catalog, write a report);
2. the probe sweep DAG on the local provider (gloo allreduce, world size 2, three fresh
   allocations) into the Parquet probe store;
3. the model refresh DAG: the XGBoost bus-bandwidth model fitted on those probes,
   registered in MLflow and promoted to champion;
4. the profiling DAG for a small ResNet-18 on the CPU (profile store + MLflow run);
5. the simulator's prediction for 2-worker DDP from that profile and the champion model,
   then the same DDP job run for real, side by side;
6. the plan-and-train DAG on the local provider: the planner chooses the workers and local
   batches, the workers train, one is preempted mid-run (as a spot VM would be), the
   monitor sensor notices and triggers a re-planning run of the same DAG, which resumes
   from the checkpoint on what is left and finishes exactly the iterations asked for; the
   plans, the monitor's decisions and the timeline go to MLflow;
7. the method's case studies planned on the emulated EC2.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.airflow_env import AirflowSession, airflow_environment, migrate
from srifty_core.case_studies import format_case_plans, plan_case_studies
from srifty_core.cloud.base import InstanceState
from srifty_core.cloud.local import LocalProvider, pid_alive
from srifty_core.errors import SriftyError
from srifty_core.jobs.job import JobPlan
from srifty_core.jobs.monitor_step import read_decisions
from srifty_core.profiling.report import summary_text
from srifty_core.profiling.store import ProfileStore
from srifty_core.runs.progress import PROGRESS_FILE, median_step_s, read_progress
from srifty_core.simulator.apm import ApmEstimator
from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload

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


def run_dag(
    airflow: AirflowSession,
    dag_id: str,
    conf: dict[str, object],
    home: Path,
    logical_date: str | None = None,
) -> None:
    """Run one DAG through Airflow's ``dags test`` in the demo's Airflow interpreter
    (``AirflowSession``); raise ``SriftyError`` unless it succeeds.

    ``dags test`` runs until the run leaves the running state and exits non-zero when it
    ends failed, so a zero exit is a successful run (no second CLI start to read its state).
    ``logical_date`` (ISO 8601) names the run; by default it is now. ``dags test`` replaces
    a queued run of the same logical date (a run another DAG run triggered) with the one it
    runs.
    """
    from datetime import UTC, datetime

    when = logical_date or datetime.now(UTC).isoformat(timespec="microseconds")
    try:
        airflow.run(["dags", "test", dag_id, when, "-c", json.dumps(conf)])
    except SriftyError as e:
        raise SriftyError(f"{dag_id} failed; task logs: {home / 'logs'}\n{e}") from e


def list_runs(airflow: AirflowSession, dag_id: str) -> list[dict[str, Any]]:
    out = airflow.run(["dags", "list-runs", dag_id, "-o", "json"])
    # Airflow may print warnings on stdout before the JSON document, which is one line.
    runs: list[dict[str, Any]] = next(
        (json.loads(ln) for ln in out.splitlines() if ln.startswith("[")), []
    )
    return runs


TRAIN_CONF: dict[str, Any] = {
    "model": DEMO_MODEL,
    "size": DEMO_SIZE,
    "global_batch": 64,
    "iterations": 40,
    "provider": "local",
    # local.cpu has no market price: $0.10/h per worker is a nominal figure for the budget
    "offers": [{"type": "local.cpu", "market": "on-demand", "quota": 2, "price": 0.1}],
    "objective": "time",
    "budget_usd": 1.0,
    "checkpoint_every": 5,
    "step_sleep_s": 0.05,
}
PREEMPT_AT = 10


def _preempt_when_running(root: Path, stop: Any) -> list[str]:
    """A watcher thread: once a plan-and-train run has logged ``PREEMPT_AT`` iterations,
    reclaim its second worker the way a spot interruption would (the local provider marks
    the instance interrupted and kills its process)."""
    import threading

    provider = LocalProvider()  # the same state folder as the DAG's tasks (the data folder)
    taken: list[str] = []
    runs = paths.data_dir(root) / "runs"
    earlier = set(runs.glob("*"))  # an earlier demo's finished runs are not this job

    def watch() -> None:
        while not stop.is_set():
            for log in runs.glob(f"*/{PROGRESS_FILE}"):
                if log.parent in earlier:
                    continue
                if len(read_progress(log)) >= PREEMPT_AT:
                    # The training job's workers: one allocation per worker, each running.
                    live = []
                    for f in sorted(provider.state_dir.glob("local-*.json")):
                        alloc = provider.get_allocation(f.stem)
                        state = json.loads(f.read_text())
                        running = [
                            i.id for i in provider.describe(alloc)
                            if i.state is InstanceState.RUNNING
                        ]  # fmt: skip
                        if running and any(
                            pid_alive(p["pid"], p["start_ticks"]) for p in state["processes"]
                        ):
                            live += running
                    if len(live) > 1:
                        provider.interrupt(live[-1])
                        taken.append(live[-1])
                        return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    return taken


def _plan_and_train(root: Path, airflow: AirflowSession, home: Path) -> Path:
    """The plan-and-train DAG with a preemption, then the re-planning run it triggered."""
    import threading

    stop = threading.Event()
    taken = _preempt_when_running(root, stop)
    try:
        run_dag(airflow, "srifty_plan_and_train", TRAIN_CONF, home)
    finally:
        stop.set()
    run_dir = sorted((paths.data_dir(root) / "runs").glob("*/job-c0.json"))[-1].parent
    if not taken:
        print("  (the job finished before the watcher could preempt a worker)")
        return run_dir
    print(f"  preempted worker {taken[0]} at iteration {PREEMPT_AT}")
    for k in range(1, 4):  # each re-plan writes the conf of the run it triggered
        conf_file = run_dir / f"replan-after-c{k - 1}.json"
        if not conf_file.is_file():
            break
        conf = json.loads(conf_file.read_text())
        queued = [
            r for r in list_runs(airflow, "srifty_plan_and_train")
            if r.get("state") == "queued"
        ]  # fmt: skip
        if not queued:
            raise SriftyError("the re-plan run that plan-and-train triggered is not queued")
        when = str(max(queued, key=lambda r: str(r.get("logical_date")))["logical_date"])
        kept = ", ".join(conf["resume"].get("allocations", [])) or "none"
        print(f"  re-planning run (triggered by the monitor) for {conf['iterations']} "
              f"iterations left; allocations handed over: {kept} ...", flush=True)  # fmt: skip
        run_dag(airflow, "srifty_plan_and_train", conf, home, logical_date=when)
    return run_dir


def _print_job(run_dir: Path) -> None:
    records = read_progress(run_dir / PROGRESS_FILE)
    decisions = read_decisions(run_dir)
    for path in sorted(run_dir.glob("job-c*.json")):
        job = JobPlan.load(path)
        print(f"  plan {job.config_id}: " + job.explanation[0])
        for line in job.explanation[1:3]:
            print(f"    {line}")
        # a re-plan plans with what the job measured of itself (jobs.recalibration)
        for line in job.explanation:
            if line.startswith("calibrated"):
                print(f"    {line}")
        mine = [r.iteration for r in records if r.config_id == job.config_id]
        # Once the monitor has decided to re-plan, this host also runs the re-planning
        # tasks beside the ranks still stepping (on a cloud, elsewhere): those steps are
        # not the configuration's
        ended = [
            int(d["iterations_done"]) for d in decisions
            if d.get("config_id") == job.config_id and d.get("status") == "replan"
        ]  # fmt: skip
        judged = [r for r in records if not ended or r.iteration <= min(ended)]
        measured = median_step_s(judged, job.config_id)
        if measured is not None:
            pred = float(job.predicted["t_iter_s"])
            p90 = float(job.predicted.get("t_iter_p90_s") or pred)
            # the demo's workers sleep each step (to be preempted mid-run): the simulator
            # predicts the training step, so compare with the step less that sleep
            sleep = float(TRAIN_CONF["step_sleep_s"])
            step = measured - sleep
            kind = "calibrated prediction" if any(
                x.startswith("calibrated") for x in job.explanation
            ) else "predicted"  # fmt: skip
            print(
                f"    ran iterations {mine[0]}..{mine[-1]}"
                + (f" (re-plan decided at {min(ended)})" if ended else "")
                + f": measured {step * 1e3:.0f} "
                f"ms/iteration ({measured * 1e3:.0f} ms with the demo's {sleep * 1e3:.0f} ms "
                f"sleep), {kind} {pred * 1e3:.0f} ms ({100 * (pred / step - 1):+.0f}%), "
                f"p90 {p90 * 1e3:.0f} ms"
            )
    for d in decisions:
        if d.get("status") != "running":
            print(f"  monitor ({d['config_id']}): {d['status']} - {d['reason']}")
    done = max((r.iteration for r in records), default=0)
    print(f"  outcome: {done} of {TRAIN_CONF['iterations']} iterations; run folder {run_dir}")


def run_demo(data_dir: Path | None = None) -> int:
    root = paths.data_dir(data_dir)
    env = airflow_environment(paths.airflow_home(root))
    env[paths.ENV_VAR] = str(root)
    # one Airflow interpreter runs every DAG below: each `airflow` start costs seconds of CPU
    with AirflowSession(env) as airflow:
        return _run_demo(root, airflow)


def _run_demo(root: Path, airflow: AirflowSession) -> int:
    home = paths.airflow_home(root)
    os.environ[paths.ENV_VAR] = str(root)  # this process reads the same store (MLflow)
    steps = _Steps(8)
    print(f"Srifty demo - data folder: {root}")

    steps.start(f"preparing Airflow home {home} (SQLite, airflow db migrate)")
    migrate(airflow)
    steps.done()

    steps.start("DAG srifty_catalog_refresh: validate the instance catalog")
    run_dag(airflow, "srifty_catalog_refresh", {"regions": [], "fail_on_error": True}, home)
    reports = sorted((paths.reports_dir(root) / "catalog").glob("*/report.json"))
    s = json.loads(reports[-1].read_text())["summary"]
    steps.done(
        f"{s['rows']} rows, {s['errors']} errors, {s['warnings']} warnings; "
        f"report {reports[-1].parent / 'report.md'}"
    )

    steps.start("DAG srifty_probe_sweep: gloo allreduce, 2 local workers, 3 allocations")
    run_dag(
        airflow,
        "srifty_probe_sweep",
        {
            "world_sizes": [2],
            "sizes": "4B:64MB",
            "points_per_decade": 1,
            "concurrency": [1, 2],
            "repeats": 3,
            "allocations": 3,
            # the demo's jobs are DDP: allreduce is all they exchange (the DAG's default
            # also sweeps all_gather and reduce_scatter, for sharded plans)
            "collectives": ["all_reduce"],
        },
        home,
    )
    from srifty_core.probing.store import read_probes
    from srifty_core.probing.summary import format_summary, summarize

    probes = read_probes(root=paths.probe_store_dir(root))
    steps.done(f"{len(probes)} rows in {paths.probe_store_dir(root)}")
    print(format_summary(summarize(probes)))

    steps.start("DAG srifty_model_refresh: fit the XGBoost bus-bandwidth model, promote it")
    run_dag(
        airflow,
        "srifty_model_refresh",
        {"since_days": None, "half_life_days": None, "n_trials": 4},
        home,
    )
    from srifty_core.predictors.registry import CHAMPION, alias_version

    steps.done(f"champion: version {alias_version(CHAMPION)} in MLflow ({paths.mlflow_dir(root)})")

    steps.start(f"DAG srifty_profile_model: {DEMO_MODEL}/{DEMO_SIZE} on the CPU (4 probes)")
    run_dag(
        airflow,
        "srifty_profile_model",
        # one thread: each DDP rank below runs one, on this 2-core machine
        {
            "model": DEMO_MODEL,
            "size": DEMO_SIZE,
            "probes": 4,
            "max_batch": 64,
            "repeats": 4,
            "threads": 1,
        },
        home,
    )

    profile = ProfileStore(paths.profiles_dir(root)).load(DEMO_MODEL, DEMO_SIZE, "cpu")
    steps.done(f"profile in {paths.profiles_dir(root)}, run logged to MLflow")
    print(summary_text(profile))

    a, b = DEMO_BATCHES
    steps.start(f"simulate, then run, DDP on 2 local workers with local batches {a} and {b}")
    from srifty_core.predictors.registry import load_champion
    from srifty_core.profiling.ddp_check import measure_ddp
    from srifty_core.simulator.estimator import Simulator

    inst = SimInstance.local_cpu()
    config = ClusterConfig((Group(inst, 1, a), Group(inst, 1, b)))
    workload = Workload(DEMO_MODEL, {"cpu": profile})
    est = Simulator(load_champion()).estimate(workload, config)
    apm = ApmEstimator().estimate(workload, config)
    real = measure_ddp(DEMO_MODEL, DEMO_SIZE, (a, b), iterations=8, warmup=2)
    steps.done()
    err, apm_err = (100 * (x / real.mean_s - 1) for x in (est.t_iter, apm.t_iter))
    print(
        f"predicted {est.t_iter * 1e3:.1f} ms/iteration (forward {est.t_fw * 1e3:.1f}, "
        f"backward {est.t_bw * 1e3:.1f}, exchange {est.t_pe * 1e3:.1f}; {est.bottleneck} "
        f"binds; p90 over allocations {(est.t_iter_p90 or est.t_iter) * 1e3:.1f}); APM baseline "
        f"{apm.t_iter * 1e3:.1f} ms; measured {real.mean_s * 1e3:.1f} ms "
        f"(Srifty {err:+.0f}%, APM {apm_err:+.0f}%)."
    )

    steps.start(
        f"DAG srifty_plan_and_train: plan, train {TRAIN_CONF['iterations']} iterations, "
        f"preempt a worker at iteration {PREEMPT_AT}, re-plan, resume"
    )
    run_dir = _plan_and_train(root, airflow, home)
    steps.done()
    _print_job(run_dir)

    steps.start("the method's case studies, planned on the emulated EC2")

    plans = plan_case_studies()
    steps.done(f"{len(plans)} cases, {sum(p.feasible for p in plans)} feasible")
    print(format_case_plans(plans))

    print(
        f"\nEverything is under {root}: probes/, profiles/, runs/, mlflow/, airflow/, "
        "reports/.\nTo look at it: scripts/ui starts the Airflow UI (http://127.0.0.1:8080, "
        "user admin, password srifty-admin) and the MLflow UI (http://127.0.0.1:5001: "
        "experiments srifty-jobs, srifty-compute-profiles and srifty-bandwidth-models; "
        "model srifty-busbw) on this data folder."
    )
    return 0
