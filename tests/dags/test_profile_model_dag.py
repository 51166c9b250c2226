"""Run srifty_profile_model for real with dag.test() on the CPU with a tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from srifty_core.profiling.store import ProfileStore

pytestmark = pytest.mark.airflow


@pytest.mark.alone
@pytest.mark.slow
def test_profile_model_dag_writes_the_profile(dagbag: Any, data_dir: Path) -> None:
    dag = dagbag.get_dag("srifty_profile_model")
    run = dag.test(
        run_conf={
            "model": "resnet18",
            "size": "tiny",
            "device_types": ["cpu"],
            "probes": 3,
            "repeats": 2,
            "max_batch": 8,
        }
    )
    assert run.state == "success"
    profile = ProfileStore().load("resnet18", "tiny", "cpu")
    assert profile.b_max == 8 and len(profile.fw.batch_sizes) == 3 + len(profile.probe_checks)
    assert 1 <= len(profile.probe_checks) <= 3  # the DAG's default refine
    assert [k for k, _ in profile.shared_slowdown] == [2]  # share_host 2 on cpu
    assert (data_dir / "mlflow" / "mlflow.db").is_file()


def test_bad_model_names_the_field(dagbag: Any) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    from tests.dags.services import check_trigger

    dag = dagbag.get_dag("srifty_profile_model")
    with pytest.raises(ParamValidationError, match="model"):
        dag.test(run_conf={"model": "resnet19"})
    with pytest.raises(ParamValidationError, match="device_types"):
        check_trigger(dag, {"device_types": ["tpu"]})  # what dag.test refuses it with


# ---------------------------------------------------------------- in the (emulated) cloud
EMULATED: dict[str, Any] = {
    "model": "resnet18",
    "size": "tiny",
    "provider": "ec2-emulated",
    "instance_types": ["g4dn.xlarge", "g5.xlarge"],
    "probes": 3,
    "repeats": 2,
    "refine": 1,
}


def _profiler_records(data_dir: Path) -> list[dict[str, Any]]:
    import json

    folder = data_dir / "cloud" / "profilers"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def _states(run: Any) -> dict[tuple[str, int], str]:
    return {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}


def test_emulated_ec2_profiles_each_type_on_its_own_vm(
    dagbag: Any, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No profile of the model is stored: the DAG profiles it on this CPU first (the
    reference), then one emulated VM per type profiles it on its GPU; every VM released."""
    from tests.dags.services import fresh

    run = fresh(dagbag, "srifty_profile_model").test(run_conf=EMULATED)
    assert run.state == "success", _states(run)
    store = ProfileStore()
    cpu = store.load("resnet18", "tiny", "cpu")  # the reference, made on this host
    t4 = store.load("resnet18", "tiny", "T4")
    a10g = store.load("resnet18", "tiny", "A10G")
    assert "g4dn.xlarge" in t4.device_name and "g5.xlarge" in a10g.device_name
    # B_max follows the GPU's memory (the network's footprint, the emulator's test)
    assert 1 < t4.b_max < a10g.b_max and t4.b_max_limit == a10g.b_max_limit == "memory"
    assert (t4.memory_per_sample_bytes, t4.gradient_bytes) == (
        cpu.memory_per_sample_bytes,
        cpu.gradient_bytes,
    )
    assert t4.profiled_vms == 1 and len(t4.fw.batch_sizes) >= 3
    # teardown: every VM given back, billed per second from its launch
    records = _profiler_records(data_dir)
    assert sorted(r["instance_type"] for r in records) == ["g4dn.xlarge", "g5.xlarge"]
    assert all(r["released"] for r in records)
    assert all("--device cuda" in r["script"] and "--no-mlflow" in r["script"] for r in records)
    states = _states(run)
    assert [states[("on_vm.release", i)] for i in (0, 1)] == ["success", "success"]
    (ti,) = [t for t in run.get_task_instances() if t.task_id == "cloud_summary"]
    summary = ti.xcom_pull(task_ids="cloud_summary")
    rows = {r["instance_type"]: r for r in summary["types"]}
    assert rows["g4dn.xlarge"]["b_max"] == t4.b_max and rows["g5.xlarge"]["device_type"] == "A10G"
    assert rows["g4dn.xlarge"]["path"] == str(store.path("resnet18", "tiny", "T4"))
    for r in rows.values():
        assert r["vm_s"] > 60  # the launch delay (about 150 s) and the profile's steps
        assert r["cost_usd"] == pytest.approx(r["vm_s"] * r["usd_per_hour"] / 3600)
    assert rows["g4dn.xlarge"]["usd_per_hour"] == 0.526  # the catalog's on-demand price
    assert summary["total_cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows.values()))
    assert "total: 2 VM(s)" in capsys.readouterr().out


def test_a_failed_profile_still_releases_its_vm(dagbag: Any, data_dir: Path) -> None:
    """The stored reference (the shipped H200 profile of ResNet-50, made to need 20 GiB
    beside its samples) fits an A10G (22 GiB) but not a T4 (16 GiB). The T4's profile task
    fails; both VMs are released and billed, and the summary fails the run."""
    from dataclasses import replace

    from srifty_core import paths
    from srifty_core.profiling.profile import ComputeProfile
    from tests.dags.services import fresh

    shipped = paths.REFERENCE_PROFILES_DIR / "gpu" / "h200_resnet50.json"
    h200 = ComputeProfile.from_json(shipped.read_text())
    ProfileStore().save(replace(h200, memory_fixed_bytes=20 * 2**30))
    conf = {**EMULATED, "model": "resnet50", "size": "full", "reference_on_cpu": False}
    run = fresh(dagbag, "srifty_profile_model").test(run_conf=conf)
    assert run.state == "failed"
    states = _states(run)
    assert states[("on_vm.profile", 0)] == "failed"  # g4dn.xlarge: does not fit
    assert states[("on_vm.profile", 1)] == "success"
    assert [states[("on_vm.release", i)] for i in (0, 1)] == ["success", "success"]
    assert states[("cloud_summary", -1)] == "failed"
    records = _profiler_records(data_dir)
    assert len(records) == 2 and all(r["released"] and r["bill"]["cost_usd"] > 0 for r in records)
    assert ProfileStore().load("resnet50", "full", "A10G").b_max >= 1
    assert not ProfileStore().path("resnet50", "full", "T4").exists()


def test_cloud_conf_mistakes_fail_at_once_naming_the_field(dagbag: Any, data_dir: Path) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    from tests.dags.services import check_trigger, fresh

    # refused before a run is created, as dag.test refuses them (test_bad_model_names_the_field)
    dag = fresh(dagbag, "srifty_profile_model")
    check_trigger(dag, EMULATED)
    with pytest.raises(ParamValidationError, match="provider"):
        check_trigger(dag, {**EMULATED, "provider": "gcp"})
    with pytest.raises(ParamValidationError, match="instance_types"):
        check_trigger(dag, {**EMULATED, "instance_types": ["G4DN.xlarge"]})
    # a type the catalog does not have: the check fails before anything is launched
    run = dag.test(run_conf={**EMULATED, "instance_types": ["g4dn.xlarg"]})
    assert run.state == "failed"
    states = _states(run)
    assert states[("cloud_plan", -1)] == "failed"
    assert not (data_dir / "cloud" / "profilers").exists()  # no VM
    # no reference stored and none to be made here: fails naming the command
    run = fresh(dagbag, "srifty_profile_model").test(
        run_conf={**EMULATED, "reference_on_cpu": False}
    )
    assert run.state == "failed" and _states(run)[("reference", -1)] == "failed"
    assert not (data_dir / "cloud" / "profilers").exists()


def test_ec2_profile_through_moto_lands_in_the_store(
    dagbag: Any, data_dir: Path, aws: Any, ec2_storage: str
) -> None:
    """The EC2 path against moto. Nothing executes on moto (no profiler runs on its VMs):
    a thread plays the VM's part, reading the VM's user data for its run-storage folder
    and placing a T4 profile and the exit code there, as the VM's ``finish`` step would.
    The profile task collects it into the store; the teardown terminates the VM."""
    import re
    import threading
    import time
    from dataclasses import replace

    from srifty_core import paths
    from srifty_core.profiling.profile import ComputeProfile
    from srifty_core.runs import store as run_store
    from tests.cloud.moto_aws import AMI, live_instances, user_data_of
    from tests.dags.services import fresh

    h200 = paths.REFERENCE_PROFILES_DIR / "gpu" / "h200_resnet50.json"
    t4 = replace(ComputeProfile.from_json(h200.read_text()), device_type="T4", b_max=96)
    scripts: list[str] = []

    def be_the_vm() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end and not scripts:
            resp = aws.describe_instances(
                Filters=[{"Name": "instance-state-name", "Values": ["running"]}]
            )
            for r in resp["Reservations"]:
                for i in r["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                    script = user_data_of(aws, tags["srifty:allocation"])
                    run_dir = re.search(r"finish --run-dir (\S+)", script)
                    assert run_dir is not None
                    run_store.write_text(f"{run_dir[1]}/profile.json", t4.to_json())
                    run_store.write_text(f"{run_dir[1]}/exit.json", '{"code": 0}')
                    scripts.append(script)
            time.sleep(0.05)

    vm = threading.Thread(target=be_the_vm, daemon=True)
    vm.start()
    conf = {
        "model": "resnet50",
        "size": "full",
        "provider": "ec2",
        "instance_types": ["g4dn.xlarge"],
        "ec2": {"image_id": AMI, "poll_s": 0.05, "wait_timeout_s": 20},
        "collect_timeout_s": 30,
        "poll_s": 0.1,
    }
    run = fresh(dagbag, "srifty_profile_model").test(run_conf=conf)
    vm.join(timeout=5)
    assert run.state == "success", _states(run)
    (script,) = scripts
    assert "srifty profile --model resnet50 --size full --device cuda --no-mlflow" in script
    assert ProfileStore().load("resnet50", "full", "T4") == t4
    assert live_instances(aws) == []
    summary = next(t for t in run.get_task_instances() if t.task_id == "cloud_summary")
    (row,) = summary.xcom_pull(task_ids="cloud_summary")["types"]
    assert row["b_max"] == 96 and row["usd_per_hour"] == 0.526 and row["cost_usd"] > 0
