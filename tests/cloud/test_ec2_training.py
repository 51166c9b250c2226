"""Launching a training configuration on EC2 (against a moto server on loopback, the only
stand-in for AWS; it runs no user data): the first VM alone, the others told its private
address; every VM's user data installs the deployment's wheel (URI and sha256), carries
the plan and its start script, and no secret."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from srifty_core.cloud import LaunchRequest
from srifty_core.cloud.base import InstanceState
from srifty_core.cloud.ec2 import EC2Provider
from srifty_core.cloud.ec2.records import TAG_PLACEMENT, TAG_RELEASED, instance_state
from srifty_core.cloud.ec2.user_data import (
    BOOTSTRAP_LOG,
    INSTALL_FAILED,
    INSTALL_S,
    WHEEL_SHA256_ENV,
    WHEEL_URI_ENV,
    WorkerWheel,
    training_user_data,
)
from srifty_core.errors import ConfigError
from srifty_core.worker.rendezvous import Rendezvous, TrainingStart, node_groups, start_script
from tests.cloud.moto_aws import AMI, SECRET, live_instances

WHEEL = WorkerWheel("s3://deploy-bucket/wheels/srifty-0.1.0-py3-none-any.whl", "cd" * 32)
# g4dn.12xlarge: 4 GPUs (4 ranks per VM); g4dn.xlarge: 1 GPU
PLAN = {
    "model": "resnet50",
    "size": "full",
    "global_batch": 224,
    "iterations": 100,
    "local_batches": [32, 32, 32, 32, 32, 32, 32],
    "run_dir": "s3://runs-bucket/jobs/j1",
    "config_id": "c0",
}


def _user_data(aws: Any, instance_id: str) -> str:
    attr = aws.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(attr["UserData"]["Value"]).decode()


def _start_part(user_data: str) -> str:
    m = re.search(r"<<'SRIFTY_START_SCRIPT'\n(.*)\nSRIFTY_START_SCRIPT\n", user_data, re.S)
    assert m, user_data
    return m.group(1) + "\n"


def test_a_configuration_launches_the_first_vm_first_and_tells_the_others(
    aws: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(WHEEL_URI_ENV, WHEEL.uri)  # a deployment setting
    monkeypatch.setenv(WHEEL_SHA256_ENV, WHEEL.sha256)
    plan_file = tmp_path / "plan-c0.json"
    plan_file.write_text(json.dumps(PLAN))
    training = TrainingStart.for_plan(plan_file, "c0")
    p = EC2Provider(image_id=AMI, poll_s=0.05, wait_timeout_s=20, training=training)
    requests = [LaunchRequest("g4dn.xlarge", count=3), LaunchRequest("g4dn.12xlarge", count=1)]
    allocs = p.launch_many(requests)
    try:
        assert [a.count for a in allocs] == [1, 2, 1]  # the first VM alone, then the rest
        assert [a.spec.name for a in allocs] == ["g4dn.xlarge"] * 2 + ["g4dn.12xlarge"]
        first = p.describe(allocs[0])[0].address
        assert first
        scripts = [_user_data(aws, a.instance_ids[0]) for a in allocs]
        groups = node_groups([(3, 1), (1, 4)])
        for k, (a, script) in enumerate(zip(allocs, scripts, strict=True)):
            assert WHEEL.uri in script and WHEEL.sha256 in script and a.id in script
            assert "pip install srifty" not in script
            lowered = script.lower()
            for secret in (SECRET.lower(), "aws_secret_access_key", "password", "token="):
                assert secret not in lowered, secret
            host = "" if k == 0 else first
            rdzv = Rendezvous(training.run_id, 4, 7, host, join_timeout_s=p.join_timeout_s)
            assert _start_part(script) == start_script(training.plan_json, groups[k], rdzv)
            assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
        assert f"--rdzv-endpoint={first}:29400" in scripts[1] and "--nproc-per-node=4" in scripts[2]
        assert "SRIFTY_RANK_OFFSET=$((3 + SRIFTY_LAUNCH_INDEX * 4))" in scripts[2]
        # the VMs wait for each other as long as a launch and an install may take
        assert p.join_timeout_s == 20 + INSTALL_S and "join_timeout=620" in scripts[1]
        for a in allocs:  # a VM that shuts itself down (torchrun ended) is terminated
            attr = aws.describe_instance_attribute(
                InstanceId=a.instance_ids[0], Attribute="instanceInitiatedShutdownBehavior"
            )
            assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        with pytest.raises(Exception, match="launch_many"):
            p.launch(requests[0])
    finally:
        for a in allocs:
            p.release(a)
    assert live_instances(aws) == []


def test_a_configuration_that_does_not_fit_the_plan_launches_nothing(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(WHEEL_URI_ENV, WHEEL.uri)
    monkeypatch.setenv(WHEEL_SHA256_ENV, WHEEL.sha256)
    training = TrainingStart(json.dumps(PLAN), "srifty-x-c0")
    p = EC2Provider(image_id=AMI, poll_s=0.05, wait_timeout_s=20, training=training)
    with pytest.raises(ConfigError, match="7"):
        p.launch_many([LaunchRequest("g4dn.xlarge", count=2)])
    assert live_instances(aws) == []


def test_training_user_data_installs_before_it_starts() -> None:
    data = training_user_data("#!/bin/bash\necho start\n", wheel=WHEEL, allocation_id="a1")
    lines = data.splitlines()
    check = next(i for i, x in enumerate(lines) if "sha256sum --check" in x)
    install = next(i for i, x in enumerate(lines) if "pip install '/opt/srifty/wheel/" in x)
    start = lines.index(
        "nohup bash /opt/srifty/start-worker.sh >>/var/log/srifty-worker.log 2>&1 &"
    )
    assert lines[1] == "set -euo pipefail" and check < install < start
    with pytest.raises(ConfigError, match="marker"):
        training_user_data("x\nSRIFTY_START_SCRIPT\n", wheel=WHEEL)


def test_provision_of_an_ec2_job_starts_torchrun_on_every_vm(
    aws: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What the DAG's provision task does for an EC2 configuration."""
    from srifty_core.jobs.job import JobPlan, Launch
    from srifty_core.jobs.provisioning import provision, release

    monkeypatch.setenv(WHEEL_URI_ENV, WHEEL.uri)
    monkeypatch.setenv(WHEEL_SHA256_ENV, WHEEL.sha256)
    plan_file = tmp_path / "plan-c0.json"
    plan_file.write_text(json.dumps(PLAN))
    job = JobPlan(
        config_id="c0",
        provider="ec2",
        region="us-east-1",
        train_plan=str(plan_file),
        launches=(
            Launch("g4dn.xlarge", "on-demand", 3, 1, 32),
            Launch("g4dn.12xlarge", "on-demand", 1, 4, 32),
        ),
        usd_per_hour=1.0,
        predicted={},
        explanation=(),
        ec2={"image_id": AMI, "poll_s": 0.05, "wait_timeout_s": 20},
    )
    job_path = job.save(tmp_path / "job-c0.json")
    ids = provision(job_path)
    try:
        assert len(ids) == 3  # the first VM, the other two g4dn.xlarge, the g4dn.12xlarge
        p = EC2Provider(image_id=AMI)
        allocs = [p.get_allocation(a) for a in ids]
        scripts = [_user_data(aws, i) for a in allocs for i in a.instance_ids]
        assert len(scripts) == 4
        assert all("torchrun --nnodes=4 " in s and WHEEL.sha256 in s for s in scripts)
        assert all("srifty train" not in s for s in scripts)
    finally:
        release(ids, job_path=job_path)
    assert live_instances(aws) == []


