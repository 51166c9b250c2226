"""Plan a training job, provision it, train it, watch it, and re-plan when it falls behind
or is preempted.

Manual trigger; also triggered by itself when a run re-plans. Tasks:

1. **plan**: the real planner over the trigger's ``offers`` (instance type, market, quota,
   optional price): the model's compute profiles (made by ``srifty_profile_model``), the
   champion bus-bandwidth model (made by ``srifty_model_refresh``), the simulator and the
   search. It fails at once, naming the DAG to run, when either is missing, and with the
   nearest misses when nothing meets the limits. The plan goes to MLflow (experiment
   ``srifty-jobs``: one run per job, a nested run per re-plan) and to the data folder's
   ``runs/<run id>/``. The ``local`` provider offers ``local.cpu`` (worker processes on
   this machine, priced by the trigger); ``ec2`` offers the catalog's types.
2. **provision** (setup): launch the plan's VMs; **release** (teardown) gives them back
   whatever happens.
3. **start_training**: the DDP workers; rank 0 appends to the progress log and
   checkpoints.
4. **monitor** (deferrable sensor; its trigger polls every 5 s in the triggerer): done when
   training finished, or when the monitor decides to re-plan (a preempted VM, or even the
   optimistic projection breaks a limit and other capacity exists).
5. On re-plan, **child_conf** stops the workers (they checkpoint) and **trigger_replan**
   starts a new run of this DAG with the remaining iterations, time and budget, the
   offers less what was taken back, and a ``resume`` block: the checkpoint, what was done
   and spent, the depleted offers, this run's id (the parent) and the job's MLflow run.
   When training finished, **finish** logs the outcome and the timeline plot to MLflow.

All logic lives in ``srifty_core.runtime.orchestrate``; the tasks pass paths and ids.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, get_current_context, task

# The monitor sensor and its trigger (plugins/): thin adapters over srifty_core.
from srifty_monitor import TrainingProgressSensor

# Light constants (no torch): the zoo's names and sizes, so a bad trigger fails at once.
from srifty_core.profiling import MODEL_NAMES, SIZES

DAG_ID = "srifty_plan_and_train"


def job_failed(context: Any) -> None:
    """A task gave up: mark the job's MLflow runs FAILED with the reason (never raises)."""
    import logging

    ti = context["ti"]
    try:
        job_path = ti.xcom_pull(task_ids="plan")
        if job_path:
            from srifty_core.runtime.orchestrate import job_failed as record

            record(job_path, f"{ti.task_id} failed: {context.get('exception')}")
    except Exception:  # a callback must not hide the task's own error
        logging.getLogger(__name__).exception("could not record the failure in MLflow")


DEFAULT_ARGS = {
    "owner": "srifty",
    "retries": 1,
    "retry_delay": timedelta(seconds=30),
    "on_failure_callback": job_failed,
}
RESUME_SCHEMA = {
    "type": "object",
    "required": ["checkpoint", "iterations_done"],
    "additionalProperties": False,
    "properties": {
        "checkpoint": {"type": "string", "minLength": 1},
        "iterations_done": {"type": "integer", "minimum": 0},
        "time_spent_s": {"type": "number", "minimum": 0},
        "cost_spent_usd": {"type": "number", "minimum": 0},
        "depleted": {"type": "array", "items": {"type": "string"}},
        "parent_run_id": {"type": ["null", "string"]},
        "job_run_id": {"type": ["null", "string"]},
    },
}
OFFER_SCHEMA = {
    "type": "object",
    "required": ["type", "quota"],
    "additionalProperties": False,
    "properties": {
        "type": {"type": "string", "minLength": 1},
        "market": {"type": "string", "enum": ["on-demand", "spot"]},
        "quota": {"type": "integer", "minimum": 0},
        "price": {"type": ["null", "number"], "exclusiveMinimum": 0},
        "zone": {"type": ["null", "string"]},
    },
}
EC2_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "image_id": {"type": "string"},
        "subnet_id": {"type": "string"},
        "security_group_ids": {"type": "array", "items": {"type": "string"}},
        "key_name": {"type": "string"},
        "instance_profile_arn": {"type": "string"},
        "aws_conn_id": {"type": "string"},
        "package": {"type": "string"},
        "poll_s": {"type": "number", "exclusiveMinimum": 0},
        "wait_timeout_s": {"type": "number", "exclusiveMinimum": 0},
    },
}
LOCAL_OFFER = {"type": "local.cpu", "market": "on-demand", "quota": 2, "price": 0.1}


