"""Plan a training job, provision it, train it, watch it, and re-plan when it is preempted.

Manual trigger; also triggered by itself when a run re-plans. Tasks:

1. **plan**: the trigger's parameters become a training plan (JSON, under the data folder's
   ``runs/<run id>/``). With the ``local`` provider the plan is simple: ``workers`` local
   CPU workers with the global batch split evenly (the catalog planner plans EC2 types).
2. **provision** (setup): launch one instance per rank; **release** (teardown) gives them
   back whatever happens.
3. **start_training**: one DDP worker per rank; rank 0 appends to the progress log and
   checkpoints.
4. **monitor** (deferrable sensor; its trigger polls every 5 s in the triggerer): done when
   training finished, or when the monitor decides to re-plan (a preempted instance marks
   its type depleted).
5. On re-plan, **child_conf** stops the workers (they checkpoint) and
   **trigger_replan** starts a new run of this DAG with the remaining iterations, time and
   budget, and a ``resume`` block: the checkpoint, what was done and spent, the depleted
   types and this run's id (the parent).

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
DEFAULT_ARGS = {"owner": "srifty", "retries": 1, "retry_delay": timedelta(seconds=30)}
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
    },
}


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
        "provider": Param("local", type="string", enum=["local"]),
        "workers": Param(
            2, type="integer", minimum=1, maximum=16, description="Local workers (ranks)."
        ),
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
    def provision(plan_path: str) -> str:
        from srifty_core.runtime.orchestrate import provision as launch

        return launch(plan_path)

    @task
    def start_training(plan_path: str, allocation_id: str) -> float:
        from srifty_core.runtime.orchestrate import start_training as start

        return start(plan_path, allocation_id)

    @task.branch
    def finished_or_replan(result: dict[str, Any]) -> str:
        return "child_conf" if result["status"] == "replan" else "finished"

    @task
    def finished(plan_path: str) -> str:
        from srifty_core.runtime.worker import TrainPlan

        return str(TrainPlan.load(plan_path).progress_path)

    @task
    def child_conf(plan_path: str, allocation_id: str, result: dict[str, Any]) -> dict[str, Any]:
        from srifty_core.runtime.orchestrate import child_conf as build

        ctx = get_current_context()
        return build(dict(ctx["params"]), plan_path, allocation_id, result, ctx["run_id"])

    @task
    def release(allocation_id: str) -> None:
        from srifty_core.runtime.orchestrate import release as give_back

        give_back(allocation_id)

    plan_path = plan()
    alloc = provision(plan_path)
    started = start_training(plan_path, alloc)
    monitor = TrainingProgressSensor(
        task_id="monitor", plan_path=plan_path, allocation_id=alloc, started_at=started,
        poll_s=5.0, timeout=6 * 3600,
    )  # fmt: skip
    result = monitor.output
    branch = finished_or_replan(result)
    conf = child_conf(plan_path, alloc, result)
    trigger_replan = TriggerDagRunOperator(
        task_id="trigger_replan",
        trigger_dag_id=DAG_ID,
        conf=conf,
        wait_for_completion=False,
    )
    done = finished(plan_path)
    branch >> [conf, done]
    conf >> trigger_replan
    [trigger_replan, done] >> release(alloc).as_teardown(setups=alloc)


srifty_plan_and_train()
