"""Cloud profiling (``jobs.profile_vms`` and its modules): the request and its checks, the
reference an emulated profile starts from, the emulated VM's life across processes (its
record), and the EC2 path against moto.

Nothing executes on moto: it has no compute, so no profiler runs on its "VMs". The EC2
tests check what the VM is told to run (its user data), then play the VM's part
themselves: they place a profile in the VM's run-storage folder, as the VM's ``finish``
step would, and check that the collect step brings it into the profile store, and that
the teardown terminates the instance (also after the collect step timed out)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from srifty_core import paths
from srifty_core.errors import ConfigError, FieldError
from srifty_core.jobs import cloud_request, emulation_reference, profile_summary, profile_vms
from srifty_core.jobs import profiler_vm as vms
from srifty_core.jobs import vm_script as on_vm
from srifty_core.jobs.cloud_request import CloudProfileRequest
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.store import ProfileNotFoundError, ProfileStore
from srifty_core.training_settings import TrainingSettings
from tests.cloud.moto_aws import AMI, WHEEL_SHA, WHEEL_URI, live_instances, user_data_of

SHIPPED = paths.REFERENCE_PROFILES_DIR


def shipped(name: str) -> ComputeProfile:
    return ComputeProfile.from_json((SHIPPED / name).read_text())


@pytest.fixture
def h200() -> ComputeProfile:
    """A measured GPU profile of ResNet-50 (full), stored."""
    p = shipped("gpu/h200_resnet50.json")
    ProfileStore().save(p)
    return p


REQ = CloudProfileRequest("resnet50", "full", probes=3, repeats=2, refine=1)


# --------------------------------------------------------------------------- the request
def test_the_vm_command_is_the_profiler_on_cuda_with_the_training_settings() -> None:
    req = CloudProfileRequest(
        "hf:gpt2", "small", TrainingSettings("bf16", "adamw", compile=True), max_batch=64
    )
    argv = req.profiler_argv("/tmp/p.json")
    assert argv[:7] == ["profile", "--model", "hf:gpt2", "--size", "small", "--device", "cuda"]
    assert "--no-mlflow" in argv and "--compile" in argv and "--channels-last" not in argv
    flags = dict(itertools.pairwise(argv))
    assert flags["--precision"] == "bf16" and flags["--optimizer"] == "adamw"
    assert flags["--max-batch"] == "64" and flags["--out"] == "/tmp/p.json"
    script = on_vm.vm_script(req, "s3://b/runs/x")
    assert "/opt/srifty/bin/srifty profile --model hf:gpt2" in script
    assert "srifty_core.jobs.vm_script finish --run-dir s3://b/runs/x" in script
    assert script.rstrip().endswith("shutdown -h now")  # terminates: billing stops


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"model": "resnet19"}, "model"),
        ({"size": "huge"}, "size"),
        ({"probes": 1}, "probes"),
        ({"max_batch": 0}, "max_batch"),
    ],
)
def test_a_bad_request_names_its_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(FieldError) as err:
        CloudProfileRequest(**{"model": "resnet18", **kwargs})
    assert err.value.path == field


def test_the_check_names_the_field_before_anything_launches() -> None:
    assert cloud_request.check_cloud_request("ec2-emulated", ["g4dn.xlarge", "g5.xlarge"]) == [
        "g4dn.xlarge",
        "g5.xlarge",
    ]
    cases = [
        (("local", ["g4dn.xlarge"]), {}, "provider"),
        (("ec2-emulated", []), {}, "instance_types"),
        (("ec2-emulated", ["g4dn.xlarge", "g4dn.xlarg"]), {}, "instance_types[1]"),
        (("ec2-emulated", ["g4dn.xlarge"]), {"market": "reserved"}, "market"),
        (("ec2", ["g4dn.xlarge"]), {"ec2": {}}, "ec2.image_id"),
        (("ec2", ["g4dn.xlarge"]), {"ec2": {"image_id": AMI, "aws_conn_id": "x"}}, "ec2"),
        (("ec2", ["g4dn.xlarge"]), {"ec2": {"image_id": AMI}, "model": "m.py:f"}, "model"),
    ]
    for args, kwargs, field in cases:
        with pytest.raises(FieldError) as err:
            cloud_request.check_cloud_request(*args, **kwargs)
        assert err.value.path.startswith(field), (field, str(err.value))
    with pytest.raises(FieldError, match=r"did you mean 'g4dn\.xlarge'"):
        cloud_request.check_cloud_request("ec2-emulated", ["g4dn.xlarg"])


# --------------------------------------------------------------------------- references
def test_the_reference_is_a_measured_gpu_profile_first(h200: ComputeProfile) -> None:
    store = ProfileStore()
    cpu = shipped("resnet50.json")
    store.save(replace(cpu, size="full"))
    store.save(replace(h200, device_type="V100", device_name="V100 (p3.2xlarge, ec2-emulated)"))
    store.save(replace(h200, device_type="A100", settings=TrainingSettings("bf16")))  # others
    path, ref = emulation_reference.reference_profile(REQ)
    assert ref.device_type == "H200" and path == store.path("resnet50", "full", "H200")
    found = emulation_reference.reference_candidates(REQ)
    assert [p.device_type for _, p in found] == ["H200", "cpu", "V100"]


def test_without_a_reference_the_error_is_the_command_that_makes_one() -> None:
    with pytest.raises(ProfileNotFoundError) as err:
        emulation_reference.ensure_reference(
            replace(REQ, settings=TrainingSettings(optimizer="adamw")), make=False
        )
    text = str(err.value)
    assert "\n" not in text
    assert "`srifty profile --model resnet50 --size full --optimizer adamw --device cpu`" in text


# --------------------------------------------------------------------------- emulated VMs
def test_an_emulated_vm_lives_across_steps_through_its_record(h200: ComputeProfile) -> None:
    """Each step rebuilds the VM's world from its record, as separate task processes do."""
    vm = vms.provision_profiler_vm("ec2-emulated", "g4dn.xlarge", REQ, key="run/1", seed=3)
    record = vms.ProfilerVM.record_path(vm.id)
    assert record.is_file() and record.parent == paths.cloud_dir() / "profilers"
    assert vm.gpu_model == "T4" and vm.market == "on-demand" and not vm.released
    assert "--device cuda" in vm.script
    result = profile_vms.profile_on_vm(vm.to_dict(), REQ)  # what XCom carries
    assert result.device_type == "T4" and result.b_max_limit == "memory"
    assert result.reference == str(ProfileStore().path("resnet50", "full", "H200"))
    stored = ProfileStore().load("resnet50", "full", "T4")
    assert stored.b_max == result.b_max and stored.profiled_vms == 1
    assert stored.settings == REQ.settings and stored.noisy == ()
    moved = vms.ProfilerVM.load(vm.id)
    assert moved.clock > vm.clock  # the profile's steps took simulated time
    bill = vms.release(vm.to_dict())  # the setup's record: the teardown reads the latest
    # billed from the launch request to the release (the emulator's clock)
    assert bill.vm_s == pytest.approx((_t(moved.clock) - _t(vm.launched_at)).total_seconds())
    assert bill.vm_s > 60  # the launch delay (about 150 s) and the profile's steps
    assert bill.usd_per_hour == 0.526
    assert bill.cost_usd == pytest.approx(bill.vm_s * 0.526 / 3600)
    assert vms.ProfilerVM.load(vm.id).released
    assert vms.release(vm) == bill  # idempotent

    # same seed, same measurements; the GPU's memory sets B_max
    again = vms.provision_profiler_vm("ec2-emulated", "g4dn.xlarge", REQ, key="run/2", seed=3)
    assert profile_vms.profile_on_vm(again, REQ).b_max == result.b_max
    a10g = vms.provision_profiler_vm("ec2-emulated", "g5.xlarge", REQ, key="run/2", seed=3)
    assert profile_vms.profile_on_vm(a10g, REQ).b_max > result.b_max
    for v in (again, a10g):
        vms.release(v)