@pytest.fixture
def wheel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WHEEL_URI_ENV, WHEEL.uri)  # a deployment setting
    monkeypatch.setenv(WHEEL_SHA256_ENV, WHEEL.sha256)


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Placement groups created and deleted (moto 5.2 has no placement-group actions, so
    these two calls are recorded instead of sent; ``run_instances`` takes any name)."""
    seen: dict[str, list[str]] = {"created": [], "deleted": []}
    monkeypatch.setattr(
        EC2Provider, "_create_placement_group", lambda self, n: seen["created"].append(n)
    )
    monkeypatch.setattr(
        EC2Provider, "_delete_placement_group", lambda self, n: seen["deleted"].append(n)
    )
    return seen


def _instances(aws: Any, ids: Any) -> list[dict[str, Any]]:
    resp = aws.describe_instances(InstanceIds=list(ids))
    return [i for r in resp["Reservations"] for i in r["Instances"]]


def test_a_configuration_shares_one_placement_group_and_launches_without_waiting(
    aws: Any, wheel_env: None, groups: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first VM and its peers in one cluster placement group, deleted with the last
    allocation in it; every launch sent before any wait, then one wait for all VMs."""
    calls: list[str] = []
    placements: list[str] = []
    real_wait = EC2Provider._wait_running

    def wait(self: EC2Provider, ids: Any) -> None:
        calls.append(f"wait {len(ids)}")
        real_wait(self, ids)

    monkeypatch.setattr(EC2Provider, "_wait_running", wait)
    p = EC2Provider(
        image_id=AMI, poll_s=0.05, wait_timeout_s=20, join_timeout_s=1800,
        training=TrainingStart(json.dumps(PLAN), "srifty-x-c0"),
    )  # fmt: skip
    client = p.client()
    real_run = client.run_instances

    def run_instances(**kw: Any) -> Any:
        calls.append(f"run {kw['MinCount']}")
        placements.append(kw["Placement"]["GroupName"])  # moto does not keep it
        return real_run(**kw)

    monkeypatch.setattr(client, "run_instances", run_instances)
    requests = [
        LaunchRequest("g4dn.xlarge", count=3, placement_group=True),
        LaunchRequest("g4dn.12xlarge", count=1, placement_group=True),
    ]
    allocs = p.launch_many(requests)
    try:
        assert calls == ["run 1", "run 2", "run 1", "wait 4"]
        (group,) = groups["created"]  # one group for the configuration, not one per call
        insts = _instances(aws, [i for a in allocs for i in a.instance_ids])
        assert len(insts) == 4
        assert placements == [group] * 3
        assert all({"Key": TAG_PLACEMENT, "Value": group} in i["Tags"] for i in insts)
        assert all(a.placement_group for a in allocs)
        assert "join_timeout=1800" in _user_data(aws, allocs[1].instance_ids[0])
        p.release(allocs[0])
        p.release(allocs[2])
        assert groups["deleted"] == []  # the middle allocation is still in it
        p.release(allocs[1])
        assert groups["deleted"] == [group]  # with the last allocation in it
    finally:
        for a in allocs:
            p.release(a)  # idempotent (a retry may try the deletion again)
    assert set(groups["deleted"]) == {group}
    assert live_instances(aws) == []


