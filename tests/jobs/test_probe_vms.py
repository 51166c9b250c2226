"""A probe sweep on EC2 VMs that start their workers from their user data
(``jobs.probe_vms``), through ``srifty probe --provider ec2``, against moto (EC2 and the
run storage's S3). moto runs no VM, so each instance it launches is "booted" here: the
start script its user data carries (the wheel's install left out) runs as a local process,
its torchrun on loopback instead of the VMs' private addresses, and the instance is
terminated when the script ends, as EC2 terminates a VM that shut itself down. Everything
else is what a VM would run: torchrun's c10d rendezvous over the ring's "VMs", the probe
worker reading its plan from the run storage, rank 0's rows and the exit markers written
there."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from srifty_core.cli import main
from srifty_core.errors import ConfigError
from srifty_core.jobs.probe_vms import probe_provider
from srifty_core.probing.mix import mix_label
from srifty_core.probing.store import read_probes
from tests.cloud.booted_vms import BootedVMs
from tests.cloud.moto_aws import AMI, live_instances

pytestmark = pytest.mark.slow

TINY = ["--sizes", "1KB,64KB", "--concurrency", "1", "--repeats", "2", "--warmup", "0",
        "--collectives", "all_reduce", "--allocations", "1", "--no-progress"]  # fmt: skip
EC2 = ["--provider", "ec2", "--ec2", json.dumps({"image_id": AMI, "poll_s": 0.05})]


@pytest.fixture
def vms(aws: Any, ec2_storage: str, tmp_path: Path) -> Iterator[BootedVMs]:
    with BootedVMs(aws, tmp_path / "vms") as booted:
        yield booted


@pytest.mark.timeout(300)
def test_a_mix_is_probed_on_ec2_vms_as_one_ring_and_lands_in_the_store(
    vms: BootedVMs, aws: Any, ec2_storage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    mix = "g4dn.xlarge:1,g5.xlarge:1"
    assert main(["probe", "--mix", mix, *EC2, *TINY]) == 0, vms.logs()
    captured = capsys.readouterr()
    out = captured.out
    assert "2 point(s) measured, 0 already stored, 0 failed" in out, out
    assert "2 VM(s) launched" in captured.err and "join as one ring" in captured.err
    label = mix_label({"g4dn.xlarge": 1, "g5.xlarge": 1})
    df = read_probes(providers=["ec2"], instance_types=[label])
    assert len(df) == 4 and set(df["world_size"]) == {2} and df["busbw"].gt(0).all()
    # labelled with the ring's allocations, as EC2 named them
    (alloc,) = set(df["allocation_id"])
    assert len(alloc.split("+")) == 2 and set(df["provider"]) == {"ec2"}
    # each VM ran the probe worker under torchrun, its plan a stub naming the run storage's
    starts = list(vms.scripts.values())
    for s in starts:
        assert "--module srifty_core.measure.probe_worker" in s
        assert ec2_storage in s and '"points"' not in s
    # the first VM hosts the rendezvous at its own address; the other is told that address
    own = [s for s in starts if "--rdzv-endpoint=${SRIFTY_PRIVATE_ADDRESS}:29400" in s]
    assert len(own) == 1 and len(starts) == 2
    assert live_instances(aws) == []  # released: nothing left to pay for


@pytest.mark.timeout(300)
def test_one_type_over_two_vms_is_one_allocation_of_the_store(
    vms: BootedVMs, aws: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A configuration launches its first VM alone: two EC2 allocations of one type are
    stored as one (their ids joined), under the type's own label."""
    argv = ["probe", "--instance-type", "g4dn.xlarge", "--world-sizes", "2", *EC2, *TINY]
    assert main(argv) == 0, vms.logs()
    df = read_probes(providers=["ec2"], instance_types=["g4dn.xlarge"])
    assert len(df) == 4 and set(df["world_size"]) == {2}
    (alloc,) = set(df["allocation_id"])
    assert len(alloc.split("+")) == 2
    assert live_instances(aws) == []


@pytest.mark.timeout(300)
def test_a_rank_that_fails_on_a_vm_fails_its_point_and_a_rerun_measures_the_rest(
    aws: Any, ec2_storage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mix = "g4dn.xlarge:1,g5.xlarge:1"
    with BootedVMs(aws, tmp_path / "a", {"SRIFTY_PROBE_FAIL_AT": "1:1"}) as booted:
        assert main(["probe", "--mix", mix, *EC2, *TINY]) == 1, booted.logs()
    captured = capsys.readouterr()
    assert "1 point(s) measured, 0 already stored, 1 failed" in captured.out, captured.out
    assert "rerun the same command" in captured.err
    assert live_instances(aws) == []
    with BootedVMs(aws, tmp_path / "b"):
        assert main(["probe", "--mix", mix, *EC2, *TINY]) == 0
    assert "1 point(s) measured, 1 already stored, 0 failed" in capsys.readouterr().out
    assert live_instances(aws) == []


def test_without_run_storage_nothing_is_launched(aws: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SRIFTY_RUN_STORAGE", raising=False)
    with pytest.raises(ConfigError, match="SRIFTY_RUN_STORAGE"):
        probe_provider("ec2", ec2={"image_id": AMI})
    with pytest.raises(ConfigError, match=r"ec2\.image_id"):
        probe_provider("ec2", ec2={})
    with pytest.raises(ConfigError, match="--ec2: settings of the ec2 provider"):
        probe_provider("local", ec2={"image_id": AMI})
    assert live_instances(aws) == []
