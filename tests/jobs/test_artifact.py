"""The worker wheel of a run's own source (issue 19): built once from a copy of the sources,
uploaded once, content-addressed, to the run storage with its sha256, reused while the
sources are unchanged, rebuilt when one changes, and passed into the EC2 user data.

A moto server on loopback stands in for AWS (S3 for the run storage, EC2 for the launch;
AWS itself cannot be reached here): s3fs and boto3 talk HTTP to it as they would to AWS,
with fake credentials and the endpoint given through the environment. The wheels are built
from a copy of this checkout in a temporary folder, so the checkout never gets a ``dist/``,
``build/`` or ``*.egg-info``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest

from srifty_core import paths
from srifty_core.cloud.ec2 import EC2Provider
from srifty_core.cloud.ec2.user_data import WHEEL_SHA256_ENV, WHEEL_URI_ENV, WorkerWheel
from srifty_core.errors import ConfigError
from srifty_core.jobs import artifact
from srifty_core.jobs.job import JobPlan, Launch
from srifty_core.jobs.provisioning import make_provider, provision, release
from srifty_core.runs import store as run_store
from tests.cloud.moto_aws import AMI, SECRET, live_instances

REPO = paths.REPO_ROOT
BUCKET = "srifty-artifacts"
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
PLAN = {
    "model": "resnet50",
    "size": "full",
    "global_batch": 64,
    "iterations": 10,
    "local_batches": [32, 32],
    "run_dir": "s3://runs-bucket/jobs/j1",
    "config_id": "c0",
}
pytestmark = pytest.mark.slow  # pip builds real wheels (seconds each)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of this checkout's sources: what the wheels are built from."""
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("source") / "srifty"
    src.mkdir()
    for name in artifact.SOURCE_FILES:
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "srifty_core", src / "srifty_core", ignore=shutil.ignore_patterns("__pycache__")
    )
    return src


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    artifact.clear_cache()


