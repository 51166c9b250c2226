"""Plan a training job, provision it, train it, watch it, and re-plan when it falls behind
or is preempted.

Manual trigger; also triggered by itself when a run re-plans. Tasks:

1. **plan**: the real planner over the trigger's ``offers`` (instance type, market, quota,
   optional price): the model's compute profiles (made by ``srifty_profile_model``), the
   champion bus-bandwidth model (made by ``srifty_model_refresh``; until there is one, the
   model of the shipped public nccl-tests tables, as ``srifty plan``), the simulator and
   the search. It fails at once with the nearest misses when nothing meets the limits, and
   logs what it planned. The plan goes to MLflow (experiment
   ``srifty-jobs``: one run per job, a nested run per re-plan) and to the data folder's
   ``runs/<run id>/``. The ``local`` provider offers ``local.cpu`` (worker processes on
   this machine, priced by the trigger); ``ec2`` offers the catalog's types.
2. **provision** (setup): launch the plan's VMs; **release** (teardown) gives them back
   whatever happens.
3. **start_training**: the DDP workers; rank 0 appends to the progress log and
   checkpoints.
4. **monitor** (deferrable sensor; its trigger steps after 1, 2 and 4 s, then every 5 s,
   in the triggerer): done when training finished, or when the monitor decides to re-plan
   (a preempted VM, or even the optimistic projection breaks a limit and other capacity
   exists).
5. On re-plan, **child_conf** stops the workers (they checkpoint) and **trigger_replan**
   starts a new run of this DAG with the remaining iterations, time and budget, the
   offers less what was taken back, and a ``resume`` block: the checkpoint, what was done
   and spent, the depleted offers, this run's id (the parent), the job's MLflow run and
   the allocations whose VMs still run (``allocations``). This run's teardown leaves
   those running; the child's **provision** keeps those its plan wants and launches or
   releases only the difference (one ``Replanner`` for every re-plan).
   When training finished, **finish** logs the outcome and the timeline plot to MLflow.

Task policy: deterministic errors (a bad conf, a missing input, no feasible plan, workers
that died) fail at once without a retry; every task has an ``execution_timeout`` and the
run a ``dagrun_timeout``; the monitor's deferral times out after the job's
``time_limit_s`` plus a margin, and a deadline alert (``JobTimeLimitDeadline``, from the
run's queue time) tags the job's MLflow runs if the run is still going then. MLflow
shows the configuration's window metrics live.

All logic lives in ``srifty_core.jobs`` (``orchestrate`` names the steps); the tasks
pass paths and ids.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

# The job's deadline alert (plugins/): the run's queue time plus the conf's time_limit_s.
from srifty_deadline import job_deadline_alert

# The monitor sensor and its trigger (plugins/): thin adapters over srifty_core.
from srifty_monitor import TrainingProgressSensor

# Shared policy (plugins/): deterministic errors fail at once, the start date.
from srifty_policy import START_DATE, fail_fast

# The conf's schema (pydantic, no torch): Params from it, and the plan task checks with it.
from srifty_core.planner.schema.job_conf import JobConf
from srifty_core.planner.schema.trigger_form import param_schemas

DAG_ID = "srifty_plan_and_train"


def job_failed(context: Any) -> None:
    """A task gave up: mark the job's MLflow runs FAILED with the reason (never raises)."""
    import logging

    ti = context["ti"]
    try:
        job_path = ti.xcom_pull(task_ids="plan")
        if job_path:
            from srifty_core.jobs.orchestrate import job_failed as record

            record(job_path, f"{ti.task_id} failed: {context.get('exception')}")
    except Exception:  # a callback must not hide the task's own error
        logging.getLogger(__name__).exception("could not record the failure in MLflow")


DEFAULT_ARGS = {
    "owner": "srifty",
    "retries": 1,  # for transient errors; deterministic ones raise AirflowFailException
    "retry_delay": timedelta(seconds=30),
    "execution_timeout": timedelta(minutes=30),
    "on_failure_callback": job_failed,
}
MONITOR_TIMEOUT = timedelta(hours=6)
"""The monitor's deferral limit for a job without a time limit."""
RUN_TIMEOUT = timedelta(days=3)
"""A backstop for the whole run (no run hangs forever); the job's own ``time_limit_s`` is
enforced sooner, by the monitor's deferral timeout."""
DEADLINE_MARGIN = timedelta(minutes=10)
"""The deadline alert fires this long after the job's time limit (the monitor's margin)."""

