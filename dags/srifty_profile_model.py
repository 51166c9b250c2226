"""Profile one model (a zoo name or your factory or ``hf:`` reference) on each requested
device type, with the training settings you train with, and store the compute profiles.

Manual trigger. One mapped task per device type runs the profiler where that device is
(``cpu`` here; ``cuda`` on a GPU worker), in the ``srifty_local_host`` pool, writes
``<data dir>/profiles/<model>/<size>/<device type>.json`` atomically, and logs the profile,
its fit and its plot to MLflow (experiment ``srifty-compute-profiles``). The summary task
lists what was written.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

# Shared policy (plugins/): the probe-store Asset, start date, task defaults.
from srifty_policy import LOCAL_HOST_POOL, START_DATE, default_args, fails_fast

# Light constants (no torch): sizes, settings and the model field's schema, so a bad
# trigger fails at once.
from srifty_core.planner.schema import JobConf, param_schemas
from srifty_core.profiling import SIZES
from srifty_core.training_settings import OPTIMIZERS, PRECISIONS

_MODEL = param_schemas(JobConf)["model"]["schema"]

DEFAULT_ARGS = default_args(retry_delay=timedelta(seconds=30))


@dag(
    dag_id="srifty_profile_model",
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    default_args=DEFAULT_ARGS,
    tags=["srifty", "profiling"],
    doc_md=__doc__,
    params={
        "model": Param(
            "resnet18",
            **_MODEL,
            description="A zoo model, package.module:factory, path/to/file.py:factory "
            "(on the worker) or hf:NAME.",
        ),
        "size": Param("small", type="string", enum=list(SIZES)),
        "precision": Param("fp32", type="string", enum=list(PRECISIONS)),
        "optimizer": Param("sgd", type="string", enum=list(OPTIMIZERS)),
        "compile": Param(False, type="boolean"),
        "channels_last": Param(False, type="boolean"),
        "device_types": Param(
            ["cpu"],
            type="array",
            minItems=1,
            items={"type": "string", "pattern": "^(cpu|cuda(:[0-9]+)?)$"},
            description="Devices to profile on: cpu, cuda or cuda:N.",
        ),
        "probes": Param(4, type="integer", minimum=2, maximum=32),
        "refine": Param(
            3,
            type="integer",
            minimum=0,
            maximum=16,
            description="Check probes between the budgeted ones, where t(B) may bend.",
        ),
        "repeats": Param(5, type="integer", minimum=2, maximum=100),
        "max_batch": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="B_max search ceiling; null: until a batch does not fit the memory.",
        ),
        "memory_cap_mib": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="Memory a batch must fit in; null: 4096 MiB on a CPU, the GPU's own.",
        ),
        "threads": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="CPU threads (match the training ranks); null keeps torch's default.",
        ),
        "share_host": Param(
            2,
            type="integer",
            minimum=1,
            maximum=64,
            description="On cpu: measure how a step slows with up to this many local workers "
            "sharing the host (the local runs' ranks); 1: not measured. Ignored on cuda.",
        ),
        "log_to_mlflow": Param(True, type="boolean"),
    },
)
def srifty_profile_model() -> None:
    @task
    @fails_fast
    def device_types() -> list[str]:
        return list(get_current_context()["params"]["device_types"])

    # Profiles time the machine they run on: never two at once, and never beside a local
    # sweep or a local training job (the local host's pool, one slot).
    @task(multiple_outputs=True, max_active_tis_per_dag=1, pool=LOCAL_HOST_POOL)
    @fails_fast
    def profile_on(device: str) -> dict[str, Any]:
        from srifty_core.profiling.job import run_profile_job
        from srifty_core.profiling.profiler import ProfilerConfig
        from srifty_core.training_settings import TrainingSettings

        p = get_current_context()["params"]
        config = ProfilerConfig(
            device=device,
            probes=p["probes"],
            repeats=p["repeats"],
            max_batch=p["max_batch"],
            memory_cap_bytes=p["memory_cap_mib"] * 2**20 if p["memory_cap_mib"] else None,
            threads=p["threads"],
            share_host=p["share_host"] if device == "cpu" else 1,
            refine=p["refine"],
            settings=TrainingSettings.from_dict(p),
        )
        result = run_profile_job(p["model"], p["size"], config, log_to_mlflow=p["log_to_mlflow"])
        return {
            "device_type": result.profile.device_type,
            "path": str(result.path),
            "b_max": result.profile.b_max,
            "mlflow_run_id": result.mlflow_run_id,
        }

    @task
    @fails_fast
    def summarize(results: list[dict[str, Any]]) -> list[str]:
        # Index by length: iterating a lazy XCom sequence probes one past its end.
        rows = [results[i] for i in range(len(results))]
        for r in rows:
            print(f"{r['device_type']}: B_max {r['b_max']}, profile {r['path']}")
        return [r["path"] for r in rows]

    summarize(profile_on.expand(device=device_types()))


srifty_profile_model()