def s3_storage(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://`` run storage on the moto server (a fresh prefix), for s3fs through the
    environment as a deployment would give it."""
    import fsspec

    for k, v in FAKE_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_url)
    fsspec.get_filesystem_class("s3").clear_instance_cache()  # no client for another endpoint
    run_store.filesystem(f"s3://{BUCKET}")[0].makedirs(BUCKET, exist_ok=True)
    return f"s3://{BUCKET}/deploy-{uuid.uuid4().hex[:8]}"


def stored_wheels(storage: str) -> list[str]:
    fs, where = run_store.filesystem(storage)
    fs.invalidate_cache()
    return sorted(p for p in fs.find(where) if p.endswith(".whl"))


def test_the_wheel_is_built_once_uploaded_once_and_checked_by_its_hash(
    tree: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = s3_storage(moto_url, monkeypatch)
    first = artifact.prepare(tree, storage)
    assert first.built and first.uploaded
    sha = first.wheel.sha256
    assert first.wheel.uri == f"{storage}/wheels/{sha}/srifty-0.1.0-py3-none-any.whl"
    uploaded = run_store.read_bytes(first.wheel.uri)
    assert uploaded is not None and hashlib.sha256(uploaded).hexdigest() == sha
    assert uploaded == first.path.read_bytes()
    assert stored_wheels(storage) == [first.wheel.uri.removeprefix("s3://")]
    # what it was built from, beside the wheel here and in the run storage
    record = json.loads((first.path.parent / artifact.SOURCE_JSON).read_text())
    assert record["source_digest"] == artifact.source_digest(tree) == first.path.parent.name
    assert record["sha256"] == sha and record["commit"] == ""  # the copy has no git history
    remote = run_store.read_text(f"{storage}/wheels/{sha}/{artifact.SOURCE_JSON}")
    assert remote is not None and json.loads(remote) == record
    assert first.path.is_relative_to(tree / "dist" / artifact.BUILDS_FOLDER)
    # built from a further copy: the source tree gets no build/ or egg-info
    assert not (tree / "build").exists() and not list(tree.glob("*.egg-info"))
    with zipfile.ZipFile(first.path) as zf:
        assert "srifty_core/jobs/artifact.py" in zf.namelist()

    def no_build(*_: Any) -> Any:
        raise AssertionError("built again")

    monkeypatch.setattr(artifact, "build_wheel", no_build)
    again = artifact.prepare(tree, storage)  # this process's cache
    assert again.wheel == first.wheel and not again.built and not again.uploaded
    artifact.clear_cache()  # another process: finds the stored build, skips the upload
    later = artifact.prepare(tree, storage)
    assert later.wheel == first.wheel and not later.built and not later.uploaded
    assert stored_wheels(storage) == [first.wheel.uri.removeprefix("s3://")]


def test_a_changed_source_makes_a_new_wheel_and_records_the_commit(
    tree: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = s3_storage(moto_url, monkeypatch)
    before = artifact.prepare(tree, storage)
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "sources"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    edited = tree / "srifty_core" / "worker" / "rendezvous.py"
    original = edited.read_text()
    try:
        edited.write_text(original + "\n# an uncommitted edit\n")
        after = artifact.prepare(tree, storage)
        assert after.built and after.uploaded
        assert after.wheel.sha256 != before.wheel.sha256
        assert after.wheel.uri != before.wheel.uri
        assert after.source["commit"] == head and after.source["dirty"] is True
        with zipfile.ZipFile(after.path) as zf:
            assert zf.read("srifty_core/worker/rendezvous.py").endswith(b"# an uncommitted edit\n")
        assert len(stored_wheels(storage)) == 2
    finally:
        edited.write_text(original)
        shutil.rmtree(tree / ".git")
    artifact.clear_cache()
    back = artifact.prepare(tree, storage)  # the sources as they were: the first wheel
    assert back.wheel == before.wheel and not back.built and not back.uploaded


def test_an_ec2_job_installs_the_wheel_of_its_own_source(
    tree: Path, aws: Any, moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What the DAG's provision task does when the deployment named no wheel."""
    monkeypatch.delenv(WHEEL_URI_ENV, raising=False)
    monkeypatch.delenv(WHEEL_SHA256_ENV, raising=False)
    storage = s3_storage(moto_url, monkeypatch)  # after `aws` reset moto's state
    monkeypatch.setenv(paths.RUN_STORAGE_ENV, storage)
    monkeypatch.setattr(artifact, "source_root", lambda: tree)
    plan_file = tmp_path / "plan-c0.json"
    plan_file.write_text(json.dumps(PLAN))
    job = JobPlan(
        config_id="c0",
        provider="ec2",
        region="us-east-1",
        train_plan=str(plan_file),
        launches=(Launch("g4dn.xlarge", "on-demand", 2, 1, 32),),
        usd_per_hour=1.0,
        predicted={},
        explanation=(),
        ec2={"image_id": AMI, "poll_s": 0.05, "wait_timeout_s": 20},
    )
    job_path = job.save(tmp_path / "job-c0.json")
    ids = provision(job_path)
    try:
        wheel = artifact.prepare().wheel  # the one provisioning made (this process's cache)
        assert wheel.uri.startswith(f"{storage}/wheels/{wheel.sha256}/")
        assert stored_wheels(storage) == [wheel.uri.removeprefix("s3://")]
        p = EC2Provider(image_id=AMI)
        ids_ = [i for a in ids for i in p.get_allocation(a).instance_ids]
        assert len(ids_) == 2
        for instance in ids_:
            attr = aws.describe_instance_attribute(InstanceId=instance, Attribute="userData")
            script = base64.b64decode(attr["UserData"]["Value"]).decode()
            assert f"aws s3 cp --only-show-errors {wheel.uri} " in script
            assert f"{wheel.sha256}  /opt/srifty/wheel/{wheel.filename}" in script
            assert "sha256sum --check" in script and "[worker]" in script
            assert "pip install srifty" not in script and "torchrun" in script
            lowered = script.lower()
            for secret in (SECRET.lower(), "aws_secret_access_key", "testing"):
                assert secret not in lowered, secret
    finally:
        release(ids, job_path=job_path)
    assert live_instances(aws) == []


def test_the_deployments_wheel_wins_and_what_is_refused(
    tree: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_build(*_: Any) -> Any:
        raise AssertionError("nothing is built when the deployment names the wheel")

    monkeypatch.setattr(artifact, "find_or_build", no_build)
    monkeypatch.setattr(artifact, "source_root", lambda: tree)
    monkeypatch.setenv(paths.RUN_STORAGE_ENV, f"s3://{BUCKET}/deploy")
    plan_file = tmp_path / "plan-c0.json"
    plan_file.write_text(json.dumps(PLAN))
    job = JobPlan(
        config_id="c0",
        provider="ec2",
        region="us-east-1",
        train_plan=str(plan_file),
        launches=(Launch("g4dn.xlarge", "on-demand", 2, 1, 32),),
        usd_per_hour=1.0,
        predicted={},
        explanation=(),
        ec2={"image_id": AMI},
    )
    named = WorkerWheel("https://example.org/w/srifty-0.1.0-py3-none-any.whl", "ab" * 32)
    monkeypatch.setenv(WHEEL_URI_ENV, named.uri)
    monkeypatch.setenv(WHEEL_SHA256_ENV, named.sha256)
    provider = make_provider(job, training=True)
    assert isinstance(provider, EC2Provider) and provider.wheel() == named
    monkeypatch.delenv(WHEEL_URI_ENV)
    monkeypatch.delenv(WHEEL_SHA256_ENV)
    make_provider(job)  # no workers (releasing, watching): no wheel needed, none made
    monkeypatch.delenv(paths.RUN_STORAGE_ENV)
    with pytest.raises(ConfigError, match=f"{WHEEL_URI_ENV}.*{paths.RUN_STORAGE_ENV}"):
        make_provider(job, training=True)
    monkeypatch.setenv(paths.RUN_STORAGE_ENV, "gs://elsewhere/runs")
    with pytest.raises(ConfigError, match="s3://"):
        make_provider(job, training=True)
    monkeypatch.setattr(artifact, "source_root", lambda: None)  # an installed wheel
    with pytest.raises(ConfigError, match=f"without its sources.*must set {WHEEL_URI_ENV}"):
        make_provider(job, training=True)


def test_the_source_digest_covers_what_the_wheel_is_built_from(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "srifty_core" / "__pycache__").mkdir(parents=True)
    (src / "pyproject.toml").write_text("[project]\n")
    (src / "srifty_core" / "a.py").write_text("A = 1\n")
    digest = artifact.source_digest(src)
    (src / "srifty_core" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (src / "dist").mkdir()
    (src / "dist" / "old.whl").write_bytes(b"\0")
    assert artifact.source_digest(src) == digest  # caches and builds do not count
    (src / "srifty_core" / "a.py").write_text("A = 2\n")
    assert artifact.source_digest(src) != digest
    (src / "srifty_core" / "a.py").write_text("A = 1\n")
    (src / "srifty_core" / "b.py").write_text("")
    assert artifact.source_digest(src) != digest  # a new (even empty) file counts
