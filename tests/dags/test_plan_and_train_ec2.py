"""srifty_plan_and_train on the EC2 path, against moto (the only stand-in for AWS; it has
no compute, so no worker trains): the planner chooses catalog types, the VMs are launched
through the Airflow AWS connection, a spot VM is taken back, the monitor re-plans without
that offer, and nothing is left running afterwards. The run folder is on run storage (the
same moto server's S3), as EC2 training requires."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cloud.moto_aws import AMI, live_instances
from tests.dags.services import fresh

pytestmark = pytest.mark.airflow

DAG_ID = "srifty_plan_and_train"
CONF: dict[str, Any] = {
    "model": "dlrm",
    "size": "tiny",
    "global_batch": 64,
    "iterations": 1000,
    "provider": "ec2",
    "region": "us-east-1",
    "offers": [
        {"type": "g4dn.xlarge", "market": "spot", "quota": 2},
        {"type": "g4dn.12xlarge", "market": "on-demand", "quota": 1},
    ],
    "objective": "cost",
    "ec2": {"image_id": AMI, "poll_s": 0.05, "wait_timeout_s": 20},
}


WHEEL_URI = "s3://srifty-deploy/wheels/srifty-0.1.0-py3-none-any.whl"
WHEEL_SHA = "ab" * 32


RUNS_BUCKET = "srifty-runs"


@pytest.fixture
def run_storage(moto_url: str, aws: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The deployment's run storage: a bucket on the moto server, reached through the
    environment (``AWS_ENDPOINT_URL_S3``, fake credentials), as a deployment gives S3's."""
    import boto3
    import fsspec

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": moto_url,
        "SRIFTY_RUN_STORAGE": f"s3://{RUNS_BUCKET}/deploy",
    }.items():
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    s3.create_bucket(Bucket=RUNS_BUCKET)
    S3FileSystem = fsspec.get_filesystem_class("s3")
    S3FileSystem.clear_instance_cache()  # no client made for another endpoint
    yield f"s3://{RUNS_BUCKET}/deploy"
    S3FileSystem.clear_instance_cache()


def test_ec2_plan_provision_preempt_replan_and_release(
    dagbag: Any, ready_to_plan: Path, aws: Any, run_storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what VMs install is a deployment setting, not a trigger-conf field
    monkeypatch.setenv("SRIFTY_WORKER_WHEEL_URI", WHEEL_URI)
    monkeypatch.setenv("SRIFTY_WORKER_WHEEL_SHA256", WHEEL_SHA)
    taken: list[str] = []
    user_data: list[str] = []

    def take_back_a_spot_vm() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            resp = aws.describe_instances(
                Filters=[
                    {"Name": "instance-state-name", "Values": ["running"]},
                    {"Name": "tag:srifty:market", "Values": ["spot"]},
                ]
            )
            ids = [i["InstanceId"] for r in resp["Reservations"] for i in r["Instances"]]
            if ids:
                import base64

                attr = aws.describe_instance_attribute(InstanceId=ids[0], Attribute="userData")
                user_data.append(base64.b64decode(attr["UserData"]["Value"]).decode())
                time.sleep(1.0)  # let training "start" first
                aws.terminate_instances(InstanceIds=[ids[0]])  # EC2 takes it back
                taken.append(ids[0])
                return
            time.sleep(0.1)

    reaper = threading.Thread(target=take_back_a_spot_vm, daemon=True)
    reaper.start()
    dag = fresh(dagbag, DAG_ID)
    run = dag.test(run_conf=CONF)
    reaper.join(timeout=5)
    assert taken, "the plan launched no spot VM"
    (script,) = user_data
    assert WHEEL_URI in script and WHEEL_SHA in script  # the artifact and its hash
    assert "pip install srifty" not in script  # never a package name from an index
    lowered = script.lower()
    for secret in ("aws_secret_access_key", "aws_session_token", "airflow_conn", "password"):
        assert secret not in lowered, secret
    assert run.state == "success"
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["trigger_replan"] == "success" and states["release"] == "success"
    assert live_instances(aws) == []

    from airflow.models.dagrun import DagRun

    (child,) = [
        r
        for r in DagRun.find(dag_id=DAG_ID)
        if (r.conf or {}).get("resume", {}).get("parent_run_id") == run.run_id
    ]
    conf = child.conf
    assert conf["resume"]["depleted"] == ["g4dn.xlarge/spot"]
    assert conf["resume"]["iterations_done"] == 0  # moto runs no worker
    assert conf["iterations"] == 1000
    assert conf["resume"]["cost_spent_usd"] > 0

    # What the first run launched: the planner's choice, tagged and on the right market.
    from srifty_core.jobs.orchestrate import JobPlan
    from srifty_core.runs import store as run_store

    fs, root = run_store.filesystem(f"{run_storage}/runs")
    (job_file,) = fs.glob(f"{root}/*/job-c0.json")  # on the run storage, not on this disk
    assert not (ready_to_plan / "runs").exists()
    job = JobPlan.load(f"s3://{job_file}")
    assert {(x.instance_type, x.market) for x in job.launches} >= {("g4dn.xlarge", "spot")}
    assert sum(x.batch_per_rank * x.count * x.ranks_per_vm for x in job.launches) == 64
