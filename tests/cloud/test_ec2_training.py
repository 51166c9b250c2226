"""Launching a training configuration on EC2 (against a moto server on loopback, the only
stand-in for AWS; it runs no user data): the first VM alone, the others told its private
address; every VM's user data installs the deployment's wheel (URI and sha256), carries
the plan and its start script, and no secret."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from srifty_core.cloud import LaunchRequest
from srifty_core.cloud.ec2 import (
    WHEEL_SHA256_ENV,
    WHEEL_URI_ENV,
    EC2Provider,
    EC2Training,
    WorkerWheel,
    training_user_data,
)
from srifty_core.errors import ConfigError
from srifty_core.runtime.rendezvous import Rendezvous, node_groups, start_script
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
    training = EC2Training.for_plan(plan_file, "c0")
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
            rdzv = Rendezvous(training.run_id, 4, 7, host)
            assert _start_part(script) == start_script(training.plan_json, groups[k], rdzv)
            assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
        assert f"--rdzv-endpoint={first}:29400" in scripts[1] and "--nproc-per-node=4" in scripts[2]
        assert "SRIFTY_RANK_OFFSET=$((3 + SRIFTY_LAUNCH_INDEX * 4))" in scripts[2]
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
    training = EC2Training(json.dumps(PLAN), "srifty-x-c0")
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
    from srifty_core.runtime.job import JobPlan, Launch
    from srifty_core.runtime.provisioning import provision, release

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