LOCAL_OFFER = {"type": "local.cpu", "market": "on-demand", "quota": 2, "price": 0.1}
EXAMPLES: dict[str, Any] = {
    "model": "resnet18",
    "global_batch": 16,
    "iterations": 40,
    "offers": [LOCAL_OFFER],
}
"""The trigger form's values of the fields ``JobConf`` requires (it has no default for
them); every other Param's default is ``JobConf``'s, so a trigger that leaves a field out
gets what ``srifty train --job`` and ``srifty plan`` give it."""


def job_params() -> dict[str, Param]:
    """One Param per field of ``JobConf``, its JSON schema and default made from the model,
    so the trigger form and the API check types and ranges before a run starts. Airflow
    keeps an unknown top-level key (a typo) as a new param: the plan task rejects it,
    naming it."""
    out = {}
    for name, p in param_schemas(JobConf).items():
        default = EXAMPLES[name] if name in EXAMPLES else p.get("default")
        out[name] = Param(default, description=p.get("description"), schema=p["schema"])
    return out


@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    dagrun_timeout=RUN_TIMEOUT,
    deadline=job_deadline_alert(DEADLINE_MARGIN),
    default_args=DEFAULT_ARGS,
    tags=["srifty", "training"],
    doc_md=__doc__,
    params=job_params(),
)
def srifty_plan_and_train() -> None:
    @task
    def plan() -> str:
        from srifty_core.jobs.orchestrate import JobSpec, handed_over, plan_job, release

        ctx = get_current_context()
        spec = None
        try:
            spec = JobSpec.from_params(ctx["params"])  # the conf checked first, field by field
            return str(plan_job(spec, ctx["run_id"]))
        except Exception as exc:
            # Nothing will provision: give back what the re-planning parent handed over.
            if spec is not None and handed_over(spec):
                release(handed_over(spec), job_path=None)
            # A bad conf field or a missing input (named with the DAG that makes it): a retry
            # would fail alike, so fail now.
            raise fail_fast(exc) from exc

    @task
    def provision(job_path: str) -> list[str]:
        from srifty_core.jobs.orchestrate import JobSpec, handed_over
        from srifty_core.jobs.orchestrate import provision as launch

        keep = handed_over(JobSpec.from_params(get_current_context()["params"]))
        try:
            return launch(job_path, keep=keep)
        except Exception as exc:  # a launch setting missing fails at once; capacity retries
            raise fail_fast(exc) from exc

    @task
    def start_training(job_path: str, allocation_ids: list[str]) -> float:
        from srifty_core.jobs.orchestrate import start_training as start

        try:
            return start(job_path, allocation_ids)
        except Exception as exc:
            raise fail_fast(exc) from exc

    @task.branch
    def finished_or_replan(result: dict[str, Any]) -> str:
        return "child_conf" if result["status"] == "replan" else "finished"

    @task(multiple_outputs=True)
    def finished(job_path: str, result: dict[str, Any]) -> dict[str, Any]:
        from srifty_core.jobs.orchestrate import finish

        return finish(job_path, result)

    @task
    def child_conf(job_path: str, allocation_ids: list[str], result: dict[str, Any]) -> Any:
        from srifty_core.jobs.orchestrate import continue_or_finish

        ctx = get_current_context()
        try:
            conf = continue_or_finish(
                dict(ctx["params"]), job_path, allocation_ids, result, ctx["run_id"]
            )
        except Exception as exc:
            raise fail_fast(exc) from exc
        if conf is None:  # the job did its last iteration before the re-plan stopped it
            raise AirflowSkipException("the job finished; nothing to re-plan")
        return conf

    @task
    def release(job_path: str, allocation_ids: list[str]) -> None:
        from srifty_core.jobs.orchestrate import release as give_back

        # What the re-plan handed over to the child run stays up (the child releases it).
        conf = get_current_context()["ti"].xcom_pull(task_ids="child_conf")
        kept = (conf or {}).get("resume", {}).get("allocations", [])
        give_back(allocation_ids, job_path=job_path, except_ids=kept)

    job_path = plan()
    alloc = provision(job_path)
    started = start_training(job_path, alloc)
    monitor = TrainingProgressSensor(
        task_id="monitor", job_path=job_path, allocation_ids=alloc, started_at=started,
        poll_s=5.0, margin_s=DEADLINE_MARGIN.total_seconds(), timeout=MONITOR_TIMEOUT,
        execution_timeout=None,
    )  # fmt: skip
    result = monitor.output
    branch = finished_or_replan(result)
    conf = child_conf(job_path, alloc, result)
    trigger_replan = TriggerDagRunOperator(
        task_id="trigger_replan",
        trigger_dag_id=DAG_ID,
        conf=conf,
        wait_for_completion=False,
    )
    done = finished(job_path, result)
    branch >> [conf, done]
    conf >> trigger_replan
    [trigger_replan, done] >> release(job_path, alloc).as_teardown(setups=alloc)


srifty_plan_and_train()
