"""A moto server on loopback standing in for AWS (moto lives in the tests only), the
Airflow connection pointing at it, and what a user would still pay for afterwards."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from srifty_core.lifetime import free_port

AMI = "ami-12c6146b"  # any id: moto does not check it
SECRET = "not-a-real-secret-but-never-log-it"


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    """One moto server per test process (each start is seconds of CPU): ``aws`` resets
    its state for each test that uses it, and the tests that do not use fresh prefixes."""
    exe = Path(sys.executable).with_name("moto_server")
    port = free_port()
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def aws(moto_url: str, airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh moto state, the Airflow connection pointing at it, and a boto3 client for
    the test's own checks."""
    import boto3

    req = urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")
    urllib.request.urlopen(req, timeout=10).read()
    conn = {
        "conn_type": "aws",
        "login": "testing",
        "password": SECRET,
        "extra": {"endpoint_url": moto_url, "region_name": "us-east-1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(conn))
    return boto3.client(
        "ec2",
        endpoint_url=moto_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def live_instances(client: Any) -> list[str]:
    """Instances moto still holds that are not terminated (what a user would pay for)."""
    resp = client.describe_instances(
        Filters=[
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}
        ]
    )
    return [i["InstanceId"] for r in resp["Reservations"] for i in r["Instances"]]


WHEEL_URI = "s3://srifty-deploy/wheels/srifty-0.1.0-py3-none-any.whl"
WHEEL_SHA = "cd" * 32
PROFILE_RUNS_BUCKET = "srifty-profile-runs"


@pytest.fixture
def ec2_storage(moto_url: str, aws: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The deployment's settings for VMs that write to run storage: a bucket on the moto
    server (reached through ``AWS_ENDPOINT_URL_S3`` with fake credentials) as
    ``SRIFTY_RUN_STORAGE``, and the worker wheel (``SRIFTY_WORKER_WHEEL_URI``/``_SHA256``)."""
    import boto3
    import fsspec

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": moto_url,
        "SRIFTY_RUN_STORAGE": f"s3://{PROFILE_RUNS_BUCKET}/deploy",
        "SRIFTY_WORKER_WHEEL_URI": WHEEL_URI,
        "SRIFTY_WORKER_WHEEL_SHA256": WHEEL_SHA,
    }.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(
        Bucket=PROFILE_RUNS_BUCKET
    )
    s3 = fsspec.get_filesystem_class("s3")
    s3.clear_instance_cache()  # no client made for another endpoint
    yield f"s3://{PROFILE_RUNS_BUCKET}/deploy"
    s3.clear_instance_cache()


def user_data_of(client: Any, allocation_id: str) -> str:
    """The user data of the one instance tagged with ``allocation_id``."""
    import base64

    resp = client.describe_instances(
        Filters=[{"Name": "tag:srifty:allocation", "Values": [allocation_id]}]
    )
    (iid,) = [i["InstanceId"] for r in resp["Reservations"] for i in r["Instances"]]
    attr = client.describe_instance_attribute(InstanceId=iid, Attribute="userData")
    return base64.b64decode(attr["UserData"]["Value"]).decode()
