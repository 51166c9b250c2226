"""The rendezvous of one configuration: node groups in the plan's order, the torchrun
command line, the start script's arithmetic on a VM, and the worker's rank mapping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from srifty_core.errors import ConfigError
from srifty_core.worker.rendezvous import (
    NodeGroup,
    Rendezvous,
    exit_markers,
    node_groups,
    run_id,
    start_script,
    torchrun_argv,
)
from srifty_core.worker.worker import plan_rank

PLAN = {
    "model": "dlrm",
    "size": "tiny",
    "local_batches": [1, 1, 2, 2, 2, 2, 4, 4, 4, 4],
    "run_dir": "s3://runs/j1",
    "config_id": "c0",
}
REPO = Path(__file__).resolve().parents[2]
AGENT = {"TORCHELASTIC_USE_AGENT_STORE": "True"}


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
        "srifty_core.worker.launch",
        "p.json",
    ]


def _fake_venv(tmp: Path, code: int = 0) -> Path:
    """A folder whose ``bin/torchrun`` prints what it was given and exits with ``code``:
    only to read what the start script computed on a VM (the namespace test runs the real
    torchrun); its ``bin/python`` is this Python (the exit marker is written for real)."""
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    tr = venv / "bin" / "torchrun"
    tr.write_text(
        "#!/bin/bash\n"
        'echo "ARGS $*"\n'
        'echo "ENV $SRIFTY_NODE_INDEX $SRIFTY_RANK_OFFSET $TORCH_DISABLE_SHARE_RDZV_TCP_STORE"\n'
        'echo "PLAN $(cat "${@: -1}")"\n'
        f"exit {code}\n"
    )
    tr.chmod(0o755)
    py = venv / "bin" / "python"
    py.write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return venv


def _run(script: str, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = tmp / "start.sh"
    path.write_text(script)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SRIFTY_")}
    return subprocess.run(
        ["bash", str(path)], env={**clean, **env}, capture_output=True, text=True, timeout=60,
        cwd=REPO,
    )  # fmt: skip


def test_start_script_places_each_vm_by_its_launch_index(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path)
    groups = node_groups([(3, 2), (1, 4)])
    joined = Rendezvous("srifty-x-c0", 4, 10, host="10.0.0.5")
    plan = {**PLAN, "run_dir": str(tmp_path / "run")}
    script = start_script(
        plan, groups[1], joined, venv=str(venv), workdir=str(tmp_path / "w"), shutdown=False
    )
    out = _run(script, tmp_path, SRIFTY_LAUNCH_INDEX="1", SRIFTY_PRIVATE_ADDRESS="10.0.0.9")
    assert out.returncode == 0, out.stderr
    lines = dict(x.split(" ", 1) for x in out.stdout.splitlines())
    assert lines["ENV"] == "2 4 0"  # VM 2 of the configuration, plan ranks 4..5; agent store
    args = lines["ARGS"].split()
    assert "--nproc-per-node=2" in args and "--rdzv-endpoint=10.0.0.5:29400" in args
    assert "--rdzv-conf=is_host=false,join_timeout=900" in args
    assert "--local-addr=10.0.0.9" in args
    assert json.loads(lines["PLAN"]) == plan
    assert exit_markers(str(plan["run_dir"]), "c0") == {"2": 0}  # torchrun's code, by node
    # the first VM: its own address is the endpoint and it hosts the store
    first = Rendezvous("srifty-x-c0", 4, 10)
    script = start_script(
        plan, groups[0], first, venv=str(venv), workdir=str(tmp_path / "w"), shutdown=False
    )
    out = _run(script, tmp_path, SRIFTY_LAUNCH_INDEX="0", SRIFTY_PRIVATE_ADDRESS="10.0.0.5")
    assert out.returncode == 0, out.stderr
    assert "--rdzv-endpoint=10.0.0.5:29400" in out.stdout and "is_host=true" in out.stdout
    assert "ENV 0 0 0" in out.stdout
    # what the metadata service could not have said is refused before torchrun starts
    for index, addr in (("1", "10.0.0.5"), ("x", "10.0.0.5"), ("0", "10.0.0.5;rm -rf /")):
        bad = _run(script, tmp_path, SRIFTY_LAUNCH_INDEX=index, SRIFTY_PRIVATE_ADDRESS=addr)
        assert bad.returncode == 2 and "ARGS" not in bad.stdout, (index, addr)
    # ... and reported: a VM that does not know its index yet reports as its group
    assert exit_markers(str(plan["run_dir"]), "c0") == {"0": 0, "2": 0, "g0": 2}
    assert "shutdown" not in script and "shutdown -h now" in start_script(PLAN, groups[0], first)


def test_a_failed_torchrun_is_reported_in_the_run_folder(tmp_path: Path) -> None:
    """torchrun ends non-zero (a join timeout, a crash): the script (no longer ``exec``)
    writes ``exit-<config>-<node>.json`` with its code, then would shut the VM down."""
    venv = _fake_venv(tmp_path, code=7)
    plan = {**PLAN, "run_dir": str(tmp_path / "run"), "config_id": "c0.r1"}
    g = node_groups([(3, 2), (1, 4)])[2]
    rdzv = Rendezvous("srifty-x-c0", 4, 10, host="10.0.0.5", join_timeout_s=1500)
    script = start_script(plan, g, rdzv, venv=str(venv), workdir=str(tmp_path / "w"))
    script = script.replace("shutdown -h now", "echo SHUTDOWN")  # not this machine
    out = _run(script, tmp_path, SRIFTY_LAUNCH_INDEX="0", SRIFTY_PRIVATE_ADDRESS="10.0.0.8")
    assert out.returncode == 7, out.stderr
    assert "join_timeout=1500" in out.stdout and out.stdout.rstrip().endswith("SHUTDOWN")
    assert exit_markers(str(plan["run_dir"]), "c0.r1") == {"3": 7}
    assert exit_markers(str(plan["run_dir"]), "c0") == {}  # another configuration's markers
    (name,) = os.listdir(tmp_path / "run")
    assert name == "exit-c0.r1-3.json"
    marker = json.loads((tmp_path / "run" / name).read_text())
    assert marker["code"] == 7 and marker["at"] > 0


def test_an_empty_metadata_answer_is_named_as_such(tmp_path: Path) -> None:
    """The metadata service is reached with retries; an empty answer stops the script with
    an error naming the service, not a "bad launch index". A ``curl`` on PATH that logs its
    arguments and answers nothing stands in for the service (only EC2 has it)."""
    venv = _fake_venv(tmp_path)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "curl").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path / "curl.log"}\nexit 0\n')
    (fake / "curl").chmod(0o755)
    plan = {**PLAN, "run_dir": str(tmp_path / "run")}
    g = node_groups([(3, 2), (1, 4)])[1]
    rdzv = Rendezvous("srifty-x-c0", 4, 10, host="10.0.0.5")
    script = start_script(
        plan, g, rdzv, venv=str(venv), workdir=str(tmp_path / "w"), shutdown=False
    )
    out = _run(script, tmp_path, PATH=f"{fake}:{os.environ['PATH']}")
    assert out.returncode == 3 and "ARGS" not in out.stdout
    assert "instance metadata service (169.254.169.254) gave no ami-launch-index" in out.stderr
    assert "bad launch index" not in out.stderr
    calls = (tmp_path / "curl.log").read_text().splitlines()
    assert calls and all("--retry 5 --retry-connrefused --max-time 5" in c for c in calls)
    assert exit_markers(str(plan["run_dir"]), "c0") == {"g1": 3}


def test_start_script_refuses_groups_that_do_not_fit_the_plan() -> None:
    with pytest.raises(ConfigError, match="ranks"):
        start_script(PLAN, NodeGroup(0, 1, 2, 0), Rendezvous("r", 4, 12))
    with pytest.raises(ConfigError, match="does not fit"):
        start_script(PLAN, NodeGroup(3, 2, 4, 6), Rendezvous("r", 4, 10))


def test_plan_rank_maps_torchruns_rank_to_the_plans() -> None:
    base = {"WORLD_SIZE": "10", "LOCAL_WORLD_SIZE": "4", **AGENT}
    # c10d numbered this VM first (RANK 1), but it holds the plan's ranks 6..9
    assert plan_rank({**base, "RANK": "1", "LOCAL_RANK": "1", "SRIFTY_RANK_OFFSET": "6"}) == 7
    assert plan_rank({**base, "RANK": "3", "LOCAL_RANK": "3"}) == 3  # no offset: RANK
    with pytest.raises(ConfigError, match="does not fit"):
        plan_rank({**base, "RANK": "0", "LOCAL_RANK": "0", "SRIFTY_RANK_OFFSET": "7"})
    # an offset only works where every worker is a client of torchrun's agent store
    no_agent = {**base, "RANK": "1", "LOCAL_RANK": "1", "SRIFTY_RANK_OFFSET": "6"}
    no_agent["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    with pytest.raises(ConfigError, match="TORCHELASTIC_USE_AGENT_STORE"):
        plan_rank(no_agent)