@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args=DEFAULT_ARGS,
    tags=["srifty", "training"],
    doc_md=__doc__,
    params={
        "model": Param("resnet18", type="string", enum=list(MODEL_NAMES)),
        "size": Param("tiny", type="string", enum=list(SIZES)),
        "global_batch": Param(16, type="integer", minimum=1),
        "iterations": Param(
            40, type="integer", minimum=1, description="Iterations this run should do."
        ),
        "time_limit_s": Param(None, type=["null", "number"], minimum=0),
        "budget_usd": Param(None, type=["null", "number"], minimum=0),
        "objective": Param("cost", type="string", enum=["cost", "time"]),
        "risk_quantile": Param(
            0.9,
            type="number",
            minimum=0.5,
            exclusiveMaximum=1,
            description="The limits hold for this quantile of predicted time and cost.",
        ),
        "provider": Param("local", type="string", enum=["local", "ec2"]),
        "region": Param("us-east-1", type="string", description="Catalog region (ec2)."),
        "offers": Param(
            [LOCAL_OFFER],
            type="array",
            minItems=1,
            items=OFFER_SCHEMA,
            description=(
                "What may be rented: {type, market, quota, price?, zone?}. local: type "
                "local.cpu, quota = worker processes, price = the $/hour a worker counts for "
                "(0.1 is a nominal demo value); ec2: catalog types, prices from the catalog "
                "unless given."
            ),
        ),
        "bandwidth": Param("champion", type="string", enum=["champion", "probes"]),
        "launch_s": Param(
            None,
            type=["null", "number"],
            minimum=0,
            description="Launch overhead the planner charges (default: local 0, ec2 150 s).",
        ),
        "ec2": Param({}, type="object", **{k: v for k, v in EC2_SCHEMA.items() if k != "type"}),
        "checkpoint_every": Param(10, type="integer", minimum=1),
        "step_sleep_s": Param(
            0.0,
            type="number",
            minimum=0,
            description="Extra seconds per step (slows a demo job so it can be interrupted).",
        ),
        "seed": Param(0, type="integer", minimum=0),
        "resume": Param(
            None,
            type=["null", "object"],
            description="Set by a re-plan: where the earlier run stopped.",
            **{k: v for k, v in RESUME_SCHEMA.items() if k != "type"},
        ),
    },
)
def srifty_plan_and_train() -> None:
    @task
    def plan() -> str:
        from srifty_core.runtime.orchestrate import JobSpec, plan_job

        ctx = get_current_context()
        spec = JobSpec.from_params(ctx["params"])
        return str(plan_job(spec, ctx["run_id"]))

    @task
    def provision(job_path: str) -> list[str]:
        from srifty_core.runtime.orchestrate import provision as launch

        return launch(job_path)

    @task
    def start_training(job_path: str, allocation_ids: list[str]) -> float:
        from srifty_core.runtime.orchestrate import start_training as start

        return start(job_path, allocation_ids)

    @task.branch
    def finished_or_replan(result: dict[str, Any]) -> str:
        return "child_conf" if result["status"] == "replan" else "finished"

    @task
    def finished(job_path: str, result: dict[str, Any]) -> dict[str, Any]:
        from srifty_core.runtime.orchestrate import finish

        return finish(job_path, result)

    @task
    def child_conf(job_path: str, allocation_ids: list[str], result: dict[str, Any]) -> Any:
        from srifty_core.runtime.orchestrate import child_conf as build

        ctx = get_current_context()
        return build(dict(ctx["params"]), job_path, allocation_ids, result, ctx["run_id"])

    @task
    def release(job_path: str, allocation_ids: list[str]) -> None:
        from srifty_core.runtime.orchestrate import release as give_back

        give_back(allocation_ids, job_path=job_path)

    job_path = plan()
    alloc = provision(job_path)
    started = start_training(job_path, alloc)
    monitor = TrainingProgressSensor(
        task_id="monitor", job_path=job_path, allocation_ids=alloc, started_at=started,
        poll_s=5.0, timeout=6 * 3600,
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
