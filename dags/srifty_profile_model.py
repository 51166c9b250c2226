"""Profile one model (a zoo name or your factory or ``hf:`` reference) on each requested
device type, with the training settings you train with, and store the compute profiles.

Manual trigger. ``provider`` says where:

* ``local`` (default): one mapped task per entry of ``device_types`` runs the profiler
  where that device is (``cpu`` here; ``cuda`` on a GPU worker), in the
  ``srifty_local_host`` pool, writes ``<data dir>/profiles/<model>/<size>/<device
  type>.json`` atomically, and logs the profile, its fit and its plot to MLflow
  (experiment ``srifty-compute-profiles``).
* ``ec2`` or ``ec2-emulated``: one mapped task group ``on_vm`` per entry of
  ``instance_types`` (catalog types): **provision** (setup) launches one VM of that type
  (``market``: on-demand by default), **profile** runs the profiler on its GPU and brings
  the profile back into the profile store (keyed by the model reference and training
  settings, as local profiles are), **release** (teardown, also after a failure) gives
  the VM back and returns its bill. On ``ec2`` the VM installs the worker wheel the
  training path installs, runs ``srifty profile ... --device cuda --no-mlflow`` and writes
  the profile to the run storage (``SRIFTY_RUN_STORAGE``), where the profile task
  collects it (``collect_timeout_s``, ``poll_s``); the VM then shuts itself down. On
  ``ec2-emulated`` the emulator measures what that GPU would from a stored reference
  profile of the same model and settings (a measured GPU profile first); with none, the
  **reference** task first profiles the model on this host's CPU with a small budget
  (``reference_on_cpu``), or fails naming the command that makes one.

The summary task lists what was written: per type B_max, the profile's path, the VM's
seconds and cost (per-second billing at the catalog's price), and the run's total; it
fails the run when a type's profile failed. All logic lives in ``srifty_core.jobs``
(``profile_vms`` and the modules it names); the tasks pass small records, not data.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task, task_group

# Shared policy (plugins/): the probe-store Asset, start date, task defaults.
from srifty_policy import LOCAL_HOST_POOL, START_DATE, default_args, fails_fast

# Light constants (no torch): sizes, settings, the profiler's budget and the model field's
# schema, so a bad trigger fails at once.
from srifty_core.cloud import PROVIDERS
from srifty_core.planner.schema.job_conf import JobConf
from srifty_core.planner.schema.trigger_form import param_schemas
from srifty_core.profiling.budget import (
    DEFAULT_DEVICE,
    DEFAULT_SIZE,
    budget_from_params,
    budget_params,
)
from srifty_core.training_settings import DEFAULT_SETTINGS, OPTIMIZERS, PRECISIONS
from srifty_core.workloads import SIZES

_MODEL = param_schemas(JobConf)["model"]["schema"]
_EC2 = param_schemas(JobConf)["ec2"]["schema"]

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
            "(on the worker) or hf:NAME; all but a zoo model may end ',seq=N' (tokens per "
            "sample) and ',vocab=N'.",
        ),
        "size": Param(DEFAULT_SIZE, type="string", enum=list(SIZES)),
        "precision": Param(DEFAULT_SETTINGS.precision, type="string", enum=list(PRECISIONS)),
        "optimizer": Param(DEFAULT_SETTINGS.optimizer, type="string", enum=list(OPTIMIZERS)),
        "compile": Param(False, type="boolean"),
        "channels_last": Param(False, type="boolean"),
        "tf32": Param(False, type="boolean"),
        "device_types": Param(
            [DEFAULT_DEVICE],
            type="array",
            minItems=1,
            items={"type": "string", "pattern": "^(cpu|cuda(:[0-9]+)?)$"},
            description="Devices to profile on: cpu, cuda or cuda:N.",
        ),
        # the profiler's budget: defaults, bounds and texts from its one home
        **{name: Param(**kw) for name, kw in budget_params().items()},
        "log_to_mlflow": Param(True, type="boolean"),
        "provider": Param(
            "local",
            type="string",
            enum=list(PROVIDERS),
            description="local: the device_types of this worker; ec2-emulated or ec2: one VM "
            "per instance type.",
        ),
        "instance_types": Param(
            [],
            type="array",
            uniqueItems=True,
            items={"type": "string", "pattern": "^[a-z0-9][a-z0-9.-]*$"},
            description="Cloud providers: catalog GPU types to profile on, one VM each "
            '(e.g. ["g4dn.xlarge", "p3.2xlarge"]).',
        ),
        "market": Param("on-demand", type="string", enum=["on-demand", "spot"]),
        "region": Param("us-east-1", type="string", pattern="^[a-z]{2}-[a-z]+-[0-9]+$"),
        "ec2": Param(
            {},
            schema=_EC2,
            description="ec2: launch settings as the plan-and-train DAG's (image_id, "
            "subnet_id, security_group_ids, instance_profile_arn, poll_s, wait_timeout_s).",
        ),
        "collect_timeout_s": Param(
            3600,
            type="number",
            exclusiveMinimum=0,
            maximum=7200,
            description="ec2: how long the profile task waits for the VM's profile.",
        ),
        "poll_s": Param(10, type="number", exclusiveMinimum=0, maximum=300),
        "reference_on_cpu": Param(
            True,
            type="boolean",
            description="ec2-emulated: with no stored profile of the model and settings to "
            "emulate from, profile it on this host's CPU first (a small budget); false: fail.",
        ),
        "seed": Param(0, type="integer", minimum=0, description="ec2-emulated: the seed."),
    },
)
def srifty_profile_model() -> None:
    @task
    @fails_fast
    def device_types() -> list[str]:
        p = get_current_context()["params"]
        return list(p["device_types"]) if p["provider"] == "local" else []

    # Profiles time the machine they run on: never two at once, and never beside a local
    # sweep or a local training job (the local host's pool, one slot).
    @task(multiple_outputs=True, max_active_tis_per_dag=1, pool=LOCAL_HOST_POOL)
    @fails_fast
    def profile_on(device: str) -> dict[str, Any]:
        from srifty_core.profiling.config import ProfilerConfig
        from srifty_core.profiling.job import run_profile_job
        from srifty_core.training_settings import TrainingSettings
        from srifty_core.trigger_models import registered_model

        p = get_current_context()["params"]
        registered_model(p["model"])  # a trigger's model is data: never a file to import
        config = ProfilerConfig(
            **budget_from_params(p), device=device, settings=TrainingSettings.from_dict(p)
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

    # ---------------------------------------------------------------- in the cloud
    @task
    @fails_fast
    def cloud_plan() -> list[dict[str, Any]]:
        """Check the whole cloud conf before anything is launched; one entry per VM."""
        from srifty_core.errors import FieldError
        from srifty_core.jobs.cloud_request import CloudProfileRequest, check_cloud_request

        p = get_current_context()["params"]
        if p["provider"] == "local":
            if p["instance_types"]:
                raise FieldError("instance_types", "only with provider ec2-emulated or ec2")
            return []
        request = CloudProfileRequest.from_params(p)
        types = check_cloud_request(
            p["provider"], p["instance_types"], market=p["market"], region=p["region"],
            ec2=p["ec2"], model=request.model,
        )  # fmt: skip
        return [{"instance_type": t} for t in types]

    # Makes a CPU reference (emulated EC2, none stored): the local host's pool.
    @task(pool=LOCAL_HOST_POOL)
    @fails_fast
    def reference(items: list[dict[str, Any]]) -> str | None:
        from srifty_core.jobs.cloud_request import CloudProfileRequest
        from srifty_core.jobs.emulation_reference import ensure_reference

        p = get_current_context()["params"]
        if not items or p["provider"] != "ec2-emulated":
            return None
        request = CloudProfileRequest.from_params(p)
        path, _, made = ensure_reference(request, make=p["reference_on_cpu"])
        print(f"reference profile: {path}{' (made on this CPU now)' if made else ''}")
        return str(path)

    @task
    @fails_fast
    def provision(item: dict[str, Any], ref: str | None) -> dict[str, Any]:
        """Launch the type's VM; ``ref`` (the reference profile's path, or none): nothing is
        launched unless the reference task succeeded."""
        from srifty_core.jobs.cloud_request import CloudProfileRequest
        from srifty_core.jobs.profiler_vm import provision_profiler_vm

        ctx = get_current_context()
        p = ctx["params"]
        vm = provision_profiler_vm(
            p["provider"], item["instance_type"], CloudProfileRequest.from_params(p),
            market=p["market"], region=p["region"], ec2=p["ec2"], key=ctx["run_id"],
            seed=p["seed"],
        )  # fmt: skip
        print(f"{vm.instance_type}: VM {vm.allocation_id} ({vm.market}), record {vm.id}")
        return vm.to_dict()

    # ec2: waits up to collect_timeout_s (a retry waits again for the same VM's profile).
    @task(execution_timeout=timedelta(hours=2, minutes=30))
    @fails_fast
    def profile(vm: dict[str, Any]) -> dict[str, Any]:
        from srifty_core.jobs.cloud_request import CloudProfileRequest
        from srifty_core.jobs.profile_vms import profile_on_vm

        p = get_current_context()["params"]
        result = profile_on_vm(
            vm, CloudProfileRequest.from_params(p),
            timeout_s=float(p["collect_timeout_s"]), poll_s=float(p["poll_s"]),
        )  # fmt: skip
        print(f"{result.instance_type}: {result.device_type} B_max {result.b_max}, {result.path}")
        return result.to_dict()

    @task
    @fails_fast
    def release(vm: dict[str, Any]) -> dict[str, Any]:
        from srifty_core.jobs.profiler_vm import release as give_back

        ti: Any = get_current_context()["ti"]
        bill = give_back(vm)
        # This VM's profile, if its profile task wrote one (same group, same map index).
        group = ti.task_id.rsplit(".", 1)[0]
        result = ti.xcom_pull(task_ids=f"{group}.profile", map_indexes=ti.map_index)
        print(f"{bill.instance_type}: released, {bill.vm_s:.0f} VM-seconds, ${bill.cost_usd:.4f}")
        return {**bill.to_dict(), "profile": result}

    @task_group
    def on_vm(item: dict[str, Any], ref: str | None) -> Any:
        """One VM: launch it (setup), profile on it, release it (teardown, always)."""
        vm = provision(item, ref)
        result = profile(vm)
        bill = release(vm).as_teardown(setups=vm)
        result >> bill
        return bill

    @task
    @fails_fast
    def cloud_summary(bills: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from srifty_core.jobs.profile_summary import format_summary, summarize

        # One value when the group expanded once, else a lazy sequence (by length).
        rows = [bills] if isinstance(bills, dict) else [bills[i] for i in range(len(bills))]
        summary = summarize(rows)
        print(format_summary(summary))
        if summary["failed"]:  # a retry would find the same failed profile tasks
            raise AirflowFailException(
                f"no profile from {', '.join(summary['failed'])} (see their profile tasks); "
                f"the VMs were released, ${summary['total_cost_usd']:.4f} in all"
            )
        return summary

    items = cloud_plan()
    cloud_summary(on_vm.partial(ref=reference(items)).expand(item=items))


srifty_profile_model()