def test_a_failed_second_launch_releases_the_first_vm(
    aws: Any, wheel_env: None, groups: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first VM started; the next ``run_instances`` fails (no capacity): the first VM
    is terminated and the configuration's placement group deleted before the error goes
    up. The failure is injected into the client (moto always has capacity)."""
    from botocore.exceptions import ClientError

    p = EC2Provider(
        image_id=AMI, poll_s=0.05, wait_timeout_s=20,
        training=TrainingStart(json.dumps(PLAN), "srifty-x-c0"),
    )  # fmt: skip
    client = p.client()
    real_run = client.run_instances
    started: list[str] = []

    def run_instances(**kw: Any) -> Any:
        if started:
            err = {"Code": "InsufficientInstanceCapacity", "Message": "injected: no capacity"}
            raise ClientError({"Error": err}, "RunInstances")
        resp = real_run(**kw)
        started.extend(i["InstanceId"] for i in resp["Instances"])
        return resp

    monkeypatch.setattr(client, "run_instances", run_instances)
    requests = [
        LaunchRequest("g4dn.xlarge", count=3, placement_group=True),
        LaunchRequest("g4dn.12xlarge", count=1, placement_group=True),
    ]
    with pytest.raises(ClientError, match="InsufficientInstanceCapacity"):
        p.launch_many(requests)
    assert len(started) == 1  # the first VM had been launched
    (first,) = _instances(aws, started)
    assert first["State"]["Name"] in ("shutting-down", "terminated")
    assert any(t["Key"] == TAG_RELEASED for t in first["Tags"])
    assert live_instances(aws) == []
    assert len(groups["created"]) == 1 and groups["deleted"] == groups["created"]


def test_ec2_training_needs_its_run_folder_on_run_storage(tmp_path: Path) -> None:
    """A local run folder would be each VM's own disk: the monitor would see nothing."""
    plan_file = tmp_path / "plan-c0.json"
    plan_file.write_text(json.dumps({**PLAN, "run_dir": str(tmp_path / "run")}))
    with pytest.raises(ConfigError, match="SRIFTY_RUN_STORAGE"):
        TrainingStart.for_plan(plan_file, "c0")
    plan_file.write_text(json.dumps({**PLAN, "run_dir": f"file://{tmp_path}/run"}))
    with pytest.raises(ConfigError, match="SRIFTY_RUN_STORAGE"):
        TrainingStart.for_plan(plan_file, "c0")


def test_a_vm_that_shut_itself_down_is_terminated_not_taken_back() -> None:
    """The start script shuts the VM down once torchrun ends: EC2's state reason says so
    (moto cannot shut an instance down from inside, so the record is written here)."""
    p = EC2Provider(image_id=AMI)
    raw: dict[str, Any] = {
        "State": {"Name": "terminated"},
        "StateReason": {
            "Code": "Client.InstanceInitiatedShutdown",
            "Message": "Client.InstanceInitiatedShutdown: Instance initiated shutdown",
        },
        "StateTransitionReason": "User initiated (2026-11-30 12:00:00 GMT)",
        "Tags": [],
    }
    state, ended = instance_state(raw, p.now)
    assert state is InstanceState.TERMINATED and ended is not None and ended.hour == 12
    spot = {**raw, "StateReason": {"Code": "Server.SpotInstanceTermination"}}
    assert instance_state(spot, p.now)[0] is InstanceState.INTERRUPTED


def test_the_monitor_fails_an_ec2_run_on_a_non_zero_exit_marker(tmp_path: Path) -> None:
    """torchrun ended on a VM (a join timeout, a crash) and the VM shut down: its exit
    marker in the run folder fails the run at the next step instead of waiting for the
    sensor's timeout. The marker is the one the start script's CLI writes."""
    import time

    from srifty_core.jobs.job import JobPlan, JobSpec, TrainingFailed
    from srifty_core.jobs.monitor_step import Monitor
    from srifty_core.planner.schema.train_plan import TrainPlan
    from srifty_core.worker.rendezvous import main as rendezvous_main

    run_dir = tmp_path / "run"
    plan = TrainPlan(
        model="dlrm", size="tiny", global_batch=8, iterations=10, local_batches=(4, 4),
        run_dir=str(run_dir), config_id="c0",
    )  # fmt: skip
    plan_path = plan.save(run_dir / "plan-c0.json")
    job = JobPlan(
        config_id="c0", provider="ec2", region="us-east-1", train_plan=str(plan_path),
        launches=(), usd_per_hour=1.0, predicted={}, explanation=(),
    )  # fmt: skip
    job_path = job.save(run_dir / "job-c0.json")
    spec = JobSpec.from_params(
        {"model": "dlrm", "size": "tiny", "global_batch": 8, "iterations": 10,
         "offers": [{"type": "local.cpu", "quota": 1, "price": 1.0}], "provider": "local"}
    )  # fmt: skip
    started = time.time()
    from srifty_core.cloud.local import LocalProvider

    # no allocations: the VMs are gone; only the markers speak for them
    monitor = Monitor(job_path, [], spec, started, provider=LocalProvider())
    assert monitor.step(now=started + 1).status == "running"
    assert rendezvous_main(["exit-marker", str(run_dir), "c0", "0", "0"]) == 0
    assert monitor.step(now=started + 2).status == "running"  # a clean exit is no failure
    assert rendezvous_main(["exit-marker", str(run_dir), "c0", "1", "1"]) == 0
    with pytest.raises(TrainingFailed, match=r"without a preemption.*'1': 1"):
        monitor.step(now=started + 3)


def test_a_vm_whose_install_fails_shuts_itself_down(tmp_path: Path) -> None:
    """The user data's install fails (here: the wheel's sha256): the VM shuts down (EC2
    terminates it) with the end of its log on the console, and never starts the worker.
    Run with the VM's paths moved into a temporary folder and ``shutdown`` and the
    console standing in as files."""
    data = training_user_data("#!/bin/bash\necho start\n", wheel=WHEEL, allocation_id="a1")
    assert data.splitlines()[3] == INSTALL_FAILED  # before the first command that can fail
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, body in {
        "shutdown": f'echo "shutdown $*" >> {tmp_path}/shutdown',
        "python3": "exit 0",  # the venv: not on this machine
        # the download (https or s3): an empty file, so its sha256 is wrong
        "curl": 'touch "${@: -1}"',
        "aws": 'touch "${@: -1}"',
    }.items():
        (fake / name).write_text(f"#!/bin/bash\n{body}\n")
        (fake / name).chmod(0o755)
    script = (
        data.replace(BOOTSTRAP_LOG, str(tmp_path / "bootstrap.log"))
        .replace("/dev/console", str(tmp_path / "console"))
        .replace("/opt/srifty", str(tmp_path / "opt"))
    )
    (tmp_path / "opt" / "bin").mkdir(parents=True)
    (tmp_path / "opt" / "bin" / "pip").write_text("#!/bin/bash\nexit 0\n")  # pip's upgrade
    (tmp_path / "opt" / "bin" / "pip").chmod(0o755)
    out = subprocess.run(
        ["bash", "-c", script], env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert (tmp_path / "shutdown").read_text() == "shutdown -h now\n"
    console = (tmp_path / "console").read_text()
    assert "FAILED" in console and "the worker install failed" in console, console
    assert not (tmp_path / "opt" / "start-worker.sh").exists()  # the worker never started