def _t(text: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(text)


def test_a_model_too_big_for_the_gpu_fails_and_the_vm_is_still_released(
    h200: ComputeProfile,
) -> None:
    ProfileStore().save(replace(h200, memory_fixed_bytes=20 * 2**30))
    vm = vms.provision_profiler_vm("ec2-emulated", "g4dn.xlarge", REQ, market="spot")
    with pytest.raises(ConfigError, match="does not fit one T4"):
        profile_vms.profile_on_vm(vm, REQ)
    bill = vms.release(vm)
    assert bill.market == "spot" and bill.cost_usd > 0
    assert not ProfileStore().path("resnet50", "full", "T4").exists()


def test_profile_in_cloud_makes_the_summary(h200: ComputeProfile) -> None:
    ProfileStore().save(replace(h200, memory_fixed_bytes=20 * 2**30))
    out = profile_vms.profile_in_cloud("ec2-emulated", ["g4dn.xlarge", "g5.xlarge"], REQ)
    assert out["failed"] == ["g4dn.xlarge"] and "does not fit" in out["errors"]["g4dn.xlarge"]
    rows = {r["instance_type"]: r for r in out["types"]}
    assert rows["g5.xlarge"]["device_type"] == "A10G" and rows["g5.xlarge"]["b_max"] >= 1
    assert out["total_cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows.values()))
    records = list((paths.cloud_dir() / "profilers").glob("*.json"))
    assert len(records) == 2 and all(json.loads(p.read_text())["released"] for p in records)
    text = profile_summary.format_summary(out)
    assert "g4dn.xlarge (on-demand): no profile (failed)" in text and "total: 2 VM(s)" in text


# --------------------------------------------------------------------------- on the VM
def test_the_vm_side_hands_over_the_profile_then_the_exit_code(
    tmp_path: Path, h200: ComputeProfile
) -> None:
    prof, log = tmp_path / "profile.json", tmp_path / "profile.log"
    prof.write_text(h200.to_json())
    log.write_text("profile resnet50: done\n")
    run_dir = tmp_path / "run"
    assert on_vm.main(["finish", "--run-dir", str(run_dir), "--profile", str(prof),
                       "--log", str(log), "--code", "0"]) == 0  # fmt: skip
    assert (run_dir / "profile.json").read_text() == h200.to_json()
    assert json.loads((run_dir / "exit.json").read_text())["code"] == 0
    failed = tmp_path / "failed"
    log.write_text("CUDA out of memory at batch 1\n")
    on_vm.finish(str(failed), 1, tmp_path / "none.json", log)
    assert not (failed / "profile.json").exists()
    done = json.loads((failed / "exit.json").read_text())
    assert done["code"] == 1 and "out of memory" in done["tail"]


# --------------------------------------------------------------------------- EC2 (moto)
EC2 = {"image_id": AMI, "poll_s": 0.05, "wait_timeout_s": 20}


@pytest.mark.airflow
def test_ec2_vm_runs_the_profiler_and_its_profile_is_collected(
    aws: Any, ec2_storage: str, h200: ComputeProfile
) -> None:
    from srifty_core.runs import store as run_store

    req = replace(REQ, settings=TrainingSettings("fp16"))
    vm = vms.provision_profiler_vm("ec2", "g4dn.xlarge", req, ec2=EC2, key="dag/run")
    assert vm.run_dir.startswith(f"{ec2_storage}/profile-runs/") and vm.gpu_model == "T4"
    script = user_data_of(aws, vm.allocation_id)
    assert WHEEL_URI in script and WHEEL_SHA in script  # the training path's artifact
    assert (
        "/opt/srifty/bin/srifty profile --model resnet50 --size full --device cuda "
        "--no-mlflow --precision fp16 --optimizer sgd" in script
    )
    assert f"finish --run-dir {vm.run_dir}" in script and "shutdown -h now" in script
    for secret in ("aws_secret_access_key", "password", "testing"):
        assert secret not in script.lower()
    assert live_instances(aws)

    # the VM's part (nothing runs on moto): its profile of a T4, then its exit code
    t4 = replace(h200, device_type="T4", device_name="Tesla T4", settings=req.settings)
    run_store.write_text(run_store.join(vm.run_dir, "profile.json"), t4.to_json())
    run_store.write_text(run_store.join(vm.run_dir, "exit.json"), '{"code": 0}')

    result = profile_vms.profile_on_vm(vm.to_dict(), req, timeout_s=10, poll_s=0.05)
    assert result.device_type == "T4" and result.b_max == t4.b_max
    stored = ProfileStore().load("resnet50", "full", "T4", req.settings)
    assert stored == t4
    assert result.path == str(ProfileStore().path("resnet50", "full", "T4", req.settings))
    bill = vms.release(vm.to_dict())
    assert live_instances(aws) == []
    assert bill.usd_per_hour == 0.526 and bill.cost_usd >= 0.526 * 60 / 3600  # 1-min minimum


@pytest.mark.airflow
def test_ec2_collect_times_out_and_teardown_still_terminates(
    aws: Any, ec2_storage: str, h200: ComputeProfile
) -> None:
    vm = vms.provision_profiler_vm("ec2", "p3.2xlarge", REQ, ec2=EC2, market="spot")
    late = r"no profile from p3.2xlarge .* after 0 s"
    with pytest.raises(profile_vms.CollectTimeout, match=late):
        profile_vms.collect_profile(vm, REQ, timeout_s=0.3, poll_s=0.05)
    assert live_instances(aws)
    bill = vms.release(vm)
    assert live_instances(aws) == [] and bill.market == "spot"
    assert not ProfileStore().path("resnet50", "full", "V100").exists()


@pytest.mark.airflow
def test_ec2_profiler_failure_is_reported_with_its_last_line(
    aws: Any, ec2_storage: str, h200: ComputeProfile
) -> None:
    from srifty_core.cloud.base import ProviderError
    from srifty_core.runs import store as run_store

    vm = vms.provision_profiler_vm("ec2", "g4dn.xlarge", REQ, ec2=EC2)
    done = {"code": 1, "tail": "...\nBatchDoesNotFitError: batch 1 does not fit"}
    run_store.write_text(run_store.join(vm.run_dir, "exit.json"), json.dumps(done))
    with pytest.raises(ProviderError, match=r"exited with code 1: .*BatchDoesNotFitError"):
        profile_vms.collect_profile(vm, REQ, timeout_s=10, poll_s=0.05)
    vms.release(vm)
    assert live_instances(aws) == []


@pytest.mark.airflow
def test_ec2_needs_run_storage(aws: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SRIFTY_RUN_STORAGE", raising=False)
    with pytest.raises(ConfigError, match="SRIFTY_RUN_STORAGE"):
        vms.provision_profiler_vm("ec2", "g4dn.xlarge", REQ, ec2=EC2)
    assert live_instances(aws) == []


def test_the_command_profiles_on_emulated_vms(
    h200: ComputeProfile, capsys: pytest.CaptureFixture[str]
) -> None:
    from srifty_core.cli import main

    argv = ["profile", "--model", "resnet50", "--size", "full", "--provider", "ec2-emulated",
            "--instance-type", "g4dn.xlarge", "--instance-type", "g5.xlarge", "--probes", "3",
            "--no-reference"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "g4dn.xlarge (on-demand): T4: B_max" in out and "total: 2 VM(s)" in out
    assert ProfileStore().load("resnet50", "full", "A10G").b_max > 1
    assert main([*argv[:6], "ec2-emulated", "--instance-type", "g4dn.xlarg"]) == 2
    assert "instance_types[0]: unknown instance type 'g4dn.xlarg'" in capsys.readouterr().err
