"""The rendezvous of one configuration: node groups in the plan's order, the torchrun
command line, the start script's arithmetic on a VM, and the worker's rank mapping."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from srifty_core.errors import ConfigError
from srifty_core.runtime.rendezvous import (
    NodeGroup,
    Rendezvous,
    node_groups,
    run_id,
    start_script,
    torchrun_argv,
)
from srifty_core.runtime.worker import plan_rank

PLAN = {"model": "dlrm", "size": "tiny", "local_batches": [1, 1, 2, 2, 2, 2, 4, 4, 4, 4]}


def test_node_groups_follow_the_plan_order_with_the_first_vm_alone() -> None:
    # launches: 3 VMs of 2 ranks, then 1 VM of 4 ranks (10 ranks in the plan)
    groups = node_groups([(3, 2), (1, 4)])
    assert groups == (
        NodeGroup(0, 1, 2, 0),  # the first VM, launched alone: it hosts the rendezvous
        NodeGroup(1, 2, 2, 2),
        NodeGroup(3, 1, 4, 6),
    )
    assert groups[1].node(1) == (2, 4)  # the second VM of that launch runs ranks 4..5
    assert groups[2].node(0) == (3, 6)  # the 4-GPU VM runs ranks 6..9
    with pytest.raises(ConfigError, match="launch index"):
        groups[1].node(2)
    with pytest.raises(ConfigError):
        node_groups([])


def test_run_id_is_per_configuration_and_run_folder() -> None:
    a = run_id("c0", "s3://bucket/runs/job-1")
    assert a == run_id("c0", "s3://bucket/runs/job-1")
    assert a != run_id("c0.r1", "s3://bucket/runs/job-1")
    assert a != run_id("c0", "s3://bucket/runs/job-2")
    Rendezvous(run_id("c0 / evil;rm", "/x"), 1, 1)  # sanitised: a valid id
    for bad in ({"run_id": "a b"}, {"host": "h;rm"}, {"port": 0}, {"nnodes": 3, "world_size": 2}):
        kw = {"run_id": "r", "nnodes": 1, "world_size": 1, **bad}
        with pytest.raises(ConfigError):
            Rendezvous(**kw)  # type: ignore[arg-type]


def test_torchrun_command_line() -> None:
    rdzv = Rendezvous("srifty-x-c0", 4, 10, host="10.0.0.5", port=29400, join_timeout_s=300)
    argv = torchrun_argv(
        rdzv, ranks=2, host="10.0.0.5", local_addr="10.0.0.7", is_host="false", plan_path="p.json"
    )
    assert argv == [
        "torchrun",
        "--nnodes=4",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.5:29400",
        "--rdzv-id=srifty-x-c0",
        "--rdzv-conf=is_host=false,join_timeout=300",
        "--local-addr=10.0.0.7",
        "--max-restarts=0",
        "--module",
        "srifty_core.runtime.worker",
        "p.json",
    ]


def _fake_venv(tmp: Path) -> Path:
    """A folder whose ``bin/torchrun`` prints what it was given: only to read what the
    start script computed on a VM (the namespace test runs the real torchrun)."""
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    tr = venv / "bin" / "torchrun"
    tr.write_text(
        "#!/bin/bash\n"
        'echo "ARGS $*"\n'
        'echo "ENV $SRIFTY_NODE_INDEX $SRIFTY_RANK_OFFSET"\n'
        'echo "PLAN $(cat "${@: -1}")"\n'
    )
    tr.chmod(0o755)
    return venv


def _run(script: str, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = tmp / "start.sh"
    path.write_text(script)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SRIFTY_")}
    return subprocess.run(
        ["bash", str(path)], env={**clean, **env}, capture_output=True, text=True, timeout=30
    )


def test_start_script_places_each_vm_by_its_launch_index(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path)
    groups = node_groups([(3, 2), (1, 4)])
    joined = Rendezvous("srifty-x-c0", 4, 10, host="10.0.0.5")
    script = start_script(PLAN, groups[1], joined, venv=str(venv), workdir=str(tmp_path / "w"))
    out = _run(script, tmp_path, SRIFTY_LAUNCH_INDEX="1", SRIFTY_PRIVATE_ADDRESS="10.0.0.9")
    assert out.returncode == 0, out.stderr
    lines = dict(x.split(" ", 1) for x in out.stdout.splitlines())
    assert lines["ENV"] == "2 4"  # VM 2 of the configuration, plan ranks 4..5
    args = lines["ARGS"].split()
    assert "--nproc-per-node=2" in args and "--rdzv-endpoint=10.0.0.5:29400" in args
    assert "--rdzv-conf=is_host=false,join_timeout=900" in args
    assert "--local-addr=10.0.0.9" in args
    assert json.loads(lines["PLAN"]) == PLAN
    # the first VM: its own address is the endpoint and it hosts the store
    first = Rendezvous("srifty-x-c0", 4, 10)
    script = start_script(PLAN, groups[0], first, venv=str(venv), workdir=str(tmp_path / "w"))
    out = _run(script, tmp_path, SRIFTY_LAUNCH_INDEX="0", SRIFTY_PRIVATE_ADDRESS="10.0.0.5")
    assert out.returncode == 0, out.stderr
    assert "--rdzv-endpoint=10.0.0.5:29400" in out.stdout and "is_host=true" in out.stdout
    assert "ENV 0 0" in out.stdout
    # what the metadata service could not have said is refused before torchrun starts
    for index, addr in (("1", "10.0.0.5"), ("x", "10.0.0.5"), ("0", "10.0.0.5;rm -rf /")):
        bad = _run(script, tmp_path, SRIFTY_LAUNCH_INDEX=index, SRIFTY_PRIVATE_ADDRESS=addr)
        assert bad.returncode == 2 and "ARGS" not in bad.stdout, (index, addr)


def test_start_script_refuses_groups_that_do_not_fit_the_plan() -> None:
    with pytest.raises(ConfigError, match="ranks"):
        start_script(PLAN, NodeGroup(0, 1, 2, 0), Rendezvous("r", 4, 12))
    with pytest.raises(ConfigError, match="does not fit"):
        start_script(PLAN, NodeGroup(3, 2, 4, 6), Rendezvous("r", 4, 10))


def test_plan_rank_maps_torchruns_rank_to_the_plans() -> None:
    base = {"WORLD_SIZE": "10", "LOCAL_WORLD_SIZE": "4"}
    # c10d numbered this VM first (RANK 1), but it holds the plan's ranks 6..9
    assert plan_rank({**base, "RANK": "1", "LOCAL_RANK": "1", "SRIFTY_RANK_OFFSET": "6"}) == 7
    assert plan_rank({**base, "RANK": "3", "LOCAL_RANK": "3"}) == 3  # no offset: RANK
    with pytest.raises(ConfigError, match="does not fit"):
        plan_rank({**base, "RANK": "0", "LOCAL_RANK": "0", "SRIFTY_RANK_OFFSET": "7"})
