"""srifty_probe_sweep on the EC2 path, against moto (EC2 and the run storage's S3), each
VM's start script run on this machine (``tests.cloud.booted_vms``): the setup task
launches a mixed ring whose VMs start the probe workers themselves, the sweep task reads
their rows back from the run storage into the store, and the teardown leaves nothing
running."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from srifty_core.probing.mix import mix_label
from srifty_core.probing.store import read_probes
from tests.cloud.booted_vms import BootedVMs
from tests.cloud.moto_aws import AMI, live_instances
from tests.dags.services import fresh

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

CONF: dict[str, Any] = {
    "provider": "ec2",
    "ec2": {"image_id": AMI, "poll_s": 0.05},
    "instance_types": ["g4dn.xlarge"],
    "world_sizes": [2],
    "mixes": ["g4dn.xlarge:1,g5.xlarge:1"],
    "mix_budget": 0,
    "sizes": "1KB:64KB",
    "points_per_decade": 0.5,
    "concurrency": [1],
    "repeats": 2,
    "warmup": 0,
    "allocations": 1,
    "collectives": ["all_reduce"],
}


@pytest.mark.timeout(600)
def test_the_sweep_dag_probes_a_type_and_a_mix_on_ec2_vms(
    dagbag: Any, aws: Any, ec2_storage: str, tmp_path: Path
) -> None:
    with BootedVMs(aws, tmp_path / "vms") as vms:
        run = fresh(dagbag, "srifty_probe_sweep").test(run_conf=CONF)
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert run.state == "success", (states, vms.logs())
    df = read_probes(providers=["ec2"])
    label = mix_label({"g4dn.xlarge": 1, "g5.xlarge": 1})
    assert set(df["instance_type"]) == {"g4dn.xlarge", label}
    assert df["busbw"].gt(0).all() and set(df["world_size"]) == {2}
    assert len(vms.scripts) == 4  # two VMs for the type, two for the mix
    assert live_instances(aws) == []
